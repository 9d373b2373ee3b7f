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
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import stagelab.measure.device
from stagelab.core import catalogue, forward
from stagelab.core.errors import ExtraUnavailable, NativeUnavailable
from stagelab.measure import deferred, native, onepass, staging, timeline
from stagelab.measure import logprobs as lp
from stagelab.measure.device import PinnedMemoryUnavailable

STEP_ARMS = catalogue.arm_names(catalogue.STEP)
BASELINE = catalogue.baseline(catalogue.STEP)
CANDIDATE = catalogue.candidate(catalogue.STEP)
LOG_SOFTMAX = catalogue.LOG_SOFTMAX.values  # where the seed arms run the log-softmax
OVERLAP_ORDERS = forward.OVERLAP_ORDERS  # how a step meets the forward queued before it
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
        with timeline.stage(name):  # a range only while a timeline is recorded
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
        with timeline.stage(name):
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

    def __init__(self, arm: staging.GrowOnly) -> None:
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
        raise ValueError(f"overlap: {order!r} is not one of {list(OVERLAP_ORDERS)}")
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
            staged = lp.staged_for_copy(logits, self.log_softmax)
        wait_in_order(self.overlap, logits.device)  # outside every stage: the same in every arm
        faults = minor_faults()
        with clock.host_stage("alloc"):
            host, release = self.destination.acquire(staged.shape)
        self.facts = {"minor_faults": minor_faults() - faults,
                      "mapped": self.destination.mapped()}
        with clock.device_stage("copy"):
            host.copy_(staged, non_blocking=True)
        with timeline.stage("wait"):  # the engine's b.Synchronize(q): its one wait
            stagelab.measure.device.synchronize(logits.device)
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
        with timeline.stage("wait"):  # hands the results over: its one wait
            stagelab.measure.device.synchronize(logits.device)
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


def _native_scratch(arm: Callable[[], staging.GrowOnly]) -> Scratch:
    """A grow-only scratch for an arm whose host top-K is the seed's C++ (checked first, so that
    a machine without a compiler says so before any pinned memory is taken)."""
    native.require()
    return Scratch(arm())


def _numpy_step(name: str, where: str) -> SeedStep:
    """The seed's step with the numpy host top-K (unavailable where numpy is not installed)."""
    lp.require_numpy()
    return SeedStep(name, FreshZeros(), "numpy", where)


Pipeline = SeedStep | DeviceStep | deferred.DeferredStep  # a step arm, as the sweep calls it


# How each step arm of the catalogue is built (with where its log-softmax runs); the catalogue
# says what each one is.
BUILDERS: dict[str, Callable[[str, str, str], Pipeline]] = {
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
    "seed_pinned_deferred": lambda name, where, regime: deferred.build(name, where),
}


def make_pipeline(name: str, log_softmax: str = "device", regime: str = native.MALLOC,
                  overlap: str = forward.QUEUED) -> Pipeline:
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
                    ) -> tuple[dict[str, Pipeline], dict[str, str]]:
    """The named arms that can run here, and the reason for each that cannot."""
    built, unavailable = {}, {}
    for name in names:
        try:
            built[name] = make_pipeline(name, log_softmax, regime, overlap)
        except (PinnedMemoryUnavailable, NativeUnavailable, ExtraUnavailable) as exc:
            unavailable[name] = str(exc)
    return built, unavailable


def copied_bytes(arm: str, n: int, vocab: int, k: int) -> int:
    """Bytes an arm moves from device to host per step."""
    if catalogue.arm(catalogue.STEP, arm).stages_whole_logprobs:
        return n * vocab * 4
    return n * (k + 1) * 8 + n * 4

