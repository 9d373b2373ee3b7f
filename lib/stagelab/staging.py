"""Host staging strategies for a device-to-host copy: one class per arm, one interface.

``stage(src)`` returns a host tensor with ``src``'s shape, dtype and values, the copy complete
when it returns (the engine's copy-then-synchronize). Two levers hide in the seed's change and are
separated here: *reuse* (a grow-only buffer pays first-touch page faults once, not every step) and
*pinning* (page-locked memory lets the copy engine DMA straight into it instead of going through
the driver's bounce buffer). On a machine without CUDA the pinned arms raise
:class:`PinnedMemoryUnavailable`; the pageable arms and the raw ceiling still run, host to host.
"""

from __future__ import annotations

from typing import Callable

import pandas as pd
import torch

from stagelab import bench, memory, stats
from stagelab.device import (PinnedMemoryUnavailable, cuda_present, device_label,
                             pinned_allocator, require_cuda)
from stagelab.hardware import PcieSampler
from stagelab.shapes import positive_ints

Allocator = Callable[[int], torch.Tensor]


def check_source(src: torch.Tensor) -> None:
    """A staging source must be a non-empty contiguous tensor."""
    if not isinstance(src, torch.Tensor):
        raise TypeError(f"src must be a torch.Tensor, not {type(src).__name__}")
    if src.numel() == 0:
        raise ValueError(f"src is empty (shape {tuple(src.shape)}): nothing to stage")
    if not src.is_contiguous():
        raise ValueError(f"src must be contiguous (shape {tuple(src.shape)}, stride "
                         f"{src.stride()}); call .contiguous() on the device first")


def _nbytes(src: torch.Tensor) -> int:
    return src.numel() * src.element_size()


def _wait_for_copy(src: torch.Tensor) -> None:
    """Block until the copy just queued from ``src``'s device has completed."""
    if src.is_cuda:
        torch.cuda.current_stream(src.device).synchronize()


