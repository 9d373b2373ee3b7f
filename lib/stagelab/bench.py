"""Interleaved, randomized timing of several arms, with warm-up, rounds and an A/A twin.

Each round runs every arm once, in an order shuffled per round, so slow drift (thermal, page cache,
a neighbour's load) falls on all arms alike instead of on whichever ran last; the round index is
recorded as ``round``, so the arms' samples pair by round. On a GPU each call is timed with CUDA
events and cross-checked with the host clock after a synchronize (``clock_agrees``); on CPU with
``time.perf_counter``. Warm-up rounds are run and discarded. An arm may return ``{stage: seconds}``
to report its parts; the whole call is always recorded as stage ``total``. An arm that raises is
recorded once as ``failed`` with the error's first line and dropped from later rounds; the other
arms go on.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Mapping

import torch

__all__ = ["ArmCall", "Timer", "interleaved", "pick", "rotating"]

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


def interleaved(arms: Mapping[str, ArmCall], *, rounds: int, warmup: int = 2, seed: int = 0,
                device: torch.device | str | None = None) -> list[dict]:
    """Run every arm ``warmup + rounds`` times in shuffled order per round; return timing records.

    ``arms[name](round_index)`` performs one round (the index lets it rotate its sources). Each
    record has ``arm``, ``stage``, ``round``, ``seconds``, ``host_seconds`` and ``timer``, ready for
    :func:`stagelab.schema.make_rows`.
    """
    if rounds <= 0:
        raise ValueError(f"rounds must be positive, got {rounds}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not arms:
        raise ValueError("arms is empty: nothing to time")
    timer = Timer(device)
    order = list(arms)
    shuffler = random.Random(seed)
    records: list[dict] = []
    for round_index in range(warmup + rounds):
        shuffler.shuffle(order)
        for name in list(order):
            try:
                seconds, host, result = timer.time(functools.partial(arms[name], round_index))
            except Exception as exc:  # one arm's failure must not cost the others their data
                order.remove(name)
                records.append({"arm": name, "status": "failed", "note": first_line(exc),
                                "round": max(round_index - warmup, 0)})
                continue
            if round_index >= warmup:
                records += _round_records(name, round_index - warmup, seconds, host, result,
                                          timer.name)
    return records


def _round_records(name: str, round_index: int, seconds: float, host: float | None, result: object,
                   timer: str) -> list[dict]:
    """The ``total`` record of one timed call, and one per stage the arm reported."""
    records = [{"arm": name, "stage": "total", "round": round_index, "seconds": seconds,
                "host_seconds": host, "timer": timer,
                "clock_agrees": None if host is None else clocks_agree(seconds, host)}]
    if isinstance(result, Mapping):
        records += [{"arm": name, "stage": stage, "round": round_index, "seconds": float(value),
                     "timer": timer} for stage, value in result.items()]
    return records


def rotating(make: Callable[[int], torch.Tensor], count: int) -> list[torch.Tensor]:
    """``count`` distinct sources, so that consecutive rounds never reread a cached one."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    return [make(i) for i in range(count)]


def pick(sources: list[torch.Tensor], round_index: int) -> torch.Tensor:
    """The source to use in a round."""
    return sources[round_index % len(sources)]
