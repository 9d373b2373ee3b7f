#!/usr/bin/env python3
"""Time what a newcomer and a developer do, in a fresh clone, and write docs/timings.md from it.

The clone goes into a new temporary folder, at the commit the repository has checked out, and
is removed afterwards (``--keep`` keeps it). One after another on the same machine: ``make
setup``, ``make run`` (the quick profile; where each notebook's time went, from the run's
manifest), then ``make check`` with its tests on one core (``PYTEST_ARGS=-n0``) and at once on
every core, and with ``--test`` ``make test``. Each figure comes with the machine's load
average before and after it and the CPU time it took: other processes slow a figure, and the
page says so. ``--write docs/timings.md`` writes the page from these figures alone (the Makefile's
help reads its times from it); never edit that page by hand. Exit status: 0 when every make
succeeded, else the first failure's.

    python3 scripts/bench_fresh_clone.py --write docs/timings.md   # the page, about 5 minutes
    python3 scripts/bench_fresh_clone.py --only run                # make run alone, printed
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETUP_LINE = re.compile(r"^set-up: .* in (\d+) s$")
PHASES = ("kernel_start_s", "import_s", "measure_s", "analysis_s", "export_s")
NOT_MEASURING = ("kernel_start_s", "import_s", "analysis_s", "export_s")
# The goals, as ratios measured side by side on one machine.
CHECK_RATIO_GOAL = 0.65
NON_MEASUREMENT_GOAL = 0.30
SERIAL = "PYTEST_ARGS=-n0"  # make check's tests in one process, on one core
# (label in the table, make target, make arguments); the labels `make X` are what `make help` reads
STEPS = {
    "setup": ("`make setup`", "setup", []),
    "run": ("`make run`", "run", []),
    "check-serial": (f"`make check {SERIAL}`", "check", [SERIAL]),
    "check": ("`make check`", "check", []),
    "test": ("`make test`", "test", []),
}

# What a target installs first (its extras, the browser): set-up, left out of its figure.
PREREQUISITES = {"check": [".venv/.extra-test"],
                 "test": [".venv/.extra-lab", ".venv/.extra-test", ".venv/.extra-fleet", "browser"]}


@dataclass
class Figure:
    """One make target timed: its exit status, wall and CPU seconds, the load around it."""

    label: str
    status: int
    seconds: float
    cpu_s: float
    load_before: float
    load_after: float
    output: str


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


def timed_make(folder: Path, label: str, target: str, make_args: list[str]) -> Figure:
    """Run ``make TARGET ARGS`` in ``folder``, echoing its output, and time it."""
    load_before, cpu_before = os.getloadavg()[0], cpu_seconds_of_children()
    started = time.monotonic()
    process = subprocess.Popen(["make", target, *make_args], cwd=folder, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    status = process.wait()
    return Figure(label, status, time.monotonic() - started,
                  cpu_seconds_of_children() - cpu_before, load_before, os.getloadavg()[0],
                  "".join(lines))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "memory unknown"


def machine_words(clone_dir: Path) -> str:
    """The machine in words: CPU, cores, memory, system, the clone's Python and torch."""
    python = clone_dir / ".venv" / "bin" / "python"
    torch = "torch not installed"
    if python.exists():
        probe = subprocess.run([str(python), "-c", "import torch, sys; print(torch.__version__, "
                                "sys.version.split()[0])"], capture_output=True, text=True)
        if probe.returncode == 0:
            version, py = probe.stdout.split()
            torch = f"Python {py}, torch {version}"
    gpu = "an NVIDIA GPU" if shutil.which("nvidia-smi") else "no GPU"
    return (f"{_cpu_model()}, {os.cpu_count()} cores, {_memory_gib()}, {gpu}; "
            f"{platform.system()}; {torch}")


def latest_manifest(clone_dir: Path) -> dict | None:
    """The manifest of the newest run folder ``make run`` left in the clone."""
    runs = sorted((clone_dir / "papermill_runs").glob("*/manifest.json"))
    return json.loads(runs[-1].read_text()) if runs else None


# ---------------------------------------------------------------------------------- the page

def _s(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f}"


