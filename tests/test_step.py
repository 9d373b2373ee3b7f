"""The step's arms: the seed's native path and its stagings, the device paths, their stages, the
sweep over cells, and the waits each arm makes."""

from __future__ import annotations

import dataclasses
import resource

import pytest
import torch

from conftest import RecordingAllocator, make_logits, make_tokens
from reference import assert_matches_reference
from stagelab.core import catalogue, paths, schema
from stagelab.core.errors import NativeUnavailable
from stagelab.measure import logprobs as lp
from stagelab.measure import native, sequence, shapes, staging, step, step_pipelines
from stagelab.measure.testing import SyncCounter

CUDA = torch.cuda.is_available()
NATIVE_OK, NATIVE_WHY = native.status()


def pipelines() -> dict[str, step_pipelines.SeedStep | step_pipelines.DeviceStep]:
    """Every arm that can exist on this machine; the pinned scratch from a recording allocator."""
    arms = {name: step_pipelines.make_pipeline(name) for name in
            ("seed_pageable", "seed_pageable_reused", "seed_pageable_numpy", "device_gather",
             "fused")}
    arms["seed_pinned"] = step_pipelines.SeedStep("seed_pinned", step_pipelines.Scratch(
        staging.PinnedGrowOnly(allocator=RecordingAllocator())), "native")
    return arms


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
@pytest.mark.parametrize("arm", ["seed_pageable", "seed_pinned", "seed_pageable_reused",
                                 "seed_pageable_numpy", "device_gather", "fused"])
def test_every_arm_agrees_with_float64_and_reports_its_stages(arm):
    logits, tokens = make_logits(6, 2003, torch.bfloat16), make_tokens(6, 2003)
    pipeline = pipelines()[arm]
    for _ in range(2):  # a reused scratch gives the same answer the second time
        result, stages = pipeline.run(logits, 5, tokens, tokens)
        assert_matches_reference(result, logits, 5, tokens, atol=5e-5,
                                 exact_ranks=arm == "fused")
    expected = set(catalogue.arm(catalogue.STEP, arm).stages)
    assert set(stages) == expected and all(v >= 0 for v in stages.values())


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
def test_the_pinned_seed_arm_copies_into_its_allocators_buffer_and_only_grows():
    allocator = RecordingAllocator()
    scratch = step_pipelines.Scratch(staging.PinnedGrowOnly(allocator=allocator))
    pipeline = step_pipelines.SeedStep("seed_pinned", scratch, "native")
    for n in (4, 2, 8, 8):
        tokens = make_tokens(n, 1000)
        pipeline.run(make_logits(n, 1000, torch.bfloat16), 3, tokens, tokens)
        host, _release = scratch.acquire(torch.Size([n, 1000]))
        assert allocator.owns(host)
    assert [b.numel() for b in allocator.buffers] == [16000, 32000]


def test_native_unavailable_makes_its_arms_unavailable_and_keeps_the_numpy_arm(monkeypatch):
    def refuse() -> None:
        raise NativeUnavailable("no C++ compiler found (tried c++, g++, clang++)")

    monkeypatch.setattr(native, "require", refuse)
    built, unavailable = step_pipelines.build_pipelines(["seed_pageable", "seed_pageable_reused",
                                               "seed_pageable_numpy", "fused"])
    assert set(built) == {"seed_pageable_numpy", "fused"}
    assert set(unavailable) == {"seed_pageable", "seed_pageable_reused"}
    assert all("c++, g++, clang++" in why for why in unavailable.values())  # each tried, named


