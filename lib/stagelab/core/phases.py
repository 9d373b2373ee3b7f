"""Where a notebook's time goes: kernel start, imports, measurement, analysis, export.

The runner hands each kernel a file of its own (named by ``STAGELAB_PHASES_FILE``, in the
kernel's private socket folder); inside the notebook the context marks there the moment its
imports are done and adds the seconds each measurement takes. After the notebook ran, the runner
reads that file beside papermill's own cell times in the executed notebook and records the
entry's ``phases`` (:func:`notebook_phases`), which sum to the entry's duration (and its export):

- ``kernel_start_s``: outside the cells: papermill's set-up and saves, the kernel's start and
  its stop;
- ``import_s``: from the first cell's start until the notebook's imports are done;
- ``measure_s``: the measurements (the sweep, the hardware snapshot), or reading them back in a
  replay;
- ``analysis_s``: the rest of the cells (tables, plots, the verdict);
- ``export_s``: the notebook's HTML, exported once when the run ends (so the phases sum to the
  entry's duration plus its export).

Every kernel of a run starts before the first notebook (:mod:`stagelab.run.kernels`): a
notebook's ``kernel_start_s`` is then papermill's set-up and saves, and its kernel's
connection and stop; the start itself is the run's ``kernels`` seconds, which :func:`totals`
adds to the kernel start.

Standard library only: the measuring kernel and the runner both import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

PHASES_ENV = "STAGELAB_PHASES_FILE"
NAMES = ("kernel_start_s", "import_s", "measure_s", "analysis_s", "export_s")
NOT_MEASURING = ("kernel_start_s", "import_s", "analysis_s", "export_s")


# ------------------------------------------------------------------------- inside the kernel

def _marks_file() -> Path | None:
    name = os.environ.get(PHASES_ENV)
    return Path(name) if name else None


def _read(path: Path) -> dict[str, Any]:
    try:
        marks = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return marks if isinstance(marks, dict) else {}


def _update(**values: float) -> None:
    path = _marks_file()
    if path is None:  # run by hand, or by the measuring command: nothing to record
        return
    with contextlib.suppress(OSError):
        path.write_text(json.dumps({**_read(path), **values}))


def mark_imported() -> None:
    """Note that the notebook's imports are done (the first mark counts)."""
    path = _marks_file()
    if path is not None and "imported" not in _read(path):
        _update(imported=time.time())


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """Count the seconds of the block as measurement."""
    started = time.perf_counter()
    try:
        yield
    finally:
        path = _marks_file()
        if path is not None:
            spent = float(_read(path).get("measure_s", 0.0))
            _update(measure_s=spent + time.perf_counter() - started)


# ----------------------------------------------------------------------------- in the runner

def read_marks(path: Path) -> dict[str, Any]:
    """What the kernel marked (empty where it marked nothing)."""
    return _read(Path(path))


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return None


def cell_span(notebook_path: Path) -> tuple[float | None, float | None]:
    """When papermill started the executed notebook's first cell and ended its last (epoch s)."""
    try:
        cells = json.loads(Path(notebook_path).read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return None, None
    times = [cell.get("metadata", {}).get("papermill", {}) for cell in cells]
    starts = [t for t in (_epoch(m.get("start_time")) for m in times) if t is not None]
    ends = [t for t in (_epoch(m.get("end_time")) for m in times) if t is not None]
    return (min(starts) if starts else None), (max(ends) if ends else None)


def notebook_phases(started: float, executed: float, finished: float,
                    span: tuple[float | None, float | None],
                    marks: Mapping[str, Any]) -> dict[str, float | None]:
    """The entry's ``phases`` from the runner's clock (epoch seconds: when it started the
    notebook, when papermill returned, when the export was done), the cells' span and the
    kernel's marks; a phase that cannot be told (no cell ran, no mark) is None."""
    first, last = span
    export = finished - executed
    if first is None or last is None:
        return {"kernel_start_s": _round(executed - started), "import_s": None,
                "measure_s": None, "analysis_s": None, "export_s": _round(export)}
    cells = max(0.0, last - first)
    imported = marks.get("imported")
    import_s = min(cells, max(0.0, imported - first)) if isinstance(imported, float) else None
    measure_s = min(cells - (import_s or 0.0), float(marks.get("measure_s") or 0.0))
    analysis_s = cells - (import_s or 0.0) - measure_s
    return {"kernel_start_s": _round(executed - started - cells), "import_s": _round(import_s),
            "measure_s": _round(measure_s), "analysis_s": _round(analysis_s),
            "export_s": _round(export)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(max(0.0, value), 2)


def totals(manifest: Mapping[str, Any]) -> dict[str, float]:
    """Each phase's seconds summed over the run's notebooks; the kernel start also holds the
    seconds every kernel took to start together before the first notebook (the manifest's
    ``kernels``, :mod:`stagelab.run.kernels`)."""
    entries = [entry.get("phases") or {} for entry in manifest.get("notebooks", [])]
    found = {name: sum(float(p.get(name) or 0.0) for p in entries) for name in NAMES}
    found["kernel_start_s"] += float((manifest.get("kernels") or {}).get("seconds") or 0.0)
    return {name: round(seconds, 2) for name, seconds in found.items()}


def non_measurement_share(phases: Mapping[str, Any]) -> float | None:
    """The share of the time not spent measuring (None where no time is known)."""
    total = sum(float(phases.get(name) or 0.0) for name in NAMES)
    if total <= 0:
        return None
    return sum(float(phases.get(name) or 0.0) for name in NOT_MEASURING) / total


def summary_line(manifest: Mapping[str, Any]) -> str:
    """One line: where the run's time went ('' where no notebook recorded its phases)."""
    if not any(entry.get("phases") for entry in manifest.get("notebooks", [])):
        return ""
    spent = totals(manifest)
    share = non_measurement_share(spent)
    words = ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {spent[name]:.1f} s"
                      for name in NAMES)
    return (f"time: {words}; not measuring: {share:.0%} of {sum(spent.values()):.1f} s"
            if share is not None else f"time: {words}")
