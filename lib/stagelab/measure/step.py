"""A whole logprobs step, device logits in, host :class:`LogprobsTensors` out, as named arms.

The decisive experiment is the seed engine's own step, the same code with two stagings:
``seed_pageable`` (a fresh value-initialised ``std::vector`` per step) against ``seed_pinned``
(the pinned grow-only scratch), with an A/A twin of the baseline. Every arm, its role and what it
models are named in :mod:`stagelab.core.catalogue`; :data:`BUILDERS` builds each one as a
:class:`SeedStep` (fp32 log-softmax, the whole ``[n, V]`` copied into its destination, the host
top-K, the free) or a :class:`DeviceStep` (top-K on the device; only ``[n, K+1]`` is copied).

Each seed arm makes the engine's one wait (``b.Copy`` then ``b.Synchronize``) after its copy; each
device arm one wait to hand its results to the host. In the overlap order ``waited``
(:data:`stagelab.core.forward.OVERLAP_ORDERS`) every arm makes one wait more, for the device
work queued so far (the forward, and the log-softmax of a seed arm), just before its host
staging begins: outside every timed stage, inside the timed call, the same in every arm, so the
call is then the forward, waited on, plus the whole step with its allocation paid in full.
Nothing else in a timed call waits on the device. Stages (``device``, ``alloc``, ``copy``,
``host_gather``, ``free``) are timed without extra waits: CUDA events around device work, read
after the step's own wait, and the host clock around host work (on a CPU, the host clock for
all).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

import stagelab.measure.device
from stagelab.core import catalogue, design, forward, schema
from stagelab.core.catalogue import aa_name
from stagelab.core.errors import ExtraUnavailable, NativeUnavailable
from stagelab.core.schema import RowSink
from stagelab.measure import bench, hostrates, native, onepass, staging, sweep
from stagelab.measure import logprobs as lp
from stagelab.measure.device import PinnedMemoryUnavailable, default_device, device_label
from stagelab.measure.shapes import ModelShape, positive_ints

STEP_ARMS = catalogue.arm_names(catalogue.STEP)
BASELINE = catalogue.baseline(catalogue.STEP)
CANDIDATE = catalogue.candidate(catalogue.STEP)
LOG_SOFTMAX = ("device", "host")  # where the seed arms run the log-softmax
OVERLAP_ORDERS = forward.OVERLAP_ORDERS  # how a step meets the forward queued before it
HOST_RATE_REPEATS = 5  # host-rate calls kept per cell, taken between its rounds
# The allocating thread's own faults where the kernel counts per thread (Linux), else the
# process's: a CUDA driver thread's faults are not the seed's fill.
_FAULTS_OF = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def minor_faults() -> int:
    """Minor page faults this thread has taken so far (one ``getrusage``: no file is read)."""
    return resource.getrusage(_FAULTS_OF).ru_minflt


class StageClock:
    """Stage times with no host wait of its own: CUDA events around device work (read only after
    the step's own wait), the host clock around host work."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host: dict[str, float] = {}
        self.events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def host_stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.host[name] = time.perf_counter() - start

    @contextlib.contextmanager
    def device_stage(self, name: str) -> Iterator[None]:
        if not self.cuda:
            with self.host_stage(name):
                yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self.events.append((name, start, end))

    def seconds(self) -> dict[str, float]:
        """Every stage's seconds; call after the step's wait, when the events are complete."""
        return {**self.host, **{name: a.elapsed_time(b) / 1e3 for name, a, b in self.events}}


class FreshVector:
    """The seed's destination: a value-initialised ``std::vector<float>`` per step, freed by its
    destructor at the end of the step (native), under an allocation ``regime``
    (:data:`stagelab.measure.native.REGIME_CODES`)."""

    def __init__(self, regime: str = native.MALLOC) -> None:
        native.require()
        native.regime_label(regime)  # refuses an unknown regime
        self.regime = regime
        self.vector: native.SeedVector | None = None

    def acquire(self, shape: torch.Size) -> tuple[torch.Tensor, Callable[[], None]]:
        self.vector = native.seed_vector(shape.numel(), self.regime)
        return self.vector.tensor.view(shape), self.vector.free

    def mapped(self) -> bool | None:
        """Whether the vector just acquired was a fresh mapping (read after the timed stage)."""
        return None if self.vector is None else self.vector.mapped


class FreshZeros:
    """A zero-filled pageable tensor per step, dropped at the end of the step (no compiler needed)."""

    def acquire(self, shape: torch.Size) -> tuple[torch.Tensor, Callable[[], None]]:
        held = [torch.zeros(shape, dtype=torch.float32)]
        return held[0], held.clear

    def mapped(self) -> bool | None:
        """Not known for torch's allocation."""
        return None


class Scratch:
    """A grow-only scratch (pinned or pageable) reused by every step; nothing to free."""

    def __init__(self, arm: staging.StagingArm) -> None:
        self.arm = arm

    def acquire(self, shape: torch.Size) -> tuple[torch.Tensor, Callable[[], None]]:
        buffer = self.arm.ensure(shape.numel() * 4)
        return buffer[: shape.numel() * 4].view(torch.float32).view(shape), _nothing

    def mapped(self) -> bool | None:
        """No fresh vector: the scratch is reused."""
        return None


def _nothing() -> None:
    return None


def check_overlap_order(order: str) -> str:
    """``order`` if it is one of :data:`OVERLAP_ORDERS`, else a ValueError naming it."""
    if order not in OVERLAP_ORDERS:
        raise ValueError(f"overlap_orders: {order!r} is not one of {list(OVERLAP_ORDERS)}")
    return order


def wait_in_order(order: str, device: torch.device) -> None:
    """In the ``waited`` order, wait for the device work queued so far (the forward) before
    the host staging begins, so nothing on the device hides the allocation; nothing in the
    ``queued`` order (and nothing on a CPU, where no work is queued)."""
    if order == forward.WAITED:
        stagelab.measure.device.synchronize(device)


class SeedStep:
    """The seed engine's step with a given destination and host gather backend; the log-softmax
    runs on the device (then the logprobs are copied) or on the host (the fp32 logits are copied,
    as the seed's copy from ``logits.data`` does, and normalised in place there: stage
    ``host_softmax``). After each call, :attr:`facts` holds what its ``alloc`` stage met:
    the minor faults taken inside it (read just outside the timed stage) and whether the fresh
    vector was mapped (read after it). ``overlap``: the step's overlap order
    (:func:`wait_in_order` between the ``device`` stage and the ``alloc`` stage)."""

    def __init__(self, name: str, destination: FreshVector | FreshZeros | Scratch,
                 backend: str, log_softmax: str = "device") -> None:
        if log_softmax not in LOG_SOFTMAX:
            raise ValueError(f"log_softmax must be one of {LOG_SOFTMAX}, got {log_softmax!r}")
        self.name, self.destination, self.backend = name, destination, backend
        self.log_softmax = log_softmax
        self.overlap = forward.QUEUED
        self.facts: dict[str, Any] = {}

    def run(self, logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
            host_token_ids: torch.Tensor) -> tuple[lp.LogprobsTensors, dict[str, float]]:
        """``(host results, stage seconds)``; ``host_token_ids`` are the targets on the host, as
        the engine's host loop reads them. Inputs are validated once per cell by the caller."""
        clock = StageClock(logits.device)
        with clock.device_stage("device"):
            if self.log_softmax == "device":
                staged = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
            else:
                staged = logits.float()
        wait_in_order(self.overlap, logits.device)  # outside every stage: the same in every arm
        faults = minor_faults()
        with clock.host_stage("alloc"):
            host, release = self.destination.acquire(staged.shape)
        self.facts = {"minor_faults": minor_faults() - faults,
                      "mapped": self.destination.mapped()}
        with clock.device_stage("copy"):
            host.copy_(staged, non_blocking=True)
        stagelab.measure.device.synchronize(logits.device)  # the engine's b.Synchronize(q): its one wait
        if self.log_softmax == "host":
            with clock.host_stage("host_softmax"):
                host.sub_(torch.logsumexp(host, dim=-1, keepdim=True))
        with clock.host_stage("host_gather"):
            result = lp.gather_logprobs_host(host, num_logprobs, host_token_ids,
                                             backend=self.backend, validate=False)
        with clock.host_stage("free"):
            del host
            release()
        return result, clock.seconds()


class DeviceStep:
    """Top-K on the device (vLLM V1's gather, the fused path, or the one-pass kernel); only
    ``[n, K+1]`` is copied, into host tensors pinned on a GPU (an async copy into pageable memory
    would block the host) and reused while the shape stays. ``overlap``: the step's overlap
    order (:func:`wait_in_order` after the device work, before the results' destination)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.overlap = forward.QUEUED
        self.host: lp.LogprobsTensors | None = None
        self.onepass_backend = ""  # the one-pass arm's backend, resolved on its first call

    def destination(self, rows: int, num_logprobs: int, device: torch.device) -> lp.LogprobsTensors:
        """The host results, allocated again only when the shape changes."""
        shape = (rows, num_logprobs + 1)
        if self.host is None or tuple(self.host.logprobs.shape) != shape:
            self.host = lp.LogprobsTensors.empty_host(rows, num_logprobs,
                                                      pinned=device.type == "cuda")
        return self.host

    def run(self, logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
            host_token_ids: torch.Tensor) -> tuple[lp.LogprobsTensors, dict[str, float]]:
        clock = StageClock(logits.device)
        with clock.device_stage("device"):
            if self.name == catalogue.FUSED:
                on_device = lp.logprobs_from_logits(logits, num_logprobs, token_ids,
                                                    validate=False)
            elif self.name == catalogue.ONE_PASS:
                on_device = self.one_pass(logits, num_logprobs, token_ids)
            else:
                on_device = lp.gather_logprobs(lp.compute_logprobs(logits), num_logprobs,
                                               token_ids, validate=False)
        wait_in_order(self.overlap, logits.device)
        result = self.destination(logits.shape[0], num_logprobs, logits.device)
        with clock.device_stage("copy"):
            result.copy_(on_device, non_blocking=True)
        stagelab.measure.device.synchronize(logits.device)  # hands the results over: its one wait
        return result, clock.seconds()

    def one_pass(self, logits: torch.Tensor, num_logprobs: int,
                 token_ids: torch.Tensor) -> lp.LogprobsTensors:
        """The one-pass kernel's results as device ``[n, K+1]`` tensors (Triton where it can
        run, else its torch reference: :func:`stagelab.measure.onepass.resolve_backend`)."""
        if not self.onepass_backend:
            self.onepass_backend = onepass.resolve_backend("triton", logits.device)[0]
        found = onepass.topk_logprobs(logits, num_logprobs, token_ids,
                                      backend=self.onepass_backend, validate=False)
        return found.into(lp.LogprobsTensors.empty(logits.shape[0], num_logprobs,
                                                   logits.device), token_ids)


def default_forward_ms(shape: ModelShape, device: str, rows: int,
                       context: int = forward.DEFAULT_CONTEXT) -> tuple[float, str]:
    """The device work of one decode forward of ``rows`` sequences of ``shape``'s model, ms, and
    how it was reached: the active weights and every sequence's KV cache of ``context`` tokens
    read at an achievable share of the GPU's peak bandwidth (:func:`stagelab.core.forward.forward_ms`).
    0 on a CPU (there is no device work to overlap), and 0 where the model's dimensions or the
    GPU's bandwidth are unknown (then set ``forward_ms`` by hand)."""
    if torch.device(device).type != "cuda":
        return 0.0, "0 on a CPU: no device work runs beside the host's"
    name = torch.cuda.get_device_name(torch.device(device))
    bandwidth = forward.peak_bandwidth_gbps(name)
    known = shape.model in forward.model_table()
    if not known or bandwidth is None:
        missing = "the model's dimensions" if not known else f"{name}'s bandwidth"
        return 0.0, f"0: {missing} unknown; set forward_ms by hand"
    dims = forward.model_dims(shape.model)
    return (forward.forward_ms(dims, rows, peak_gbps=bandwidth, context=context),
            forward.forward_words(dims, rows, peak_gbps=bandwidth, gpu=name, context=context))


