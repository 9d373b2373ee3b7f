"""Executing a run: each notebook through papermill, in a kernel of its own, under time limits.
Every kernel is started at once, before the first notebook, its imports done
(:mod:`stagelab.run.kernels`), and stopped when its notebook is done.

The steps are named and the state lives in one :class:`~stagelab.core.rundir.ManifestRecorder`:
start the record, then for each notebook start it, execute it while watching the machine's load
(:mod:`stagelab.measure.busy`, recorded as the entry's ``load``), record how it ended;
finally close the record and export every notebook's HTML, in one pass. A failing notebook is
recorded ``failed`` (its partial output kept) and the next one still runs; Ctrl-C or SIGTERM
records ``interrupted`` and stops.

Every kernel talks over IPC sockets in a private temporary folder that is removed afterwards, so
concurrent runs never share a socket and nothing is written next to the notebooks. The kernel's
own stdout/stderr (teardown noise such as ZMQ tracebacks on Ctrl-C) goes to ``kernel.log`` in
the run folder, not to the terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import keyword
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stagelab.analyse import trust
from stagelab.core import measured as measured_folder
from stagelab.core import outcomes, paths, phases, rundir, stops
from stagelab.core.errors import UserError
from stagelab.core.records import RunFolder
from stagelab.core.rundir import ManifestRecorder, RecordError
from stagelab.measure import busy, hardware
from stagelab.present import report
from stagelab.run.kernels import (
    KERNEL_LOG,
    KERNEL_NAME,
    WarmKernel,
    WarmKernels,
    ensure_kernel,
    kernel_sockets,
    kill_kernels,
    private_kernel_manager,
)
from stagelab.run.profiles import NotebookPlan, RunPlan

# ---------------------------------------------------------------------------------- the steps


class DeferredStops:
    """While the record is being made or closed, a stop signal (a second Ctrl-C, SIGTERM,
    SIGHUP) is noted instead of abandoning it; ``raise_after`` raises KeyboardInterrupt for
    it once the block is done. Python runs signal handlers in the main thread only, so this
    holds whichever thread the signal reached."""

    def __init__(self, raise_after: bool) -> None:
        self.raise_after = raise_after
        self.pending: list[int] = []
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, _frame: Any) -> None:
        self.pending.append(signum)
        _say(True, "stagelab: finishing the run's record first")

    def __enter__(self) -> DeferredStops:
        self._previous = {signum: signal.signal(signum, self._note) for signum in stops.SIGNALS}
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self.pending and self.raise_after and exc_type is None:
            raise KeyboardInterrupt(f"signal {signal.Signals(self.pending[0]).name}")


def error_summary(exc: BaseException) -> str:
    """``Name: first line`` of an exception (papermill's carry the notebook's ename/evalue)."""
    name = getattr(exc, "ename", None) or type(exc).__name__
    value = getattr(exc, "evalue", None) or str(exc)
    lines = str(value).strip().splitlines()
    return f"{name}: {lines[0] if lines else ''}".strip()


def _last_started_cell(notebook_path: Path) -> int | None:
    """Index, in the executed notebook, of the last cell papermill started."""
    import nbformat

    try:
        nb = nbformat.read(str(notebook_path), as_version=4)
    except (OSError, ValueError):
        return None
    started = [i for i, cell in enumerate(nb.cells)
               if cell.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else None


def injected_parameters(notebook: NotebookPlan, run_dir: Path) -> dict[str, Any]:
    """The parameters papermill writes into the notebook's injected cell. Each name becomes code
    there, so each must be a plain identifier (the plan checked it against the notebook's own
    parameters cell; this refuses anything else however the plan was made)."""
    parameters = {**notebook.parameters, "run_dir": str(Path(run_dir).resolve())}
    for name in parameters:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise UserError(f"{notebook.name}: parameter name {name!r} is not a Python "
                            "identifier; refused (it would be written into the notebook as code)")
    return parameters


def _papermill(notebook: NotebookPlan, output: Path, run_dir: Path, plan: RunPlan,
               kernel_manager: type, warm: WarmKernel | None = None) -> tuple[str, str | None]:
    """papermill in a kernel it starts from ``kernel_manager``, or in the ``warm`` one."""
    import papermill

    os.environ[paths.HEADLESS_ENV] = "1"  # the kernel's sweeps print a line per cell, no bars
    try:
        papermill.execute_notebook(
            str(notebook.path), str(output), parameters=injected_parameters(notebook, run_dir),
            kernel_name=KERNEL_NAME, cwd=str(notebook.path.parent), progress_bar=False,
            request_save_on_cell_execute=True, kernel_manager_class=kernel_manager,
            start_timeout=plan.start_timeout_s, execution_timeout=plan.cell_timeout_s,
            shutdown_kernel="immediate",  # its cells are done: no need to wait for its teardown
            **({"km": warm.manager} if warm else {}))
    except TimeoutError:
        cell = _last_started_cell(output)
        return rundir.FAILED, (f"timed out after {plan.cell_timeout_s} s in cell "
                               f"{cell if cell is not None else '?'}")
    except Exception as exc:  # papermill or the kernel failed: record it, keep going
        return rundir.FAILED, error_summary(exc)
    return rundir.OK, None


def execute_notebook(notebook: NotebookPlan, output: Path, run_dir: Path, plan: RunPlan,
                     warm: WarmKernel | None = None) -> tuple[str, str | None]:
    """Execute one notebook into ``output`` in its ``warm`` kernel (stopped once the notebook
    is done) or, without one, a kernel papermill starts; return its status and, if it failed,
    why.

    papermill works in a thread of its own, so that Ctrl-C and SIGTERM reach this (main) thread
    at once: the kernel is then killed, papermill saves what the notebook produced, and
    KeyboardInterrupt goes on up.
    """
    with kernel_sockets() as sockets, open(Path(run_dir) / KERNEL_LOG, "a") as log:
        started: list = [warm.manager] if warm else []
        outcome: list[tuple[str, str | None]] = []
        loops: list[asyncio.AbstractEventLoop] = []
        manager = private_kernel_manager(sockets, log, started)

        def work() -> None:
            try:
                outcome.append(_papermill(notebook, output, run_dir, plan, manager, warm))
            finally:
                loops.extend(_thread_loop())

        worker = threading.Thread(target=work, name=f"papermill {notebook.name}", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.2)
                stops.raise_if_received()  # one a finalizer swallowed stops it too
        except KeyboardInterrupt:
            with DeferredStops(raise_after=False):  # papermill saves what the notebook made
                kill_kernels(started)
                worker.join(30)
            raise
        finally:
            if warm:
                warm.stop()  # its memory goes before the next notebook measures
            if not worker.is_alive():
                _release(loops, [m for m in started if not warm or m is not warm.manager])
    return outcome[0] if outcome else (rundir.FAILED, "papermill stopped without a result")


def _thread_loop() -> list[asyncio.AbstractEventLoop]:
    """The event loop jupyter made for this thread (papermill's), if it made one."""
    try:
        return [asyncio.get_event_loop()]
    except RuntimeError:
        return []


def _release(loops: list[asyncio.AbstractEventLoop], managers: list) -> None:
    """Close what papermill's thread leaves open once its notebook is done: jupyter's event loop
    for that thread and the zmq context of a kernel manager papermill made. Left to a garbage
    collection, they held 3 and 6 descriptors (and a context's two threads) per notebook."""
    for loop in loops:
        if not loop.is_running():
            loop.close()
    for made in managers:
        if getattr(made, "_created_context", False):
            made.context.destroy(linger=0)


def export_html(run_dir: Path, entry: dict[str, Any],
                manifest: dict[str, Any] | None = None) -> None:
    """Export one executed notebook's HTML beside it (its name from the notebook file, never
    from the record), headed by the run's trust as ``manifest`` (default: the folder's) has it;
    an export failure is recorded, never fatal."""
    folder = RunFolder(run_dir)
    notebook = folder.path / entry["output"] if entry.get("output") else None
    if notebook is None or not notebook.is_file() or notebook.is_symlink():
        entry["html"] = None
        return
    html = folder.html_for(notebook)
    entry["html"] = html.name
    entry.pop("html_error", None)
    try:
        manifest = manifest if manifest is not None else rundir.effective_manifest(run_dir)
        untrusted = trust.run_trust(run_dir, manifest) == trust.NOT_TRUSTWORTHY
        report.export_html(notebook, html, report.page_banner(run_dir, manifest, entry["name"]),
                           untrusted)
    except Exception as exc:
        entry["html"] = None
        entry["html_error"] = error_summary(exc)


def export_pages(recorder: ManifestRecorder) -> None:
    """Export every executed notebook's page once the run has ended (the one export pass), so
    that each carries the run's final trust (a later notebook's busy machine, the verdict's A/A
    checks); its seconds are the entry's ``export_s``; save the record of the pages."""
    for entry in recorder.manifest["notebooks"]:
        if entry.get("output") and (recorder.run_dir / entry["output"]).is_file():
            began = time.perf_counter()
            export_html(recorder.run_dir, entry, recorder.manifest)
            if entry.get("phases"):
                entry["phases"]["export_s"] = round(time.perf_counter() - began, 2)
    recorder.save()


def write_index(recorder: ManifestRecorder) -> None:
    """Rewrite the run's ``index.html``; if that fails the run is recorded ``failed``."""
    try:
        report.write_index(recorder.run_dir)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        recorder.record_failure(f"the run's index could not be written: {reason}")
        raise RecordError(f"{recorder.run_dir / 'index.html'}: cannot be written ({reason}); "
                          "the run stopped") from exc


# A line a sweep writes after each measured cell (:func:`stagelab.measure.sweep.run`), to its
# kernel's own stderr: kernel.log, never the notebook.
SWEEP_LINE = re.compile(r"^[\w +-]+: cell \d+/\d+ ")


# A long cell says it is still running at least this often (seconds), so the terminal is never
# silent for more than 10 s.
HEARTBEAT_S = 9.0


class ProgressLines:
    """While a notebook runs, one terminal line per notebook cell it starts and per sweep cell it
    measures (the lines its kernel writes to ``kernel.log``), each with the seconds since the
    notebook started, and a line "still running" when a cell has said nothing for
    :data:`HEARTBEAT_S`. It reads the executed notebook and the log from outside the kernel, so
    nothing of it lands in the notebook or its HTML."""

    def __init__(self, prefix: str, output: Path, log: Path, enabled: bool,
                 interval_s: float = 0.5) -> None:
        self.prefix, self.output, self.log = prefix, Path(output), Path(log)
        self.enabled, self.interval_s = enabled, interval_s
        self._offset, self._started = 0, time.perf_counter()
        self._cell: int | None = None  # the cell now running, as its index
        self._said = self._started
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cells = 0

    def __enter__(self) -> ProgressLines:
        if self.enabled:
            self._offset = self.log.stat().st_size if self.log.exists() else 0
            self._started = self._said = time.perf_counter()
            self._thread = threading.Thread(target=self._watch, daemon=True,
                                            name=f"progress {self.prefix}")
            self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
            self.poll()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def _say(self, text: str) -> None:
        self._said = time.perf_counter()
        _say(True, f"{self.prefix} {text} ({self._said - self._started:.0f} s)")

    def poll(self) -> None:
        """Print what is new: the notebook cell now running, the sweep cells measured."""
        cell = _last_started_cell(self.output)
        if cell is not None and cell != self._cell:
            self._cell = cell
            self._cells = self._cells or _cell_count(self.output)
            self._say(f"cell {cell + 1}/{self._cells or '?'}")
        for line in self._new_log_lines():
            if SWEEP_LINE.match(line):
                self._say(line)
        if self._cell is not None and time.perf_counter() - self._said >= HEARTBEAT_S:
            self._say(f"cell {self._cell + 1}/{self._cells or '?'} still running")

    def _new_log_lines(self) -> list[str]:
        """The complete lines appended to the log since the last read."""
        try:
            with open(self.log, "rb") as log:
                log.seek(self._offset)
                chunk = log.read()
        except OSError:
            return []
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        return complete.decode("utf-8", "replace").splitlines()


def _cell_count(notebook_path: Path) -> int:
    """How many cells a notebook has (0 where it cannot be read yet)."""
    import nbformat

    try:
        return len(nbformat.read(str(notebook_path), as_version=4).cells)
    except (OSError, ValueError):
        return 0


def _say(enabled: bool, text: str) -> None:
    if enabled:
        with contextlib.suppress(OSError):  # a terminal closed under the run (SIGHUP)
            print(outcomes.printable(text), file=sys.stderr, flush=True)


@contextlib.contextmanager
def phase_marks() -> Iterator[Path]:
    """A private file the next kernel marks its phases in (:mod:`stagelab.core.phases`),
    named to it through the environment it inherits; removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="stagelab-phases-") as folder:
        marks = Path(folder) / "marks.json"
        previous = os.environ.get(phases.PHASES_ENV)
        os.environ[phases.PHASES_ENV] = str(marks)
        try:
            yield marks
        finally:
            if previous is None:
                os.environ.pop(phases.PHASES_ENV, None)
            else:
                os.environ[phases.PHASES_ENV] = previous


def run_notebook_step(recorder: ManifestRecorder, index: int, plan: RunPlan,
                      progress: bool, warm: WarmKernel | None = None) -> None:
    """One notebook, in its ``warm`` kernel where it has one: start its record, execute it,
    record how it ended and where its time went (``phases``; the HTML is exported once, when
    the run ends: :func:`export_pages`)."""
    notebook = plan.notebooks[index]
    count = f"[{index + 1}/{len(plan.notebooks)}]"
    entry = recorder.start_notebook(index)
    _say(progress, f"{count} {notebook.name} ...")
    started, started_at = time.perf_counter(), time.time()
    output = recorder.run_dir / entry["output"]
    marking = contextlib.nullcontext(warm.marks) if warm else phase_marks()
    with marking as marks, busy.LoadWatch() as watch, ProgressLines(
            f"{count} {notebook.name}:", output, recorder.run_dir / KERNEL_LOG, progress):
        status, error = execute_notebook(notebook, output, recorder.run_dir, plan, warm)
        executed_at, kernel_marks = time.time(), phases.read_marks(marks)
    entry["load"] = watch.summary
    measured_on = recorder.manifest.get("measured_on")
    if measured_on and "measured" in notebook.parameters:  # a replay: trust the node's load
        entry.update(analysis_load=watch.summary, load=measured_load(measured_on, notebook.name))
    entry["phases"] = phases.notebook_phases(started_at, executed_at, executed_at,
                                             phases.cell_span(output), kernel_marks)
    recorder.finish_notebook(index, status, time.perf_counter() - started, error)
    write_index(recorder)
    _say(progress, f"{count} {notebook.name}: {status} ({entry['duration_s']} s)"
                   f"{' - ' + error if error else ''}")
    if entry["load"].get("busy"):
        _say(progress, f"{count} warning: the machine was busy: {'; '.join(entry['load']['why'])}")


def start_kernels(recorder: ManifestRecorder, warm: WarmKernels, progress: bool) -> None:
    """Start every notebook's kernel at once, before the first notebook (:mod:`stagelab.run.
    kernels`), and record it as the manifest's ``kernels``."""
    _say(progress, f"kernels: starting {len(warm.notebooks)}, each importing what its notebook "
                   "imports ...")
    warm.start()
    recorder.manifest["kernels"] = warm.record()
    recorder.save()
    failed = "; ".join(f"{name}: {why}" for name, why in warm.record()["errors"].items())
    _say(progress, f"kernels: {warm.record()['ready']} of {len(warm.notebooks)} ready in "
                   f"{warm.seconds:.1f} s" + (f" (starting their own: {failed})" if failed else ""))


def measured_load(measured_on: dict[str, Any], notebook: str) -> dict[str, Any]:
    """The load the measuring node recorded while it measured ``notebook`` (what a replay's
    trust rests on; the analysing host's load says nothing of those timings)."""
    return ((measured_on.get("loads") or {}).get(notebook)
            or busy.unknown("the measurement did not record the node's load"))


def _record(run_dir: Path, plan: RunPlan, command: list[str] | None) -> ManifestRecorder:
    """The record of a run that starts now (its hardware is filled in once the run is going)."""
    recorder = ManifestRecorder(run_dir, rundir.new_manifest(
        run_dir, plan.profile, command if command is not None else list(sys.argv),
        [rundir.notebook_entry(nb.name, nb.parameters) for nb in plan.notebooks], None))
    recorder.manifest.update(cell_timeout_s=plan.cell_timeout_s,
                             start_timeout_s=plan.start_timeout_s)
    return recorder


def _run(recorder: ManifestRecorder, plan: RunPlan, progress: bool,
         measured: dict[str, Any] | None) -> dict[str, Any]:
    """The steps of a run whose record is saved; every way out closes the record."""
    run_dir = recorder.run_dir
    try:
        ensure_kernel()
        here = hardware.snapshot()
        recorder.manifest["hardware"] = measured["hardware"] if measured else here
        if measured:
            recorder.manifest.update(
                measured_on={key: value for key, value in measured.items()
                             if key not in ("hardware", "staged")},
                analysed_on={"host": here["host"]["hostname"], "created_utc": rundir.now_utc(),
                             "hardware": here})
        recorder.save()
        write_index(recorder)
        with open(run_dir / KERNEL_LOG, "a", encoding="utf-8") as log, WarmKernels(
                [(nb.name, nb.path) for nb in plan.notebooks], log, plan.start_timeout_s) as warm:
            start_kernels(recorder, warm, progress)
            for index in range(len(plan.notebooks)):
                stops.raise_if_received()  # a stop a finalizer swallowed ends the run here
                run_notebook_step(recorder, index, plan, progress, warm.get(index))
        stops.raise_if_received()
    except RecordError:
        with contextlib.suppress(OSError):  # show the failure in the index, if there is room
            report.write_index(run_dir)
        raise
    except KeyboardInterrupt as exc:
        return _close_interrupted(recorder, str(exc) or "Ctrl-C")
    except Exception as exc:  # the runner itself broke: say so in the record, then go on up
        recorder.record_failure(f"the runner stopped: {error_summary(exc)}")
        with contextlib.suppress(Exception):  # the pages of the notebooks that ran
            export_pages(recorder)
            write_index(recorder)
        raise
    with DeferredStops(raise_after=False):  # the run is done: a late Ctrl-C changes nothing
        recorder.finish()
        export_pages(recorder)
        write_index(recorder)
    return recorder.manifest


def _close_interrupted(recorder: ManifestRecorder, reason: str) -> dict[str, Any]:
    """Record an interrupted run; a second Ctrl-C (or SIGTERM, SIGHUP) does not abandon it."""
    with DeferredStops(raise_after=False):
        recorder.interrupt(reason)
        recorder.finish()
        export_pages(recorder)
        write_index(recorder)
    return recorder.manifest


def take_in_measured(plan: RunPlan, run_dir: Path, measured: dict[str, Any]) -> None:
    """Move a replay's verified copy of the measured folder (``measured["staged"]``,
    :func:`stagelab.run.replay.replay_plan`) into the run as ``measured/``, and point every
    replayed notebook at it: the notebooks read the bytes that were checked, never the folder
    they came from."""
    staged = Path(measured["staged"])
    record = run_dir / measured_folder.RECORD_COPY
    shutil.move(staged, record)
    staged.parent.rmdir()
    for notebook in plan.notebooks:
        if notebook.parameters.get("measured") == str(staged):
            notebook.parameters["measured"] = str(record)


def _start(plan: RunPlan, make_folder: Callable[[], Path], command: list[str] | None,
           progress: bool, measured: dict[str, Any] | None = None) -> tuple[Path, dict[str, Any]]:
    """Make the folder, take its lock and save the first manifest with stop signals deferred
    (an interrupt then still leaves a listed, ``interrupted`` run), then run."""
    with stops.as_interrupt(stops.SIGNALS):
        with DeferredStops(raise_after=False) as deferred:
            run_dir = make_folder()
            lock = RunFolder(run_dir).hold_lock()
            try:
                if measured:
                    take_in_measured(plan, run_dir, measured)
                recorder = _record(run_dir, plan, command)
                recorder.save()
            except BaseException:
                lock.close()
                raise
        with contextlib.closing(lock):
            _say(progress, f"run folder: {run_dir}")
            if deferred.pending:
                reason = f"signal {signal.Signals(deferred.pending[0]).name}"
                return run_dir, _close_interrupted(recorder, reason)
            return run_dir, _run(recorder, plan, progress, measured)


def execute(plan: RunPlan, run_dir: Path, command: list[str] | None = None,
            progress: bool = True) -> dict[str, Any]:
    """Run the plan's notebooks in order into an existing, empty ``run_dir``; return the final
    manifest.

    The run holds the folder's lock until it ends, so ``stagelab report`` never rewrites a live
    run's record. SIGTERM and SIGHUP stop it as Ctrl-C does. Raises
    :class:`~stagelab.core.rundir.RecordError` when the record itself cannot be written (the
    manifest then says ``failed`` with the cause, if it can still be written at all).
    """
    return _start(plan, lambda: Path(run_dir), command, progress)[1]


def run(plan: RunPlan, root: Path, command: list[str] | None = None,
        progress: bool = True, measured: dict[str, Any] | None = None) -> tuple[Path, dict[str, Any]]:
    """Create a run folder under ``root`` (see :func:`stagelab.core.rundir.new_run_dir`) and run the
    plan into it (see :func:`execute`); return the folder and its final manifest.

    ``measured`` (``stagelab run --from``, :func:`stagelab.run.replay.replay_plan`) says where the
    rows were measured: the manifest's ``hardware`` is then the measuring machine's, beside
    ``measured_on`` and ``analysed_on`` (this machine)."""
    return _start(plan, lambda: rundir.new_run_dir(root, plan.profile), command, progress,
                  measured)


def rebuild_report(run_dir: Path) -> Path:
    """Re-export every executed notebook of a run folder, record the HTML, rewrite the index.

    Refused (UserError) while the run is live: its runner holds the folder's lock and owns its
    record. Under the lock, the manifest is read afresh and only the HTML fields change, so a
    run's final state is never rolled back. A missing or unreadable manifest is first rebuilt
    from the folder's papermill-executed notebooks, with a note.
    """
    folder = RunFolder(run_dir)
    if not folder.path.is_dir():
        raise UserError(f"{folder.path}: no such folder")
    if not folder.manifest_path.exists():  # no runner ever held this folder: nothing to lock
        return _rewrite_report(folder)
    with folder.locked():
        return _rewrite_report(folder)


def _rewrite_report(folder: RunFolder) -> Path:
    manifest = rundir.load_or_rebuild_manifest(folder.path)
    if (manifest["status"] == rundir.RUNNING and manifest.get("host") == socket.gethostname()
            and rundir.process_alive(manifest)):  # from another host, the lock decides
        raise UserError(f"{folder.path}: the run is still running (pid {manifest.get('pid')} "
                        f"on {manifest.get('host')}); its runner writes its report")
    for entry in manifest["notebooks"]:
        export_html(folder.path, entry, manifest)
    rundir.write_manifest(folder.path, manifest)
    return report.write_index(folder.path)
