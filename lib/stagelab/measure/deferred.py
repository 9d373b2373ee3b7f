"""The seed's step with its wait deferred one step: pinning's second payoff.

Pinned alone makes the copy run at DMA speed, but the host still waits for it, then sorts. An
engine that pins can stop waiting (vLLM's async output, SGLang's overlap scheduler): step ``i``
queues its log-softmax and its copy into slot ``i mod 2`` of a grow-only scratch, with an event
(:class:`Completion`); the host then waits for step ``i - 1``'s event and runs the seed's C++
top-K on that slot, while the device runs the next forward and step ``i``'s copy. Logprobs come
out one step late (the sampled token is not delayed); the last step of a sequence is drained.

Where the copy runs is a :class:`Lane`: :class:`CudaLane` (a side stream, CUDA events: the copy
overlaps the next forward) or :class:`HostLane` (a CPU: the copy completes at once, so nothing
overlaps). A test injects a lane whose copy completes late, or takes a known time.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

import stagelab.measure.device
from stagelab.core import forward
from stagelab.measure import logprobs as lp
from stagelab.measure import native, staging, timeline

SLOTS = 2  # step i's copy goes to slot i mod 2 while the host reads slot (i - 1) mod 2
LOG_SOFTMAX = ("device", "host")  # where the log-softmax runs, as in the seed's other arms


class Slot(Protocol):
    """A grow-only host buffer (:class:`stagelab.measure.staging.PinnedGrowOnly` on a GPU)."""

    def ensure(self, nbytes: int) -> torch.Tensor:
        """The buffer, grown (never shrunk) to hold at least ``nbytes``."""


class Completion(Protocol):
    """A queued copy: the host may read its slot only after :meth:`wait` returns."""

    def wait(self) -> None:
        """Block the host until the copy is complete."""

    def copy_seconds(self) -> float:
        """The copy's own seconds (read after :meth:`wait`)."""


class Lane(Protocol):
    """Where a slot's copy runs."""

    def copy(self, host: torch.Tensor, staged: torch.Tensor) -> Completion:
        """Queue ``staged``'s copy into ``host``; return at once with its completion."""


@dataclass
class Done:
    """A copy that completed when it was queued (a CPU's)."""

    seconds: float

    def wait(self) -> None:
        return None

    def copy_seconds(self) -> float:
        return self.seconds


class HostLane:
    """A CPU's lane: the copy runs when it is queued and completes at once; nothing overlaps."""

    def copy(self, host: torch.Tensor, staged: torch.Tensor) -> Completion:
        start = time.perf_counter()
        host.copy_(staged)
        return Done(time.perf_counter() - start)


class CudaCompletion:
    """A copy on the side stream between two CUDA events; holds the device source until its
    wait, so that its memory is not reused while the copy reads it."""

    def __init__(self, start: torch.cuda.Event, end: torch.cuda.Event,
                 source: torch.Tensor) -> None:
        self.start, self.end, self.source = start, end, source

    def wait(self) -> None:
        stagelab.measure.device.wait_event(self.end)
        self.source = torch.empty(0)

    def copy_seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3


class CudaLane:
    """Copies on a side stream of their own (the engines' copy stream): each waits for the work
    queued so far on the current stream (the forward, the log-softmax), then runs beside the
    next forward; its end is an event the host waits on later."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)

    def copy(self, host: torch.Tensor, staged: torch.Tensor) -> Completion:
        self.stream.wait_stream(torch.cuda.current_stream(staged.device))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record()
            host.copy_(staged, non_blocking=True)
            end.record()
        return CudaCompletion(start, end, staged)


def lane_for(device: torch.device) -> Lane:
    """The lane a device's copies run on: a side stream on CUDA, at once on a CPU."""
    return CudaLane(device) if device.type == "cuda" else HostLane()


class LogSoftmaxClock:
    """The log-softmax's seconds: CUDA events around it on a GPU (read once its copy is waited
    for, so that timing it adds no wait), the host clock on a CPU (where it runs when called)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host_start, self.host_seconds = time.perf_counter(), 0.0
        self.events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        if self.cuda:
            self.events = (torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event(enable_timing=True))
            self.events[0].record()

    def stop(self) -> LogSoftmaxClock:
        if self.events is not None:
            self.events[1].record()
        else:
            self.host_seconds = time.perf_counter() - self.host_start
        return self

    def seconds(self) -> float:
        if self.events is None:
            return self.host_seconds
        return self.events[0].elapsed_time(self.events[1]) / 1e3


@dataclass
class Pending:
    """A step whose copy is queued and whose host top-K has not run."""

    completion: Completion
    log_softmax: LogSoftmaxClock
    host: torch.Tensor
    num_logprobs: int
    host_token_ids: torch.Tensor


Stages = dict[str, float]
# The stages a step's seconds are known for once its copy is waited for (on a GPU its events are
# read only then): counted at its finish, so that a sequence sums each step's once.
FINISH_STAGES = ("device", "copy", "host_gather", "free")


def slot_view(slot: Slot, shape: torch.Size) -> torch.Tensor:
    """A grow-only slot's bytes as fp32 ``shape`` (grown, never shrunk, to hold it)."""
    nbytes = shape.numel() * 4
    return slot.ensure(nbytes)[:nbytes].view(torch.float32).view(shape)


