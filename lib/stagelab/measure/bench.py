"""Interleaved timing of several arms in a balanced order, with warm-up, rounds and an A/A twin.

Each round runs every arm once, so slow drift (thermal, page cache, a neighbour's load) falls on
all arms of a round alike; the round index is recorded as ``round``, so the arms' samples pair by
round. The order is balanced (:func:`stagelab.core.design.balanced_orders`): every arm takes every
position equally often (within one), from a seed the caller draws per run and cell, recorded as a
record of metric ``order_seed``; each sample's place in its round is recorded as ``position``.
With a :class:`Precision`, rounds are added after the first ``rounds`` while a decisive
comparison's CI still straddles its bar and a cap allows, and why it stopped is recorded (metric
``rounds``). On a GPU each call is timed with CUDA
events and cross-checked with the host clock after a synchronize (``clock_agrees``); on CPU with
``time.perf_counter``. Warm-up rounds are run and discarded. An arm may return ``{stage: seconds}``
to report its parts; the whole call is always recorded as stage ``total``. An arm that raises is
recorded once as ``failed`` with the error's first line and dropped from later rounds; the other
arms go on.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from stagelab.core import design
from stagelab.measure import busy

__all__ = ["ArmCall", "Precision", "Timer", "interleaved", "pick", "rotating"]

ArmCall = Callable[[int], "Mapping[str, float] | object"]
# The host clock also counts the launch and the final synchronize: it may exceed the events by this
# much, plus this fraction of the event time, and still agree.
CLOCK_SLACK_S, CLOCK_SLACK_FRACTION = 0.5e-3, 0.10


def clocks_agree(event_seconds: float, host_seconds: float) -> bool:
    """Whether a host-clock reading agrees with the CUDA events of the same call."""
    slack = CLOCK_SLACK_S + CLOCK_SLACK_FRACTION * event_seconds
    return abs(host_seconds - event_seconds) <= slack


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: what a failed row's note says."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


class Timer:
    """Times one call: CUDA events plus the host clock on a GPU, ``perf_counter`` elsewhere."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        device = torch.device(device or "cpu")
        self.cuda = device.type == "cuda"
        self.name = "cuda_event" if self.cuda else "perf_counter"

    def time(self, call: Callable[[], object]) -> tuple[float, float | None, object]:
        """Run ``call`` once; return (seconds, host seconds or None, what the call returned)."""
        if not self.cuda:
            start = time.perf_counter()
            result = call()
            return time.perf_counter() - start, None, result
        torch.cuda.synchronize()
        start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
            enable_timing=True)
        host_start = time.perf_counter()
        start_event.record()
        result = call()
        end_event.record()
        torch.cuda.synchronize()
        host = time.perf_counter() - host_start
        return start_event.elapsed_time(end_event) / 1e3, host, result


@dataclass(frozen=True)
class Precision:
    """Rounds until resolved: after the first ``rounds``, add rounds while the paired speedup of
    any of ``comparisons`` (``(baseline, candidate)`` arm pairs: the bundle, reuse alone, pinning
    alone) has a CI that straddles ``bar`` (checked every ``every`` rounds,
    :func:`stagelab.core.design.resolved`), until ``max_rounds`` rounds or ``max_seconds`` of
    timing are reached; stop once every comparison that was timed lies wholly on one side of the
    bar, never before ``min_rounds`` (a decision's own floor,
    :data:`stagelab.core.design.TAIL_ROUNDS`). A comparison whose arm was not timed (failed,
    unavailable) is left out; with none timed, the rounds run to a cap."""

    comparisons: tuple[tuple[str, str], ...]
    bar: float
    max_rounds: int
    max_seconds: float = math.inf
    confidence: float = 0.95
    every: int = 5
    min_rounds: int = 0

    def __post_init__(self) -> None:
        if not (self.bar >= 1 and self.max_seconds > 0 and self.every >= 1):
            raise ValueError(f"precision: bar must be at least 1, max_seconds and every "
                             f"positive, got {self.bar}, {self.max_seconds}, {self.every}")
        if not self.comparisons:
            raise ValueError("precision: comparisons is empty: nothing to resolve")

    def reason(self, records: list[dict], done: int, elapsed: float) -> str | None:
        """Why to stop after ``done`` rounds, or None to go on."""
        timed = [(pair, found) for pair in self.comparisons
                 if (found := _paired_totals(records, *pair))]
        open_pairs = [f"{c} vs {b}" for (b, c), found in timed
                      if not design.resolved(*found, self.bar, self.confidence)]
        if timed and not open_pairs and done >= self.min_rounds:
            return (f"{design.RESOLVED}: every comparison's CI lies on one side of the bar "
                    f"{self.bar:.4f} ({len(timed)} compared)")
        still = "; straddling: " + ", ".join(open_pairs) if open_pairs else ""
        if done >= self.max_rounds:
            return f"{design.ROUND_CAP}: {done} rounds{still}"
        if elapsed >= self.max_seconds:
            return f"{design.TIME_CAP}: {elapsed:.1f} s >= {self.max_seconds:g} s{still}"
        return None


