"""Is the machine busy? The load around a measurement, read from ``/proc``; standard library only.

Timings taken while other jobs load the machine can be many times off (a run made on a loaded
2-core machine came out 5-45x off a quiet one). So the runner watches each notebook: the 1-minute
load average (the largest seen), the CPU time that processes outside this run's process tree took
meanwhile, and the time the hypervisor stole from this virtual machine (``steal`` in
``/proc/stat``, where the kernel reports it). :func:`assess` turns two readings and the load
averages seen into one JSON-ready summary with ``busy`` and the reasons in plain words.

Where ``/proc`` cannot be read (not Linux), the summary says so and ``busy`` is None: unknown,
never a guess. Importable on the measuring floor (no third-party package).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")
# Busy when other processes took at least this many cores on average while a notebook ran ...
OTHERS_CORES_LIMIT = 0.5
# ... or the hypervisor stole at least this share of the machine's CPU time.
STEAL_SHARE_LIMIT = 0.05
SAMPLE_EVERY_S = 2.0
SAMPLER_THREAD = "stagelab load"  # the name of a LoadWatch's sampling thread


@dataclass(frozen=True)
class Reading:
    """One look at the machine: wall clock, the CPU seconds all cores spent busy and stolen, the
    CPU seconds this run's process tree has used, and the 1-minute load average."""

    wall_s: float
    busy_cpu_s: float
    steal_cpu_s: float | None
    own_cpu_s: float
    load1: float
    cpus: int
    source: str = "the whole host (/proc/stat)"


