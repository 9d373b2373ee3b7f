"""Memory, measured honestly: free host and device memory, pinned bytes held, peaks.

Peaks: on a device, torch's allocator statistics. On the host, the kernel's high-water mark
(``VmHWM``) in a fresh process per configuration, because memory that an allocator kept from an
earlier configuration is reused without raising any counter (``tracemalloc`` does not see torch
tensors at all); inside that process, freed heap is trimmed before the measured call, and glibc
hands a freed block back at once (:data:`HOST_ALLOCATOR_ENV`), so that the peak is what the code
holds, not what the allocator chose to keep.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from stagelab.core.errors import InsufficientMemory

# glibc's malloc, left to itself, raises its mmap threshold after each large free and keeps freed
# blocks below it in the heap, resident: a probe's peak then counts what glibc kept, and moves from
# run to run (one head_fused configuration here: 15.7 and 23.4 MiB in two runs; with the threshold
# fixed, 8.1 and 8.2 MiB). Fixed, every block of 256 KiB or more goes back to the kernel when freed,
# and the host peak counts what the code holds, as torch's device statistics count allocated
# blocks. Other allocators (jemalloc, tcmalloc preloaded) ignore the variable.
HOST_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 * 1024)}


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
    """Memory a new tensor can get on a CUDA device: the driver's free memory plus what torch's
    caching allocator holds unused (an earlier cell's blocks); None for the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free + cached


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


def _reset_high_water_mark() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS; False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _release_freed_memory() -> None:
    """Return freed heap memory to the kernel, so that a later peak cannot hide in it."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: large blocks are unmapped on free anyway


PROBE_POLL_S = 0.02  # how often running probes are looked at
Target = Callable[..., Callable[[], object]] | str  # a probe's builder, or its "module:function"


def probe_target(target: Target) -> str:
    """The ``"module:function"`` a fresh process imports, built from the function object so that
    a rename or a move is caught here, not in the probe process; a string is taken as given.
    ValueError for a function a fresh process cannot import by name (a lambda, a nested one)."""
    if isinstance(target, str):
        return target
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not module or module == "__main__" or not name.isidentifier() or getattr(
            sys.modules.get(module), name, None) is not target:
        raise ValueError(f"probe target {target!r}: a fresh process imports it by name, so it "
                         "must be a function defined at the top level of an importable module")
    return f"{module}:{name}"


def measure_peak(target: Target, config: dict, timeout: float = 900) -> dict:
    """Peak memory of one configuration, measured in a fresh Python process.

    ``target`` is a top-level function (or its ``"module:function"``, see :func:`probe_target`);
    ``function(**config)`` builds the inputs and returns a
    no-argument callable. It is called once to warm up (code pages, thread pools, lazy set-up),
    freed memory is handed back to the kernel (``malloc_trim``), the high-water mark is reset, and
    only the second call is measured. Returns host bytes (baseline, peak, extra
    over the baseline, whether the kernel's high-water mark could be reset), device bytes (extra
    peak of torch's allocator, None on CPU) and pinned host bytes held afterwards.
    """
    return measure_peaks(target, [config], 1, timeout)[0]


def measure_peaks(target: Target, configs: list[dict], parallel: int = 1,
                  timeout: float = 900,
                  finished: Callable[[int, int], None] | None = None) -> list[dict]:
    """:func:`measure_peak` of each configuration, in order, ``parallel`` probe processes at a
    time. A probe's figure is its own process's peak, so probes side by side do not change one
    another's (the caller bounds ``parallel`` by the cores and by what fits in memory at once).
    Each runs with :data:`HOST_ALLOCATOR_ENV`. Side by side, their OpenMP threads wait
    passively (``OMP_WAIT_POLICY``): spinning threads of two processes on two cores took four
    times as long as one probe after another. The probes are watched from this thread, so a stop
    (Ctrl-C, SIGTERM) or a failure kills those running at once. ``finished`` is told, as each
    probe ends, how many have ended and how many there are (a progress line)."""
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be a positive integer, got {parallel!r}")
    target = probe_target(target)
    env = dict(os.environ, **HOST_ALLOCATOR_ENV,
               **({"OMP_WAIT_POLICY": "PASSIVE"} if parallel > 1 else {}))
    results: list[dict] = [{} for _ in configs]
    waiting = list(enumerate(configs))
    running: list[tuple[int, _Probe]] = []
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                index, config = waiting.pop(0)
                running.append((index, _Probe(target, config, env, timeout)))
            done = [(index, probe) for index, probe in running if probe.finished()]
            for index, probe in done:
                running.remove((index, probe))
                results[index] = probe.result()
                if finished is not None:
                    finished(len(configs) - len(waiting) - len(running), len(configs))
            if not done:
                time.sleep(PROBE_POLL_S)
    finally:
        for _, probe in running:
            probe.kill()
    return results


class _Probe:
    """One probe process, its output in temporary files (no pipe to fill up)."""

    def __init__(self, target: str, config: dict, env: Mapping[str, str],
                 timeout: float) -> None:
        self.what = f"memory probe {target} {config}"
        self.deadline = time.monotonic() + timeout
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stagelab.measure.memory", target, json.dumps(config)],
                stdout=self.out, stderr=self.err, text=True, env=env)
        except BaseException:
            self.out.close()
            self.err.close()
            raise

    def finished(self) -> bool:
        """Whether the process has ended; TimeoutError once it has run past its time."""
        if self.process.poll() is not None:
            return True
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"{self.what} ran past its time")
        return False

    def result(self) -> dict:
        """The probe's figures; RuntimeError naming it, with its last error line, if it failed."""
        try:
            self.out.seek(0)
            self.err.seek(0)
            if self.process.returncode != 0:
                tail = (self.err.read().strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"{self.what} failed: {tail}")
            return json.loads(self.out.read().strip().splitlines()[-1])
        finally:
            self.out.close()
            self.err.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.out.close()
        self.err.close()


def _probe(target: str, config: dict) -> dict:
    module, _, function = target.partition(":")
    run = getattr(importlib.import_module(module), function)(**config)
    run()  # warm-up: code pages, thread pools and lazy initialization are not working memory
    _release_freed_memory()
    cuda = torch.cuda.is_available() and str(config.get("device", "cpu")).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        device_base = torch.cuda.memory_allocated()
    reset = _reset_high_water_mark()
    base = _status_bytes("VmRSS")
    run()
    if cuda:
        torch.cuda.synchronize()
    peak = _status_bytes("VmHWM")
    return {
        "host_baseline_bytes": base, "host_peak_bytes": peak,
        "host_extra_bytes": None if peak is None or base is None else peak - base,
        "hwm_reset": reset,
        "device_extra_bytes": torch.cuda.max_memory_allocated() - device_base if cuda else None,
        "pinned_host_bytes": pinned_host_bytes(),
    }


if __name__ == "__main__":
    print(json.dumps(_probe(sys.argv[1], json.loads(sys.argv[2]))))
