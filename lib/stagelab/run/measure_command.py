"""``stagelab measure``: the timing loops of a profile on a node with Python and torch alone.

A GPU node is lent for minutes, offline, with its own Python and torch and no notebook stack;
only one output folder comes back. This command runs every measuring experiment of a profile
there (the hardware snapshot, copy staging, the step A/B, prompt logprobs) through the very
functions the notebooks call, with the same parameters and checks, and writes one folder::

    measured.json      the manifest: profile, resolved parameters, commit, versions, times, and
                       the status of each experiment and each cell (predicted_s, measured_s)
    hardware.json      the snapshot notebook 00 shows
    preflight.json     the preflight's checks (a no-go stops here, exit 3, unless --force;
                       no CUDA or no pinned copy stops here whatever the flags, unless
                       --rehearse-on-cpu, recorded)
    inventory.json     installed distributions, compilers, ``nvidia-smi -q``
    rows/<table>.jsonl.gz  the schema rows of each experiment, one gzip member per cell,
                       appended and flushed after every cell; never larger than a lease returns

Back where the notebook stack lives, ``stagelab run --profile P --from DIR`` analyses it; the
folder's layout, manifest, reading and checks are :mod:`stagelab.core.measured`, what
``--estimate`` prints is :mod:`stagelab.measure.forecast`. It imports torch and the standard
library only (numpy and nvidia-ml-py where importable), so it runs from a plain checkout:
``PYTHONPATH=lib python3 -m stagelab measure --profile gate --out DIR``.

Exit status: 0 everything measured; 1 partial (a failed cell or experiment, or stopped at the
deadline), nothing measured (every cell skipped or unavailable: ``unmeasured``) or the deadline
passed (``deadline_passed_by_s``: a cell ran longer than predicted);
2 a bad request (one line, nothing created); 3 preflight no-go without --force, or a no-go that
makes the profile's decisive arms impossible (no CUDA, no pinned copy) without
--rehearse-on-cpu; 130 interrupted (what was measured is kept).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stagelab.core import outcomes, paths, records, rundir, stops
from stagelab.core.errors import DeadlineReached, RowsFileFull, UserError
from stagelab.core.measured import (
    LEASE_MAX_FILE_BYTES,
    MANIFEST,
    ROWS_DIR,
    SNAPSHOT_NOTEBOOK,
    UNMEASURED,
    MeasuredFolder,
    Recorder,
    measurement_manifest,
    return_problems,
    spare_files,
)
from stagelab.core.outcomes import (
    DEADLINE,
    EXIT_INTERRUPTED,
    EXIT_NO_GO,
    EXIT_OK,
    EXIT_USAGE,
    FAILED,
    INTERRUPTED,
    NO_GO,
    OK,
    PENDING,
    RUNNING,
)
from stagelab.core.schema import GzipJsonLinesSink
from stagelab.measure import busy, estimate, forecast
from stagelab.measure import inventory as node_inventory
from stagelab.measure.forecast import admission_seconds, cell_predictor, sweep_cells
from stagelab.run import profiles

EXIT_PARTIAL = outcomes.EXIT_FAILED
__all__ = ["DEADLINE", "EXIT_INTERRUPTED", "EXIT_NO_GO", "EXIT_OK", "EXIT_USAGE", "FAILED",
           "INTERRUPTED", "NO_GO", "OK", "PENDING", "RUNNING"]  # kept here for callers
MIN_TORCH = (2, 4)


# ------------------------------------------------------------------------------- the request

@dataclass
class Request:
    """A checked ``stagelab measure`` request: the measuring notebooks with their resolved
    parameters (the notebook's defaults under the profile's values and ``--param``)."""

    profile: str
    notebooks: dict[str, dict[str, Any]]
    all_parameters: dict[str, dict[str, Any]]
    out: Path  # checked by check_out: absent or an empty folder
    deadline_s: float | None = None
    force: bool = False
    command: list[str] = field(default_factory=list)
    rehearse: bool = False
    decides: bool = False  # the profile decides: a node without its decisive arms refuses it


DESCRIPTION = ("Measure a profile's experiments with torch alone into one folder (measured.json, "
               "hardware.json, preflight.json, inventory.json, rows/*.jsonl.gz); analyse it "
               "elsewhere with `stagelab run --profile P --from DIR`.")
EPILOG = ("Exit status: 0 everything measured, 1 partial (a failed cell or experiment, or stopped "
          "at the deadline), nothing measured or the deadline passed, 2 a bad request, 3 "
          "preflight no-go without --force (no CUDA or no pinned copy: without "
          "--rehearse-on-cpu, whatever the flags), 130 interrupted.")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``stagelab measure`` (here and in the ``stagelab`` command's parser)."""
    parser.add_argument("--profile", default="smoke",
                        help="a profile of profiles.json (smoke, quick, gate, full)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NOTEBOOK",
                        help="measure only these notebooks of the profile")
    parser.add_argument("--param", action="append", default=[], metavar="NOTEBOOK.KEY=VALUE",
                        help="override a notebook parameter; VALUE is JSON, bare words are text")
    parser.add_argument("--out", type=paths.given, help="the folder to create (absent or empty)")
    parser.add_argument("--deadline-s", type=float, default=None, metavar="S",
                        help="stop at the first cell whose predicted end passes S seconds after "
                             "the start; its status is `deadline`, everything measured is kept")
    parser.add_argument("--force", action="store_true",
                        help="measure even when the preflight says no-go (recorded); never past "
                             "no CUDA or no pinned copy, which make the decisive arms impossible")
    parser.add_argument("--rehearse-on-cpu", action="store_true",
                        help="rehearse the lease where the decisive arms cannot run (no CUDA, "
                             "no pinned copy): measure what can run, recorded as a rehearsal "
                             "that `keep` refuses unless forced")
    parser.add_argument("--estimate", choices=sorted(estimate.BASIS), default=None,
                        help="print each cell's predicted seconds on a cpu or cuda machine and "
                             "the total; measures and creates nothing")
    return parser