def test_measure_times_each_arm_with_a_twin_and_records_what_cannot_run():
    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [3], [2], torch.float32, list(step_pipelines.STEP_ARMS),
        rounds=3, warmup=1), progress=False))
    totals = frame[(frame.metric == "time") & (frame.stage == "total") & (frame.status == "ok")]
    expected = {"seed_pageable_numpy", "device_gather", "fused", "onepass"}
    if NATIVE_OK:
        # the deferred arm runs on a CPU too: pageable slots, each copy complete at once
        expected |= {"seed_pageable", "seed_pageable~aa", "seed_pageable_reused",
                     "seed_pinned_deferred"}
    if CUDA:
        expected.add("seed_pinned")
    assert set(totals.arm) == expected
    assert set(frame.steps.dropna()) == {sequence.DEFAULT_STEPS}
    assert all(sorted(r) == [0, 1, 2] for r in totals.groupby("arm")["round"].apply(list))
    copies = frame[(frame.stage == "copy") & (frame.status == "ok")].set_index("arm")["bytes"]
    assert copies.loc["seed_pageable_numpy"].eq(3 * 1000 * 4).all()
    assert copies.loc["fused"].eq(3 * 3 * 8 + 3 * 4).all()
    assert copies.loc["onepass"].eq(3 * 3 * 8 + 3 * 4).all()
    if not CUDA:
        missing = frame[frame.arm == "seed_pinned"]
        assert list(missing.status) == ["unavailable"]
        assert "needs a CUDA device" in missing.note.iloc[0]
    errors = frame[frame.metric == "max_abs_error"].set_index("arm")["value"]
    assert (errors < 5e-5).all() and errors["fused"] == 0.0
    ranks = frame[frame.metric == "rank_mismatches"].set_index("arm")["value"]
    assert ranks["onepass"] == 0.0


def test_a_real_run_records_each_samples_position_and_the_order_is_balanced():
    arms = ["seed_pageable_numpy", "device_gather", "fused"]
    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [3, 5], [2], torch.float32, arms,
        aa_arm="seed_pageable_numpy", rounds=9, warmup=1), progress=False),
                             run_id="run-a")
    totals = frame[(frame.metric == "time") & (frame.stage == "total") & (frame.status == "ok")]
    assert totals["position"].notna().all()
    for _, cell in totals.groupby("rows"):
        counts = cell.groupby(["arm", "position"]).size().unstack(fill_value=0)
        assert counts.shape == (4, 4)  # four arms (the twin too), four positions
        assert (counts.max() - counts.min()).max() <= 1, counts  # equally often, within one
        assert all(sorted(r) == [0, 1, 2, 3] for r in cell.groupby("round")["position"].apply(list))
    seeds = frame[frame.metric == "order_seed"]["value"]
    assert len(seeds) == 2 and seeds.nunique() == 2  # seeded per cell
    forward = frame[frame.metric == "forward_ms"]
    assert list(forward["value"]) == [0.0, 0.0] and forward["note"].str.contains("CPU").all()
    assert set(frame["log_softmax"].dropna()) == {"device"}


def test_the_log_softmax_on_the_host_gives_the_same_answer_and_its_own_stage():
    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [3], [2], torch.float32, ["seed_pageable_numpy", "fused"],
        aa_arm=None, rounds=2, warmup=0, conditions={"log_softmax": ["device", "host"]}), progress=False))
    errors = frame[frame.metric == "max_abs_error"]
    assert set(errors["log_softmax"]) == {"device", "host"} and (errors["value"] < 5e-5).all()
    stages = frame[(frame.arm == "seed_pageable_numpy") & (frame.status == "ok")]
    assert "host_softmax" in set(stages[stages.log_softmax == "host"]["stage"])
    assert "host_softmax" not in set(stages[stages.log_softmax == "device"]["stage"])


def test_the_one_pass_kernel_s_read_rate_is_a_row_of_each_size_it_was_timed_at():
    """Before: notebook 02 measured the read rate beside the sweep, so a replay or a kept run
    of a lease had no share of HBM (issue 39). Now rows of the step's table, once per size."""
    from stagelab.analyse import step_analysis

    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [3, 5], [2], torch.float32, ["fused", "onepass"],
        aa_arm=None, rounds=2, warmup=0, conditions={"log_softmax": ["device", "host"]}), progress=False))
    read = frame[frame.metric == schema.READ_RATE]
    assert sorted(zip(read["rows"], read["stage"])) == [
        (3, "l2_cold"), (3, "l2_warm"), (5, "l2_cold"), (5, "l2_warm")]  # not per place
    assert (read["arm"] == "onepass").all() and (read["status"] == "ok").all()
    assert list(read["bytes"]) == [3 * 1000 * 4] * 2 + [5 * 1000 * 4] * 2
    assert read["value"].isna().all() and read["note"].str.contains("backend torch").all()
    table = step_analysis.read_rate_table(frame)
    assert list(table["l2"]) == ["warm", "cold", "warm", "cold"]
    assert table["read_gb_per_s"].tolist() == pytest.approx(
        (read["bytes"] / read["seconds"] / 1e9).tolist())
    without = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [3], [2], torch.float32, ["fused"], aa_arm=None, rounds=2,
        warmup=0), progress=False))
    assert not (without.metric == schema.READ_RATE).any()
    said = step_analysis.read_rate_table(without).iloc[0, 0]
    assert said.startswith("not measured") and "onepass" in said