class ForwardLoad:
    """``forward_ms`` of device work queued before each step, as the decode forward is in the
    engine, so that the host's allocation overlaps it: on CUDA a busy kernel
    (``torch.cuda._sleep``) whose cycles per ms are calibrated once against CUDA events, after
    the clock is warmed; nothing when ``forward_ms`` is 0. Each queued kernel sits between CUDA
    events of its own, so :meth:`measured_ms` says what it really took (the SM clock sags
    between steps). A positive ``forward_ms`` on a CPU is refused: there is no device to queue
    it on."""

    def __init__(self, forward_ms: float, device: str) -> None:
        if not (isinstance(forward_ms, (int, float)) and forward_ms >= 0):
            raise ValueError(f"forward_ms must be a number >= 0, got {forward_ms!r}")
        if forward_ms and torch.device(device).type != "cuda":
            raise ValueError(f"forward_ms={forward_ms} needs a CUDA device; on a CPU the step "
                             "has no device work to overlap (give 0)")
        self.forward_ms = float(forward_ms)
        self.cycles = round(forward_ms * _cycles_per_ms(device)) if forward_ms else 0
        self.events: list[tuple[Any, Any]] = []

    def queue(self) -> None:
        """Queue the work, between its own CUDA events, on the current stream; returns at once."""
        if self.cycles:
            start, end = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
            start.record()
            torch.cuda._sleep(self.cycles)
            end.record()
            self.events.append((start, end))

    def measured_ms(self) -> float | None:
        """The queued work's mean measured ms per call (None when nothing was queued)."""
        if not self.events:
            return None
        self.events[-1][1].synchronize()
        times = [start.elapsed_time(end) for start, end in self.events]
        return sum(times) / len(times)

    def rows(self, how: str) -> list[dict]:
        """The cell's forward rows: the nominal ms and, where work was queued, the measured."""
        found = [{"arm": "forward", "metric": "forward_ms", "value": self.forward_ms,
                  "note": how}]
        measured = self.measured_ms()
        if measured is not None:
            found.append({"arm": "forward", "metric": "forward_measured_ms", "value": measured,
                          "note": f"mean of {len(self.events)} calls between their own CUDA "
                                  f"events; nominal {self.forward_ms:g} ms"})
        return found


