"""What ``stagelab measure --estimate`` prints, beside the estimate: each cell's predicted
seconds and the total, whether a deadline starts every cell (the admission rule the measuring
loop keeps), and the most bytes each rows file will hold against what a lease returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from stagelab.core import catalogue, design
from stagelab.core.measured import (
    LEASE_MAX_FILE_BYTES,
    LEASE_MAX_FILES,
    RECORD_FILES,
    TABLES,
    rows_file,
)
from stagelab.measure import estimate, experiments

# Before the first cell: imports, the native build on a fresh node, the preflight's probes.
FIXED_S = {"cpu": 15.0, "cuda": 20.0}


def sweep_cells(notebook: str, parameters: Mapping[str, Any], device: str) -> list[Any]:
    """The sweep cells a measuring notebook will measure (none for the snapshot)."""
    return experiments.notebook_cells(notebook, parameters, device)


def cell_predictor(notebook: str, parameters: Mapping[str, Any],
                   kind: str) -> Callable[[Any, int, int], float]:
    """``predict(cell, rounds, warmup)``: seconds by :func:`stagelab.measure.estimate.cell_seconds`."""
    return bound_experiment(notebook).predictor(parameters, kind)


def bound_experiment(notebook: str) -> experiments.Experiment:
    """The experiment a measuring notebook is bound to; ValueError for any other notebook."""
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
        lines.append(f"{name}: the cheaper answers (CLOSE, a reused buffer) need, at 2 % noise "
                     "per call, 6 cells and 80 % power, about "
                     f"{design.rounds_to_close(0.5)} rounds per cell where the deciding saving "
                     f"is 0.5 delta and {design.rounds_to_close(0.8)} at 0.8 delta (the cap: "
                     f"{parameters['max_rounds']})\n")
    return lines


def format_estimate(rows: list[tuple[str, str, float]], kind: str) -> str:
    """The ``--estimate`` table: each cell, each notebook's sum, and the total (the cell column
    as wide as its longest label, at least 44)."""
    width = max([44, *(len(label) for _, label, _ in rows)])
    lines = [f"{'notebook':20} {'cell':{width}} {'predicted_s':>11}"]
    lines += [f"{name:20} {label:{width}} {seconds:11.1f}" for name, label, seconds in rows]
    total = sum(seconds for _, _, seconds in rows)
    lines.append(f"{'before the first cell':{width + 21}} {FIXED_S[kind]:11.1f}")
    lines.append(f"{'total on ' + kind:{width + 21}} {total + FIXED_S[kind]:11.1f}")
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


# A lease's host may be slower than the estimate's basis: the decisive cells must still all start
# on one this much slower (each cell, and the time before the first, scaled alike).
SLOWER_HOST = 1.25
DECISIVE_NOTEBOOK = catalogue.notebook_of(catalogue.DECISIVE_EXPERIMENT).name


def decisive_cells_start(rows: list[tuple[str, str, float]], deadline_s: float, kind: str,
                         slowdown: float) -> bool:
    """Whether every decisive cell (the decisive experiment's notebook) is started before the
    deadline when every cell takes ``slowdown`` times its prediction, the admission rule
    (:func:`admission_seconds`, its scale then ``slowdown``) deciding each."""
    clock = FIXED_S[kind] * slowdown
    for name, _, seconds in rows:
        started = clock + admission_seconds(seconds, slowdown) <= deadline_s
        if not started and name == DECISIVE_NOTEBOOK:
            return False
        clock += seconds * slowdown if started else 0.0
    return True


def slower_host_margin(rows: list[tuple[str, str, float]], deadline_s: float,
                       kind: str) -> float:
    """The largest slowdown of the host (to 0.01, up to 4x) at which every decisive cell is
    still started before the deadline; 0 where even the estimate itself does not start them."""
    if not decisive_cells_start(rows, deadline_s, kind, 1.0):
        return 0.0
    low, high = 1.0, 4.0
    while high - low > 0.005:
        middle = (low + high) / 2
        low, high = (middle, high) if decisive_cells_start(rows, deadline_s, kind,
                                                           middle) else (low, middle)
    return round(low, 2)


def format_margin(rows: list[tuple[str, str, float]], deadline_s: float, kind: str) -> str:
    """One line: how much slower a host may be and still start every decisive cell."""
    margin = slower_host_margin(rows, deadline_s, kind)
    enough = "enough" if margin >= SLOWER_HOST else "NOT enough"
    return (f"margin: every decisive cell ({DECISIVE_NOTEBOOK}) is started at --deadline-s "
            f"{deadline_s:g} on a host up to {margin:.2f}x slower than this estimate; "
            f"{SLOWER_HOST:g}x is asked: {enough}")


def predict_file_bytes(notebooks: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """The most bytes each rows file will hold (every cell at its round cap), compressed as
    written: what ``--estimate`` prints beside the lease's 16 MiB per file."""
    sizes = {}
    for name, parameters in notebooks.items():
        if name not in TABLES:
            continue
        rounds = bound_experiment(name).max_rounds(parameters) or parameters["rounds"]
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



# A cell is admitted before the deadline only if the worse of its scaled prediction and this
# multiple of its prediction fits: the last cells of a lease on a CPU VM overran their
# predictions by 1.7-2.4x, more than the cells before them had (which is what the scale knows).
DEADLINE_SAFETY = 2.5


def admission_seconds(predicted: float, scale: float) -> float:
    """The seconds a cell is expected to take when admitting it before a deadline."""
    return max(predicted * scale, predicted * DEADLINE_SAFETY)