def _parser() -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(prog="stagelab measure",
                                                 description=DESCRIPTION, epilog=EPILOG))


def check_out(out: Path | None) -> Path:
    """The folder to create: absent, or an empty folder. UserError before anything is made."""
    if out is None:
        raise UserError("--out is required: the folder the measurements go to")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty folder; measurements are "
                        "never mixed: name a new folder")
    existing = next((p for p in [out.parent, *out.parent.parents] if p.exists()), Path("/"))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: {existing} is not writable")
    return out


def check_torch() -> None:
    """UserError, in one line, when torch cannot be imported or is older than the floor needs;
    checked before anything is created."""
    try:
        from stagelab.measure.device import torch_version  # the measuring floor: torch itself
    except Exception as exc:  # torch absent, or a broken install that fails while importing
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"torch cannot be imported ({reason}); stagelab measure needs torch "
                        f">= {'.'.join(map(str, MIN_TORCH))}") from exc
    version = torch_version()
    if tuple(int(part) for part in re.findall(r"\d+", version)[:2]) < MIN_TORCH:
        raise UserError(f"torch {version}: stagelab measure needs torch >= "
                        f"{'.'.join(map(str, MIN_TORCH))}")


def checked_request(args: argparse.Namespace, command: list[str]) -> Request | None:
    """The checked request of parsed options, or None after ``--estimate`` printed its table."""
    check_torch()
    measuring, every = profiles.resolve_measuring(args.profile, args.only, args.param)
    if args.deadline_s is not None and not 0 < args.deadline_s < math.inf:
        raise UserError(f"--deadline-s {args.deadline_s}: give a positive, finite number of "
                        "seconds")
    if args.estimate:
        predicted = forecast.predict_profile(measuring, args.estimate)
        print(forecast.format_estimate(predicted, args.estimate))
        print(*forecast.round_cap_lines(measuring, args.estimate), sep="\n", end="")
        if args.deadline_s is not None:
            print(forecast.format_admission(predicted, args.deadline_s, args.estimate))
            print(forecast.format_margin(predicted, args.deadline_s, args.estimate))
        print(forecast.format_file_sizes(forecast.predict_file_bytes(measuring)))
        return None
    return Request(args.profile, measuring, every, check_out(args.out), args.deadline_s,
                   args.force, command, args.rehearse_on_cpu,
                   profiles.profile_decides(args.profile))


def file_budget(spare: int) -> Callable[[], bool]:
    """``another()``: True (and one fewer left) while one of ``spare`` files is left."""
    left = [spare]

    def another() -> bool:
        if left[0] <= 0:
            return False
        left[0] -= 1
        return True
    return another


# ------------------------------------------------------------------------------- measuring