# Busy device time before calibrating: an idle GPU's SM clock takes a while to ramp up, and a
# calibration against a low clock queues too many cycles once it has.
CLOCK_WARM_MS = 200.0


def warm_clock(probe_cycles: int, warm_ms: float = CLOCK_WARM_MS) -> None:
    """Keep the current device busy for at least ``warm_ms`` (at most 100 kernels)."""
    busy = 0.0
    for _ in range(100):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe_cycles)
        end.record()
        end.synchronize()
        busy += start.elapsed_time(end)
        if busy >= warm_ms:
            return


def _cycles_per_ms(device: str, probe_cycles: int = 10_000_000) -> float:
    """How many ``torch.cuda._sleep`` cycles take a millisecond on this GPU (its clock, warmed)."""
    with torch.cuda.device(torch.device(device)):
        warm_clock(probe_cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe_cycles)
        end.record()
        end.synchronize()
        return probe_cycles / start.elapsed_time(end)


def host_allocations(device: str) -> int | None:
    """torch's count of pinned host allocations so far (``host_memory_stats()``'s
    ``num_host_alloc``), None on a CPU or where this torch has no such key."""
    if torch.device(device).type != "cuda":
        return None
    stats = getattr(torch.cuda, "host_memory_stats", None)
    try:
        value = (stats() if stats else {}).get("num_host_alloc")
    except RuntimeError:
        return None
    return None if value is None else int(value)


