"""The deferred arm: two slots from the pinned allocator, the host reading a slot only after its
copy's event, and a sequence of steps that gains nothing from the harness's idle time."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from conftest import RecordingAllocator, make_logits, make_tokens
from reference import assert_matches_reference
from stagelab.measure import deferred, native, sequence, staging
from stagelab.measure.testing import SyncCounter

NATIVE_OK, NATIVE_WHY = native.status()
needs_native = pytest.mark.skipif(not NATIVE_OK,
                                  reason=f"the native path cannot be built here: {NATIVE_WHY}")


def owner(allocator: RecordingAllocator, tensor: torch.Tensor) -> int:
    """The index of the allocator's buffer that holds all of ``tensor`` (-1: none does)."""
    size = tensor.numel() * tensor.element_size()
    for index, buffer in enumerate(allocator.buffers):
        start = buffer.data_ptr()
        if start <= tensor.data_ptr() and tensor.data_ptr() + size <= start + buffer.numel():
            return index
    return -1


class RecordingLane:
    """The CPU's lane, remembering every destination it was handed."""

    def __init__(self) -> None:
        self.destinations: list[torch.Tensor] = []

    def copy(self, host: torch.Tensor, staged: torch.Tensor) -> deferred.Completion:
        self.destinations.append(host)
        return deferred.HostLane().copy(host, staged)


def pinned_step(allocator: RecordingAllocator, lane: object) -> deferred.DeferredStep:
    slots = [staging.PinnedGrowOnly(allocator=allocator) for _ in range(deferred.SLOTS)]
    return deferred.DeferredStep("seed_pinned_deferred", slots, lane=lambda device: lane)


@needs_native
def test_every_copy_of_both_slots_lands_in_the_pinned_allocators_buffers_which_only_grow():
    allocator, lane = RecordingAllocator(), RecordingLane()
    pipeline = pinned_step(allocator, lane)
    inputs = [(make_logits(n, 1000, seed=n), make_tokens(n, 1000), make_tokens(n, 1000))
              for n in (4, 2, 8, 8, 8)]
    sequence.run(pipeline, lambda: None, inputs, 3)
    owners = [owner(allocator, host) for host in lane.destinations]
    assert -1 not in owners
    # slot 0 (steps 0, 2, 4) grows at n=8 into buffer 2, slot 1 (steps 1, 3) into buffer 3
    assert owners == [0, 1, 2, 3, 2]
    assert [b.numel() for b in allocator.buffers] == [16000, 8000, 32000, 32000]


class LateCompletion:
    """A copy that lands in its slot only when the host waits for it."""

    def __init__(self, lane: LateLane, index: int, host: torch.Tensor,
                 staged: torch.Tensor) -> None:
        self.lane, self.index, self.host, self.staged = lane, index, host, staged.clone()

    def wait(self) -> None:
        self.lane.log.append(f"wait {self.index}")
        self.host.copy_(self.staged)

    def copy_seconds(self) -> float:
        return 0.0


@dataclass
class LateLane:
    """A fake device that completes every copy late: until its event is waited on, the slot
    holds NaN, so a host that read it early would return NaN logprobs."""

    log: list[str] = field(default_factory=list)

    def copy(self, host: torch.Tensor, staged: torch.Tensor) -> deferred.Completion:
        index = sum(entry.startswith("copy") for entry in self.log)
        self.log.append(f"copy {index}")
        host.fill_(float("nan"))
        return LateCompletion(self, index, host, staged)


@needs_native
def test_the_host_reads_a_slot_only_after_its_event_and_each_result_comes_one_step_late():
    lane = LateLane()
    pipeline = pinned_step(RecordingAllocator(), lane)
    inputs = [(make_logits(5, 700, seed=i), make_tokens(5, 700, seed=i)) for i in range(4)]
    results = [pipeline.step(logits, 3, tokens, tokens)[0] for logits, tokens in inputs]
    results.append(pipeline.drain()[0])
    assert results[0] is None  # step 0's results come with step 1
    for result, (logits, tokens) in zip(results[1:], inputs):
        assert_matches_reference(result, logits, 3, tokens, atol=5e-5, exact_ranks=False)
    assert lane.log == ["copy 0", "copy 1", "wait 0", "copy 2", "wait 1", "copy 3", "wait 2",
                        "wait 3"]


