"""A timed call of the step experiment is a sequence of consecutive decode steps, as an engine
runs them: forward queued, step, next forward queued, step ... , the same for every arm.

Why: an arm whose wait is deferred (:mod:`stagelab.measure.deferred`) would otherwise leave its
copy pending when a call returns, and the harness's idle time between calls (other arms, the
between-rounds work) would finish it for free. Inside a sequence, each step's copy overlaps only
the next step's forward, as in the engine, and the last step is drained inside the call; the
figure is the call's time divided by its steps (:func:`per_step`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from stagelab.measure import logprobs as lp
from stagelab.measure import timeline
from stagelab.measure.deferred import DeferredStep, Stages

DEFAULT_STEPS = 4  # the full profile's: the drained last step a quarter of a deferred arm's
StepInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # logits, token ids, host ids


class Steps(Protocol):
    """A step arm that finishes each step inside its call (the seed's and the device arms)."""

    def run(self, logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
            host_token_ids: torch.Tensor) -> tuple[lp.LogprobsTensors, Stages]:
        """One step: its results and its stage seconds."""


def check_steps(steps: object, name: str = "steps_per_call") -> int:
    """``steps`` if it is an integer >= 1, else a ValueError naming the parameter ``name``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"{name}: {steps!r} must be an integer >= 1")
    return steps


def run(pipeline: Steps | DeferredStep, queue_forward: Callable[[], None],
        inputs: Sequence[StepInputs], num_logprobs: int) -> Stages:
    """Run ``inputs`` as consecutive decode steps (``queue_forward`` before each, as the decode
    forward the step follows); a deferred arm drained at the end, so that nothing it queued is
    left pending when the call returns. The stage seconds per step (their sums over the
    sequence, divided by its length)."""
    if not inputs:
        raise ValueError("inputs is empty: a sequence has at least one step")
    totals: Stages = {}
    for logits, token_ids, host_token_ids in inputs:
        with timeline.stage("forward"):
            queue_forward()
        if isinstance(pipeline, DeferredStep):
            _, stages = pipeline.step(logits, num_logprobs, token_ids, host_token_ids)
        else:
            _, stages = pipeline.run(logits, num_logprobs, token_ids, host_token_ids)
        _add(totals, stages)
    if isinstance(pipeline, DeferredStep):
        _add(totals, pipeline.drain()[1])
    return {name: seconds / len(inputs) for name, seconds in totals.items()}


def _add(totals: Stages, stages: Stages) -> None:
    for name, seconds in stages.items():
        totals[name] = totals.get(name, 0.0) + seconds


def per_step(seconds: float | None, steps: int) -> float | None:
    """A timed call's seconds as seconds per step (None stays None)."""
    return None if seconds is None else seconds / steps


def inputs(logits: Sequence[torch.Tensor], token_ids: Sequence[torch.Tensor],
           host_token_ids: Sequence[torch.Tensor], round_index: int,
           steps: int) -> list[StepInputs]:
    """The ``steps`` consecutive steps of one call in round ``round_index``: the rotating
    sources taken in turn, so that consecutive steps (and rounds) never reread one."""
    first = round_index * steps
    return [(logits[i % len(logits)], token_ids[i % len(token_ids)],
             host_token_ids[i % len(host_token_ids)]) for i in range(first, first + steps)]