def _share(phases: dict) -> float | None:
    total = sum(phases.get(name) or 0.0 for name in PHASES)
    return sum(phases.get(name) or 0.0 for name in NOT_MEASURING) / total if total else None


def figures_table(figures: list[Figure], day: str) -> list[str]:
    rows = ["| command | took | load average before, after | CPU time |", "|---|---|---|---|"]
    for f in figures:
        took = f"{f.seconds:.0f} s on {day}" if f.status == 0 else f"failed ({f.status})"
        rows.append(f"| {f.label} | {took} | {f.load_before:.1f}, {f.load_after:.1f} | "
                    f"{f.cpu_s:.0f} s |")
    return rows


def check_lines(by_key: dict[str, Figure]) -> list[str]:
    serial, parallel = by_key.get("check-serial"), by_key.get("check")
    if not serial or not parallel or serial.status or parallel.status:
        return []
    ratio = parallel.seconds / serial.seconds
    verdict = "met" if ratio <= CHECK_RATIO_GOAL else "NOT met"
    return ["", f"`make check` on every core took {parallel.seconds:.0f} s against "
                f"{serial.seconds:.0f} s with its tests on one core, measured one after the "
                f"other: **{ratio:.2f} ×** (goal at most {CHECK_RATIO_GOAL} ×: {verdict})."]


MARKED = re.compile(r"(<!-- timings:check [^>]*-->\n).*?(<!-- /timings:check -->)", re.S)


def note_in_developing(text: str, figures: list[Figure], commit: str, when: datetime) -> str:
    """docs/developing.md's text with its marked note replaced by the serial and parallel
    figures of ``make check`` (the same as timings.md's; nothing else of the page changes)."""
    by_key = {next(k for k, v in STEPS.items() if v[0] == f.label): f for f in figures}
    lines = check_lines(by_key)
    if not lines:
        return text
    note = (f"Measured {when:%Y-%m-%d} at `{commit}` ([timings.md](timings.md)):"
            f" {lines[1]}\n")
    return MARKED.sub(lambda m: m.group(1) + note + m.group(2), text)


def phases_table(manifest: dict) -> list[str]:
    """Where the quick run's time went, per notebook (its manifest's ``phases``)."""
    rows = ["| notebook | seconds | kernel start | imports | measuring | analysis | export | "
            "not measuring |", "|---|---|---|---|---|---|---|---|"]
    totals = dict.fromkeys(PHASES, 0.0)
    kernels = float((manifest.get("kernels") or {}).get("seconds") or 0.0)
    if kernels:  # every kernel started at once before the first notebook (stagelab.run.kernels)
        totals["kernel_start_s"] += kernels
        rows.append(f"| every kernel, before the first notebook | {_s(kernels)} | {_s(kernels)} |"
                    " | | | | 100% |")
    for entry in manifest.get("notebooks", []):
        phases = entry.get("phases") or {}
        for name in PHASES:
            totals[name] += phases.get(name) or 0.0
        share = _share(phases)
        rows.append(f"| {entry['name']} | {_s(entry.get('duration_s'))} | "
                    + " | ".join(_s(phases.get(name)) for name in PHASES)
                    + f" | {'' if share is None else f'{share:.0%}'} |")
    share = _share(totals)
    rows.append(f"| **the run** | {_s(sum(totals.values()))} | "
                + " | ".join(_s(totals[name]) for name in PHASES)
                + f" | **{'' if share is None else f'{share:.0%}'}** |")
    if share is not None:
        verdict = "met" if share <= NON_MEASUREMENT_GOAL else (
            f"NOT met, by {100 * (share - NON_MEASUREMENT_GOAL):.0f} percentage points")
        where = "the kernels' and notebooks'" if kernels else "the notebooks'"
        rows += ["", f"Not measuring: **{share:.0%}** of {where} {sum(totals.values()):.1f} s "
                     f"(goal at most {NON_MEASUREMENT_GOAL:.0%}: {verdict})."]
    return rows


