"""Device facts at the ground floor: is there CUDA, pinned memory, and what to call a device.

Everything that needs to know whether a GPU exists imports this module, and nothing here imports
another stagelab module but :mod:`stagelab.core.errors`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from stagelab.core.errors import PinnedMemoryUnavailable

__all__ = ["PinnedMemoryUnavailable", "cuda_present", "default_device", "device_label",
           "pinned_allocator", "require_cuda", "sync_warnings", "synchronize", "wait_event"]


def torch_version() -> str:
    """The version of the torch this process imported (e.g. ``2.13.0+cpu``)."""
    return torch.__version__


def cuda_present() -> bool:
    """Whether pinned memory and CUDA copies can be used on this machine."""
    return torch.cuda.is_available()


def default_device() -> str:
    """``cuda`` where a CUDA device exists, else ``cpu``."""
    return "cuda" if cuda_present() else "cpu"


def require_cuda(what: str) -> None:
    """Raise :class:`PinnedMemoryUnavailable`, naming ``what``, where there is no CUDA device."""
    if not cuda_present():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise PinnedMemoryUnavailable(
            f"{what}: pinned host memory needs a CUDA device, and this machine has none "
            f"(torch {torch.__version__}, {build})")


def pinned_footprint(nbytes: int) -> int:
    """The page-locked bytes torch's caching host allocator holds for a request of ``nbytes``:
    it rounds each block up to a power of two (512 MiB for 268 MB)."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 0 else 0


def pinned_allocator(nbytes: int) -> torch.Tensor:
    """torch's pinned allocation of ``nbytes`` bytes (its caching host allocator)."""
    require_cuda("pinned_allocator")
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def device_label(device: torch.device | str) -> str:
    """The ``device`` column of a measurement row: ``cpu`` or ``cuda:0 <name>``."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} {torch.cuda.get_device_name(index)}"


def synchronize(device: torch.device | str) -> None:
    """The library's one explicit host wait: wait for all queued work on a CUDA ``device``;
    nothing on a CPU, where work runs when it is called. Call it as ``device.synchronize`` (the
    module attribute), so that :class:`stagelab.measure.testing.SyncCounter` can count it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wait_event(event: torch.cuda.Event) -> None:
    """The library's other explicit host wait: until one recorded CUDA event is reached (a
    deferred copy's end), never for the work queued after it (the next forward). Call it as
    ``device.wait_event``, so that :class:`stagelab.measure.testing.SyncCounter` counts it."""
    event.synchronize()


def sync_warnings(call: Callable[[], object]) -> list[str]:
    """The synchronizing-operation warnings of one call under ``set_sync_debug_mode("warn")``,
    after an unobserved warm-up call, as ``file:line: message`` (CUDA only)."""
    require_cuda("sync_warnings")
    call()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return [f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0]}"
            for w in caught if "synchroniz" in str(w.message)]