class CellClock:
    """The sweep watcher of one experiment: predicts each cell, refuses one that would pass the
    deadline, records predicted and measured seconds in the manifest after every cell.

    Predictions are scaled by how the cells measured so far compared with theirs, so a machine
    slower or faster than the basis is judged by what it did, and never taken below
    :data:`stagelab.measure.forecast.DEADLINE_SAFETY` times the prediction
    (:func:`stagelab.measure.forecast.admission_seconds`).
    """

    def __init__(self, recorder: Recorder, entry: dict[str, Any],
                 predict: Callable[[Any, int, int], float], deadline: float | None) -> None:
        self.recorder, self.entry, self.predict, self.deadline = (
            recorder, entry, predict, deadline)
        self.predicted = 0.0

    def scale(self) -> float:
        done = [c for e in self.recorder.manifest["experiments"] for c in e["cells"]
                if c["status"] != DEADLINE and c["predicted_s"] > 0]
        predicted = sum(c["predicted_s"] for c in done)
        return sum(c["measured_s"] for c in done) / predicted if predicted else 1.0

    def admit(self, label: str, cell: Any, rounds: int, warmup: int) -> bool:
        stops.raise_if_received()
        self.predicted = self.predict(cell, rounds, warmup)
        if self.deadline is None:
            return True
        expected = admission_seconds(self.predicted, self.scale())
        if time.monotonic() + expected <= self.deadline:
            return True
        left = max(0.0, self.deadline - time.monotonic())
        self.entry["cells"].append({
            "cell": cell.label, "status": DEADLINE, "predicted_s": round(self.predicted, 3),
            "measured_s": None, "outcome": f"not started: expected {expected:.1f} s, "
                                          f"{left:.1f} s left before the deadline"})
        self.recorder.save()
        return False

    def after_round(self) -> None:
        stops.raise_if_received()

    def finished(self, label: str, cell: Any, seconds: float, records: list[dict]) -> None:
        from stagelab.measure import sweep

        failed = any(r.get("status") == FAILED for r in records)
        self.entry["cells"].append({
            "cell": cell.label, "status": FAILED if failed else OK,
            "predicted_s": round(self.predicted, 3), "measured_s": round(seconds, 3),
            "rows": len(records), "outcome": sweep.outcome(records)})
        self.recorder.save()


def run_experiment(notebook: str, p: Mapping[str, Any], sink: GzipJsonLinesSink) -> None:
    """One measuring notebook's sweep, called exactly as the notebook calls it."""
    forecast.bound_experiment(notebook).measure(p, sink)


def _say(text: str) -> None:
    print(f"measure: {outcomes.printable(text)}", file=sys.stderr, flush=True)


def measure_tables(recorder: Recorder, request: Request, device: str,
                   deadline: float | None) -> None:
    """Every table experiment in order; a deadline stops them all, a failure only its own."""
    from stagelab.measure import sweep

    kind = estimate.device_kind(device)
    stopped = False
    another_file = file_budget(spare_files(recorder.manifest))
    for entry in recorder.manifest["experiments"]:
        notebook = entry["notebook"]
        if entry["table"] is None:
            continue
        if stopped:
            entry.update(status=DEADLINE, error="not started: the deadline came first")
            continue
        parameters = request.notebooks[notebook]
        predict = cell_predictor(notebook, parameters, kind)
        cells = sweep_cells(notebook, parameters, device)
        entry.update(status=RUNNING, started_utc=rundir.now_utc(), cells_planned=len(cells),
                     predicted_s=round(sum(predict(c, parameters["rounds"],
                                                   parameters["warmup"]) for c in cells), 1))
        recorder.save()
        _say(f"{notebook}: {len(cells)} cells, predicted {entry['predicted_s']} s")
        sink = GzipJsonLinesSink(recorder.out / entry["rows"], LEASE_MAX_FILE_BYTES,
                                 another_file, run_id=recorder.out.name, notebook=notebook)
        started = time.perf_counter()
        with busy.LoadWatch() as watch:  # the node's own load: replays judge trust from it
            try:
                with sweep.watching(CellClock(recorder, entry, predict, deadline)):
                    run_experiment(notebook, parameters, sink)
                failed = any(c["status"] == FAILED for c in entry["cells"])
                entry["status"] = FAILED if failed else OK
                if failed:
                    entry["error"] = "a cell has failed rows (see its outcome)"
            except DeadlineReached as exc:
                entry.update(status=DEADLINE, error=str(exc))
                stopped = True
            except RowsFileFull as exc:  # its cells so far are whole; the lease returns them
                entry.update(status=FAILED, error=f"stopped before a cell that would not come "
                                                  f"back: {exc}")
            except KeyboardInterrupt:
                entry.update(status=INTERRUPTED, error="interrupted",
                             measured_s=round(time.perf_counter() - started, 2))
                raise
            except Exception as exc:  # one broken experiment must not cost the others
                from stagelab.measure.bench import first_line

                entry.update(status=FAILED, error=first_line(exc))
        entry.update(measured_s=round(time.perf_counter() - started, 2),
                     finished_utc=rundir.now_utc(), load=watch.summary)
        recorder.save()
        _say(f"{notebook}: {entry['status']} after {entry['measured_s']} s")


