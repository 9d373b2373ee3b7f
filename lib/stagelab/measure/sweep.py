"""One sweep for every experiment: cells x arms, interleaved, fault-isolated, written per cell.

An experiment (staging, the step, prompt logprobs) describes only its cells (the sizes of each, what
memory a cell needs) and how to prepare a cell's arms. This module does the rest, the same way for
all of them:

* a cell that would not fit in free memory is recorded ``skipped``, with the numbers, before
  anything large is allocated;
* arms that cannot exist here (no CUDA, no compiler) are recorded ``unavailable`` with the reason;
* the arms are timed interleaved (:func:`stagelab.measure.bench.interleaved`); an arm that raises is
  recorded ``failed`` and the others go on; a cell whose preparation raises is recorded ``failed``
  for all its arms and the sweep goes on;
* after every cell its records go to a sink (:class:`stagelab.core.schema.TableSink` in a notebook,
  :class:`stagelab.core.schema.JsonLinesSink` under ``stagelab measure``), so an interrupted or killed
  run leaves every finished cell on disk;
* a watcher (:func:`watching`, set by ``stagelab measure``) is asked before each cell whether it
  may start (a deadline), called between rounds, and told how long each cell took;
* progress: a bar in JupyterLab where tqdm is importable; in headless runs (the runner sets
  ``STAGELAB_HEADLESS``) or without tqdm, one line per finished cell, never a flood, and, inside
  a cell whose plan asks for it (:func:`cell_progress`), a line at most every
  :data:`PROGRESS_EVERY_S` saying how far it is (before: notebook 03's one cell said nothing
  for 250 s).
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from stagelab.core import design
from stagelab.core.errors import DeadlineReached, InsufficientMemory
from stagelab.core.paths import HEADLESS_ENV
from stagelab.core.schema import RowSink
from stagelab.measure import bench, memory


@dataclass
class Cell:
    """One size of an experiment: the schema fields its rows share, the arms it should have, and
    the memory it needs (checked before anything is allocated)."""

    sizes: dict
    arms: list[str]
    label: str
    host_bytes: int = 0
    device_bytes: int = 0
    invalid: str = ""  # why this cell cannot be measured at all (recorded as skipped)
    words: str = ""  # the label as a reader is told it, where it differs (a CPU run's wording)

    @property
    def shown(self) -> str:
        """The cell in the words of progress lines and memory messages; ``label`` stays its
        identity (the manifest's cell, its seed of the balanced order)."""
        return self.words or self.label


@dataclass
class CellPlan:
    """A prepared cell: one call per arm, the arms that cannot run here, an optional monitor that
    wraps the timing loop, and a function giving the records measured after timing."""

    calls: dict[str, bench.ArmCall]
    unavailable: dict[str, str] = field(default_factory=dict)
    monitor: AbstractContextManager | None = None
    after: Callable[[], list[dict]] | None = None
    annotate: Callable[[dict], dict] | None = None  # adds per-arm fields to a timing record
    between_rounds: Callable[[], None] | None = None  # untimed work between two rounds
    between_calls: Callable[[str, int], None] | None = None  # after each call: (arm, round)
    steps: int = 1  # consecutive steps per call: each call's total is recorded per step


def rows_for_arms(cell: Cell, arms: Iterable[str], status: str, note: str) -> list[dict]:
    """One record per arm saying why it has no timings in this cell."""
    return [{**cell.sizes, "arm": arm, "status": status, "note": note} for arm in arms]


def check_memory(cell: Cell, device: str) -> None:
    """Raise InsufficientMemory when the cell would not fit on the host or the device."""
    memory.check_fits(cell.host_bytes, memory.free_host_bytes(), f"{cell.shown} on the host")
    if torch.device(device).type == "cuda":
        memory.check_fits(cell.device_bytes, memory.free_device_bytes(device),
                          f"{cell.shown} on {device}")


def memory_plan(cell: Cell, device: str) -> str:
    """Before a cell runs, in Markdown: the memory it needs at its largest, what is free, and
    whether it fits or will be refused (recorded ``skipped``, nothing large allocated)."""
    on_gpu = torch.device(device).type == "cuda"
    needed = cell.device_bytes if on_gpu else cell.host_bytes
    free = memory.free_device_bytes(device) if on_gpu else memory.free_host_bytes()
    where = device if on_gpu else "the host"
    try:
        check_memory(cell, device)
    except InsufficientMemory as exc:
        return (f"**Refused before it starts: {exc}.** Nothing large is allocated and the cell "
                "is recorded skipped; lower the sizes in the parameters to measure it here.")
    if free is None:
        return (f"Memory: {cell.shown} needs about {needed / 2**30:.1f} GiB on {where} at its "
                "largest; free memory cannot be read here, so it is not checked.")
    return (f"Memory: {cell.shown} needs about {needed / 2**30:.1f} GiB on {where} at its "
            f"largest; {free / 2**30:.1f} GiB is free, so it fits.")


def measure_cell(cell: Cell, prepare: Callable[[Cell], CellPlan], *, rounds: int, warmup: int,
                 seed: int, device: str, run: str = "",
                 precision: bench.Precision | None = None,
                 after_round: Callable[[], None] | None = None) -> list[dict]:
    """Every record of one cell: timings, or the rows that say why there are none. The arms'
    order is balanced and seeded per run and cell (:func:`stagelab.core.design.order_seed`)."""
    if cell.invalid:
        return rows_for_arms(cell, cell.arms, "skipped", cell.invalid)
    try:
        check_memory(cell, device)
        plan = prepare(cell)
    except InsufficientMemory as exc:
        return rows_for_arms(cell, cell.arms, "skipped", str(exc))
    except Exception as exc:  # a broken cell must not stop the sweep
        return rows_for_arms(cell, cell.arms, "failed", bench.first_line(exc))
    records = rows_for_arms(cell, plan.unavailable, "unavailable", "")
    for record, reason in zip(records, plan.unavailable.values()):
        record["note"] = reason
    if plan.calls:
        with plan.monitor or contextlib.nullcontext():
            timings = bench.interleaved(
                plan.calls, rounds=rounds, warmup=warmup, device=device, precision=precision,
                seed=design.order_seed(f"{run}:{seed}", cell.label),
                after_round=both(plan.between_rounds, after_round), steps=plan.steps,
                after_call=plan.between_calls)
        annotate = plan.annotate or (lambda record: record)
        records += [annotate({**cell.sizes, **timing}) if timing["arm"] in plan.calls
                    else {**cell.sizes, **timing} for timing in timings]  # not the order's row
    if plan.after is not None:
        try:
            records += [{**cell.sizes, **extra} for extra in plan.after()]
        except Exception as exc:
            records += rows_for_arms(cell, ["checks"], "failed", bench.first_line(exc))
    return records


def both(first: Callable[[], None] | None,
          then: Callable[[], None] | None) -> Callable[[], None] | None:
    """One between-rounds hook calling ``first`` then ``then`` (either may be None)."""
    if first is None or then is None:
        return first or then

    def hook() -> None:
        first()
        then()
    return hook


def guarded(name: str, check: Callable[..., list[dict]], *args: object) -> list[dict]:
    """A check's records, or one ``failed`` row naming it: one broken check costs no other's."""
    try:
        return check(*args)
    except Exception as exc:
        return [{"arm": name, "status": "failed", "note": bench.first_line(exc)}]


class Watcher(Protocol):
    """Asked before each cell whether it may start, told after each how long it took."""

    def admit(self, label: str, cell: Cell, rounds: int, warmup: int) -> bool:
        """False: ``cell`` is not started (e.g. it would pass a deadline); the sweep goes on
        to the next cell, which may fit, and raises DeadlineReached at its end."""

    def finished(self, label: str, cell: Cell, seconds: float, records: list[dict]) -> None:
        """Record a measured cell."""

    def after_round(self) -> None:
        """Called between the timing rounds of a cell (may raise to stop)."""


_WATCHER: contextvars.ContextVar[Watcher | None] = contextvars.ContextVar("watcher", default=None)


@contextlib.contextmanager
def watching(watcher: Watcher) -> Iterator[Watcher]:
    """Every sweep run inside asks ``watcher`` before each cell and reports to it after."""
    token = _WATCHER.set(watcher)
    try:
        yield watcher
    finally:
        _WATCHER.reset(token)


# Inside a long cell, a progress line at most this often (seconds): under the runner's
# heartbeat (:data:`stagelab.run.execute.HEARTBEAT_S`), so that it never says "still running".
PROGRESS_EVERY_S = 5.0


@dataclass
class CellProgress:
    """How far one cell is, in lines like the sweep's own (``label: cell i/N cell: ...``, so
    that the runner relays them), at most one every ``every_s`` seconds; the first only after
    ``every_s``, so a short cell says nothing more than its closing line."""

    label: str
    index: int
    total: int
    rounds: int
    warmup: int
    every_s: float
    said: float = field(default_factory=time.perf_counter)

    def say(self, cell: Cell, what: str) -> None:
        """Print ``what`` about ``cell`` unless a line was printed within ``every_s``."""
        now = time.perf_counter()
        if now - self.said < self.every_s:
            return
        self.said = now
        print(f"{self.label}: cell {self.index}/{self.total} {cell.shown}: {what}",
              file=sys.__stderr__, flush=True)

    def call(self, cell: Cell) -> Callable[[str, int], None]:
        """A :attr:`CellPlan.between_calls` hook saying the round and the arm just timed."""
        def after_call(arm: str, round_index: int) -> None:
            where = (f"warm-up {round_index + self.warmup + 1}/{self.warmup}" if round_index < 0
                     else f"round {round_index + 1}/{self.rounds}")
            self.say(cell, f"{where}, {arm} timed")
        return after_call


_PROGRESS: contextvars.ContextVar[CellProgress | None] = contextvars.ContextVar(
    "cell_progress", default=None)


def cell_progress() -> CellProgress | None:
    """The progress of the cell being measured, where its sweep prints lines (not in
    JupyterLab, where a bar moves, nor with progress off); None elsewhere."""
    return _PROGRESS.get()


def _progress_bar(total: int, label: str, shown: bool) -> Any:
    """tqdm's bar where tqdm is importable and a bar is wanted, else None: a widget where
    ipywidgets can draw one, else plain text on stdout (before: tqdm's text fallback wrote to
    stderr, which JupyterLab shows as a red error box)."""
    if not shown:
        return None
    try:
        from tqdm.std import tqdm as text_bar
    except ImportError:
        return None
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm as widget_bar
        return widget_bar(total=total, desc=label)
    return text_bar(total=total, desc=label, file=sys.stdout)


def run(cells: list[Cell], prepare: Callable[[Cell], CellPlan], *, rounds: int,
        warmup: int = 2, seed: int = 0, device: str, sink: RowSink | None = None,
        label: str = "sweep", progress: bool = True,
        precision: bench.Precision | None = None) -> list[dict]:
    """Measure every cell in order; hand each one's records to the sink when one is given. The
    sink's run id seeds each cell's arm order, with ``seed``; ``precision`` adds rounds until
    resolved (:class:`stagelab.measure.bench.Precision`).

    Raises :class:`~stagelab.core.errors.DeadlineReached`, once every cell was offered, when the
    watcher refused any: a smaller cell after a refused one still runs where it fits (a lease
    lists its largest cells first), and every measured cell is in the sink.
    """
    if rounds <= 0:
        raise ValueError(f"rounds must be positive, got {rounds}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    watcher = _WATCHER.get()
    bar = _progress_bar(len(cells), label, progress and not os.environ.get(HEADLESS_ENV))
    run = str(getattr(sink, "common", {}).get("run_id", ""))
    records: list[dict] = []
    refused: list[str] = []
    try:
        for index, cell in enumerate(cells, 1):
            if watcher is not None and not watcher.admit(label, cell, rounds, warmup):
                refused.append(cell.label)
                continue
            started = time.perf_counter()
            token = _PROGRESS.set(CellProgress(label, index, len(cells), rounds, warmup,
                                               PROGRESS_EVERY_S)
                                  if progress and bar is None else None)
            try:
                found = measure_cell(cell, prepare, rounds=rounds, warmup=warmup, seed=seed,
                                     device=device, run=run, precision=precision,
                                     after_round=watcher.after_round if watcher else None)
            finally:
                _PROGRESS.reset(token)
            records += found
            if sink is not None:
                sink.append(found)
            gc.collect()
            if watcher is not None:
                watcher.finished(label, cell, time.perf_counter() - started, found)
            if bar is not None:
                bar.update()
            elif progress:
                # the process's own stderr: the terminal under `stagelab measure`, kernel.log
                # under the runner, never a box in the exported notebook
                print(f"{label}: cell {index}/{len(cells)} {cell.shown}: {outcome(found)}",
                      file=sys.__stderr__, flush=True)
    finally:
        if bar is not None:
            bar.close()
    if refused:
        raise DeadlineReached(f"{label}: not started before the deadline: "
                              f"{'; '.join(refused)}")
    return records


def outcome(records: list[dict]) -> str:
    """A cell's records in a few words: how many arms (configurations: an arm at a chunk and
    tile) were timed, skipped, unavailable, failed."""
    counts: dict[str, set] = {}
    for record in records:
        status = record.get("status", "ok")
        if status != "ok" or record.get("stage") == "total":
            counts.setdefault(status, set()).add(
                (record.get("arm"), record.get("chunk"), record.get("tile")))
    return ", ".join(f"{len(arms)} {status}" for status, arms in sorted(counts.items())) or "empty"
