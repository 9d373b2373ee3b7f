"""Host rates measured before a run, in another process: the cost model's out-of-sample input.

At the start of a run (notebook 00, beside the machine snapshot) a child Python process times the
host terms (:func:`stagelab.measure.hostrates.measure_rates`, a few repeats) at the step
notebook's cells and writes its rows to ``data/host_prior.jsonl`` in the run folder. Measured in
another process and before the step, these rates are not the run's own: the verdict's
``out_of_sample`` check feeds them to the model (:mod:`stagelab.analyse.predict_model`) against the
run's measured stages, where the in-sample check (the cell's own rates) tests additivity only.

Kept cheap and bounded: 3 repeats after one warm-up per size, sizes up to :data:`MAX_BYTES`, a
wall-clock limit on the child; what it did not measure, and why, is returned and recorded. Torch
and the standard library only (the measuring floor).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stagelab.core import catalogue, forward, paths, phases
from stagelab.core.records import RunFolder

REPEATS = 3
MAX_BYTES = 512 * 2**20  # a size above this is not probed (seconds, not minutes)
TIMEOUT_S = 120.0
NOTE = "before the run, in another process"


def step_cells(parameters: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """``(rows, vocab, k)`` of the step notebook's cells (its rows x models, the largest K),
    from its parameters; models are names of data/model_shapes.csv or vocabulary sizes."""
    shapes = forward.model_table()
    vocabs = sorted({int(shapes[m]["vocab"]) if isinstance(m, str) and m in shapes else int(m)
                     for m in parameters.get("models") or [] if not isinstance(m, bool)})
    ks = [int(k) for k in parameters.get("ks") or [5]]
    rows = sorted({int(n) for n in parameters.get("rows") or []})
    return [(n, vocab, max(ks)) for vocab in vocabs for n in rows if n > 0]


def step_parameters(run_dir: Path | str) -> dict[str, Any]:
    """The step notebook's parameters as the run's manifest plans them; {} without them."""
    step = catalogue.notebook_of(catalogue.STEP).name
    try:
        manifest = RunFolder(run_dir).read_manifest()
    except (OSError, ValueError):
        return {}
    for entry in manifest.get("notebooks") or []:
        if isinstance(entry, dict) and entry.get("name") == step:
            return dict(entry.get("parameters") or {})
    return {}


def measure_before(run_dir: Path | str, cells: Iterable[tuple[int, int, int]] | None = None,
                   timeout_s: float = TIMEOUT_S, logits_dtype: str | None = None
                   ) -> dict[str, Any]:
    """Time the host terms at the run's step cells in a child process, its rows into the run's
    ``data/host_prior.jsonl``; a JSON-ready summary (sizes measured, skipped and why, seconds,
    the child's failure). Never raises for the child's sake: the run goes on without it."""
    run_dir = Path(run_dir)
    planned = step_parameters(run_dir)
    cells = sorted(set(step_cells(planned) if cells is None else cells))
    dtype = str(logits_dtype or planned.get("logits_dtype") or "bfloat16")
    keep = [c for c in cells if c[0] * c[1] * 4 <= MAX_BYTES]
    skipped = [f"{n}x{v}: {n * v * 4 / 2**20:.0f} MiB is over {MAX_BYTES // 2**20} MiB"
               for n, v, _ in cells if (n, v, _) not in keep]
    out = run_dir / paths.HOST_PRIOR_ROWS
    summary: dict[str, Any] = {"path": str(paths.HOST_PRIOR_ROWS), "cells": [list(c) for c in keep],
                               "skipped": skipped, "repeats": REPEATS, "note": NOTE, "error": ""}
    if not keep:
        summary["error"] = "no step cell to measure"
        return summary
    command = [sys.executable, "-m", "stagelab.measure.priorrates", "--out", str(out),
               "--dtype", dtype,
               *[arg for n, v, k in keep for arg in ("--cell", f"{n}x{v}x{k}")]]
    start = time.perf_counter()
    try:
        with phases.measuring():  # the child's whole life is the measurement
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        if done.returncode:
            summary["error"] = (done.stderr.strip().splitlines() or ["exit status "
                                                                     f"{done.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        summary["error"] = f"the child ran past {timeout_s:g} s: what it wrote is kept"
    summary["seconds"] = round(time.perf_counter() - start, 2)
    return summary


def words(summary: Mapping[str, Any]) -> str:
    """The summary in one sentence for the notebook."""
    cells = ", ".join(f"{n}x{v}" for n, v, _ in summary.get("cells") or []) or "none"
    said = (f"Host rates measured {NOTE} ({summary.get('repeats')} repeats at {cells}; "
            f"{summary.get('seconds', 0):g} s) into `{summary.get('path')}`: the model's "
            "out-of-sample input.")
    if summary.get("skipped"):
        said += " Not measured: " + "; ".join(summary["skipped"]) + "."
    if summary.get("error"):
        said += f" Failed: {summary['error']}."
    return said


def _cell(text: str) -> tuple[int, int, int]:
    try:
        rows, vocab, k = (int(part) for part in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cell {text!r}: give ROWSxVOCABxK") from None
    return rows, vocab, k


def main(argv: list[str] | None = None) -> int:
    """The child: measure each ``--cell`` and append its rows to ``--out`` (JSON lines)."""
    import torch

    from stagelab.core import schema
    from stagelab.measure import hostrates

    parser = argparse.ArgumentParser(description="host rates before a run, in this process")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cell", type=_cell, action="append", default=[])
    parser.add_argument("--dtype", default="bfloat16", help="the step's logits dtype")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        parser.error(f"--dtype {args.dtype!r}: not a torch dtype")
    sink = schema.JsonLinesSink(args.out, notebook=catalogue.ENVIRONMENT_NOTEBOOK)
    for rows, vocab, k in args.cell:
        measured = hostrates.measure_rates(rows, vocab, k, repeats=REPEATS, logits_dtype=dtype)
        sink.append([{**row, "rows": rows, "vocab": vocab, "k": k,
                      "note": f"{row.get('note', '')}; {NOTE}".lstrip("; ")}
                     for row in measured])
    print(json.dumps({"cells": len(args.cell), "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
