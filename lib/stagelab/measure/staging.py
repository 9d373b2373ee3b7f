"""Host staging strategies for a device-to-host copy: one class per arm, one interface.

``stage(src)`` returns a host tensor with ``src``'s shape, dtype and values, the copy complete
when it returns (the engine's copy-then-synchronize). Two levers hide in the seed's change and are
separated here: *reuse* (a grow-only buffer pays first-touch page faults once, not every step) and
*pinning* (page-locked memory lets the copy engine DMA straight into it instead of going through
the driver's bounce buffer). On a machine without CUDA the pinned arms raise
:class:`PinnedMemoryUnavailable`; the pageable arms and the raw ceiling still run, host to host.

The grow-only arms and the raw ceiling return a **view of the arm's one buffer**, valid until the
next ``stage()`` (the engine's scratch pattern): the next call overwrites it. Callers that keep
results pass ``copy=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

import stagelab.measure.device
from stagelab.core import catalogue
from stagelab.core.catalogue import aa_name
from stagelab.core.errors import NativeUnavailable
from stagelab.core.schema import RowSink
from stagelab.measure import bench, native, sweep
from stagelab.measure.device import (
    PinnedMemoryUnavailable,
    cuda_present,
    default_device,
    device_label,
    pinned_allocator,
    require_cuda,
)
from stagelab.measure.hardware import PcieSampler
from stagelab.measure.shapes import ModelShape, positive_ints

__all__ = ["ARMS", "PageableFresh", "PageableFreshEmpty", "PageableFreshZeros", "PageableReused",
           "PinnedFresh", "PinnedGrowOnly", "PinnedMemoryUnavailable", "RawCeiling", "StagingArm",
           "ToCpuNonBlocking", "check_source", "make_arm", "pinned_allocator", "measure",
           "seed_vector_like"]

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
    stagelab.measure.device.synchronize(src.device)


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

    def stage(self, src: torch.Tensor, copy: bool = False) -> torch.Tensor:
        """``src`` on the host, the copy complete; ``copy=True`` returns a tensor the caller owns
        (the grow-only arms otherwise return a view of their buffer, overwritten next call)."""
        check_source(src)
        out = self._stage(src)
        return out.clone() if copy else out

    def _stage(self, src: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(allocations={self.allocations}, "
                f"capacity_bytes={self.capacity_bytes})")


class FreshMaker(Protocol):
    """How a fresh-buffer arm makes its buffer: ``torch.empty``'s call (shape, then dtype)."""

    def __call__(self, size: torch.Size, /, *, dtype: torch.dtype) -> torch.Tensor: ...


class _FreshPerCall(StagingArm):
    """A new pageable buffer every call, made by ``_make(shape, dtype=...)``. The sweep drops it
    inside the timed call, so its free is timed too, as at the end of the seed's step."""

    _make: FreshMaker = staticmethod(torch.empty)

    def _stage(self, src: torch.Tensor) -> torch.Tensor:
        out = self._make(src.shape, dtype=src.dtype)
        self.allocations += 1
        self.capacity_bytes = _nbytes(src)
        out.copy_(src)
        _wait_for_copy(src)
        return out