class DeferredStep:
    """The seed's step through two grow-only slots with its wait deferred one step.

    :meth:`step` queues this step's log-softmax and copy, then waits for the previous step's
    copy and runs the host top-K on its slot: it returns the previous step's results (None on a
    sequence's first step). :meth:`drain` finishes the last pending step; :meth:`run` is one
    step drained (the results of the logits it is given, as the other arms' ``run``). A step's
    stages are counted when it finishes (:data:`FINISH_STAGES`), its ``alloc`` when queued.
    Stages:
    ``device`` (the log-softmax, queued), ``alloc`` (the slot), ``copy`` (on CUDA the copy's
    own events on the side stream, beside the next forward), ``host_gather`` (the C++ top-K) and
    ``free`` (the step's view of its slot dropped; the slot is kept); the host's wait for the
    previous step's copy is outside every stage, as the other seed arms' wait (a range of the
    timeline only); with
    the log-softmax on the host, the fp32 logits are copied and normalised in the slot after the
    wait (``host_softmax``), as the seed's other arms do."""

    def __init__(self, name: str, slots: Sequence[Slot], backend: str = "native",
                 log_softmax: str = "device", lane: Callable[[torch.device], Lane] = lane_for
                 ) -> None:
        if len(slots) != SLOTS:
            raise ValueError(f"slots: a deferred step needs {SLOTS} slots, got {len(slots)}")
        if log_softmax not in LOG_SOFTMAX:
            raise ValueError(f"log_softmax must be one of {LOG_SOFTMAX}, got {log_softmax!r}")
        self.log_softmax = log_softmax
        self.name, self.slots, self.backend = name, tuple(slots), backend
        self.make_lane: Callable[[torch.device], Lane] = lane
        self.lane: Lane | None = None
        self.overlap = forward.QUEUED
        self.pending: collections.deque[Pending] = collections.deque()
        self.queued = 0  # steps queued so far: the next goes to slot queued mod 2
        self.facts: dict[str, object] = {}

    def step(self, logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
             host_token_ids: torch.Tensor) -> tuple[lp.LogprobsTensors | None, Stages]:
        """Queue this step; return the previous step's results and this call's stage seconds."""
        clock = LogSoftmaxClock(logits.device)
        with timeline.stage("device"):
            staged = lp.staged_for_copy(logits, self.log_softmax)
        clock.stop()
        if self.overlap == forward.WAITED:  # outside every stage, as in every arm
            stagelab.measure.device.synchronize(logits.device)
        start = time.perf_counter()
        with timeline.stage("alloc"):
            host = slot_view(self.slots[self.queued % SLOTS], staged.shape)
        stages = {"alloc": time.perf_counter() - start}
        if self.lane is None:
            self.lane = self.make_lane(logits.device)
        with timeline.stage("copy"):
            completion = self.lane.copy(host, staged)
        self.pending.append(Pending(completion, clock, host, num_logprobs, host_token_ids))
        self.queued += 1
        if len(self.pending) < SLOTS:
            return None, {**stages, **dict.fromkeys(FINISH_STAGES, 0.0)}
        result, finished = self.finish_oldest()
        return result, {**stages, **finished}

    def finish_oldest(self) -> tuple[lp.LogprobsTensors, Stages]:
        """Wait for the oldest pending copy, then run the host top-K on its slot."""
        oldest = self.pending.popleft()
        with timeline.stage("wait"):  # outside every stage, as the seed arms' wait
            oldest.completion.wait()
        stages = {"device": oldest.log_softmax.seconds(),
                  "copy": oldest.completion.copy_seconds()}
        if self.log_softmax == "host":
            start = time.perf_counter()
            with timeline.stage("host_softmax"):
                oldest.host.sub_(torch.logsumexp(oldest.host, dim=-1, keepdim=True))
            stages["host_softmax"] = time.perf_counter() - start
        start = time.perf_counter()
        with timeline.stage("host_gather"):
            result = lp.gather_logprobs_host(oldest.host, oldest.num_logprobs,
                                             oldest.host_token_ids, backend=self.backend,
                                             validate=False)
        stages["host_gather"] = time.perf_counter() - start
        start = time.perf_counter()
        with timeline.stage("free"):
            del oldest  # the slot's view and its completion: the slot itself is kept
        return result, {**stages, "free": time.perf_counter() - start}

    def drain(self) -> tuple[lp.LogprobsTensors | None, Stages]:
        """Finish every pending step (the last of a sequence); the last results, or None."""
        result: lp.LogprobsTensors | None = None
        stages: Stages = {}
        while self.pending:
            result, finished = self.finish_oldest()
            stages = {name: stages.get(name, 0.0) + seconds for name, seconds in finished.items()}
        return result, stages

    def run(self, logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
            host_token_ids: torch.Tensor) -> tuple[lp.LogprobsTensors, Stages]:
        """One step, drained: the results of these logits, and the step's stage seconds."""
        self.drain()
        _, queued = self.step(logits, num_logprobs, token_ids, host_token_ids)
        result, finished = self.drain()
        assert result is not None  # one step was queued, so one was finished
        return result, {**queued, **finished}


def build(name: str, log_softmax: str = "device", regime: str = native.MALLOC) -> DeferredStep:
    """The arm as the step's registry builds it (``regime`` concerns only a fresh vector): two
    pinned grow-only slots where CUDA exists; on a CPU two pageable ones, whose copies complete
    at once, so that the code path runs and nothing overlaps. The seed's C++ top-K (the
    compiler is checked first, before any pinned memory is taken)."""
    native.require()
    slot = staging.PinnedGrowOnly if stagelab.measure.device.cuda_present() else staging.PageableReused
    return DeferredStep(name, [slot() for _ in range(SLOTS)], "native", log_softmax)
