"""How well the cost model predicts this machine: measure the quick profile's step cells (or read a
folder that `stagelab measure` made), feed the model each cell's own host rates, and print the
error of every stage, every arm and the reuse lever's ratio, with the goal of issue 29 (the seed
step's total and the reuse ratio within 20 % of the measured means at every cell).

    PYTHONPATH=lib python3 scripts/bench_prediction.py [--from DIR] [--profile quick]

Prints the machine's load beside the figures: on a loaded machine the measurement and the rates
both move. Exit 0 whether the goal is met or not (the figures are the result).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL = 0.20


def measure(profile: str, out: Path) -> None:
    """The profile's step notebook alone, measured into ``out``."""
    subprocess.run([sys.executable, "-m", "stagelab", "measure", "--profile", profile, "--only",
                    "02_logprobs_step", "--out", str(out), "--force", "--rehearse-on-cpu"],
                   check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="from_dir", type=Path, default=None,
                        help="a folder made by `stagelab measure` (default: measure now)")
    parser.add_argument("--profile", default="quick")
    args = parser.parse_args()
    from stagelab.analyse import predict_check, predict_tables
    from stagelab.core import schema

    folder = args.from_dir
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="bench_prediction_")) / "measured"
        measure(args.profile, folder)
    step = schema.make_rows(schema.read_json_lines(folder / "rows" / "step.jsonl"))
    check = predict_check.check_run(step, None)
    print(f"folder: {folder}; load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"cores: {os.cpu_count()}")
    print(predict_check.check_table(check).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    met = True
    for cell in check["cells"]:
        total = next(a for a in cell["arms"] if a["name"] == predict_tables.BASELINE)
        ratio = cell["reuse_ratio"]
        for what, error in (("seed step total", total["error"]), ("reuse ratio", ratio["error"])):
            ok = error is not None and abs(error) <= GOAL
            met &= ok
            print(f"n={cell['rows']} V={cell['vocab']} K={cell['k']}: {what} error "
                  f"{'unknown' if error is None else f'{error:+.1%}'} "
                  f"({'within' if ok else 'NOT within'} {GOAL:.0%})")
    print(f"goal (every cell within {GOAL:.0%}): {'met' if met else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
