"""A timeline to look at: one short sequence of steps per step arm, recorded with
``torch.profiler`` (the device's kernels and copies where there is a device), as one compressed
Chrome trace that Perfetto opens.

Each arm's sequence sits in a range named :data:`ARM_PREFIX` + its name, each of its stages in a
range named :data:`STAGE_PREFIX` + the stage (:func:`stage`); the ranges exist only while a
timeline is recorded (:func:`labelled`), so a timed call carries none of them.
:mod:`stagelab.analyse.timeline` reads the trace back into rows.
"""

from __future__ import annotations

import contextlib
import contextvars
import gzip
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

import stagelab.measure.device
from stagelab.core import catalogue

ARM_PREFIX, STAGE_PREFIX = catalogue.TIMELINE_ARM_PREFIX, catalogue.TIMELINE_STAGE_PREFIX
MAX_BYTES = 16 * 2**20  # a lease returns files of at most 16 MiB
_RECORDING: contextvars.ContextVar[bool] = contextvars.ContextVar("timeline", default=False)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """A range named for the stage ``name`` while a timeline is recorded; nothing otherwise."""
    if not _RECORDING.get():
        yield
        return
    with torch.profiler.record_function(STAGE_PREFIX + name):
        yield


@contextlib.contextmanager
def labelled() -> Iterator[None]:
    """Inside, :func:`stage` names its ranges."""
    token = _RECORDING.set(True)
    try:
        yield
    finally:
        _RECORDING.reset(token)


def activities(device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    """The host's activity, and the device's where it is a CUDA device."""
    found = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        found.append(torch.profiler.ProfilerActivity.CUDA)
    return found


def record(sequences: Mapping[str, Callable[[], object]], device: torch.device | str) -> bytes:
    """Run each arm's sequence once (warmed by one run outside the profiler) under
    ``torch.profiler``, each in its named range and waited on before the next; the Chrome trace,
    gzip-compressed. Raises ValueError naming ``sequences`` where none is given, and where the
    trace would pass a lease's file limit (:data:`MAX_BYTES`)."""
    if not sequences:
        raise ValueError("sequences is empty: name at least one step arm")
    device = torch.device(device)
    for run in sequences.values():
        run()
    stagelab.measure.device.synchronize(device)
    with torch.profiler.profile(activities=activities(device)) as profile, labelled():
        for name, run in sequences.items():
            with torch.profiler.record_function(ARM_PREFIX + name):
                run()
                stagelab.measure.device.synchronize(device)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        profile.export_chrome_trace(str(path))
        packed = gzip.compress(path.read_bytes(), mtime=0)
    if len(packed) > MAX_BYTES:
        raise ValueError(f"sequences: the timeline's trace is {len(packed)} bytes compressed, "
                         f"above a lease's {MAX_BYTES}; time fewer steps or arms")
    return packed