def test_every_row_records_the_seed_vectors_allocation_regime():
    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [3], [2], torch.float32, ["seed_pageable", "fused"],
        aa_arm=None, rounds=2, warmup=0, conditions={"allocator": ["malloc", "mapped fresh"]}), progress=False))
    assert set(frame["regime"]) == {native.process_allocator(), "mapped fresh"}
    timed = frame[(frame.arm == "seed_pageable") & (frame.stage == "total")
                  & (frame.metric == "time")]
    assert timed.groupby("regime")["round"].nunique().to_dict() == {
        native.process_allocator(): 2, "mapped fresh": 2}
    with pytest.raises(ValueError, match=r"conditions: allocator \['jemalloc'\] must name each of"):
        step.cells(step.StepSweep(
            shapes.resolve_vocabs([1000]), [3], [2], torch.float32, ["fused"], aa_arm=None,
            conditions={"allocator": ["jemalloc"]}), device="cpu")


def test_the_step_cells_run_in_the_order_of_rows_across_every_model():
    """Before: cells ran model by model, so a lease's second model's largest decisive cell came
    after the first model's small ones and was the first a deadline refused."""
    found = step.cells(step.StepSweep(
        shapes.resolve_vocabs([1000, 3000]), [8, 2], [1, 2], torch.float32, ["fused"], aa_arm=None), device="cpu")
    sizes = [(c.sizes["rows"], c.sizes["vocab"], c.sizes["k"]) for c in found]
    assert sizes == [(8, 3000, 1), (8, 3000, 2), (8, 1000, 1), (8, 1000, 2),
                     (2, 3000, 1), (2, 3000, 2), (2, 1000, 1), (2, 1000, 2)]


def test_a_cpu_runs_progress_says_the_log_softmax_ran_on_the_host(capfd, monkeypatch):
    """Before: a CPU run's progress lines said "log-softmax on device"; the cell's label (its
    identity, the seed of its balanced order) is kept, its words follow the machine."""
    (cell,) = step.cells(step.StepSweep(
        shapes.resolve_vocabs([1000]), [2], [2], torch.float32, ["fused"], aa_arm=None), device="cpu")
    assert cell.label == "n=2 V=1000 K=2 log-softmax on device"
    assert cell.shown.startswith("n=2 V=1000 K=2") and "(a CPU run)" in cell.shown
    monkeypatch.setenv(paths.HEADLESS_ENV, "1")  # one plain line per cell, as a run prints
    step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [2], [2], torch.float32, ["fused"], aa_arm=None, rounds=1,
        warmup=0), progress=True, device="cpu")
    assert f"step: cell 1/1 {cell.shown}: " in capfd.readouterr().err  # as shown, not its label


def test_rounds_until_precise_in_a_real_run_stop_and_say_why():
    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [3], [2], torch.float32, ["seed_pageable_numpy", "fused"],
        aa_arm="seed_pageable_numpy", rounds=5, warmup=1, max_rounds=15, delta=1e-6), progress=False))
    stop = frame[frame.metric == "rounds"]
    assert list(stop["value"]) == [15.0] and stop["note"].iloc[0].startswith("round cap")
    assert frame[(frame.metric == "time") & (frame.stage == "total")]["round"].max() == 14


