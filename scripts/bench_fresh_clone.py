#!/usr/bin/env python3
"""Time what a newcomer does first: clone the repository and run ``make run`` (set-up included).

The clone goes into a new temporary folder, at the commit the repository has checked out, and
is removed afterwards (``--keep`` keeps it). The set-up's own timing line splits the figure into
set-up and run. The machine's load average is printed before and after: other processes on the
machine slow the figure, and it says so. Exit status: make's own (0 when it succeeded).

    python3 scripts/bench_fresh_clone.py               # make run, the quick profile
    python3 scripts/bench_fresh_clone.py --target setup
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 100.0
SETUP_LINE = re.compile(r"^set-up: .* in (\d+) s$")


def setup_seconds(output: str) -> float:
    """The seconds the set-up took, summed over its steps (base and extras), from its lines."""
    return float(sum(int(m.group(1)) for line in output.splitlines()
                     if (m := SETUP_LINE.match(line.strip()))))


def uv_cache_state() -> str:
    """Whether uv's cache already holds packages (a warm cache installs in seconds)."""
    cache = Path(os.environ.get("UV_CACHE_DIR")
                 or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "uv")
    return "warm" if cache.is_dir() and any(cache.iterdir()) else "cold"


def clone(repo: Path, dest: Path) -> str:
    """Clone ``repo`` into ``dest`` at the commit ``repo`` has checked out; its short id."""
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", str(repo), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", commit], check=True)
    return commit[:7]


def cpu_seconds_of_children() -> float:
    """User and system CPU time of the waited-for child processes so far: unlike the wall time,
    hardly changed by other processes sharing the machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_make(folder: Path, target: str, make_args: list[str]) -> tuple[int, float, str]:
    """Run ``make TARGET`` in ``folder``, echoing its output; (exit status, seconds, output)."""
    started = time.monotonic()
    process = subprocess.Popen(["make", target, *make_args], cwd=folder, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    return process.wait(), time.monotonic() - started, "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the repository to clone")
    parser.add_argument("--target", default="run", help="the make target (default run)")
    parser.add_argument("--keep", action="store_true", help="keep the clone")
    parser.add_argument("make_args", nargs="*", help="passed to make, e.g. PROFILE=quick")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="stagelab-fresh-clone-"))
    try:
        commit = clone(args.repo, folder / "stagelab")
        cache = uv_cache_state()
        load_before, cpu_before = os.getloadavg()[0], cpu_seconds_of_children()
        status, seconds, output = timed_make(folder / "stagelab", args.target, args.make_args)
        load_after, cpu_s = os.getloadavg()[0], cpu_seconds_of_children() - cpu_before
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    setup_s = setup_seconds(output)
    print(f"\nfresh clone of {args.repo} at {commit}: `make {args.target}` "
          f"{'succeeded' if status == 0 else f'failed ({status})'} in {seconds:.0f} s "
          f"(set-up {setup_s:.0f} s, the rest {seconds - setup_s:.0f} s)")
    if args.target == "run":
        print(f"goal <= {GOAL_S:.0f} s: {'met' if seconds <= GOAL_S else 'NOT met'}")
    print(f"machine: {os.cpu_count()} cores, load average {load_before:.1f} before, "
          f"{load_after:.1f} after; uv's cache {cache} at the start; CPU time of make and its "
          f"processes {cpu_s:.0f} s")
    if load_before >= 1:
        print("other processes were running before it started: on a quiet machine it is faster")
    if args.keep:
        print(f"clone kept: {folder / 'stagelab'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
