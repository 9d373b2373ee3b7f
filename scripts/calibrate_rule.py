#!/usr/bin/env python3
"""Measure the decision rule's error rates on its cases and write the table into the docs.

Runs :func:`stagelab.analyse.calibration_cases.cases` (families of six simulated cells at 160 rounds
and until resolved up to the gate's cap, each case's rate with its 95 % Wilson interval and
whether its requirement is met on it) and writes the table, with the command, the trials, the
commit and the seconds it took, between the markers of ``docs/decision-rule.md``'s "The rule's
cases" section (``--write``), and its rows to ``docs/calibration.csv``. Never edit that table
by hand: ``tests/test_calibration.py`` checks that the page shows the CSV's rows.

    python3 scripts/calibrate_rule.py --trials 200 --write   # the page's table
    python3 scripts/calibrate_rule.py --trials 20 --only "6 cells at the bar, lognormal 2 %"
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

# one BLAS thread: the bootstrap's small products are several times slower when BLAS threads
# contend for a shared machine's cores (measured: 2.9x on the 2-core VM under load)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pandas as pd  # noqa: E402 (after the BLAS setting)

from stagelab.analyse import calibration_cases  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGE, TABLE = ROOT / "docs" / "decision-rule.md", ROOT / "docs" / "calibration.csv"


def _one_case(name: str, *, trials: int, seed: int) -> pd.DataFrame:
    return calibration_cases.cases(trials=trials, seed=seed, only=[name])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="simulated families per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", help="a case to run (repeatable)")
    parser.add_argument("--write", action="store_true", help="write the page's table and CSV")
    parser.add_argument("--jobs", type=int, default=2, help="processes (one case each at a time)")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True, check=False).stdout.strip() or "unknown"
    started = time.monotonic()
    names = args.only or [spec[0] for spec in calibration_cases._case_specs(0.02)]
    with multiprocessing.Pool(args.jobs) as pool:  # each case keeps its own seed
        parts = pool.map(functools.partial(_one_case, trials=args.trials, seed=args.seed), names)
    table = pd.concat(parts, ignore_index=True)
    took = time.monotonic() - started
    origin = (f"`python3 scripts/calibrate_rule.py --trials {args.trials} --seed {args.seed}` at "
              f"commit {commit}, {took:.0f} s")
    if args.write:
        table.to_csv(TABLE, index=False)
        page = PAGE.read_text()
        PAGE.write_text(calibration_cases.with_table(page, table, origin))
    print(calibration_cases.cases_markdown(table, origin))
    missed = table[table["met"].eq(False)]
    print(f"{len(missed)} of {len(table)} rows short of their requirement", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