def host_allocation_rows(device: str, before: int | None) -> list[dict]:
    """The pinned host allocations a cell made (metric ``num_host_alloc``): a grow-only
    scratch takes one per size it grows to, in its first call, never one per step."""
    if torch.device(device).type != "cuda":
        return []
    after = host_allocations(device)
    if before is None or after is None:
        return [{"arm": "pinned_host", "metric": "num_host_alloc", "status": "unavailable",
                 "note": "this torch's host_memory_stats() has no num_host_alloc"}]
    return [{"arm": "pinned_host", "metric": "num_host_alloc", "value": float(after - before),
             "note": "pinned host allocations during the cell (torch.cuda.host_memory_stats)"}]


CLOCK_STRIDE = 5  # rounds between two SM clock samples


class ClockSampler:
    """The GPU's SM clock and throttle reasons, sampled between rounds (every
    :data:`CLOCK_STRIDE`, never inside a timed call) through NVML; a cell's rows give their
    min, median and max (metric ``sm_clock_mhz``, stage ``min``/``median``/``max``) and the
    throttle reasons seen. Nothing on a CPU; ``read`` stands in for NVML in tests."""

    def __init__(self, device: str,
                 read: Callable[[], tuple[int | None, int | None, str]] | None = None) -> None:
        self.on_gpu = torch.device(device).type == "cuda"
        index = torch.device(device).index or 0
        if read is None:
            from stagelab.measure import hardware

            read = functools.partial(hardware.sm_clock_sample, index)
        self.read, self.mhz, self.reasons, self.why = read, [], set(), ""
        self.rounds = itertools.count()

    def sample(self) -> None:
        mhz, reasons, why = self.read()
        if mhz is None:
            self.why = why
            return
        self.mhz.append(mhz)
        if reasons:
            self.reasons.add(reasons)

    def between_rounds(self) -> None:
        """A between-rounds hook: one sample every :data:`CLOCK_STRIDE` rounds."""
        if self.on_gpu and next(self.rounds) % CLOCK_STRIDE == 0:
            self.sample()

    def rows(self) -> list[dict]:
        """The cell's clock rows (one sample now where the rounds took none)."""
        if not self.on_gpu:
            return []
        if not self.mhz:
            self.sample()
        if not self.mhz:
            return [{"arm": "sm_clock", "metric": "sm_clock_mhz", "status": "unavailable",
                     "note": self.why}]
        seen = ", ".join(f"0x{r:x}" for r in sorted(self.reasons)) or "none"
        note = (f"{len(self.mhz)} samples between rounds; throttle reasons seen (NVML mask): "
                f"{seen}")
        values = {"min": min(self.mhz), "median": statistics.median(self.mhz),
                  "max": max(self.mhz)}
        return [{"arm": "sm_clock", "metric": "sm_clock_mhz", "stage": stage,
                 "value": float(value), "note": note} for stage, value in values.items()]


def _native_scratch(arm: Callable[[], staging.StagingArm]) -> Scratch:
    """A grow-only scratch for an arm whose host top-K is the seed's C++ (checked first, so that
    a machine without a compiler says so before any pinned memory is taken)."""
    native.require()
    return Scratch(arm())


def _numpy_step(name: str, where: str) -> SeedStep:
    """The seed's step with the numpy host top-K (unavailable where numpy is not installed)."""
    lp.require_numpy()
    return SeedStep(name, FreshZeros(), "numpy", where)