def seed_vector_like(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A fresh value-initialised ``std::vector<float>`` (:func:`stagelab.measure.native.seed_vector`)
    covering ``shape`` of ``dtype``, viewed as such; the vector is freed when the view goes."""
    nbytes = shape.numel() * torch.empty((), dtype=dtype).element_size()
    vector = native.seed_vector(-(-nbytes // 4))
    return vector.tensor.view(torch.uint8)[:nbytes].view(dtype).view(shape)


class PageableFresh(_FreshPerCall):
    """The seed's per-step ``std::vector<float>(n)``, through the native library: a new
    pageable buffer value-initialised on one thread (every page zero-filled and faulted in)
    before the copy, destroyed at the end of the call. Needs the native build."""

    name = "pageable_fresh"
    _make = staticmethod(seed_vector_like)

    def __init__(self) -> None:
        native.require()
        super().__init__()


class PageableFreshZeros(_FreshPerCall):
    """A new zero-filled pageable buffer through ``torch.zeros``: this suite's first copy-level
    baseline, kept labelled. torch fills on several threads where the engine's vector fills on
    one, so on a many-core host it makes a fresh buffer look cheaper than the seed's."""

    name = "pageable_fresh_zeros"
    _make = staticmethod(torch.zeros)


class PageableFreshEmpty(_FreshPerCall):
    """A new uninitialised pageable buffer every call (``torch.empty``): what the first version of
    this suite timed; beside :class:`PageableFresh` it shows what zero-fill costs."""

    name = "pageable_fresh_empty"
    _make = staticmethod(torch.empty)


class GrowOnly(StagingArm):
    """A grow-only byte buffer: allocated again only when a larger copy arrives, never shrunk."""

    def __init__(self, allocator: Allocator) -> None:
        super().__init__()
        self._allocate = allocator
        self._buffer: torch.Tensor | None = None

    def ensure(self, nbytes: int) -> torch.Tensor:
        """The buffer, grown (never shrunk) to hold at least ``nbytes``."""
        if self._buffer is None or nbytes > self.capacity_bytes:
            buffer = self._allocate(nbytes)
            if buffer.dtype != torch.uint8 or buffer.numel() < nbytes or buffer.is_cuda:
                raise ValueError(f"allocator returned {buffer.dtype} x {buffer.numel()} on "
                                 f"{buffer.device}; expected host uint8 of at least {nbytes}")
            self._buffer = buffer
            self.allocations += 1
            self.capacity_bytes = buffer.numel()
        return self._buffer

    def _stage(self, src: torch.Tensor) -> torch.Tensor:
        out = _view(self.ensure(_nbytes(src)), src)
        out.copy_(src, non_blocking=self.pinned)
        _wait_for_copy(src)
        return out


class PageableReused(GrowOnly):
    """A grow-only pageable buffer: the reuse lever alone."""

    name = "pageable_reused"

    def __init__(self) -> None:
        super().__init__(lambda nbytes: torch.empty(nbytes, dtype=torch.uint8))


class PinnedGrowOnly(GrowOnly):
    """A grow-only pinned scratch (the seed's ``GreedyArgmaxScratch`` pattern): reuse and pinning.

    ``allocator(nbytes) -> uint8 Tensor`` defaults to torch's pinned allocation; a test may inject
    one that records what it hands out.
    """

    name = "pinned_grow_only"
    pinned = True

    def __init__(self, allocator: Allocator | None = None) -> None:
        self.torch_allocator = allocator is None
        if allocator is None:
            require_cuda(self.name)
            allocator = pinned_allocator
        super().__init__(allocator)

    @property
    def pinned_bytes_held(self) -> int:
        """Page-locked bytes held as torch's allocator holds them (a power of two per block),
        or as an injected allocator handed them out."""
        if self.torch_allocator:
            return stagelab.measure.device.pinned_footprint(self.capacity_bytes)
        return self.capacity_bytes


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

    def _stage(self, src: torch.Tensor) -> torch.Tensor:
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
    :func:`stagelab.measure.memory.pinned_host_bytes`); ``allocations`` counts requests made to it (the
    cache serves rounds without a new ``cudaHostAlloc``).
    """

    name = "to_cpu_non_blocking"

    def _stage(self, src: torch.Tensor) -> torch.Tensor:
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

    def _stage(self, src: torch.Tensor) -> torch.Tensor:
        if _nbytes(src) > self.capacity_bytes:
            raise ValueError(f"src has {_nbytes(src)} bytes; raw_ceiling holds "
                             f"{self.capacity_bytes}")
        out = _view(self._buffer, src)
        out.copy_(src, non_blocking=self.pinned)
        _wait_for_copy(src)
        return out


def arm_classes() -> dict[str, type[StagingArm]]:
    """Every concrete arm class by its name (those that set ``name`` themselves)."""
    found, todo = {}, [StagingArm]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "name" in vars(cls) and cls is not StagingArm:
            found[cls.name] = cls
    return found


# The catalogue names the arms and their order; an entry without a class fails here, at import.
ARMS: dict[str, type[StagingArm]] = {name: arm_classes()[name]
                                      for name in catalogue.arm_names(catalogue.STAGING)}


def make_arm(name: str, capacity_bytes: int = 0) -> StagingArm:
    """Build an arm by name; ``capacity_bytes`` sizes the raw ceiling's one buffer."""
    if name not in ARMS:
        raise ValueError(f"arms: unknown arm {name!r}; valid: {', '.join(ARMS)}")
    if name == RawCeiling.name:
        return RawCeiling(capacity_bytes)
    return ARMS[name]()


# ------------------------------------------------------------------------------- measurement

def _pcie_records(pcie: PcieSampler) -> list[dict]:
    """NVML's link throughput samples taken during a copy loop, or one row saying why not."""
    common = {"arm": "nvml_pcie", "metric": "pcie_tx_bytes_per_s"}
    if not pcie.available:
        return [{**common, "status": "unavailable", "note": pcie.reason}]
    return [{**common, "round": i, "value": float(tx), "seconds": t}
            for i, (t, tx, _rx) in enumerate(pcie.samples)]


def build_arms(names: list[str], capacity_bytes: int) -> tuple[dict[str, StagingArm], dict[str, str]]:
    """Build the named arms; those that cannot exist here are returned with the reason instead."""
    built, unavailable = {}, {}
    for name in names:
        try:
            built[name] = make_arm(name, capacity_bytes)
        except (PinnedMemoryUnavailable, NativeUnavailable) as exc:
            unavailable[name] = str(exc)
    return built, unavailable


def _stage_and_release(arm: StagingArm, src: torch.Tensor) -> None:
    """One timed call: stage, then drop the result, so that a fresh buffer's free is timed too."""
    arm.stage(src)