def take_snapshot(recorder: Recorder, request: Request) -> dict[str, Any]:
    """The hardware snapshot (as notebook 00 takes it) into ``hardware.json``."""
    from stagelab.measure import device, hardware

    under_load = bool(request.notebooks.get(SNAPSHOT_NOTEBOOK, {}).get("under_load"))
    snap = hardware.snapshot(under_load=under_load and device.cuda_present())
    records.write_json_atomic(recorder.out / "hardware.json", snap)
    gpu = snap.get("gpu") or {}
    recorder.manifest.update(device=device.device_label(device.default_device()),
                             gpu=gpu.get("name"), versions=node_inventory.versions(snap))
    if SNAPSHOT_NOTEBOOK in request.notebooks:
        recorder.experiment(SNAPSHOT_NOTEBOOK).update(status=OK)
    return snap


def run_preflight(recorder: Recorder, request: Request) -> tuple[list[str], list[str]]:
    """The preflight's checks into ``preflight.json``; the blocking reasons, and those of
    them that make the profile's decisive arms impossible (no CUDA, no pinned copy)."""
    from stagelab.measure import preflight

    started = time.perf_counter()
    checks = preflight.run_checks(request.all_parameters)
    preflight.write_report(recorder.out / "preflight.json", request.profile, checks,
                           time.perf_counter() - started)
    blocking = preflight.blocking_reasons(checks)
    decisive = preflight.decisive_reasons(checks)
    recorder.manifest["preflight"] = {"decision": NO_GO if blocking else "go",
                                      "blocking": blocking, "decisive": decisive}
    return blocking, decisive


def refused_no_go(request: Request, blocking: list[str], decisive: list[str]) -> str | None:
    """Why a no-go stops the measurement (None when it goes on). A decisive no-go (no CUDA, no
    pinned copy) passes only with ``--rehearse-on-cpu`` for a profile that decides, whatever
    ``--force`` says, and with either flag for one that does not; any other passes with
    ``--force``."""
    if decisive and not request.rehearse and (request.decides or not request.force):
        if request.decides:
            return ("preflight no-go: the profile's decisive arms cannot run here (no CUDA or "
                    "no pinned copy): nothing measured (exit 3), --force does not pass this; "
                    "--rehearse-on-cpu measures a rehearsal, recorded, never evidence")
        return ("preflight no-go: no CUDA or no pinned copy here: nothing measured (exit 3); "
                "--rehearse-on-cpu (or --force) measures what this machine can")
    if set(blocking) - set(decisive) and not request.force:
        return "preflight no-go: nothing measured (exit 3); --force measures anyway"
    return None


def overall_status(manifest: Mapping[str, Any]) -> str:
    """``ok`` when every experiment is, else the first of interrupted, deadline, failed found."""
    statuses = {e["status"] for e in manifest["experiments"]}
    for status in (INTERRUPTED, DEADLINE, FAILED):
        if status in statuses:
            return status
    return OK


def row_counts(out: Path, manifest: Mapping[str, Any]) -> dict[str, int]:
    """The measured rows per status, over every table the measurement wrote."""
    counts: dict[str, int] = {}
    for entry in manifest["experiments"]:
        if entry["table"] is None:
            continue
        try:
            rows = MeasuredFolder(out).table_rows(entry["table"])
        except FileNotFoundError:
            continue
        for row in rows:
            counts[str(row.get("status"))] = counts.get(str(row.get("status")), 0) + 1
    return counts


def _unless_nothing_measured(recorder: Recorder, status: str) -> str:
    """``status``, or ``unmeasured`` where cells ran and no table holds an ok row (every cell
    skipped or unavailable): exit 1, as ``stagelab run`` does."""
    cells = [c for e in recorder.manifest["experiments"] if e["table"] is not None
             for c in e["cells"] if c["status"] in (OK, FAILED)]
    counts = row_counts(recorder.out, recorder.manifest)
    recorder.manifest["measured"] = counts
    if status == OK and cells and not counts.get(OK):
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no rows"
        _say(f"nothing measured ({detail}): every cell was skipped or unavailable here (exit 1)")
        return UNMEASURED
    return status


