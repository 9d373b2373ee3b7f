"""The narrow plan against the four-warp one under the roofline model, cubins compiled here.

``stagelab.core.launches.narrow_walk`` sends every call of 16 rows or more whose top-K pads to
at most 32 (none included) and whose tile and slices are left to the plan to one-warp programs
of 512-wide tiles, twelve an SM with a top-K and sixteen without; this compares it at fewer
rows too, to show why decode keeps the four-warp plan. The compile check keeps only the plans
launched, so the four-warp plan's cubins at those shapes are not in
``data/kernel_compile.json``, nor all of the narrow plan's: this compiles both for sm_90 on
the lease's Triton (``scripts/kernel_compile_check.py``'s environment and cache; rows kept
under ``.cache/``, not in the data) and prints, for each k and row count, the model's share
of an H200's HBM (``stagelab.analyse.roofline``, slow and fast ends) for both plans: what
narrow_walk's words quote. A model, never a measurement.

    python scripts/compare_narrow_plan.py [--rows 1 4 16 64 256 1000] [--k 0 5 20]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
ROWS = (1, 4, 16, 64, 256, 1000)
PLANS = ("narrow", "four-warp")
KS = (0, 5, 20)
VOCAB = 152064
DTYPES = ("fp32", "bf16")
KEPT = ROOT / ".cache" / "plan-rows.jsonl"


def _check():
    """scripts/kernel_compile_check.py as a module (it is a script, not in the package)."""
    spec = importlib.util.spec_from_file_location("kernel_compile_check",
                                                  ROOT / "scripts" / "kernel_compile_check.py")
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def plan(name: str) -> contextlib.AbstractContextManager:
    """The plan ``name`` at every call that leaves its tile and slices to the plan:
    ``narrow`` at any row count (below :data:`stagelab.core.launches.NARROW_LEAST_ROWS` too,
    to show why decode keeps the four-warp plan), ``four-warp`` never narrow."""
    from stagelab.core import launches

    if name == "narrow":
        return mock.patch.object(launches, "NARROW_LEAST_ROWS", 1)
    return mock.patch.object(launches, "narrow_walk", lambda *call: False)


def plan_specs(rows: tuple[int, ...], ks: tuple[int, ...], sms: int, name: str) -> list[dict]:
    """The first launch of plan ``name`` (:func:`plan`) at each k, row count and dtype, as
    compile specs."""
    from stagelab.core import launches
    from stagelab.measure import kernel_variants

    specs = []
    with plan(name):
        for k in ks:
            for n in rows:
                first = launches.triton_launches(n, VOCAB, k, True, None, None,
                                                 launches.device_slots(sms, k))[0]
                specs += [dict(kernel_variants.spec_of(first, dtype),
                               where=f"{name} {dtype} n={n} k={k}") for dtype in DTYPES]
    return specs


def shares(rows: tuple[int, ...], ks: tuple[int, ...], variants: tuple[dict, ...]) -> list[dict]:
    """The model's slow and fast shares of an H200's HBM for each plan, k, row count and
    dtype."""
    from stagelab.analyse import roofline

    gpu = roofline.GPUS[roofline.LEASE_GPU]
    found = []
    for k, n in ((k, n) for k in ks for n in rows):
        for dtype in DTYPES:
            cell = dict(rows=n, k=k, dtype=dtype)
            for name in PLANS:
                with plan(name):
                    cell[name] = tuple(roofline.predict(n, VOCAB, k, dtype, gpu, ends,
                                                        variants)["model_hbm_share"]
                                       for ends in (roofline.SLOW, roofline.FAST))
            found.append(cell)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--k", type=int, nargs="+", default=list(KS))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "lib"))
    from stagelab.analyse import roofline

    check = _check()
    gpu = roofline.GPUS[roofline.LEASE_GPU]
    rows, ks = tuple(args.rows), tuple(args.k)
    specs = [spec for name in PLANS for spec in plan_specs(rows, ks, gpu.sms, name)]
    variants = tuple(check.compile_with(check.triton_python(check.LEASE_TRITON), specs,
                                        (gpu.arch,), workers=2, out=KEPT))
    print(f"V = {VOCAB}, {gpu.name}, % of HBM at the slow-fast ends "
          "(a model, never a measurement):")
    for cell in shares(rows, ks, variants):
        narrow, wide = ("-".join(f"{100 * share:.1f}" for share in cell[name])
                        for name in PLANS)
        print(f"  k={cell['k']} n={cell['rows']} {cell['dtype']}: narrow {narrow}, "
              f"four-warp {wide}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