# How each step arm of the catalogue is built (with where its log-softmax runs); the catalogue
# says what each one is.
BUILDERS: dict[str, Callable[[str, str, str], SeedStep | DeviceStep]] = {
    "seed_pageable": lambda name, where, regime: SeedStep(name, FreshVector(regime), "native",
                                                          where),
    "seed_pinned": lambda name, where, regime: SeedStep(
        name, _native_scratch(staging.PinnedGrowOnly), "native", where),
    "seed_pageable_reused": lambda name, where, regime: SeedStep(
        name, _native_scratch(staging.PageableReused), "native", where),
    "seed_pageable_numpy": lambda name, where, regime: _numpy_step(name, where),
    "device_gather": lambda name, where, regime: DeviceStep(name),
    "fused": lambda name, where, regime: DeviceStep(name),
    "onepass": lambda name, where, regime: DeviceStep(name),
}


def make_pipeline(name: str, log_softmax: str = "device", regime: str = native.MALLOC,
                  overlap: str = forward.QUEUED) -> SeedStep | DeviceStep:
    """An arm by name (``regime``: the seed vector's allocation, for the arm that allocates one;
    ``overlap``: how it meets the forward queued before it); raises PinnedMemoryUnavailable or
    NativeUnavailable where it cannot exist."""
    if name not in STEP_ARMS:
        raise ValueError(f"arms: unknown step arm {name!r}; valid: {', '.join(STEP_ARMS)}")
    check_overlap_order(overlap)
    pipeline = BUILDERS[name](name, log_softmax, regime)
    pipeline.overlap = overlap
    return pipeline


def build_pipelines(names: list[str], log_softmax: str = "device", regime: str = native.MALLOC,
                    overlap: str = forward.QUEUED
                    ) -> tuple[dict[str, SeedStep | DeviceStep], dict[str, str]]:
    """The named arms that can run here, and the reason for each that cannot."""
    built, unavailable = {}, {}
    for name in names:
        try:
            built[name] = make_pipeline(name, log_softmax, regime, overlap)
        except (PinnedMemoryUnavailable, NativeUnavailable, ExtraUnavailable) as exc:
            unavailable[name] = str(exc)
    return built, unavailable


def chosen_arms(arms: list[str] | None) -> list[str]:
    """The arms to time: those named, or (None) every step arm of the catalogue."""
    return list(STEP_ARMS) if arms is None else list(arms)


def check_arms(arms: list[str], aa_arm: str | None) -> None:
    """Known arm names, and the A/A arm among them."""
    if not arms:
        raise ValueError("arms is empty: name at least one step arm")
    for name in arms:
        if name not in STEP_ARMS:
            raise ValueError(f"arms: unknown step arm {name!r}; valid: {', '.join(STEP_ARMS)}")
    if aa_arm is not None and aa_arm not in arms:
        raise ValueError(f"aa_arm {aa_arm!r} must be one of arms {arms}")


def copied_bytes(arm: str, n: int, vocab: int, k: int) -> int:
    """Bytes an arm moves from device to host per step."""
    if catalogue.arm(catalogue.STEP, arm).stages_whole_logprobs:
        return n * vocab * 4
    return n * (k + 1) * 8 + n * 4


Dimension = tuple[str, ...] | list[str]
OverlapCells = list[tuple[int, int | str]] | list[list[int | str]]


def _check_dimensions(log_softmax: Dimension, seed_regimes: Dimension,
                      overlap_orders: Dimension) -> None:
    """Each of the step's dimensions names each of its values at most once, at least one."""
    if not seed_regimes or len(set(seed_regimes)) != len(seed_regimes):
        raise ValueError(f"seed_regimes: {list(seed_regimes)!r} must name each of "
                         f"{list(native.REGIME_CODES)} at most once, at least one")
    if not log_softmax or any(where not in LOG_SOFTMAX for where in log_softmax) or len(
            set(log_softmax)) != len(log_softmax):
        raise ValueError(f"log_softmax: {list(log_softmax)!r} must name each of {LOG_SOFTMAX} "
                         "at most once, at least one")
    if not overlap_orders or len(set(overlap_orders)) != len(overlap_orders):
        raise ValueError(f"overlap_orders: {list(overlap_orders)!r} must name each of "
                         f"{list(OVERLAP_ORDERS)} at most once, at least one")
    for order in overlap_orders:
        check_overlap_order(order)


def in_order(order: str, orders: Dimension, only: OverlapCells | None, shape: ModelShape,
             n: int) -> bool:
    """Whether a cell of ``n`` rows on ``shape`` is measured in overlap ``order``: the first of
    ``orders`` everywhere, the others everywhere too unless ``only`` names the ``[n, model or
    vocabulary]`` cells they are limited to (a lease's budget)."""
    if order == orders[0] or only is None:
        return True
    return any(rows == n and model in (shape.model, shape.vocab) for rows, model in only)


