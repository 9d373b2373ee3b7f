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

Back where the notebook stack lives, ``stagelab run --profile P --from DIR`` analyses it
(:func:`read_measured`, :func:`measured_rows`). It imports torch and the standard library only
(numpy and nvidia-ml-py where importable), so it runs from a plain checkout:
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
import gzip
import importlib.util
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from stagelab.core import catalogue, outcomes, paths, provenance, records, rundir, stops, untrusted
from stagelab.core.errors import DeadlineReached, RowsFileFull, SchemaError, UserError
from stagelab.core.measured import (
    LEASE_MAX_FILE_BYTES,
    LEASE_MAX_FILES,
    LEASE_MAX_FOLDERS_BELOW_OUT,
    MANIFEST,
    PLAIN_ROWS_SUFFIX,
    ROWS_DIR,
    ROWS_SUFFIX,
    rows_names,
    rows_path,
    table_rows,
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
from stagelab.measure import busy, estimate, experiments
from stagelab.run import profiles

FORMAT, VERSION = "stagelab-measured", 1
EXIT_PARTIAL = outcomes.EXIT_FAILED
__all__ = ["DEADLINE", "EXIT_INTERRUPTED", "EXIT_NO_GO", "EXIT_OK", "EXIT_USAGE", "FAILED",
           "INTERRUPTED", "NO_GO", "OK", "PENDING", "RUNNING"]  # kept here for callers
SNAPSHOT_NOTEBOOK = catalogue.ENVIRONMENT_NOTEBOOK
# The measuring notebooks with a table, and the table each writes (the replay reads these).
TABLES = {e.notebook: e.table for e in experiments.EXPERIMENTS.values()}
UNMEASURED = "unmeasured"  # every experiment ran, no table holds an ok row (all skipped)
MEASURING = (SNAPSHOT_NOTEBOOK, *TABLES)
# Before the first cell: imports, the native build on a fresh node, the preflight's probes.
FIXED_S = {"cpu": 15.0, "cuda": 20.0}
MIN_TORCH = (2, 4)
COMPILERS = ("c++", "g++", "clang++", "gcc", "cc", "nvcc")


# ------------------------------------------------------------------------------- the request

@dataclass
class Request:
    """A checked ``stagelab measure`` request: the measuring notebooks with their resolved
    parameters (the notebook's defaults under the profile's values and ``--param``)."""

    profile: str
    notebooks: dict[str, dict[str, Any]]
    all_parameters: dict[str, dict[str, Any]]
    out: Path | None
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
    parser.add_argument("--out", type=Path, help="the folder to create (absent or empty)")
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


def resolve(profile: str, only: list[str], overrides: list[str]) -> tuple[
        dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The measuring notebooks' resolved parameters, and every notebook's (the preflight sizes
    its memory check from them); UserError for anything the run would refuse."""
    plan = profiles.plan_run(profile, only, profiles.parse_overrides(overrides))
    every = {}
    for notebook in plan.notebooks:
        declared = profiles.notebook_parameters(notebook.path)
        every[notebook.name] = {key: value for key, value in
                                {**declared, **notebook.parameters}.items()
                                if key not in profiles.INJECTED}
    measuring = {name: values for name, values in every.items() if name in MEASURING}
    if not measuring:
        raise UserError(f"profile {profile!r}{' with --only' if only else ''} has no measuring "
                        f"notebook; measuring notebooks: {', '.join(MEASURING)}")
    return measuring, every


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
    measuring, every = resolve(args.profile, args.only, args.param)
    if args.deadline_s is not None and not 0 < args.deadline_s < math.inf:
        raise UserError(f"--deadline-s {args.deadline_s}: give a positive, finite number of "
                        "seconds")
    if args.estimate:
        predicted = predict_profile(measuring, args.estimate)
        print(format_estimate(predicted, args.estimate))
        print(*round_cap_lines(measuring, args.estimate), sep="\n", end="")
        if args.deadline_s is not None:
            print(format_admission(predicted, args.deadline_s, args.estimate))
        print(format_file_sizes(predict_file_bytes(measuring)))
        return None
    return Request(args.profile, measuring, every, check_out(args.out), args.deadline_s,
                   args.force, command, args.rehearse_on_cpu,
                   profiles.profile_decides(args.profile))


# ------------------------------------------------------------------------------ predictions

def sweep_cells(notebook: str, parameters: Mapping[str, Any], device: str) -> list[Any]:
    """The sweep cells a measuring notebook will measure (none for the snapshot)."""
    return experiments.notebook_cells(notebook, parameters, device)


def cell_predictor(notebook: str, parameters: Mapping[str, Any],
                   kind: str) -> Callable[[Any, int, int], float]:
    """``predict(cell, rounds, warmup)``: seconds by :func:`stagelab.measure.estimate.cell_seconds`."""
    return _bound(notebook).predictor(parameters, kind)


def _bound(notebook: str) -> experiments.Experiment:
    experiment = experiments.of_notebook(notebook)
    if experiment is None:
        raise ValueError(f"{notebook} is not a measuring notebook with a table")
    return experiment


def predict_profile(notebooks: Mapping[str, Mapping[str, Any]],
                    kind: str) -> list[tuple[str, str, float]]:
    """``(notebook, cell, seconds)`` for every cell the notebooks would measure."""
    rows = []
    for name, parameters in notebooks.items():
        cells = sweep_cells(name, parameters, "cpu")  # sizes only: any machine can tell
        if not cells:  # the snapshot: nothing to predict
            continue
        predict = cell_predictor(name, parameters, kind)
        for cell in cells:
            rows.append((name, cell.label, predict(cell, parameters["rounds"],
                                                   parameters["warmup"])))
    return rows


def round_cap_lines(notebooks: Mapping[str, Mapping[str, Any]], kind: str) -> list[str]:
    """A line, newline-ended, per notebook whose cells run rounds until resolved: their floor
    and cap, and the seconds at each (:func:`stagelab.measure.estimate.format_round_cap`)."""
    lines = []
    for name, parameters in notebooks.items():
        bound = experiments.of_notebook(name)
        if bound is None or bound.max_rounds(parameters) is None:
            continue
        cells = [c for c in sweep_cells(name, parameters, "cpu") if not c.invalid]
        at_floor = bound.predictor({**parameters, "max_rounds": parameters["rounds"]}, kind)
        at_cap = bound.predictor(parameters, kind)
        lines.append(estimate.format_round_cap(
            name, rounds=parameters["rounds"], max_rounds=parameters["max_rounds"],
            max_seconds=parameters.get("max_seconds", math.inf), cells=len(cells),
            floor_s=sum(at_floor(c, parameters["rounds"], parameters["warmup"]) for c in cells),
            cap_s=sum(at_cap(c, parameters["rounds"], parameters["warmup"]) for c in cells))
            + "\n")
    return lines


def format_estimate(rows: list[tuple[str, str, float]], kind: str) -> str:
    """The ``--estimate`` table: each cell, each notebook's sum, and the total."""
    lines = [f"{'notebook':20} {'cell':44} {'predicted_s':>11}"]
    lines += [f"{name:20} {label:44} {seconds:11.1f}" for name, label, seconds in rows]
    total = sum(seconds for _, _, seconds in rows)
    lines.append(f"{'before the first cell':65} {FIXED_S[kind]:11.1f}")
    lines.append(f"{'total on ' + kind:65} {total + FIXED_S[kind]:11.1f}")
    return "\n".join(lines)


def admitted_cells(rows: list[tuple[str, str, float]], deadline_s: float,
                   kind: str) -> list[bool]:
    """Whether each cell would be started before a deadline ``deadline_s`` seconds after the
    start, were every cell to take exactly its prediction: the admission's own rule
    (:func:`admission_seconds`, its safety multiple included), so a lease's deadline can be
    checked against its profile before the lease."""
    clock, admitted = FIXED_S[kind], []
    for _, _, seconds in rows:
        admitted.append(clock + admission_seconds(seconds, 1.0) <= deadline_s)
        clock += seconds if admitted[-1] else 0.0
    return admitted


def format_admission(rows: list[tuple[str, str, float]], deadline_s: float, kind: str) -> str:
    """One line: how many cells a deadline admits on this estimate, and the first it refuses."""
    admitted = admitted_cells(rows, deadline_s, kind)
    refused = [f"{name} {label}" for (name, label, _), ok in zip(rows, admitted) if not ok]
    if not refused:
        return (f"--deadline-s {deadline_s:g}: every cell is started on this estimate "
                f"({len(rows)} cells, each admitted with {DEADLINE_SAFETY:g}x its prediction)")
    return (f"--deadline-s {deadline_s:g}: {len(refused)} of {len(rows)} cells would not be "
            f"started on this estimate (each needs {DEADLINE_SAFETY:g}x its prediction left), "
            f"the first {refused[0]}")


def predict_file_bytes(notebooks: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """The most bytes each rows file will hold (every cell at its round cap), compressed as
    written: what ``--estimate`` prints beside the lease's 16 MiB per file."""
    sizes = {}
    for name, parameters in notebooks.items():
        if name not in TABLES:
            continue
        rounds = _bound(name).max_rounds(parameters) or parameters["rounds"]
        rows = sum(estimate.cell_rows(cell.sizes["experiment"], cell.arms, rounds)
                   for cell in sweep_cells(name, parameters, "cpu") if not cell.invalid)
        sizes[rows_file(TABLES[name])] = rows * estimate.ROW_BYTES["gzip"]
    return sizes


def format_file_sizes(sizes: Mapping[str, int]) -> str:
    """The ``--estimate`` lines of predicted bytes per rows file, against the lease's limit."""
    lines = [f"{'file':65} {'at most bytes':>13}"]
    lines += [f"{path:65} {size:13d}{_files_needed(size)}" for path, size in sizes.items()]
    files = len(RECORD_FILES) + sum(-(-size // LEASE_MAX_FILE_BYTES) or 1
                                    for size in sizes.values())
    lines.append(f"{'a lease returns per file at most':65} {LEASE_MAX_FILE_BYTES:13d}")
    lines.append(f"files at most: {files} of the {LEASE_MAX_FILES} a lease returns"
                 f"{'' if files <= LEASE_MAX_FILES else ': the last cells would stop'}")
    return "\n".join(lines)


def _files_needed(size: int) -> str:
    files = -(-size // LEASE_MAX_FILE_BYTES)
    return f"  (in {files} files: rolls over at {LEASE_MAX_FILE_BYTES} B)" if files > 1 else ""


def rows_file(table: str) -> str:
    """Where a table's rows are written, relative to the measured folder."""
    return f"{ROWS_DIR}/{table}{ROWS_SUFFIX}"


def spare_files(manifest: Mapping[str, Any]) -> int:
    """How many files a measurement may add, beyond its record and one rows file per table,
    and still be returned whole: what a rows file may roll over into."""
    tables = sum(1 for e in manifest["experiments"] if e["table"])
    return max(0, LEASE_MAX_FILES - len(RECORD_FILES) - tables)


def file_budget(spare: int) -> Callable[[], bool]:
    """``another()``: True (and one fewer left) while one of ``spare`` files is left."""
    left = [spare]

    def another() -> bool:
        if left[0] <= 0:
            return False
        left[0] -= 1
        return True
    return another


def return_problems(out: Path | str) -> list[str]:
    """What a lease would not return of the measured folder ``out`` (more than 8 files, a file
    over 16 MiB, a file too deep, a link), in words; empty when everything comes back."""
    out = Path(out)
    found = sorted(p for p in out.rglob("*") if not p.is_dir() or p.is_symlink())
    problems = [f"{len(found)} files, more than the {LEASE_MAX_FILES} a lease returns"
                ] if len(found) > LEASE_MAX_FILES else []
    for path in found:
        name = path.relative_to(out).as_posix()
        if path.is_symlink() or not path.is_file():
            problems.append(f"{name}: not a plain file")
        elif path.stat().st_size > LEASE_MAX_FILE_BYTES:
            problems.append(f"{name}: {path.stat().st_size} B, over {LEASE_MAX_FILE_BYTES} B")
        if len(path.relative_to(out).parts) - 1 > LEASE_MAX_FOLDERS_BELOW_OUT:
            problems.append(f"{name}: deeper than a lease returns")
    return problems


# ------------------------------------------------------------------------------- the record

class Recorder:
    """The one writer of ``measured.json``: every change is saved atomically at once."""

    def __init__(self, out: Path, manifest: dict[str, Any]) -> None:
        self.out, self.manifest = out, manifest

    def save(self) -> None:
        records.write_json_atomic(self.out / MANIFEST, self.manifest)

    def experiment(self, notebook: str) -> dict[str, Any]:
        return next(e for e in self.manifest["experiments"] if e["notebook"] == notebook)


def versions(snap: Mapping[str, Any]) -> dict[str, Any]:
    """Python, torch, CUDA, driver, and the optional extras' versions."""
    found = {}
    for name, module in (("numpy", "numpy"), ("nvidia-ml-py", "pynvml")):
        try:  # installed is not enough: None where this Python cannot import it
            found[name] = metadata.version(name) if importlib.util.find_spec(module) else None
        except (metadata.PackageNotFoundError, ImportError, ValueError):
            found[name] = None
    return {"python": platform.python_version(), "torch": snap["torch"]["torch"],
            "cuda": snap["torch"]["cuda_build"],
            "driver": (snap.get("nvml") or {}).get("driver"), **found}


def new_manifest(request: Request, out: Path) -> dict[str, Any]:
    """The manifest of a measurement that starts now: every experiment pending."""
    experiments = []
    for name, parameters in request.notebooks.items():
        table = TABLES.get(name)
        experiments.append({
            "notebook": name, "table": table, "parameters": parameters, "status": PENDING,
            "rows": rows_file(table) if table else None,
            "file": None if table else "hardware.json", "error": None,
            "cells_planned": None, "predicted_s": None, "measured_s": None, "cells": []})
    return {
        "format": FORMAT, "version": VERSION, "measured_id": f"{out.name}-{uuid.uuid4().hex[:12]}",
        "profile": request.profile, "command": request.command, "status": RUNNING,
        "created_utc": rundir.now_utc(), "finished_utc": None, "host": socket.gethostname(),
        "pid": os.getpid(), "device": None, "gpu": None, "versions": None,
        "git": commit_state(), "source": provenance.source_record(),
        "deadline_s": request.deadline_s, "forced": request.force,
        "rehearsal": request.rehearse, "preflight": None, "experiments": experiments,
    }


def commit_state() -> dict[str, Any]:
    """The commit of the checkout (git), else the one named in ``STAGELAB_COMMIT`` (a lease
    copies the tree without ``.git``; the source's tree id is recorded beside it)."""
    state = rundir.git_state()
    if state["commit"] is None and os.environ.get(provenance.COMMIT_ENV):
        return {"commit": os.environ[provenance.COMMIT_ENV], "dirty": None,
                "from": provenance.COMMIT_ENV}
    return state


# ---------------------------------------------------------------------------- the inventory

def _first_line(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ((done.stdout or done.stderr).strip().splitlines() or [""])[0]


def inventory() -> dict[str, Any]:
    """What the node has: installed distributions, compilers, ``nvidia-smi -q``."""
    distributions = sorted({(d.metadata["Name"] or "?", d.version)
                            for d in metadata.distributions()}, key=lambda d: d[0].lower())
    compilers = {name: {"path": shutil.which(name),
                        "version": _first_line([name, "--version"])}
                 for name in COMPILERS if shutil.which(name)}
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True,
                                  timeout=60)
            smi = done.stdout if done.returncode == 0 else (
                f"nvidia-smi -q exited {done.returncode}: {done.stderr.strip()[:500]}")
        except (OSError, subprocess.SubprocessError) as exc:
            smi = f"nvidia-smi -q failed: {type(exc).__name__}: {exc}"
    else:
        smi = "unavailable: nvidia-smi is not on PATH"
    return {"python": sys.version, "executable": sys.executable, "platform": platform.platform(),
            "distributions": [{"name": n, "version": v} for n, v in distributions],
            "compilers": compilers, "nvidia_smi_q": smi,
            "environment": {key: os.environ.get(key) for key in
                            ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "CXX", "PYTHONPATH")}}


# ------------------------------------------------------------------------------- measuring

# A cell is admitted before the deadline only if the worse of its scaled prediction and this
# multiple of its prediction fits: the last cells of a lease on a CPU VM overran their
# predictions by 1.7-2.4x, more than the cells before them had (which is what the scale knows).
DEADLINE_SAFETY = 2.5


def admission_seconds(predicted: float, scale: float) -> float:
    """The seconds a cell is expected to take when admitting it before a deadline."""
    return max(predicted * scale, predicted * DEADLINE_SAFETY)


class CellClock:
    """The sweep watcher of one experiment: predicts each cell, refuses one that would pass the
    deadline, records predicted and measured seconds in the manifest after every cell.

    Predictions are scaled by how the cells measured so far compared with theirs, so a machine
    slower or faster than the basis is judged by what it did, and never taken below
    :data:`DEADLINE_SAFETY` times the prediction (:func:`admission_seconds`).
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
    _bound(notebook).measure(p, sink)


def _say(text: str) -> None:
    print(f"measure: {text}", file=sys.stderr, flush=True)


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
                             gpu=gpu.get("name"), versions=versions(snap))
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
            rows = table_rows(out, entry["table"])
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
    recorder = Recorder(out, new_manifest(request, out))
    recorder.save()
    with stops.as_interrupt(stops.SIGNALS):  # the manifest says interrupted, cells kept
        try:
            _say(f"into {out}")
            take_snapshot(recorder, request)
            records.write_json_atomic(out / "inventory.json", inventory())
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
        return outcomes.one_line_errors("stagelab measure", body)
    except SystemExit as exc:  # argparse: --help (0) or a malformed command line (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


# ------------------------------------------------------------------------- reading it back

def read_measured(folder: Path | str) -> dict[str, Any]:
    """A measured folder's manifest; UserError, in one line, for anything else.

    The folder may come from a stranger: the manifest is read as
    :func:`stagelab.core.untrusted.load_json` reads (a regular file, no link, bounded size and
    depth) and every field a replay uses is shape-checked (:func:`check_manifest`).
    A manifest still saying ``running`` was written by a process that was killed (or that still
    writes): its running experiment reads ``interrupted``.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    try:
        manifest = untrusted.load_json(path, root=folder)
    except FileNotFoundError:
        raise UserError(f"--from {folder}: not a measured folder (no {MANIFEST}; make one with "
                        "`stagelab measure`)") from None
    except UserError as exc:
        raise UserError(f"--from {folder}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"--from {folder}: {MANIFEST} is not a stagelab measurement")
    if manifest.get("version") != VERSION:
        raise UserError(f"--from {folder}: measurement format version "
                        f"{manifest.get('version')!r}, this stagelab reads {VERSION}")
    problem = manifest_problem(manifest)
    if problem:
        raise UserError(f"--from {folder}: {MANIFEST} {problem}")
    if manifest.get("status") == RUNNING:
        manifest["status"] = INTERRUPTED
        for entry in manifest["experiments"]:
            if entry["status"] in (RUNNING, PENDING):
                entry.update(status=INTERRUPTED, error="the measuring process was killed")
    return manifest


STATUSES = (OK, FAILED, DEADLINE, INTERRUPTED, RUNNING, PENDING, NO_GO, UNMEASURED)
# Top-level fields a replay copies into its run's record, and the types each may have.
TEXT_FIELDS = ("measured_id", "profile", "status", "created_utc", "finished_utc", "host",
               "device", "gpu")


def _field_problem(value: Any, kinds: tuple[type, ...], where: str) -> str | None:
    wrong = (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds)
    if wrong:
        return (f"has {where} of type {type(value).__name__}, not "
                f"{' or '.join(k.__name__ for k in kinds)}")
    return None


def _load_problem(load: Any, where: str) -> str | None:
    if load is None:
        return None
    if not isinstance(load, dict) or not isinstance(load.get("busy"), (bool, type(None))):
        return f"has {where}.load that is not a load summary"
    why = load.get("why", [])
    if not isinstance(why, list) or not all(isinstance(w, str) for w in why):
        return f"has {where}.load.why that is not a list of text"
    return None


def _experiment_problem(entry: Any, where: str) -> str | None:
    if not isinstance(entry, dict):
        return f"has {where} that is not an object"
    notebook = entry.get("notebook")
    if notebook not in MEASURING:
        return (f"has {where}.notebook {notebook!r}, not a measuring notebook "
                f"({', '.join(MEASURING)})")
    if entry.get("table") != TABLES.get(notebook):
        return (f"has {where}.table {entry.get('table')!r}, not {notebook}'s "
                f"({TABLES.get(notebook)!r})")
    if entry.get("status") not in STATUSES:
        return f"has {where}.status {entry.get('status')!r}, not one of {', '.join(STATUSES)}"
    checks = [(entry.get("parameters", {}), (dict,), "parameters"),
              (entry.get("error"), (str, type(None)), "error"),
              (entry.get("cells_planned"), (int, type(None)), "cells_planned"),
              (entry.get("cells"), (list,), "cells")]
    for value, kinds, name in checks:
        problem = _field_problem(value, kinds, f"{where}.{name}")
        if problem:
            return problem
    for index, cell in enumerate(entry["cells"]):
        inner = f"{where}.cells[{index}]"
        if not isinstance(cell, dict) or cell.get("status") not in STATUSES:
            return f"has {inner} that is not a cell with a known status"
        rows = cell.get("rows", 1)
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            return f"has {inner}.rows {rows!r}, not a count"
        problem = _field_problem(cell.get("cell", ""), (str,), f"{inner}.cell")
        if problem:
            return problem
    return _load_problem(entry.get("load"), where)


def manifest_problem(manifest: Mapping[str, Any]) -> str | None:
    """What in a measured manifest a replay could not use as data, or None."""
    for name in TEXT_FIELDS:
        problem = _field_problem(manifest.get(name), (str, type(None)), name)
        if problem:
            return problem
    for name, kinds in (("preflight", (dict, type(None))), ("versions", (dict, type(None))),
                        ("git", (dict, type(None))), ("forced", (bool, type(None)))):
        problem = _field_problem(manifest.get(name), kinds, name)
        if problem:
            return problem
    experiments = manifest.get("experiments")
    if not isinstance(experiments, list):
        return "has no readable list of experiments"
    seen = set()
    for index, entry in enumerate(experiments):
        problem = _experiment_problem(entry, f"experiments[{index}]")
        if problem:
            return problem
        if entry["notebook"] in seen:
            return f"lists {entry['notebook']} twice"
        seen.add(entry["notebook"])
    return None


def recorded_rows(entry: Mapping[str, Any]) -> int:
    """How many rows an experiment's finished cells say they wrote."""
    return sum(c.get("rows", 1) for c in entry["cells"] if c["status"] in (OK, FAILED))


def measured_rows(folder: Path | str, table: str) -> list[dict[str, Any]]:
    """The rows of one measured table that its manifest's cells account for (empty where the
    experiment measured no cell); the rows of a cell a kill cut off before it was recorded are
    left out."""
    folder = Path(folder)
    entry = next((e for e in read_measured(folder)["experiments"] if e["table"] == table), None)
    if entry is None or not recorded_rows(entry):
        return []
    try:
        return table_rows(folder, table)[:recorded_rows(entry)]
    except FileNotFoundError:
        return []


def check_rows(folder: Path | str, entry: Mapping[str, Any]) -> None:
    """UserError when an experiment's rows file does not hold exactly the rows its cells
    recorded: fewer is a lost or truncated ``rows/`` (a replay would analyse part of it as
    whole), more is rows no cell accounts for (only a measurement killed between writing a
    cell's rows and recording the cell may hold those, and they are left out)."""
    expected = recorded_rows(entry)
    if entry["table"] is None or not expected:
        return
    name = rows_path(folder, entry["table"]).relative_to(folder).as_posix()
    try:
        found = len(table_rows(folder, entry["table"]))
    except FileNotFoundError:
        cells = sum(1 for c in entry["cells"] if c["status"] in (OK, FAILED))
        raise UserError(f"--from {folder}: {name} is missing, although {entry['notebook']} "
                        f"recorded {cells} measured cells") from None
    except (OSError, SchemaError, UserError) as exc:
        raise UserError(f"--from {folder}: {name} cannot be read ({exc})") from exc
    if found < expected:
        raise UserError(f"--from {folder}: {name} holds {found} rows, fewer than the "
                        f"{expected} that {entry['notebook']}'s cells recorded")
    if found > expected and entry["status"] != INTERRUPTED:
        raise UserError(f"--from {folder}: {name} holds {found} rows, more than the "
                        f"{expected} that {entry['notebook']}'s cells recorded")


def gaps(manifest: Mapping[str, Any]) -> list[str]:
    """What a measured folder lacks, in words: experiments not ``ok``, with their cells."""
    found = []
    for entry in manifest["experiments"]:
        if entry["status"] == OK:
            continue
        done = sum(1 for c in entry["cells"] if c["status"] == OK)
        planned = entry.get("cells_planned")
        cells = f", {done} of {planned} cells measured" if planned is not None else ""
        found.append(f"{entry['notebook']}: {entry['status']}{cells}"
                     f"{' (' + entry['error'] + ')' if entry.get('error') else ''}")
    return found


RECORD_FILES = (MANIFEST, "hardware.json", "preflight.json", "inventory.json")
RECORD_COPY = "measured"  # the node's record inside a replayed run folder


def record_names() -> list[str]:
    """The only names a measured folder's record is read by (a path in it is never followed)."""
    return [*RECORD_FILES, *(name for table in TABLES.values() for name in rows_names(table))]


def _record_limit(name: str) -> int:
    return untrusted.MAX_ROWS_BYTES if name.startswith(ROWS_DIR) else untrusted.MAX_JSON_BYTES


def check_record_files(folder: Path | str) -> None:
    """UserError, naming the file, when one of the record's known names is not a regular file
    of bounded size inside the folder (a link, a FIFO, a device, a giant file): checked before
    a run folder exists, so nothing outside the folder is ever copied into a run."""
    folder = Path(folder)
    for name in record_names():
        try:
            untrusted.read_regular(folder / name, _record_limit(name), root=folder)
        except FileNotFoundError:
            continue
        except UserError as exc:
            raise UserError(f"--from {folder}: {exc}") from exc


def copy_record(folder: Path | str, dest: Path) -> None:
    """Copy a measured folder's record (manifest, hardware, preflight, inventory, the rows of
    its known tables) into ``dest``, so a replayed run, and its kept copy, carry what the node
    wrote. Read as :func:`stagelab.core.untrusted.read_regular` reads: only the folder's own
    regular files, by known names, each of bounded size. Rows stay compressed, and the plain
    rows of an older folder are compressed on the way (kept evidence must fit a lease)."""
    folder, dest = Path(folder), Path(dest)
    (dest / ROWS_DIR).mkdir(parents=True)
    for name in record_names():
        try:
            data = untrusted.read_regular(folder / name, _record_limit(name), root=folder)
        except FileNotFoundError:
            continue
        if name.endswith(PLAIN_ROWS_SUFFIX):  # kept compressed: its whole rows, one member
            name, data = f"{name}.gz", gzip.compress(data[:data.rfind(b"\n") + 1], mtime=0)
            if (folder / name).exists():
                continue
        records.write_bytes_atomic(dest / name, data)


def matched_source(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The measurement's source record with ``matched_commit``: the commit here whose
    ``lib/stagelab`` has the tree id the node recorded (None where none has it)."""
    source = manifest.get("source")
    if not isinstance(source, dict):
        return None
    tree, named = source.get("tree"), source.get("commit_env")
    if not isinstance(tree, str) or len(tree) != 40 or not tree.isalnum():
        tree = None  # a stranger's folder: only a tree id is looked up
    return {"path": provenance.SOURCE, "tree": tree,
            "commit_env": named if isinstance(named, str) else None,
            "matched_commit": provenance.matching_commit(tree)}


def origin(folder: Path | str, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Where and when a measurement was made, for the run's manifest and report; ``record`` is
    its copy inside the run folder, ``folder`` where it was read from on the analysing host."""
    return {"folder": str(Path(folder).resolve()), "record": RECORD_COPY,
            "measured_id": manifest.get("measured_id"), "preflight": manifest.get("preflight"),
            "host": manifest.get("host"), "gpu": manifest.get("gpu"),
            "device": manifest.get("device"), "created_utc": manifest.get("created_utc"),
            "profile": manifest.get("profile"), "status": manifest.get("status"),
            "forced": manifest.get("forced"), "rehearsal": bool(manifest.get("rehearsal")),
            "git": manifest.get("git"), "source": matched_source(manifest),
            "versions": manifest.get("versions"), "gaps": gaps(manifest),
            "loads": {e["notebook"]: e["load"] for e in manifest["experiments"] if e.get("load")}}
