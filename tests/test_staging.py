"""Staging arms: values, allocation counts, grow-only behaviour, the pinned-allocator proof."""

from __future__ import annotations

import pytest
import torch

from conftest import RecordingAllocator
from stagelab.core import schema
from stagelab.measure import memory, native, shapes, staging

CUDA = torch.cuda.is_available()


def source(n: int, vocab: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)).to(dtype)


def cpu_arms() -> list[staging.StagingArm]:
    return [staging.PageableFresh(), staging.PageableReused(),
            staging.PinnedGrowOnly(allocator=RecordingAllocator()), staging.RawCeiling(1 << 20)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("arm", cpu_arms(), ids=lambda a: a.name)
def test_every_arm_returns_the_source_values(arm, dtype):
    for n, vocab in [(3, 1001), (1, 7), (5, 333)]:
        src = source(n, vocab, dtype, seed=n)
        out = arm.stage(src)
        assert out.shape == src.shape and out.dtype == src.dtype and out.device.type == "cpu"
        assert torch.equal(out, src)
        assert out.data_ptr() != src.data_ptr()


def test_pinned_grow_only_stages_into_the_allocators_buffer_and_only_grows():
    allocator = RecordingAllocator()
    arm = staging.PinnedGrowOnly(allocator=allocator)
    sizes = [(4, 1000), (2, 1000), (1, 10), (4, 1000), (8, 1000), (3, 1000), (8, 1000)]
    allocations_after = []
    for i, (n, vocab) in enumerate(sizes):
        src = source(n, vocab, seed=i)
        out = arm.stage(src)
        assert torch.equal(out, src)
        assert allocator.owns(out), "the staged tensor must lie inside the allocator's buffer"
        allocations_after.append(arm.allocations)
    assert allocations_after == [1, 1, 1, 1, 2, 2, 2]
    assert [b.numel() for b in allocator.buffers] == [16000, 32000]
    assert arm.capacity_bytes == 32000 and arm.pinned_bytes_held == 32000 and arm.pinned


def test_pinned_bytes_held_are_the_footprint_torch_s_allocator_holds():
    from stagelab.measure import device

    request = 4 * 256 * 262_208  # the step's largest fp32 block: 268.5 MB
    assert device.pinned_footprint(request) == 512 << 20
    assert [device.pinned_footprint(n) for n in (0, 1, 1 << 20, (1 << 20) + 1)] == [
        0, 1, 1 << 20, 2 << 20]
    arm = staging.PinnedGrowOnly(allocator=RecordingAllocator())
    arm.stage(source(3, 1000))  # 12000 B
    assert arm.pinned_bytes_held == 12000  # an injected allocator: what it handed out
    arm.torch_allocator = True  # torch's: rounded up to a power of two per block
    assert arm.pinned_bytes_held == 16384 and arm.capacity_bytes == 12000


def test_pageable_arms_count_their_allocations():
    fresh, reused = staging.PageableFresh(), staging.PageableReused()
    for i in range(5):
        fresh.stage(source(2, 100, seed=i))
        reused.stage(source(2, 100, seed=i))
    assert fresh.allocations == 5 and reused.allocations == 1
    assert fresh.pinned_bytes_held == 0 and reused.pinned_bytes_held == 0


def test_pageable_reused_returns_views_of_one_buffer():
    arm = staging.PageableReused()
    first = arm.stage(source(4, 50))
    second = arm.stage(source(2, 50, seed=1))
    assert first.data_ptr() == second.data_ptr()


@pytest.mark.skipif(CUDA, reason="checks the CPU-only refusal")
@pytest.mark.parametrize("cls", [staging.PinnedGrowOnly, staging.PinnedFresh,
                                 staging.ToCpuNonBlocking])
def test_pinned_arms_refuse_clearly_without_cuda(cls):
    with pytest.raises(staging.PinnedMemoryUnavailable, match="needs a CUDA device"):
        cls()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_pinned_grow_only_on_cuda_uses_pinned_memory_from_its_allocator():
    handed: list[torch.Tensor] = []

    def allocator(nbytes: int) -> torch.Tensor:
        handed.append(staging.pinned_allocator(nbytes))
        return handed[-1]

    arm = staging.PinnedGrowOnly(allocator=allocator)
    src = torch.randn(8, 4099, device="cuda")
    out = arm.stage(src)
    assert out.is_pinned() and torch.equal(out, src.cpu())
    start = handed[-1].data_ptr()
    assert start <= out.data_ptr() < start + handed[-1].numel()
    for cls in (staging.PinnedFresh, staging.ToCpuNonBlocking):
        assert torch.equal(cls().stage(src), src.cpu())


def test_bad_sources_are_refused_naming_src():
    arm = staging.PageableReused()
    with pytest.raises(ValueError, match="src must be contiguous"):
        arm.stage(source(4, 10).t())
    with pytest.raises(ValueError, match="src is empty"):
        arm.stage(torch.empty(0, 10))
    with pytest.raises(TypeError, match="src must be a torch.Tensor"):
        arm.stage([1.0, 2.0])
    assert arm.allocations == 0  # refused before allocating


def test_raw_ceiling_refuses_a_copy_larger_than_its_buffer():
    with pytest.raises(ValueError, match="raw_ceiling holds 64"):
        staging.RawCeiling(64).stage(source(1, 100))
    with pytest.raises(ValueError, match="capacity_bytes must be positive"):
        staging.RawCeiling(0)


def test_unknown_arm_is_named():
    with pytest.raises(ValueError, match="unknown arm 'fast'; valid: pageable_fresh"):
        staging.make_arm("fast")


def test_measure_times_interleaved_arms_and_records_what_it_cannot_measure():
    arms = ["pageable_fresh", "pageable_fresh_empty", "pageable_reused", "pinned_grow_only",
            "raw_ceiling"]
    records = staging.measure(staging.StagingSweep(
        shapes.resolve_vocabs([1000]), [2], torch.float32, arms, rounds=4, warmup=1), progress=False)
    frame = schema.make_rows(records)
    timed = frame[(frame.metric == "time") & (frame.status == "ok")]
    expected = {"pageable_fresh": 4, "pageable_fresh~aa": 4, "pageable_fresh_empty": 4,
                "pageable_reused": 4, "raw_ceiling": 4}
    if CUDA:
        expected["pinned_grow_only"] = 4
    assert timed.groupby("arm").size().to_dict() == expected
    assert (timed.bytes == 8000).all() and (timed.seconds > 0).all()
    assert set(timed["round"]) == {0, 1, 2, 3}
    if not CUDA:
        missing = frame[frame.arm == "pinned_grow_only"]
        assert list(missing.status) == ["unavailable"]
        assert "needs a CUDA device" in missing.note.iloc[0]
    allocations = frame[frame.metric == "allocations"].set_index("arm")["value"]
    assert allocations["pageable_fresh"] == 5 and allocations["pageable_reused"] == 1


def test_measure_skips_a_cell_that_does_not_fit_with_the_numbers(monkeypatch):
    monkeypatch.setattr(memory, "free_host_bytes", lambda: 10_000)
    frame = schema.make_rows(staging.measure(staging.StagingSweep(
        shapes.resolve_vocabs([1000]), [64], torch.float32, ["pageable_fresh"], rounds=2), progress=False))
    assert list(frame.status) == ["skipped", "skipped"]  # the arm and its A/A twin
    assert "needs" in frame.note.iloc[0] and "GiB" in frame.note.iloc[0]


@pytest.mark.parametrize("kwargs, message", [
    ({"arms": ["nope"]}, "arms: unknown arm 'nope'"),
    ({"arms": []}, "arms is empty"),
    ({"arms": ["pageable_reused"]}, "aa_arm 'pageable_fresh' must be one of arms"),
    ({"rounds": 0}, "rounds must be positive"),
    ({"rows": [0]}, "rows: 0 is not a positive integer"),
    ({"rows": []}, "rows is empty"),
])
def test_measure_bad_parameters(kwargs, message):
    args = {"arms": ["pageable_fresh"], "rounds": 2, "rows": [1], **kwargs}
    rows = args.pop("rows")
    with pytest.raises(ValueError, match=message):
        staging.measure(staging.StagingSweep(
            shapes.resolve_vocabs([10]), rows, torch.float32, **args), progress=False)


def test_grow_only_results_are_views_until_the_next_stage_unless_copied():
    arm = staging.PageableReused()
    first_src, second_src = source(2, 50), source(2, 50, seed=1)
    kept = arm.stage(first_src, copy=True)
    view = arm.stage(first_src)
    arm.stage(second_src)
    assert torch.equal(view, second_src), "a view of the buffer shows the next stage's data"
    assert torch.equal(kept, first_src), "copy=True keeps the result"


def test_the_fresh_arm_zero_fills_like_a_value_initialised_vector(monkeypatch):
    made = []
    real_zeros = torch.zeros

    def recording_zeros(*args, **kwargs):
        made.append(args)
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(staging.PageableFresh, "_make", staticmethod(recording_zeros))
    out = staging.PageableFresh().stage(source(3, 10))
    assert made == [(torch.Size([3, 10]),)] and out.shape == (3, 10)
    assert staging.PageableFreshEmpty._make is torch.empty


def test_the_copy_level_baseline_fills_through_the_native_vector(monkeypatch):
    """The seed's fresh buffer is its value-initialised std::vector (one thread), not torch's
    multi-threaded zeros, which stays as a labelled arm of its own."""
    assert staging.PageableFresh._make is staging.seed_vector_like
    assert staging.PageableFreshZeros._make is torch.zeros
    fresh = staging.seed_vector_like(torch.Size([3, 5]), torch.bfloat16)
    assert fresh.shape == (3, 5) and fresh.dtype == torch.bfloat16 and not fresh.any()
    src = torch.randn(4, 7).to(torch.bfloat16)
    assert torch.equal(staging.make_arm("pageable_fresh").stage(src, copy=True), src)
    monkeypatch.setattr(native, "status", lambda: (False, "no C++ compiler: test"))
    built, unavailable = staging.build_arms(["pageable_fresh", "pageable_fresh_zeros"], 0)
    assert list(built) == ["pageable_fresh_zeros"]
    assert unavailable == {"pageable_fresh": "no C++ compiler: test"}