def cells(shapes: list[ModelShape], rows: list[int], ks: list[int], logits_dtype: torch.dtype,
          arms: list[str] | None, *, aa_arm: str | None = BASELINE, sources: int = 2,
          device: str | None = None,
          log_softmax: Dimension = ("device",),
          seed_regimes: Dimension = (native.MALLOC,),
          overlap_orders: Dimension = (forward.QUEUED,),
          overlap_only: OverlapCells | None = None) -> list[sweep.Cell]:
    """The sweep's cells, one per ``(n, V, K)``, place of the log-softmax, allocation regime
    of the seed's vector and overlap order (:func:`in_order`: ``overlap_only`` limits the
    orders after the first to some ``[n, model]`` cells), with the memory each needs; a K
    beyond the vocabulary is a cell recorded as skipped, with the reason. In the order of
    ``rows``, and for each ``n`` every model, the largest vocabulary first: a profile that lists
    its rows largest first (a lease's) starts its costliest cells across every model while the
    most time is left before a deadline; the order within one size is the parameters' own."""
    _check_dimensions(log_softmax, seed_regimes, overlap_orders)
    labels = {regime: native.regime_label(regime) for regime in seed_regimes}
    positive_ints(rows, "rows")
    positive_ints([sources], "sources")
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in ks):
        raise ValueError(f"ks: {ks!r} must be a non-empty list of integers >= 0")
    arms = chosen_arms(arms)
    check_arms(arms, aa_arm)
    device = device or default_device()
    itemsize = torch.empty((), dtype=logits_dtype).element_size()
    every_arm = [*arms, *([aa_name(aa_arm)] if aa_arm else [])]
    on_cpu = torch.device(device).type == "cpu"
    out = []
    for shape, n, k, where, regime, order in itertools.product(shapes, rows, ks, log_softmax,
                                                               seed_regimes, overlap_orders):
        if not in_order(order, overlap_orders, overlap_only, shape, n):
            continue
        logits_bytes, fp32_bytes = n * shape.vocab * itemsize, n * shape.vocab * 4
        label = (f"n={n} V={shape.vocab} K={k} log-softmax on {where}"
                 + (", seed vector mapped fresh" if regime == native.MAPPED else "")
                 + (", forward waited on" if order == forward.WAITED else ""))
        device_bytes = sources * logits_bytes + 3 * fp32_bytes
        out.append(sweep.Cell(
            sizes=dict(experiment=catalogue.STEP, device=device_label(device), model=shape.model,
                       rows=n, vocab=shape.vocab, k=k, log_softmax=where, regime=labels[regime],
                       overlap_order=order, dtype=str(logits_dtype).removeprefix("torch.")),
            arms=every_arm, label=label,
            words=label.replace("on device", "on the host (a CPU run)") if on_cpu else "",
            host_bytes=3 * fp32_bytes + (device_bytes if on_cpu else 0),
            device_bytes=0 if on_cpu else device_bytes,
            invalid="" if k <= shape.vocab else
            f"K={k} exceeds the vocabulary V={shape.vocab}: no top-K to take"))
    return sorted(out, key=lambda cell: (rows.index(cell.sizes["rows"]), -cell.sizes["vocab"]))


def precision_for(arms: list[str], aa_arm: str | None, *, delta: float, max_rounds: int,
                  max_seconds: float) -> bench.Precision:
    """Rounds until resolved for the three questions: ``seed_pinned`` and the grow-only pageable
    buffer against the seed's step, and ``seed_pinned`` against the grow-only pageable buffer,
    each while its CI straddles the bar ``1 / (1 - delta)``, and the A/A twin against the seed's
    step (what is resolved where the others cannot run, with no GPU). A comparison whose arm was
    not timed is left out when the rounds are checked. Never stopping before the rounds a PORT
    needs (:data:`stagelab.core.design.TAIL_ROUNDS`, or the cap)."""
    reused = catalogue.REUSE_LEVER[catalogue.STEP]
    questions = tuple((b, c) for b, c in ((BASELINE, CANDIDATE), (BASELINE, reused),
                                          (reused, CANDIDATE)) if b in arms and c in arms)
    twin = ((BASELINE, aa_name(aa_arm)),) if aa_arm else ()
    return bench.Precision(questions + twin or ((BASELINE, CANDIDATE),), bar=1 / (1 - delta),
                           max_rounds=max_rounds, max_seconds=max_seconds,
                           min_rounds=min(design.TAIL_ROUNDS, max_rounds))