@needs_native
@pytest.mark.parametrize("where", deferred.LOG_SOFTMAX)
def test_run_is_one_step_drained_with_no_hidden_wait_wherever_its_log_softmax_runs(where):
    pipeline = deferred.build("seed_pinned_deferred", where)
    logits, tokens = make_logits(3, 500, torch.bfloat16), make_tokens(3, 500)
    with SyncCounter() as counter:
        result, stages = pipeline.run(logits, 2, tokens, tokens)
    assert_matches_reference(result, logits, 2, tokens, atol=5e-5, exact_ranks=False)
    expected = {"device", "alloc", "copy", "host_gather", "free"}
    assert set(stages) == expected | ({"host_softmax"} if where == "host" else set())
    assert counter.hidden == 0 and not pipeline.pending


def test_a_deferred_step_refuses_one_slot_and_an_unknown_place_of_its_log_softmax():
    with pytest.raises(ValueError, match="slots"):
        deferred.DeferredStep("x", [staging.PageableReused()])
    with pytest.raises(ValueError, match="log_softmax"):
        deferred.DeferredStep("x", [staging.PageableReused()] * 2, log_softmax="gpu")
    with pytest.raises(ValueError, match="steps_per_call"):
        sequence.check_steps(0)


@dataclass
class VirtualDevice:
    """A fake device on a virtual clock: one queue, a forward of ``forward_s`` and copies of
    ``copy_s`` each; the host's clock moves only when it waits (host work costs nothing)."""

    forward_s: float
    copy_s: float
    now: float = 0.0  # the host's clock
    free_at: float = 0.0  # when the device's queue runs dry

    def queue_forward(self) -> None:
        self.free_at = max(self.now, self.free_at) + self.forward_s

    def copy(self, host: torch.Tensor, staged: torch.Tensor) -> deferred.Completion:
        host.copy_(staged)
        self.free_at = max(self.now, self.free_at) + self.copy_s
        return VirtualCompletion(self, self.free_at)


@dataclass
class VirtualCompletion:
    device: VirtualDevice
    done_at: float

    def wait(self) -> None:
        self.device.now = max(self.device.now, self.done_at)

    def copy_seconds(self) -> float:
        return self.device.copy_s


def per_step_times(pipeline: deferred.DeferredStep, device: VirtualDevice, idle_s: float,
                   calls: int = 4, steps: int = 5) -> list[float]:
    """Each timed call's virtual seconds per step, with ``idle_s`` of idle host time between
    calls (the harness timing other arms)."""
    inputs = [(make_logits(2, 300, seed=i), make_tokens(2, 300), make_tokens(2, 300))
              for i in range(steps)]
    found = []
    for _ in range(calls):
        start = device.now
        sequence.run(pipeline, device.queue_forward, inputs, 2)
        found.append((device.now - start) / steps)
        device.now += idle_s
    return found


@needs_native
def test_a_pipelined_arm_gains_nothing_from_idle_time_between_its_calls(monkeypatch):
    """Each call drains its last copy, so a copy of known time never finishes for free while
    other arms run; without the drain the same arm would look faster with idle time between."""
    def timed(idle_s: float, drained: bool) -> list[float]:
        device = VirtualDevice(forward_s=1.0, copy_s=2.0)
        pipeline = deferred.DeferredStep(
            "seed_pinned_deferred", [staging.PageableReused() for _ in range(deferred.SLOTS)],
            lane=lambda _: device)
        if not drained:
            monkeypatch.setattr(pipeline, "drain", lambda: (None, {}))
        return per_step_times(pipeline, device, idle_s)

    assert timed(0.0, True) == timed(100.0, True) == pytest.approx([3.0] * 4)  # forward + copy
    # without the drain a call leaves its last copy pending: 2.4 s per step where idle time
    # finished it, 3.0 where the next call met it: the gain the drain removes
    assert timed(100.0, False) == pytest.approx([2.4] * 4)
    assert timed(0.0, False) == pytest.approx([2.4, 3.0, 3.0, 3.0])


def test_a_calls_steps_take_the_rotating_sources_in_turn_across_rounds():
    sources = [torch.full((1,), float(i)) for i in range(3)]
    picked = [[float(x[0]) for x, _, _ in sequence.inputs(sources, sources, sources, r, 2)]
              for r in range(3)]
    assert picked == [[0.0, 1.0], [2.0, 0.0], [1.0, 2.0]]
