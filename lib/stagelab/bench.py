"""Interleaved, randomized timing of several arms, with warm-up, repeats and an A/A twin.

Each round runs every arm once, in an order shuffled per round, so slow drift (thermal, page cache,
a neighbour's load) falls on all arms alike instead of on whichever ran last. On a GPU each call is
timed with CUDA events and cross-checked with the host clock after a synchronize (a pageable copy
is synchronous, so both must agree); on CPU with ``time.perf_counter``. Warm-up rounds are run and
discarded. An arm may return ``{stage: seconds}`` to report its parts; the whole call is always
recorded as stage ``total``.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Mapping

import torch
from tqdm import tqdm

from stagelab.schema import aa_name

__all__ = ["ArmCall", "Timer", "aa_name", "interleaved", "pick", "rotating"]

ArmCall = Callable[[int], "Mapping[str, float] | object"]


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


def interleaved(arms: Mapping[str, ArmCall], *, repeats: int, warmup: int = 2, seed: int = 0,
                device: torch.device | str | None = None, progress: bool = False,
                label: str = "") -> list[dict]:
    """Run every arm ``warmup + repeats`` times in shuffled order per round; return timing records.

    ``arms[name](round_index)`` performs one repeat (the index lets it rotate its sources). Each
    record has ``arm``, ``stage``, ``repeat``, ``seconds``, ``host_seconds`` and ``timer``, ready for
    :func:`stagelab.schema.make_rows`.
    """
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not arms:
        raise ValueError("arms is empty: nothing to time")
    timer = Timer(device)
    order = list(arms)
    shuffler = random.Random(seed)
    records: list[dict] = []
    rounds = range(warmup + repeats)
    for round_index in tqdm(rounds, desc=label or "rounds", disable=not progress, leave=False):
        shuffler.shuffle(order)
        for name in order:
            seconds, host, result = timer.time(lambda: arms[name](round_index))
            if round_index < warmup:
                continue
            repeat = round_index - warmup
            records.append({"arm": name, "stage": "total", "repeat": repeat, "seconds": seconds,
                            "host_seconds": host, "timer": timer.name})
            if isinstance(result, Mapping):
                records.extend({"arm": name, "stage": stage, "repeat": repeat,
                                "seconds": float(value), "host_seconds": None,
                                "timer": "perf_counter"} for stage, value in result.items())
    return records


def rotating(make: Callable[[int], torch.Tensor], count: int) -> list[torch.Tensor]:
    """``count`` distinct sources, so that consecutive repeats never reread a cached one."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    return [make(i) for i in range(count)]


def pick(sources: list[torch.Tensor], round_index: int) -> torch.Tensor:
    """The source to use in a round."""
    return sources[round_index % len(sources)]