def _record_failed(recorder: Recorder, exc: OSError) -> str:
    """Mark what was running or pending ``failed`` with the write error; ``failed``."""
    reason = f"the record could not be written: {exc.filename or recorder.out}: " \
             f"{exc.strerror or exc}"
    for entry in recorder.manifest["experiments"]:
        if entry["status"] in (RUNNING, PENDING):
            entry.update(status=FAILED, error=reason)
    recorder.manifest["error"] = reason
    _say(reason)
    return FAILED


def measure(request: Request) -> int:
    """Measure a checked request into ``request.out``; the exit status."""
    started = time.monotonic()
    deadline = started + request.deadline_s if request.deadline_s else None
    os.environ[paths.HEADLESS_ENV] = "1"  # progress as one plain line per cell, never bars
    out = request.out
    try:  # os.access can say yes where mkdir fails (root, a read-only mount, /proc, /sys)
        out.mkdir(parents=True, exist_ok=True)
        (out / ROWS_DIR).mkdir()
    except OSError as exc:
        raise UserError(f"--out {out}: cannot be created ({exc.strerror or exc})") from exc
    recorder = Recorder(out, measurement_manifest(request, out))
    recorder.save()
    with stops.as_interrupt(stops.SIGNALS):  # the manifest says interrupted, cells kept
        try:
            _say(f"into {out}")
            take_snapshot(recorder, request)
            records.write_json_atomic(out / "inventory.json", node_inventory.inventory())
            blocking, decisive = run_preflight(recorder, request)
            for reason in blocking:
                _say(f"preflight blocking: {reason}")
            refused = refused_no_go(request, blocking, decisive)
            if refused:
                recorder.manifest.update(status=NO_GO, finished_utc=rundir.now_utc())
                recorder.save()
                _say(refused)
                return EXIT_NO_GO
            recorder.save()
            from stagelab.measure.device import default_device

            measure_tables(recorder, request, default_device(), deadline)
            stops.raise_if_received()  # one swallowed in the last round: recorded interrupted
            status = overall_status(recorder.manifest)
            status = _unless_nothing_measured(recorder, status)
        except KeyboardInterrupt as exc:
            for entry in recorder.manifest["experiments"]:
                if entry["status"] in (RUNNING, PENDING):
                    entry.update(status=INTERRUPTED, error=f"interrupted ({exc or 'Ctrl-C'})")
            status = INTERRUPTED
        except OSError as exc:  # the record itself could not be written (a full disk)
            status = _record_failed(recorder, exc)
    ended = time.monotonic()
    overrun = round(ended - deadline, 2) if deadline is not None and ended > deadline else None
    recorder.manifest.update(status=status, finished_utc=rundir.now_utc(),
                             elapsed_s=round(ended - started, 2), deadline_passed_by_s=overrun)
    try:
        recorder.save()
    except OSError as exc:
        _say(f"{status}, and the record could not be closed: {out / MANIFEST}: "
             f"{exc.strerror or exc} (a replay reads it as interrupted; exit 1)")
        return EXIT_INTERRUPTED if status == INTERRUPTED else EXIT_PARTIAL
    for problem in return_problems(out):
        _say(f"a lease would not return this: {problem}")
    _say(f"{status} after {recorder.manifest['elapsed_s']} s: {out}")
    if overrun is not None:  # a cell ran longer than predicted: the lease's bound was not kept
        _say(f"the deadline was passed by {overrun} s (exit 1); the cells are kept")
    exit_status = {OK: EXIT_OK, INTERRUPTED: EXIT_INTERRUPTED}.get(status, EXIT_PARTIAL)
    return EXIT_PARTIAL if overrun is not None and exit_status == EXIT_OK else exit_status


def main(argv: list[str] | None = None) -> int:
    """``stagelab measure ARGS``; returns the exit status (a bad request: one line, 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        request = checked_request(_parser().parse_args(argv), ["stagelab", "measure", *argv])
        return EXIT_OK if request is None else measure(request)
    try:
        with outcomes.escaped_output():  # every printed line, escaped
            return outcomes.one_line_errors("stagelab measure", body)
    except SystemExit as exc:  # argparse: --help (0) or a malformed command line (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