def _ticks_per_s() -> int:
    return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(proc: Path = PROC, cpus: frozenset[int] | None = None) -> tuple[
        float, float | None]:
    """Busy and stolen CPU seconds since boot of all cores (the ``cpu`` line of /proc/stat), or
    of the cores ``cpus`` (their ``cpuN`` lines). Busy counts everything but idle, iowait and
    steal; steal is None where the kernel does not report it (fewer than 8 fields)."""
    lines = (proc / "stat").read_text().splitlines()
    if cpus is None:
        chosen = [lines[0]]
    else:
        chosen = [line for line in lines if line.startswith("cpu") and line[3:4].isdigit()
                  and int(line.split()[0][3:]) in cpus]
    busy, hz = 0, _ticks_per_s()
    steal: int | None = 0
    for line in chosen:
        ticks = [int(x) for x in line.split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq = (ticks + [0] * 7)[:7]
        busy += user + nice + system + irq + softirq
        steal = None if steal is None or len(ticks) <= 7 else steal + ticks[7]
    return busy / hz, (None if steal is None else steal / hz)


def own_cpus(proc: Path = PROC) -> frozenset[int] | None:
    """The cores this process may run on, where they are fewer than the host's (a container or
    a job pinned by its affinity, or a cgroup cpuset); None where it may use them all."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    mine = frozenset(os.sched_getaffinity(0))
    listed = [line.split()[0] for line in (proc / "stat").read_text().splitlines()
              if line.startswith("cpu") and line[3:4].isdigit()]
    return mine if mine and len(mine) < len(listed) else None


def _stat_fields(stat_text: str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    return stat_text[stat_text.rindex(")") + 2:].split()


def tree_cpu_seconds(root_pid: int, proc: Path = PROC) -> float:
    """CPU seconds used by ``root_pid`` and its live descendants, each with its reaped children
    (a child's time moves into its parent's when it is waited for, so nothing is lost)."""
    parents, used = {}, {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = _stat_fields(stat.read_text())
        except (OSError, ValueError):
            continue  # the process ended while we looked
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        used[pid] = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    tree, frontier = set(), {root_pid}
    while frontier:
        tree |= frontier
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - tree
    return sum(used.get(pid, 0) for pid in tree) / _ticks_per_s()


def read_machine(root_pid: int | None = None, proc: Path = PROC) -> Reading:
    """The machine now, seen from the process tree of ``root_pid`` (default: this process):
    the cores this process may use (its affinity) where they are fewer than the host's, else
    the whole host; ``source`` says which."""
    cpus = own_cpus(proc)
    busy, steal = cpu_seconds(proc, cpus)
    load1 = float((proc / "loadavg").read_text().split()[0])
    source = ("the whole host (/proc/stat)" if cpus is None else
              f"this process's {len(cpus)} cores (affinity; /proc/stat per core)")
    return Reading(wall_s=time.monotonic(), busy_cpu_s=busy, steal_cpu_s=steal,
                   own_cpu_s=tree_cpu_seconds(root_pid or os.getpid(), proc), load1=load1,
                   cpus=len(cpus) if cpus else os.cpu_count() or 1, source=source)


def assess(start: Reading, end: Reading, loads: list[float] | None = None) -> dict[str, Any]:
    """The load between two readings as a JSON-ready summary: seconds, cores, the largest load
    average seen, the CPU seconds others took (and on average how many cores), the stolen share,
    ``busy`` and, when busy, why in plain words."""
    seconds = max(end.wall_s - start.wall_s, 1e-9)
    others = max(0.0, (end.busy_cpu_s - start.busy_cpu_s) - (end.own_cpu_s - start.own_cpu_s))
    steal = (None if start.steal_cpu_s is None or end.steal_cpu_s is None
             else max(0.0, end.steal_cpu_s - start.steal_cpu_s))
    steal_share = None if steal is None else steal / (seconds * end.cpus)
    why = []
    if others / seconds >= OTHERS_CORES_LIMIT:
        why.append(f"other processes took {others / seconds:.2f} of {end.cpus} cores on average "
                   f"(limit {OTHERS_CORES_LIMIT})")
    if steal_share is not None and steal_share >= STEAL_SHARE_LIMIT:
        why.append(f"the hypervisor stole {steal_share:.0%} of the CPU time "
                   f"(limit {STEAL_SHARE_LIMIT:.0%})")
    return {"seconds": round(seconds, 2), "cpus": end.cpus,
            "load_avg_max": max([start.load1, end.load1, *(loads or [])]),
            "others_cpu_s": round(others, 2), "others_cores": round(others / seconds, 3),
            "steal_share": None if steal_share is None else round(steal_share, 4),
            "busy": bool(why), "why": why, "source": end.source}


def unknown(reason: str) -> dict[str, Any]:
    """The summary where the load could not be read: ``busy`` unknown (None), and why."""
    return {"busy": None, "why": [], "unavailable": reason}


_PAUSED = threading.Event()  # set while timed rounds run: the sampler skips its wake-ups


@contextlib.contextmanager
def sampling_paused() -> Iterator[None]:
    """Hold every :class:`LoadWatch`'s periodic sampling while the block runs (timed rounds);
    the readings at its start and end are unaffected."""
    already = _PAUSED.is_set()
    _PAUSED.set()
    try:
        yield
    finally:
        if not already:
            _PAUSED.clear()


@dataclass
class LoadWatch:
    """Watch the machine while a block runs: a reading at the start and end, the 1-minute load
    average every ``every_s`` seconds in a daemon thread. ``summary`` holds :func:`assess`'s
    result afterwards (or :func:`unknown`'s where /proc cannot be read)."""

    read: Callable[[], Reading] = read_machine
    every_s: float = SAMPLE_EVERY_S
    summary: dict[str, Any] | None = None
    _start: Reading | None = None
    _loads: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> LoadWatch:
        try:
            self._start = self.read()
        except (OSError, ValueError, IndexError) as exc:
            self.summary = unknown(f"the machine's load cannot be read here ({exc})")
            return self
        self._thread = threading.Thread(target=self._sample, name=SAMPLER_THREAD, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            if _PAUSED.is_set():
                continue
            try:
                self._loads.append(self.read().load1)
            except (OSError, ValueError, IndexError):
                return

    def __exit__(self, *_exc: Any) -> None:
        if self._start is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.summary = assess(self._start, self.read(), self._loads)
        except (OSError, ValueError, IndexError) as exc:
            self.summary = unknown(f"the machine's load cannot be read here ({exc})")