def test_forward_ms_on_a_cpu_is_refused_and_the_default_follows_the_formula(monkeypatch):
    with pytest.raises(ValueError, match="forward_ms=2 needs a CUDA device"):
        step.measure(step.StepSweep(
            shapes.resolve_vocabs([10]), [1], [0], torch.float32, ["fused"], aa_arm=None, rounds=1,
            forward_ms=2), progress=False, device="cpu")
    (qwen,) = shapes.resolve_vocabs(["Qwen2.5-7B"])
    assert step.default_forward_ms(qwen, "cpu", 16)[0] == 0.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    ms, how = step.default_forward_ms(qwen, "cuda:0", 16)
    # 15.22 GB of weights + 16 x 2048 tokens x 57,344 B of KV, at 0.8 x 4800 GB/s
    assert ms == pytest.approx((7.61e9 * 2 + 16 * 2048 * 57344) / (0.8 * 4800e9) * 1e3)
    assert "16 x 2048 tokens" in how and "0.8 x 4800 GB/s" in how and "NVIDIA H200" in how
    assert step.default_forward_ms(shapes.resolve_vocabs([1000])[0], "cuda:0", 16)[0] == 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"ks": [-1]}, "ks: "), ({"ks": []}, "ks: "), ({"rows": [0]}, "rows: 0 is not a positive"),
    ({"arms": ["nope"]}, "unknown step arm 'nope'"), ({"arms": []}, "arms is empty"),
    ({"arms": ["fused"], "aa_arm": "seed_pageable"}, "aa_arm 'seed_pageable' must be one of"),
    ({"rounds": 0}, "rounds must be positive"),
])
def test_measure_refuses_bad_parameters_naming_them(kwargs, message):
    args = {"rows": [1], "ks": [0], "arms": ["fused"], "aa_arm": None, "rounds": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        step.measure(step.StepSweep(
            shapes.resolve_vocabs([10]), args.pop("rows"), args.pop("ks"), torch.float32,
            args.pop("arms"), **args), progress=False)


def test_measure_skips_a_k_larger_than_the_vocabulary_and_says_why():
    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([10]), [2], [20], torch.float32, ["fused"], aa_arm=None, rounds=1), progress=False))
    assert list(frame.status) == ["skipped"]
    assert "K=20 exceeds the vocabulary V=10" in frame.note.iloc[0]


def test_unknown_arm_is_named():
    with pytest.raises(ValueError, match="unknown step arm 'x'"):
        step_pipelines.make_pipeline("x")


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
@pytest.mark.parametrize("arm", ["seed_pageable", "seed_pinned", "seed_pageable_reused",
                                 "seed_pageable_numpy", "device_gather", "fused"])
def test_each_arm_makes_exactly_the_wait_its_design_names(arm):
    """Seed arms wait once after their copy (the engine's Synchronize), device arms once to hand
    their results over; no hidden wait (a read of a device value) anywhere in a timed call."""
    pipeline = pipelines()[arm]
    logits, tokens = make_logits(8, 3001, torch.bfloat16), make_tokens(8, 3001)
    pipeline.run(logits, 5, tokens, tokens)  # first call: builds, grows its scratch
    with SyncCounter() as counter:
        pipeline.run(logits, 5, tokens, tokens)
    assert (counter.explicit, counter.hidden) == (1, 0), counter.ops


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
@pytest.mark.parametrize("arm", ["seed_pageable", "seed_pinned", "seed_pageable_reused",
                                 "device_gather", "fused"])
@pytest.mark.parametrize("order, waits, before_staging", [("queued", 1, 0), ("waited", 2, 1)])
def test_the_waited_order_waits_once_more_before_the_host_staging(arm, order, waits,
                                                                  before_staging):
    """In the waited order every arm waits for the queued device work just before its host
    staging (a seed arm's allocation, a device arm's destination), and only then; the queued
    order makes the design's one wait, after the copy."""
    pipeline = pipelines()[arm]
    pipeline.overlap = order
    logits, tokens = make_logits(8, 3001, torch.bfloat16), make_tokens(8, 3001)
    pipeline.run(logits, 5, tokens, tokens)
    seen: list[int] = []
    owner, name = ((pipeline.destination, "acquire") if isinstance(pipeline, step_pipelines.SeedStep)
                   else (pipeline, "destination"))
    staging_call = getattr(owner, name)

    def recorded(*args):
        seen.append(counter.explicit)
        return staging_call(*args)

    setattr(owner, name, recorded)
    with SyncCounter() as counter:
        pipeline.run(logits, 5, tokens, tokens)
    assert (counter.explicit, counter.hidden, seen) == (waits, 0, [before_staging]), counter.ops


