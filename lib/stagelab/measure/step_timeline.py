"""The step's timeline at one cell: each step arm's short sequence of decode steps, as the
timed calls run them (:mod:`stagelab.measure.sequence`), recorded under ``torch.profiler``
(:func:`stagelab.measure.timeline.record`) after the sweep, never inside a timed call."""

from __future__ import annotations

import functools

import torch

from stagelab.measure import memory, sequence, step, timeline
from stagelab.measure.device import default_device
from stagelab.measure.shapes import ModelShape

DEFAULT_STEPS = 3  # a first step, one whose wait is deferred, and the drained last


def check_fits(shape: ModelShape, rows: int, logits_dtype: torch.dtype, steps: int,
               device: str) -> None:
    """Raise InsufficientMemory where ``steps`` logits of ``[rows, V]`` (where the forward
    writes them) and an arm's fp32 ``[rows, V]`` staging and copy (on the host) would not fit."""
    itemsize = torch.empty((), dtype=logits_dtype).element_size()
    logits, staged = steps * rows * shape.vocab * itemsize, 3 * rows * shape.vocab * 4
    what = f"the timeline at n={rows} V={shape.vocab} ({steps} steps)"
    if torch.device(device).type == "cuda":
        memory.check_fits(logits, memory.free_device_bytes(device), f"{what} on {device}")
        logits = 0
    memory.check_fits(logits + staged, memory.free_host_bytes(), f"{what} on the host")


def record(shape: ModelShape, rows: int, k: int, logits_dtype: torch.dtype,
           arms: list[str] | None, *, steps: int = DEFAULT_STEPS, device: str | None = None,
           forward_ms: float | None = None, seed: int = 0,
           log_softmax: str = "device") -> bytes:
    """One sequence of ``steps`` steps per arm that can run here (``arms=None``: every step
    arm), the forward queued before each as in the sweep (``forward_ms``; None: the cell's
    model's default); the compressed Chrome trace. Raises ValueError naming ``timeline_steps``
    (the notebook's parameter) below 1, and InsufficientMemory, before anything large is
    allocated, where the sequence would not fit."""
    sequence.check_steps(steps, "timeline_steps")
    device = device or default_device()
    check_fits(shape, rows, logits_dtype, steps, device)
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