def measure(shapes: list[ModelShape], rows: list[int], ks: list[int], logits_dtype: torch.dtype,
            arms: list[str] | None, *, rounds: int, warmup: int = 2,
            aa_arm: str | None = BASELINE,
            sources: int = 2, seed: int = 0, device: str | None = None,
            sink: RowSink | None = None, progress: bool = True,
            log_softmax: tuple[str, ...] | list[str] = ("device",),
            forward_ms: float | None = None, delta: float = 0.02, max_rounds: int | None = None,
            max_seconds: float = math.inf,
            seed_regimes: Dimension = (native.MALLOC,),
            overlap_orders: Dimension = (forward.QUEUED,),
            overlap_only: OverlapCells | None = None) -> list[dict]:
    """Time every arm's whole step per ``(n, V, K)`` cell and place of the log-softmax,
    interleaved in a balanced order, with an A/A twin of ``aa_arm``; schema records out (written
    per cell into ``sink``).

    ``seed_regimes``: the seed vector's allocation regimes, each its own cells (the process's
    malloc, ``malloc``, as the engine gets it; ``mapped fresh``: every vector its own mapping),
    recorded per row (column ``regime``).

    ``overlap_orders``: how each step meets the forward queued before it, each its own cells
    (column ``overlap_order``): ``queued``, the fill overlaps the forward; ``waited``, the
    device is waited on before the allocation (:func:`wait_in_order`), the other bound;
    ``overlap_only`` limits the orders after the first to some ``[n, model]`` cells
    (:func:`in_order`). On a CPU nothing is queued, so both orders measure the same step.

    ``forward_ms`` of device work is queued before each timed step (None: the cell's model's
    :func:`default_forward_ms`), so that each timed call is a decode step; it is recorded per
    cell (metric ``forward_ms``, the formula in the note). With ``max_rounds`` above ``rounds``,
    rounds are added until the decisive comparison's CI half-width is at most ``delta / 2`` or a
    cap (``max_rounds``, ``max_seconds`` per cell) is reached (:func:`precision_for`).

    Also records, per cell, the host's own rates at its size (:mod:`stagelab.measure.hostrates`,
    the cost model's inputs), taken between its rounds, and, per arm and cell, the largest
    difference of its logprobs from the fused arm's and how many ranks differ
    (``max_abs_error``, ``rank_mismatches``), so that a speed comparison is never one between
    different answers; where the one-pass arm is timed, the kernel's read rate once per size
    (:func:`read_rates_once`). ``arms=None`` times every arm of the catalogue.
    """
    device, arms = device or default_device(), chosen_arms(arms)
    todo = cells(shapes, rows, ks, logits_dtype, arms, aa_arm=aa_arm, sources=sources,
                 device=device, log_softmax=log_softmax, seed_regimes=seed_regimes,
                 overlap_orders=overlap_orders, overlap_only=overlap_only)
    regime_of = {native.regime_label(regime): regime for regime in seed_regimes}
    if forward_ms is not None:
        ForwardLoad(forward_ms, device)  # refuses a bad value before anything is measured
    shape_of = {(shape.model, shape.vocab): shape for shape in shapes}
    generator = torch.Generator(device=device).manual_seed(seed)
    read_sizes: set[tuple[int, ...]] = set()  # the one-pass kernel's read rate: once per size

    def prepare(cell: sweep.Cell) -> sweep.CellPlan:
        n, vocab, k = cell.sizes["rows"], cell.sizes["vocab"], cell.sizes["k"]
        where = cell.sizes["log_softmax"]
        if forward_ms is None:
            ms, how = default_forward_ms(shape_of[(cell.sizes["model"], vocab)], device, n)
        else:
            ms, how = forward_ms, "given"
        load = ForwardLoad(ms, device)
        regime, order = regime_of[cell.sizes["regime"]], cell.sizes["overlap_order"]
        built, unavailable = build_pipelines(arms, where, regime, order)
        if aa_arm in built:
            built[aa_name(aa_arm)] = make_pipeline(aa_arm, where, regime, order)
        elif aa_arm:
            unavailable[aa_name(aa_arm)] = unavailable[aa_arm]
        logits = bench.rotating(lambda i: (3 * torch.randn(
            n, vocab, device=device, generator=generator)).to(logits_dtype), sources)
        tokens = bench.rotating(lambda i: torch.randint(0, vocab, (n,), device=device,
                                                        generator=generator), sources)
        host_tokens = [t.cpu() for t in tokens]
        host_rates, no_rates = _host_sampler(n, vocab, k, seed, sources, logits_dtype,
                                             host_block=torch.device(device).type == "cpu")
        for scores, ids in zip(logits, tokens):  # validated once here, never inside a timed call
            lp.check_call(scores, k, ids)
            lp.check_token_ids(ids, n, vocab)

        facts: dict[tuple[str, int], dict[str, Any]] = {}  # per (arm, round): its alloc's

        def call(name: str, pipeline: SeedStep | DeviceStep, r: int) -> dict[str, float]:
            load.queue()  # the decode forward the step follows in the engine
            stages = pipeline.run(bench.pick(logits, r), k, bench.pick(tokens, r),
                                  bench.pick(host_tokens, r))[1]
            if isinstance(pipeline, SeedStep):
                facts[(name, r - warmup)] = pipeline.facts  # the record's round: r - warm-up
            return stages

        def annotate(record: dict) -> dict:
            if record.get("stage") == "copy":
                record["bytes"] = copied_bytes(record["arm"], n, vocab, k)
            if record.get("stage") == "alloc":
                record.update(facts.get((record["arm"], record["round"]), {}))
            return record

        clocks, pinned_before = ClockSampler(device), host_allocations(device)

        def after() -> list[dict]:
            inputs = (built, logits[0], k, tokens[0], host_tokens[0])
            return [*load.rows(how), *clocks.rows(),
                    *host_allocation_rows(device, pinned_before),
                    *sweep.guarded("agreement", agreement, *inputs),
                    *sweep.guarded("sync_debug", sync_debug, *inputs),
                    *(sweep.guarded(hostrates.ARM, host_rates.rows, HOST_RATE_REPEATS)
                      if host_rates else no_rates),
                    *read_rates_once(built, read_sizes, logits[0], k, tokens[0])]

        return sweep.CellPlan(
            calls={name: (lambda r, name=name, p=p: call(name, p, r))
                   for name, p in built.items()},
            unavailable=unavailable, annotate=annotate, after=after,
            between_rounds=sweep.both(clocks.between_rounds,
                                      host_rates.every(warmup + rounds, HOST_RATE_REPEATS)
                                      if host_rates else None))

    precision = (precision_for(arms, aa_arm, delta=delta, max_rounds=max_rounds,
                               max_seconds=max_seconds)
                 if max_rounds is not None and max_rounds > rounds else None)
    return sweep.run(todo, prepare, rounds=rounds, warmup=warmup, seed=seed, device=device,
                     sink=sink, label="step", progress=progress, precision=precision)