def test_cells_carry_each_overlap_order_and_a_profile_may_limit_the_second():
    found = step.cells(step.StepSweep(
        shapes.resolve_vocabs([1000, 3000]), [8, 2], [1], torch.float32, ["fused"], aa_arm=None,
        conditions={"overlap": ["queued", "waited"]}), device="cpu")
    assert [(c.sizes["rows"], c.sizes["vocab"], c.sizes["overlap_order"]) for c in found] == [
        (n, v, order) for n in (8, 2) for v in (3000, 1000) for order in ("queued", "waited")]
    assert [c.label.endswith(", forward waited on") for c in found] == [False, True] * 4
    limited = step.cells(step.StepSweep(
        shapes.resolve_vocabs([1000, 3000]), [8, 2], [1], torch.float32, ["fused"], aa_arm=None,
        conditions={"overlap": ["queued", "waited"]}, condition_cells={"overlap": [[2, 1000]]}), device="cpu")
    assert [(c.sizes["rows"], c.sizes["vocab"], c.sizes["overlap_order"]) for c in limited] == [
        (8, 3000, "queued"), (8, 1000, "queued"), (2, 3000, "queued"), (2, 1000, "queued"),
        (2, 1000, "waited")]
    default = step.cells(step.StepSweep(
        shapes.resolve_vocabs([1000]), [2], [1], torch.float32, ["fused"], aa_arm=None), device="cpu")
    assert [c.sizes["overlap_order"] for c in default] == ["queued"]
    for orders, message in ((["waited", "waited"], "at most once"), ([], "at least one"),
                            (["after"], r"conditions: overlap \['after'\] must name each of")):
        with pytest.raises(ValueError, match=message):
            step.cells(step.StepSweep(
                shapes.resolve_vocabs([1000]), [2], [1], torch.float32, ["fused"], aa_arm=None,
                conditions={"overlap": orders}), device="cpu")


def test_a_step_sweep_names_every_condition_of_the_catalogue_and_refuses_a_stranger():
    spec = step.StepSweep(shapes.resolve_vocabs([1000]), [2], [1], torch.float32, ["fused"],
                          aa_arm=None, conditions={"log_softmax": ["host", "device"]})
    assert spec.chosen == {c.name: ((c.decides,) if c is not catalogue.LOG_SOFTMAX
                                    else ("host", "device")) for c in catalogue.CONDITIONS}
    (first, second) = step.cells(spec, device="cpu")
    assert (first.sizes["log_softmax"], second.sizes["log_softmax"]) == ("host", "device")
    for given in ({"conditions": {"thp": ["never"]}}, {"condition_cells": {"thp": [[2, 1000]]}}):
        with pytest.raises(ValueError, match="no step condition"):
            step.StepSweep(shapes.resolve_vocabs([1000]), [2], [1], torch.float32, ["fused"],
                           aa_arm=None, **given)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.rounds = 3  # type: ignore[misc]


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
def test_every_step_row_records_its_overlap_order():
    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([1000]), [3], [2], torch.float32, ["seed_pageable", "fused"],
        aa_arm=None, rounds=2, warmup=0, conditions={"overlap": ["queued", "waited"]}), progress=False))
    assert set(frame["overlap_order"]) == {"queued", "waited"}  # every row, none missing
    timed = frame[(frame.arm == "seed_pageable") & (frame.stage == "total")
                  & (frame.metric == "time")]
    assert timed.groupby("overlap_order")["round"].nunique().to_dict() == {"queued": 2,
                                                                            "waited": 2}
    forward = frame[frame.metric == "forward_ms"]
    assert sorted(forward["overlap_order"]) == ["queued", "waited"]


def test_the_wait_counter_sees_a_validating_call_negative_control():
    logits, tokens = make_logits(8, 3001, torch.bfloat16), make_tokens(8, 3001)
    with SyncCounter() as counter:
        lp.logprobs_from_logits(logits, 5, tokens)  # validate=True reads its device flag once
    assert counter.hidden == 1