def chosen_arms(arms: Sequence[str] | None) -> list[str]:
    """The arms to time: those named, or (None) every staging arm of the catalogue."""
    return list(ARMS) if arms is None else list(arms)


def check_arms(arms: list[str], aa_arm: str) -> None:
    """Known arm names, and the A/A arm among them."""
    if not arms:
        raise ValueError("arms is empty: name at least one staging arm")
    for name in arms:
        if name not in ARMS:
            raise ValueError(f"arms: unknown arm {name!r}; valid: {', '.join(ARMS)}")
    if aa_arm not in arms:
        raise ValueError(f"aa_arm {aa_arm!r} must be one of arms {arms}")


@dataclass(frozen=True)
class StagingSweep:
    """What a staging sweep measures and how, fixed once (checked when built): every arm
    (``arms``; None: every staging arm of the catalogue) with an A/A twin of ``aa_arm`` over
    each ``rows x vocab`` cell of the models' ``shapes``, ``sources`` tensors rotated between
    rounds, ``rounds`` timed after ``warmup``, in an order seeded by ``seed``."""

    shapes: Sequence[ModelShape]
    rows: Sequence[int]
    dtype: torch.dtype
    arms: Sequence[str] | None = None
    aa_arm: str = catalogue.baseline(catalogue.STAGING)
    sources: int = 3
    rounds: int = 12
    warmup: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        positive_ints(self.rows, "rows")
        positive_ints([self.sources], "sources")
        arms = chosen_arms(self.arms)
        check_arms(arms, self.aa_arm)
        for name, value in (("arms", tuple(arms)), ("shapes", tuple(self.shapes)),
                            ("rows", tuple(self.rows))):
            object.__setattr__(self, name, value)


def cells(spec: StagingSweep, device: str | None = None) -> list[sweep.Cell]:
    """The sweep's cells, one per ``rows x vocab``, with the memory each needs (the preflight
    checks the largest against free memory)."""
    device = device or default_device()
    itemsize = torch.empty((), dtype=spec.dtype).element_size()
    on_cpu = torch.device(device).type == "cpu"
    every_arm = [*(spec.arms or ()), aa_name(spec.aa_arm)]
    out = []
    for shape in spec.shapes:
        for n in spec.rows:
            nbytes = n * shape.vocab * itemsize
            out.append(sweep.Cell(
                sizes=dict(experiment=catalogue.STAGING, device=device_label(device), model=shape.model,
                           rows=n, vocab=shape.vocab, dtype=str(spec.dtype).removeprefix("torch."),
                           bytes=nbytes),
                arms=every_arm, label=f"n={n} V={shape.vocab}",
                host_bytes=(len(every_arm) + 1 + (spec.sources if on_cpu else 0)) * nbytes,
                device_bytes=0 if on_cpu else spec.sources * nbytes))
    return out


def measure(spec: StagingSweep, *, device: str | None = None, sink: RowSink | None = None,
            progress: bool = True) -> list[dict]:
    """Time each arm's ``stage()`` over every cell of ``spec``, interleaved, with an A/A twin
    of its ``aa_arm``; schema records out (written per cell into ``sink``). See
    :mod:`stagelab.measure.sweep` for skipped, unavailable and failed rows."""
    device = device or default_device()
    todo = cells(spec, device)
    arms, aa_arm, dtype, sources = list(spec.arms or ()), spec.aa_arm, spec.dtype, spec.sources
    generator = torch.Generator(device=device).manual_seed(spec.seed)

    def prepare(cell: sweep.Cell) -> sweep.CellPlan:
        nbytes, n, vocab = cell.sizes["bytes"], cell.sizes["rows"], cell.sizes["vocab"]
        built, unavailable = build_arms(arms, nbytes)
        if aa_arm in built:
            built[aa_name(aa_arm)] = make_arm(aa_arm, nbytes)
        else:
            unavailable[aa_name(aa_arm)] = unavailable[aa_arm]
        srcs = bench.rotating(lambda i: torch.randn(n, vocab, device=device,
                                                    generator=generator).to(dtype), sources)
        pcie = PcieSampler()

        def after() -> list[dict]:
            return [*_pcie_records(pcie), *_holdings(built)]

        def timed(arm: StagingArm) -> bench.ArmCall:
            return lambda r: _stage_and_release(arm, bench.pick(srcs, r))

        return sweep.CellPlan(
            calls={name: timed(arm) for name, arm in built.items()},
            unavailable=unavailable, monitor=pcie, after=after)

    return sweep.run(todo, prepare, rounds=spec.rounds, warmup=spec.warmup, seed=spec.seed,
                     device=device, sink=sink, label="staging", progress=progress)


def _holdings(built: dict[str, StagingArm]) -> list[dict]:
    """Pinned bytes each arm holds and the allocations it made over the cell."""
    records = []
    for name, arm in built.items():
        records.append({"arm": name, "metric": "pinned_bytes_held", "bytes": arm.pinned_bytes_held})
        records.append({"arm": name, "metric": "allocations", "value": float(arm.allocations),
                        "bytes": arm.capacity_bytes})
    return records