def read_rates_once(built: Mapping[str, Any], measured: set[tuple[int, ...]],
                    logits: torch.Tensor, k: int, tokens: torch.Tensor) -> list[dict]:
    """The one-pass kernel's read rate on a cell's logits (:func:`stagelab.measure.onepass.
    read_rate_rows`, its figure of merit beside the step: bytes read per second and the share
    of the HBM peak), where the cell times the one-pass arm and its size was not read yet
    (``measured``: the sizes already read, the place of the log-softmax, the regime and the
    overlap order do not change it); after the cell's rounds, never inside a timed call."""
    size = (*logits.shape, k, logits.element_size())
    if catalogue.ONE_PASS not in built or size in measured:
        return []
    measured.add(size)
    try:
        return onepass.read_rate_rows(logits, k, tokens)
    except Exception as exc:  # a failed read rate costs the cell nothing else
        return [{"arm": catalogue.ONE_PASS, "metric": schema.READ_RATE, "status": "failed",
                 "note": bench.first_line(exc)}]


def _host_sampler(n: int, vocab: int, k: int, seed: int, sources: int,
                  logits_dtype: torch.dtype, host_block: bool
                  ) -> tuple[hostrates.Sampler | None, list[dict]]:
    """A cell's host-rate sampler, allocating in the step's pattern (``host_block``: its
    log-softmax output on the host, a CPU step), or None and the row saying why it could not be
    made: the host rates never cost a cell its timings."""
    try:
        return hostrates.Sampler(n, vocab, k, seed=seed, sources=sources,
                                 logits_dtype=logits_dtype, host_block=host_block), []
    except Exception as exc:
        return None, [{"arm": hostrates.ARM, "status": "failed", "note": bench.first_line(exc)}]


def agreement(pipelines: dict[str, SeedStep | DeviceStep], logits: torch.Tensor, k: int,
              tokens: torch.Tensor, host_tokens: torch.Tensor) -> list[dict]:
    """Each arm's largest logprob difference from the fused arm's, and its rank mismatches."""
    reference, _ = DeviceStep(catalogue.FUSED).run(logits, k, tokens, host_tokens)
    rows = []
    for name, pipeline in pipelines.items():
        result, _ = pipeline.run(logits, k, tokens, host_tokens)
        error = float((result.logprobs - reference.logprobs).abs().max())
        mismatches = int((result.selected_token_ranks != reference.selected_token_ranks).sum())
        rows += [{"arm": name, "metric": "max_abs_error", "value": error},
                 {"arm": name, "metric": "rank_mismatches", "value": float(mismatches)}]
    return rows


def sync_debug(pipelines: dict[str, SeedStep | DeviceStep], logits: torch.Tensor, k: int,
               tokens: torch.Tensor, host_tokens: torch.Tensor) -> list[dict]:
    """On CUDA, one call of each arm under ``set_sync_debug_mode("warn")``: how many
    synchronizing operations torch flags (metric ``sync_warnings``; the first texts in the note).
    The designed waits are the seed arms' copy into pageable memory and each arm's one
    synchronize (and, in the ``waited`` overlap order, one more before its host staging);
    anything more is a hidden wait."""
    if logits.device.type != "cuda":
        return [{"arm": "sync_debug", "metric": "sync_warnings", "status": "unavailable",
                 "note": "torch's sync debug mode needs a CUDA device"}]
    bare = len(stagelab.measure.device.sync_warnings(lambda: stagelab.measure.device.synchronize(logits.device)))
    rows = []
    for name, pipeline in pipelines.items():
        found = stagelab.measure.device.sync_warnings(
            lambda p=pipeline: p.run(logits, k, tokens, host_tokens))
        rows.append({"arm": name, "metric": "sync_warnings", "value": float(len(found)),
                     "note": f"a bare synchronize gives {bare}; " + " | ".join(found[:3])})
    return rows