@pytest.mark.skipif(not CUDA, reason="the busy kernel needs a CUDA device")
def test_forward_load_queues_about_forward_ms_of_device_work():
    load = step.ForwardLoad(5.0, "cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    load.queue()
    end.record()
    end.synchronize()
    assert 4.0 < start.elapsed_time(end) < 6.5
    assert 4.0 < load.measured_ms() < 6.5 and len(load.events) == 1


class FakeEvent:
    """A CUDA event stand-in: each pair's elapsed time is the next of ``FakeEvent.times``."""

    times: list[float] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.recorded = False

    def record(self) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        return FakeEvent.times.pop(0)


def test_the_queued_forward_is_measured_between_its_own_events(monkeypatch):
    slept = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    load = object.__new__(step.ForwardLoad)
    load.forward_ms, load.cycles, load.events = 2.0, 1000, []
    load.queue()
    load.queue()
    FakeEvent.times = [2.5, 3.5]
    nominal, measured = load.rows("given")
    assert slept == [1000, 1000] and all(s.recorded and e.recorded for s, e in load.events)
    assert nominal == {"arm": "forward", "metric": "forward_ms", "value": 2.0, "note": "given"}
    assert measured == {"arm": "forward", "metric": "forward_measured_ms", "value": 3.0,
                        "note": measured["note"]}
    assert "2 calls" in measured["note"] and "nominal 2 ms" in measured["note"]
    idle = object.__new__(step.ForwardLoad)
    idle.forward_ms, idle.cycles, idle.events = 0.0, 0, []
    idle.queue()
    assert idle.rows("cpu") == [{"arm": "forward", "metric": "forward_ms", "value": 0.0,
                                 "note": "cpu"}]


def test_the_clock_is_warmed_for_at_least_its_busy_time_before_calibrating(monkeypatch):
    slept = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    FakeEvent.times = [30.0] * 20
    step.warm_clock(7, warm_ms=200.0)
    assert slept == [7] * 7  # 7 x 30 ms >= 200 ms


def test_the_sm_clock_is_sampled_between_rounds_with_min_median_max():
    """Before: one sample per cell, after its last round."""
    readings = iter([(1980, 0, ""), (1500, 0x4, ""), (1755, 0, ""), (None, None, "gone")])
    clocks = step.ClockSampler("cuda:0", read=lambda: next(readings))
    for _ in range(3 * step.CLOCK_STRIDE):
        clocks.between_rounds()
    rows = clocks.rows()
    assert {r["stage"]: r["value"] for r in rows} == {"min": 1500.0, "median": 1755.0,
                                                      "max": 1980.0}
    assert all(r["metric"] == "sm_clock_mhz" for r in rows) and "0x4" in rows[0]["note"]
    assert "3 samples between rounds" in rows[0]["note"]
    assert step.ClockSampler("cpu", read=lambda: (1, 0, "")).rows() == []
    silent = step.ClockSampler("cuda:0", read=lambda: (None, None, "NVML cannot be read"))
    assert silent.rows() == [{"arm": "sm_clock", "metric": "sm_clock_mhz",
                              "status": "unavailable", "note": "NVML cannot be read"}]


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
def test_every_alloc_row_says_whether_its_vector_was_mapped_and_its_faults():
    """Glibc maps a 40 MiB vector fresh every step (above its 32 MiB ceiling): its alloc rows
    say so, with at least a fault per huge page; a vector mapped fresh by its own regime too;
    the reused scratch has no fresh vector and faults nothing once grown."""
    n, vocab = 1, 10 * 2 ** 20  # 40 MiB of fp32
    frame = schema.make_rows(step.measure(step.StepSweep(
        shapes.resolve_vocabs([vocab]), [n], [1], torch.float32,
        ["seed_pageable", "seed_pageable_reused"], aa_arm=None, rounds=3, warmup=1), progress=False))
    alloc = frame[(frame.stage == "alloc") & (frame.status == "ok")]
    fresh = alloc[alloc.arm == "seed_pageable"]
    assert len(fresh) == 3
    if native.process_allocator() == "glibc":
        assert fresh["mapped"].eq(True).all()
    assert (fresh["minor_faults"] >= 40 * 2 ** 20 // resource.getpagesize() // 512).all()
    reused = alloc[alloc.arm == "seed_pageable_reused"]
    assert reused["mapped"].isna().all() and (reused["minor_faults"] < 64).all()
    assert frame[frame.stage == "copy"]["minor_faults"].isna().all()


def test_a_cells_pinned_host_allocations_are_counted_where_torch_says(monkeypatch):
    counts = iter([{"num_host_alloc": 7}, {"num_host_alloc": 8}, {}])
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: next(counts), raising=False)
    before = step.host_allocations("cuda:0")
    assert step.host_allocation_rows("cuda:0", before)[0]["value"] == 1.0
    assert step.host_allocation_rows("cuda:0", 3)[0]["status"] == "unavailable"  # no key
    assert step.host_allocation_rows("cpu", None) == []
