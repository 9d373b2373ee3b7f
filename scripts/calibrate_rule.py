#!/usr/bin/env python3
"""Measure the decision rule's error rates on its cases and write the table into the docs.

Runs :func:`stagelab.analyse.calibration_cases.cases` (families of six simulated cells at 160 rounds
and until resolved up to the gate's cap, each case's rate with its 95 % Wilson interval, whether
its requirement is met on it and the trials that would show it) and, with ``--write``, puts its
rows (with the commit they ran at) into ``docs/calibration.csv`` (with ``--only``: replacing that
case's rows, keeping the others) and redraws the table between the markers of
``docs/decision-rule.md``'s "The rule's cases" section from the whole CSV. ``--render`` redraws
the table from the CSV without simulating. Never edit that table by hand:
``tests/test_calibration.py`` checks that the page shows the CSV's rows.

    python3 scripts/calibrate_rule.py --trials 200 --write   # every case
    python3 scripts/calibrate_rule.py --trials 1000 --only "6 cells at the bar, lognormal 2 %" --write
    python3 scripts/calibrate_rule.py --render
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


def _commit() -> str:
    """This checkout's short commit, with ``+dirty`` where its code (lib, scripts) differs from
    it (the docs a run writes do not count)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True,
                              check=False).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{commit}+dirty" if git("status", "--porcelain", "--untracked-files=no", "--", "lib", "scripts") else commit


def render() -> pd.DataFrame:
    """Redraw the page's table from docs/calibration.csv; the rows."""
    table = pd.read_csv(TABLE)
    table["met"] = table["met"].map({True: True, False: False, "True": True, "False": False})
    PAGE.write_text(calibration_cases.with_table(PAGE.read_text(), table))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="simulated families per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", help="a case to run (repeatable)")
    parser.add_argument("--write", action="store_true", help="write the CSV's rows and the table")
    parser.add_argument("--render", action="store_true",
                        help="only redraw the page's table from docs/calibration.csv")
    parser.add_argument("--jobs", type=int, default=2, help="processes (one case each at a time)")
    args = parser.parse_args(argv)
    if args.render:
        print(calibration_cases.cases_markdown(render()))
        return 0
    known = [spec[0] for spec in calibration_cases._case_specs(0.02)]
    unknown = [name for name in args.only or [] if name not in known]
    if unknown:
        parser.error(f"--only: unknown case(s) {unknown}; the cases: {known}")
    commit, started = _commit(), time.monotonic()
    names = args.only or known
    with multiprocessing.Pool(min(args.jobs, len(names))) as pool:  # each case its own seed
        parts = pool.map(functools.partial(_one_case, trials=args.trials, seed=args.seed), names)
    table = pd.concat(parts, ignore_index=True).assign(commit=commit)
    print(f"{len(names)} case(s), {args.trials} trials each, {time.monotonic() - started:.0f} s "
          f"at {commit}", file=sys.stderr)
    if args.write:
        if args.only and TABLE.exists():
            table = calibration_cases.merged(pd.read_csv(TABLE), table)
        calibration_cases.with_trials_needed(table).to_csv(TABLE, index=False)
        table = render()
    print(calibration_cases.cases_markdown(table))
    missed = table[table["met"].eq(False)]
    print(f"{len(missed)} of {len(table)} rows short of their requirement", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