def _paired_totals(records: list[dict], baseline: str,
                   candidate: str) -> tuple[list[float], list[float]] | None:
    """The two arms' total seconds over the rounds both have, in round order."""
    totals: dict[str, dict[int, float]] = {baseline: {}, candidate: {}}
    for record in records:
        if record.get("stage") == "total" and record.get("arm") in totals:
            totals[record["arm"]][record["round"]] = record["seconds"]
    shared = sorted(set(totals[baseline]) & set(totals[candidate]))
    if not shared:
        return None
    return [totals[baseline][r] for r in shared], [totals[candidate][r] for r in shared]


@contextlib.contextmanager
def quiet_rounds() -> Iterator[None]:
    """While rounds run: Python's garbage collected once, then frozen and disabled, and the
    load sampler (:func:`stagelab.measure.busy.sampling_paused`) quiet, so neither runs inside
    a timed call; all restored afterwards."""
    gc.collect()
    gc.freeze()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with busy.sampling_paused():
            yield
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()


def _check_schedule(arms: Mapping[str, ArmCall], rounds: int, warmup: int, steps: int) -> None:
    """A ValueError naming the parameter that cannot be timed: no arm, no round, a negative
    warm-up, a sequence of no step."""
    if rounds <= 0:
        raise ValueError(f"rounds must be positive, got {rounds}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not arms:
        raise ValueError("arms is empty: nothing to time")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")


def interleaved(arms: Mapping[str, ArmCall], *, rounds: int, warmup: int = 2, seed: int = 0,
                device: torch.device | str | None = None, precision: Precision | None = None,
                after_round: Callable[[], None] | None = None, steps: int = 1,
                after_call: Callable[[str, int], None] | None = None) -> list[dict]:
    """Run every arm ``warmup + rounds`` times in a balanced order (more rounds with a
    ``precision``); return timing records. ``after_round`` is called between rounds (``stagelab
    measure`` raises there a stop request that a finalizer swallowed); ``after_call`` after each
    call, untimed, with the arm and its round (negative in the warm-up: -warmup to -1), so that
    a cell of long calls can say how far it is.

    ``arms[name](round_index)`` performs one round (the index lets it rotate its sources). Each
    record has ``arm``, ``stage``, ``round``, ``position``, ``seconds``, ``host_seconds`` and
    ``timer``, ready for :func:`stagelab.core.schema.make_rows`; one more records the order's seed, and
    with a ``precision`` one the rounds done and why they stopped. ``steps``: the consecutive
    steps each call runs (the step experiment's sequence): its ``total`` is recorded per step,
    the call's seconds divided by it (the clocks compared before).
    """
    _check_schedule(arms, rounds, warmup, steps)
    cap = rounds if precision is None else precision.max_rounds
    if cap < rounds:
        raise ValueError(f"precision.max_rounds ({cap}) must be at least rounds ({rounds})")
    timer = Timer(device)
    orders = design.balanced_orders(list(arms), cap, seed)
    alive = set(arms)
    records: list[dict] = [{"arm": "order", "metric": "order_seed", "value": float(seed),
                            "note": f"balanced order (Williams rows) of {len(arms)} arms, "
                                    f"seed {seed}"}]
    with quiet_rounds():  # no collector pass or sampler wake-up inside a timed call
        started = time.perf_counter()
        for index in range(warmup + cap):
            measured = index - warmup
            order = [name for name in orders[measured if measured >= 0 else index % cap]
                     if name in alive]
            for position, name in enumerate(order):
                try:
                    seconds, host, result = timer.time(functools.partial(arms[name], index))
                except Exception as exc:  # one arm's failure must not cost the others their data
                    alive.discard(name)
                    records.append({"arm": name, "status": "failed", "note": first_line(exc),
                                    "round": max(measured, 0)})
                    continue
                if measured >= 0:
                    records += _round_records(name, measured, position, seconds, host, result,
                                              timer.name, steps)
                if after_call is not None:
                    after_call(name, measured)
            if after_round is not None:
                after_round()
            done = measured + 1
            if done < rounds or precision is None:
                continue
            if (done - rounds) % precision.every == 0 or done == cap:
                reason = precision.reason(records, done, time.perf_counter() - started)
                if reason:
                    records.append({"arm": "rounds", "metric": "rounds", "value": float(done),
                                    "note": reason})
                    break
    return records


def _round_records(name: str, round_index: int, position: int, seconds: float,
                   host: float | None, result: object, timer: str, steps: int = 1) -> list[dict]:
    """The ``total`` record of one timed call (per step of its ``steps``), and one per stage
    the arm reported."""
    records = [{"arm": name, "stage": "total", "round": round_index, "position": position,
                "seconds": seconds / steps, "host_seconds": None if host is None else host / steps,
                "timer": timer,
                "clock_agrees": None if host is None else clocks_agree(seconds, host)}]
    if isinstance(result, Mapping):
        records += [{"arm": name, "stage": stage, "round": round_index, "position": position,
                     "seconds": float(value), "timer": timer} for stage, value in result.items()]
    return records


def rotating(make: Callable[[int], torch.Tensor], count: int) -> list[torch.Tensor]:
    """``count`` distinct sources, so that consecutive rounds never reread a cached one."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    return [make(i) for i in range(count)]


def pick(sources: list[torch.Tensor], round_index: int) -> torch.Tensor:
    """The source to use in a round."""
    return sources[round_index % len(sources)]