def _view(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The first bytes of a uint8 buffer viewed with ``like``'s dtype and shape."""
    return buffer[: _nbytes(like)].view(like.dtype).view(like.shape)


class StagingArm:
    """Common bookkeeping: the arm's name, whether it pins, allocations made, capacity held."""

    name = "arm"
    pinned = False

    def __init__(self) -> None:
        self.allocations = 0
        self.capacity_bytes = 0

    @property
    def pinned_bytes_held(self) -> int:
        """Page-locked host bytes this arm keeps between steps."""
        return self.capacity_bytes if self.pinned else 0

    def stage(self, src: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(allocations={self.allocations}, "
                f"capacity_bytes={self.capacity_bytes})")


class PageableFresh(StagingArm):
    """A new pageable buffer every call: the seed's per-step ``std::vector``."""

    name = "pageable_fresh"

    def stage(self, src: torch.Tensor) -> torch.Tensor:
        check_source(src)
        out = torch.empty(src.shape, dtype=src.dtype)
        self.allocations += 1
        self.capacity_bytes = _nbytes(src)
        out.copy_(src)
        _wait_for_copy(src)
        return out


class _GrowOnly(StagingArm):
    """A grow-only byte buffer: allocated again only when a larger copy arrives, never shrunk."""

    def __init__(self, allocator: Allocator) -> None:
        super().__init__()
        self._allocate = allocator
        self._buffer: torch.Tensor | None = None

    def _ensure(self, nbytes: int) -> torch.Tensor:
        if self._buffer is None or nbytes > self.capacity_bytes:
            buffer = self._allocate(nbytes)
            if buffer.dtype != torch.uint8 or buffer.numel() < nbytes or buffer.is_cuda:
                raise ValueError(f"allocator returned {buffer.dtype} x {buffer.numel()} on "
                                 f"{buffer.device}; expected host uint8 of at least {nbytes}")
            self._buffer = buffer
            self.allocations += 1
            self.capacity_bytes = buffer.numel()
        return self._buffer

    def stage(self, src: torch.Tensor) -> torch.Tensor:
        check_source(src)
        out = _view(self._ensure(_nbytes(src)), src)
        out.copy_(src, non_blocking=self.pinned)
        _wait_for_copy(src)
        return out


class PageableReused(_GrowOnly):
    """A grow-only pageable buffer: the reuse lever alone."""

    name = "pageable_reused"

    def __init__(self) -> None:
        super().__init__(lambda nbytes: torch.empty(nbytes, dtype=torch.uint8))


class PinnedGrowOnly(_GrowOnly):
    """A grow-only pinned scratch (the seed's ``GreedyArgmaxScratch`` pattern): reuse and pinning.

    ``allocator(nbytes) -> uint8 Tensor`` defaults to torch's pinned allocation; a test may inject
    one that records what it hands out.
    """

    name = "pinned_grow_only"
    pinned = True

    def __init__(self, allocator: Allocator | None = None) -> None:
        if allocator is None:
            require_cuda(self.name)
            allocator = pinned_allocator
        super().__init__(allocator)


class _PinnedPerCall(StagingArm):
    """A pinned destination per call that the arm does not keep: CUDA only, holds no bytes."""

    pinned = True

    def __init__(self) -> None:
        require_cuda(self.name)
        super().__init__()

    @property
    def pinned_bytes_held(self) -> int:
        return 0


class PinnedFresh(_PinnedPerCall):
    """Pins a new buffer every call (``cudaHostRegister`` of fresh memory): the cost of pinning.

    torch's pinned allocator caches blocks, so it would hide that cost; registering a fresh
    pageable allocation pays it every time, as an engine that pins per step would. The buffer is
    unregistered before it is returned.
    """

    name = "pinned_fresh"

    def stage(self, src: torch.Tensor) -> torch.Tensor:
        check_source(src)
        out = torch.empty(src.shape, dtype=src.dtype)
        cudart = torch.cuda.cudart()
        nbytes = _nbytes(src)
        status = cudart.cudaHostRegister(out.data_ptr(), nbytes, 0)
        if int(status) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: {status}")
        try:
            self.allocations += 1
            self.capacity_bytes = nbytes
            out.copy_(src, non_blocking=True)
            _wait_for_copy(src)
        finally:
            cudart.cudaHostUnregister(out.data_ptr())
        return out


class ToCpuNonBlocking(_PinnedPerCall):
    """``src.to("cpu", non_blocking=True)`` then an event wait: vLLM's async output, SGLang.

    The destination comes from torch's caching pinned allocator, which holds it (see
    :func:`stagelab.memory.pinned_host_bytes`); ``allocations`` counts requests made to it (the
    cache serves repeats without a new ``cudaHostAlloc``).
    """

    name = "to_cpu_non_blocking"

    def stage(self, src: torch.Tensor) -> torch.Tensor:
        check_source(src)
        out = src.to("cpu", non_blocking=True)
        self.allocations += 1
        self.capacity_bytes = _nbytes(src)
        if src.is_cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(src.device))
            event.synchronize()
        return out


class RawCeiling(StagingArm):
    """``copy_`` into one preallocated buffer, no strategy logic: the reference ceiling.

    Pinned where CUDA exists (the nvbandwidth-like bound of the run); a plain host buffer on CPU.
    """

    name = "raw_ceiling"

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__()
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.pinned = cuda_present()
        self._buffer = torch.empty(capacity_bytes, dtype=torch.uint8, pin_memory=self.pinned)
        self.allocations = 1
        self.capacity_bytes = capacity_bytes

    def stage(self, src: torch.Tensor) -> torch.Tensor:
        check_source(src)
        if _nbytes(src) > self.capacity_bytes:
            raise ValueError(f"src has {_nbytes(src)} bytes; raw_ceiling holds "
                             f"{self.capacity_bytes}")
        out = _view(self._buffer, src)
        out.copy_(src, non_blocking=self.pinned)
        _wait_for_copy(src)
        return out


ARMS: dict[str, Callable[..., StagingArm]] = {
    cls.name: cls for cls in (PageableFresh, PageableReused, PinnedGrowOnly, PinnedFresh,
                              ToCpuNonBlocking, RawCeiling)
}


def make_arm(name: str, capacity_bytes: int = 0) -> StagingArm:
    """Build an arm by name; ``capacity_bytes`` sizes the raw ceiling's one buffer."""
    if name not in ARMS:
        raise ValueError(f"arms: unknown arm {name!r}; valid: {', '.join(ARMS)}")
    if name == RawCeiling.name:
        return RawCeiling(capacity_bytes)
    return ARMS[name]()


# ------------------------------------------------------------------------------- measurement

def _pcie_records(pcie, sizes: dict) -> list[dict]:
    """NVML's link throughput samples taken during a copy loop, or one row saying why not."""
    common = {**sizes, "arm": "nvml_pcie", "bytes": None}
    if not pcie.available:
        return [{**common, "metric": "pcie_tx_bytes_per_s", "status": "unavailable",
                 "note": pcie.reason}]
    return [{**common, "metric": "pcie_tx_bytes_per_s", "repeat": i, "value": float(tx),
             "seconds": t} for i, (t, tx, _rx) in enumerate(pcie.samples)]


def build_arms(names: list[str], capacity_bytes: int) -> tuple[dict[str, StagingArm], dict[str, str]]:
    """Build the named arms; those that cannot exist here are returned with the reason instead."""
    built, unavailable = {}, {}
    for name in names:
        try:
            built[name] = make_arm(name, capacity_bytes)
        except PinnedMemoryUnavailable as exc:
            unavailable[name] = str(exc)
    return built, unavailable


def sweep(shapes: list, rows: list[int], dtype: torch.dtype, arms: list[str], *,
          repeats: int, warmup: int = 2, aa_arm: str = PageableFresh.name, sources: int = 3,
          seed: int = 0, device: str | None = None, progress: bool = False) -> list[dict]:
    """Time each arm's ``stage()`` over every ``rows x vocab`` cell, interleaved, with an A/A twin.

    Returns schema records (without run id and notebook). A cell that would not fit in free memory
    is recorded as ``skipped`` with the numbers; arms that cannot run here as ``unavailable``.
    """
    positive_ints(rows, "rows")
    positive_ints([sources], "sources")
    for name in arms:
        if name not in ARMS:
            raise ValueError(f"arms: unknown arm {name!r}; valid: {', '.join(ARMS)}")
    if aa_arm not in arms:
        raise ValueError(f"aa_arm {aa_arm!r} must be one of arms {arms}")
    device = device or ("cuda" if cuda_present() else "cpu")
    label = device_label(device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator(device=device).manual_seed(seed)
    records: list[dict] = []
    for shape in shapes:
        for n in rows:
            nbytes = n * shape.vocab * itemsize
            sizes = dict(experiment="d2h_copy", device=label, model=shape.model, rows=n,
                         vocab=shape.vocab, dtype=str(dtype).removeprefix("torch."),
                         bytes=nbytes)
            try:
                host_buffers = len(arms) + 2 + (sources if device == "cpu" else 0)
                memory.check_fits(host_buffers * nbytes, memory.free_host_bytes(),
                                  f"{n} x {shape.vocab} staging on the host")
                if device != "cpu":
                    memory.check_fits(sources * nbytes, memory.free_device_bytes(device),
                                      f"{sources} sources of {n} x {shape.vocab} on {device}")
            except memory.InsufficientMemory as exc:
                records += [{**sizes, "arm": a, "status": "skipped", "note": str(exc)}
                            for a in arms]
                continue
            built, unavailable = build_arms(arms, nbytes)
            if aa_arm in unavailable:
                raise ValueError(f"aa_arm {aa_arm!r} cannot run here: {unavailable[aa_arm]}")
            twin = make_arm(aa_arm, nbytes)
            records += [{**sizes, "arm": name, "status": "unavailable", "note": reason}
                        for name, reason in unavailable.items()]
            srcs = bench.rotating(lambda i: torch.randn(n, shape.vocab, device=device,
                                                        generator=generator).to(dtype), sources)
            calls = {name: (lambda r, arm=arm: arm.stage(bench.pick(srcs, r)))
                     for name, arm in built.items()}
            calls[bench.aa_name(aa_arm)] = lambda r: twin.stage(bench.pick(srcs, r))
            with PcieSampler() as pcie:
                timings = bench.interleaved(calls, repeats=repeats, warmup=warmup, seed=seed,
                                            device=device, progress=progress,
                                            label=f"n={n} V={shape.vocab}")
            records += [{**sizes, **t} for t in timings]
            records += _pcie_records(pcie, sizes)
            for name, arm in built.items():
                records.append({**sizes, "arm": name, "metric": "pinned_bytes_held",
                                "bytes": arm.pinned_bytes_held})
                records.append({**sizes, "arm": name, "metric": "allocations",
                                "value": float(arm.allocations), "bytes": arm.capacity_bytes})
            del srcs, built, twin
    return records


def goal_checks(frame: pd.DataFrame, snap: dict, big_bytes: int = 64 * 10**6) -> pd.DataFrame:
    """The staging goals of this suite, each with what was measured here, or why it was not.

    Goals: pinned grow-only >= 95 % of the raw pinned ceiling; the raw ceiling >= 85 % of the NVML
    link bandwidth for copies of 64 MB and more (else the likely cause); the A/A noise band within
    +-2 %; the reuse lever (reused vs fresh pageable) with its CI at the largest cell.
    """
    timed = frame[(frame["metric"] == "time") & (frame["stage"] == "total")
                  & (frame["status"] == "ok")]
    medians = timed.groupby(["arm", "bytes"], observed=True)["gb_per_s"].median().unstack("arm")
    goals = []

    def add(goal: str, target: str, measured: str, met: bool | None, note: str = "") -> None:
        status = "not measured" if met is None else ("met" if met else "not met")
        goals.append({"goal": goal, "target": target, "measured": measured, "status": status,
                      "note": note})

    if {"pinned_grow_only", "raw_ceiling"} <= set(medians.columns) and bool(
            medians["raw_ceiling"].notna().any()) and snap.get("gpu"):
        share = (medians["pinned_grow_only"] / medians["raw_ceiling"]).dropna()
        add("pinned grow-only vs raw pinned ceiling", ">= 95 % in every cell",
            f"{share.min():.1%} (worst cell) to {share.max():.1%}", bool(share.min() >= 0.95))
    else:
        add("pinned grow-only vs raw pinned ceiling", ">= 95 % in every cell", "-", None,
            "no CUDA device: pinned memory does not exist here")
    link = (snap.get("nvml") or {}).get("pcie_max_gbps_per_direction")
    big = medians[medians.index >= big_bytes] if "raw_ceiling" in medians else medians.iloc[:0]
    if link and snap.get("gpu") and not big.empty:
        share = float(big["raw_ceiling"].median() / link)
        add("raw ceiling vs NVML link (copies >= 64 MB)", ">= 85 %",
            f"{share:.1%} of {link} GB/s", share >= 0.85,
            "" if share >= 0.85 else likely_link_cause(snap))
    else:
        add("raw ceiling vs NVML link (copies >= 64 MB)", ">= 85 %", "-", None,
            "no GPU link to compare with (the raw ceiling here is a host-to-host copy)"
            if not snap.get("gpu") else "no copy of 64 MB or more in this run, or NVML unread")
    aa = stats.compare_arms(frame, "pageable_fresh", "pageable_reused", ["rows", "vocab"],
                            noise_arm="pageable_fresh")
    if "noise_half_width" in aa and aa["noise_half_width"].notna().any():
        widest = aa.sort_values("noise_half_width").iloc[-1]
        add("A/A noise band", "within +-2 %",
            f"+-{aa['noise_half_width'].median():.1%} median over cells, +-"
            f"{widest['noise_half_width']:.1%} worst (n={widest['rows']}, V={widest['vocab']})",
            bool(aa["noise_half_width"].max() <= 0.02))
    else:
        add("A/A noise band", "within +-2 %", "-", None, "pageable_fresh and its twin not timed")
    if "speedup" in aa and aa["speedup"].notna().any():
        largest = aa.assign(size=aa["rows"] * aa["vocab"]).sort_values("size").iloc[-1]
        add("reuse lever: reused vs fresh pageable", "measured with its CI",
            f"{largest['speedup']:.2f}x [{largest['ci_low']:.2f}, {largest['ci_high']:.2f}], "
            f"{largest['saved_ms']:.2f} ms per copy at n={largest['rows']}, "
            f"V={largest['vocab']}", True)
    else:
        add("reuse lever: reused vs fresh pageable", "measured with its CI", "-", None,
            "pageable arms not both timed")
    return pd.DataFrame(goals)


def likely_link_cause(snap: dict) -> str:
    """Plain words for why a raw pinned copy falls short of the link's theoretical bandwidth."""
    nvml = snap.get("nvml") or {}
    causes = []
    if (nvml.get("pcie_current_generation") or 0) < (nvml.get("pcie_max_generation") or 0) or (
            nvml.get("pcie_current_width") or 0) < (nvml.get("pcie_max_width") or 0):
        causes.append(f"the link runs below its maximum (Gen{nvml.get('pcie_current_generation')}"
                      f" x{nvml.get('pcie_current_width')} of Gen{nvml.get('pcie_max_generation')}"
                      f" x{nvml.get('pcie_max_width')}; read it under load to rule out idle "
                      "downtraining)")
    if nvml.get("numa_node") is not None:
        causes.append(f"the GPU hangs off NUMA node {nvml['numa_node']}: a process or buffer on "
                      "another node crosses the socket link (numactl --cpunodebind/--membind)")
    causes.append("the buffer size: small copies pay fixed per-copy latency")
    return "; ".join(causes)
