"""The step's timeline at one cell: each step arm's short sequence of decode steps, as the
timed calls run them (:mod:`stagelab.measure.sequence`), recorded under ``torch.profiler``
(:func:`stagelab.measure.timeline.record`) after the sweep, never inside a timed call."""

from __future__ import annotations

import functools

import torch

from stagelab.measure import sequence, step, timeline
from stagelab.measure.device import default_device
from stagelab.measure.shapes import ModelShape

DEFAULT_STEPS = 3  # a first step, one whose wait is deferred, and the drained last


def record(shape: ModelShape, rows: int, k: int, logits_dtype: torch.dtype,
           arms: list[str] | None, *, steps: int = DEFAULT_STEPS, device: str | None = None,
           forward_ms: float | None = None, seed: int = 0,
           log_softmax: str = "device") -> bytes:
    """One sequence of ``steps`` steps per arm that can run here (``arms=None``: every step
    arm), the forward queued before each as in the sweep (``forward_ms``; None: the cell's
    model's default); the compressed Chrome trace. Raises ValueError naming ``timeline_steps``
    (the notebook's parameter) below 1."""
    sequence.check_steps(steps, "timeline_steps")
    device = device or default_device()
    built, _ = step.build_pipelines(step.chosen_arms(arms), log_softmax)
    if forward_ms is None:
        forward_ms = step.default_forward_ms(shape, device, rows)[0]
    load = step.ForwardLoad(forward_ms, device)
    generator = torch.Generator(device=device).manual_seed(seed)
    inputs = []
    for _ in range(steps):
        logits = (3 * torch.randn(rows, shape.vocab, device=device, generator=generator)).to(
            logits_dtype)
        tokens = torch.randint(0, shape.vocab, (rows,), device=device, generator=generator)
        inputs.append((logits, tokens, tokens.cpu()))
    return timeline.record({name: functools.partial(sequence.run, pipeline, load.queue, inputs, k)
                            for name, pipeline in built.items()}, device)
