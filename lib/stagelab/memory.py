"""Memory, measured honestly: free host and device memory, pinned bytes held, peaks.

Peaks: on a device, torch's allocator statistics. On the host, the kernel's high-water mark
(``VmHWM``) in a fresh process per configuration, because memory that an allocator kept from an
earlier step is reused without raising any counter; ``tracemalloc`` does not see torch tensors.
"""

from __future__ import annotations

from pathlib import Path

import torch


def _status_bytes(key: str, pid: str = "self") -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None


def free_host_bytes() -> int | None:
    """Host memory available to a new allocation without swapping (``MemAvailable``)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_device_bytes(device: torch.device | str) -> int | None:
    """Free memory on a CUDA device; None for the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free


class InsufficientMemory(MemoryError):
    """A configuration would not fit; raised before anything large is allocated."""


def check_fits(needed: int, free: int | None, what: str, margin: float = 0.9) -> None:
    """Raise InsufficientMemory when ``needed`` exceeds ``margin`` of ``free`` (None: unknown)."""
    if free is not None and needed > margin * free:
        raise InsufficientMemory(
            f"{what}: needs {needed / 2**30:.2f} GiB but only {free / 2**30:.2f} GiB is free "
            f"({margin:.0%} of it may be used)")


def pinned_host_bytes() -> int:
    """Pinned host bytes held by torch's caching host allocator (0 without CUDA)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    stats = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    for key in ("allocated_bytes.current", "reserved_bytes.current", "host_alloc_bytes.current"):
        if key in stats:
            return int(stats[key])
    return 0