def page(figures: list[Figure], manifest: dict | None, commit: str, machine: str,
         cache: str, when: datetime) -> str:
    """docs/timings.md from the figures of one invocation."""
    day = f"{when:%Y-%m-%d}"
    by_key = {next(k for k, v in STEPS.items() if v[0] == f.label): f for f in figures}
    lines = [
        "# Timings",
        "",
        "<!-- Generated by scripts/bench_fresh_clone.py --write docs/timings.md: do not edit by "
        "hand. -->",
        "",
        f"Measured {when:%Y-%m-%d %H:%M} UTC at commit `{commit}`, in a fresh clone, one "
        "command after the other, by `python3 scripts/bench_fresh_clone.py --write "
        "docs/timings.md`. The machine: "
        f"{machine}. uv's cache was {cache} at the start. These figures say how long the "
        "commands take on this machine; they are not results about staging. Other processes "
        "slow them: the load average (1 minute) before and after each is beside it, and the CPU "
        "time (user and system, every process it started) changes far less with the load than "
        "the wall time. A command the table does not list has not been timed.",
        "",
        *figures_table(figures, day),
        *check_lines(by_key),
    ]
    if manifest is not None:
        lines += [
            "",
            "## Where the quick run's time goes",
            "",
            f"`make run`'s notebooks ({manifest.get('run_id', '')}), from each notebook entry's "
            "`phases` in the run's `manifest.json`, in seconds: kernel start (every kernel "
            "started at once, each importing what its notebook imports, before the first "
            "notebook: the first row; then per notebook papermill's set-up and saves, its "
            "kernel's connection and stop), imports (the first cell until the notebook's "
            "imports were done), measuring (the sweeps, the hardware snapshot, the host-rate "
            "and read-rate probes), analysis (the other cells: tables, plots, the verdict), "
            "export (its HTML, once, when the run has ended). The run's own start (its kernel "
            "spec, the hardware snapshot of its manifest) and its index pages are outside the "
            "notebooks.",
            "",
            *phases_table(manifest),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the repository to clone")
    parser.add_argument("--only", choices=list(STEPS), action="append",
                        help="time only these (repeatable; default: setup, run, check on one "
                             "core and on every core)")
    parser.add_argument("--test", action="store_true", help="time make test too (long)")
    parser.add_argument("--write", type=Path, help="write the page here (docs/timings.md)")
    parser.add_argument("--keep", action="store_true", help="keep the clone")
    args = parser.parse_args(argv)
    keys = args.only or ["setup", "run", "check-serial", "check", *(["test"] if args.test else [])]
    folder = Path(tempfile.mkdtemp(prefix="stagelab-fresh-clone-"))
    clone_dir = folder / "stagelab"
    figures: list[Figure] = []
    try:
        commit, cache, when = clone(args.repo, clone_dir), uv_cache_state(), datetime.now(UTC)
        for key in keys:
            label, target, make_args = STEPS[key]
            if PREREQUISITES.get(target):  # their extras are set-up, not the figure
                subprocess.run(["make", *PREREQUISITES[target]], cwd=clone_dir, check=False,
                               capture_output=True)
            figures.append(timed_make(clone_dir, label, target, make_args))
            print(f"\n{label}: {'ok' if figures[-1].status == 0 else 'FAILED'} in "
                  f"{figures[-1].seconds:.0f} s (load average {figures[-1].load_before:.1f} "
                  f"before, {figures[-1].load_after:.1f} after; CPU {figures[-1].cpu_s:.0f} s)\n")
        manifest = latest_manifest(clone_dir) if "run" in keys else None
        machine = machine_words(clone_dir)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    text = page(figures, manifest, commit, machine, cache, when)
    print(text)
    if args.write:
        failed = [f.label for f in figures if f.status]
        if failed:
            print(f"not written: {', '.join(failed)} failed", file=sys.stderr)
        else:
            args.write.write_text(text)
            developing = args.write.parent / "developing.md"
            if developing.exists():
                developing.write_text(note_in_developing(developing.read_text(), figures,
                                                         commit, when))
            print(f"written: {args.write} (and its note in {developing.name})")
    if args.keep:
        print(f"clone kept: {clone_dir}")
    return next((f.status for f in figures if f.status), 0)


if __name__ == "__main__":
    sys.exit(main())
