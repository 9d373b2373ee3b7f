"""The step's timeline: one short sequence per arm recorded with torch.profiler as a compressed
Chrome trace, read back into spans, its overlap in words, and its figure."""

from __future__ import annotations

import gzip
import json

import matplotlib

matplotlib.use("agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from conftest import make_logits, make_tokens  # noqa: E402
from stagelab.analyse import timeline as read_timeline  # noqa: E402
from stagelab.core import catalogue  # noqa: E402
from stagelab.core.errors import InsufficientMemory  # noqa: E402
from stagelab.measure import deferred, native, sequence, timeline  # noqa: E402
from stagelab.present import plots  # noqa: E402

NATIVE_OK, NATIVE_WHY = native.status()


def recorded() -> bytes:
    pipeline = deferred.build("seed_pinned_deferred")
    inputs = [(make_logits(2, 400, seed=i), make_tokens(2, 400), make_tokens(2, 400))
              for i in range(3)]
    return timeline.record({"seed_pinned_deferred":
                            lambda: sequence.run(pipeline, lambda: None, inputs, 2)}, "cpu")


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
def test_a_cpu_timeline_names_each_stage_of_each_step_on_the_host_and_says_no_overlap():
    packed = recorded()
    assert len(packed) < timeline.MAX_BYTES
    frame = read_timeline.spans(json.loads(gzip.decompress(packed)))
    assert set(frame.arm) == {"seed_pinned_deferred"} and set(frame.lane) == {"host"}
    counts = frame.groupby("stage").size().to_dict()
    # three steps queued; the host top-K and its wait for each, the last one drained
    assert counts == {"forward": 3, "device": 3, "alloc": 3, "copy": 3, "wait": 3,
                      "host_gather": 3, "free": 3}
    assert (frame.end_ms >= frame.start_ms).all() and frame.start_ms.min() == 0
    assert read_timeline.overlap_words(frame) == read_timeline.NO_OVERLAP_ON_CPU
    assert "No overlap on a CPU" in read_timeline.NO_OVERLAP_ON_CPU


def test_stage_ranges_exist_only_while_a_timeline_is_recorded():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        with timeline.stage("copy"):
            torch.ones(3).sum()
        with timeline.labelled(), timeline.stage("wait"):
            torch.ones(3).sum()
    names = {event.name for event in profile.events()}
    assert timeline.STAGE_PREFIX + "wait" in names
    assert timeline.STAGE_PREFIX + "copy" not in names


def test_record_refuses_no_arm():
    with pytest.raises(ValueError, match="sequences"):
        timeline.record({}, "cpu")


def gpu_trace() -> dict:
    """A GPU trace in the profiler's shape: the forward's busy kernel 0-10 ms on the device,
    the copy 10-14 ms, the host top-K 5-15 ms: half of it beside the forward."""
    def event(name: str, cat: str, start_ms: float, end_ms: float) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": 1e3 * start_ms,
                "dur": 1e3 * (end_ms - start_ms), "pid": 1, "tid": 1}
    return {"traceEvents": [
        event(catalogue.TIMELINE_ARM_PREFIX + "seed_pinned_deferred", "user_annotation", 0, 20),
        event("void at::native::(anonymous namespace)::spin_kernel_sleep", "kernel", 0, 10),
        event("cunn_SoftMaxForward", "kernel", 10, 11),
        event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 11, 14),
        event(catalogue.TIMELINE_STAGE_PREFIX + "host_gather", "user_annotation", 5, 15),
        event("aten::copy_", "cpu_op", 1, 2),  # an op, not a stage: left out
        {"ph": "M", "name": "process_name", "pid": 1},
    ]}


def test_device_spans_are_named_by_stage_and_the_overlap_is_the_share_beside_the_forward():
    frame = read_timeline.spans(gpu_trace())
    device = frame[frame.lane == "device"].set_index("stage")
    assert list(device.index) == ["forward", "device", "copy"]
    assert device.loc["copy", "start_ms"] == 11 and device.loc["copy", "end_ms"] == 14
    shares = read_timeline.overlap(frame)
    assert list(shares.beside_forward) == [0.5] and list(shares.host_top_k_ms) == [10.0]
    assert "50 %" in read_timeline.overlap_words(frame)


def test_the_figure_has_a_panel_per_arm_and_a_legend_in_the_stage_words():
    frame = read_timeline.spans(gpu_trace())
    figure = plots.timeline(frame)
    assert len(figure.axes) == 1
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["device", "host"]
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert legend == ["forward", "log-softmax", "copy", "host top-K"]
    assert plots.empty_reason(plots.timeline(frame.iloc[0:0])) is not None


def test_no_trace_reads_as_no_spans_and_says_so():
    frame = read_timeline.read(None)
    assert list(frame.columns) == read_timeline.COLUMNS and frame.empty
    assert "stagelab measure" in read_timeline.overlap_words(frame)


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
def test_the_step_timeline_has_each_arm_that_runs_here_and_one_forward_per_step():
    from stagelab.measure import shapes, step_timeline

    packed = step_timeline.record(shapes.resolve_vocabs([500])[0], 2, 3, torch.float32,
                                  ["seed_pageable", "fused"], steps=2)
    frame = read_timeline.spans(json.loads(gzip.decompress(packed)))
    assert set(frame.arm) == {"seed_pageable", "fused"}
    forwards = frame[frame.stage == "forward"].groupby("arm").size()
    assert forwards.to_dict() == {"fused": 2, "seed_pageable": 2}
    with pytest.raises(ValueError, match="timeline_steps"):
        step_timeline.record(shapes.resolve_vocabs([500])[0], 2, 3, torch.float32, None, steps=0)


def test_a_timeline_too_large_for_the_machine_is_refused_before_it_allocates(tmp_path,
                                                                           monkeypatch):
    """Before: notebook 02's timeline cell allocated its logits at the first cell's size even
    where the sweep had refused that cell (n=100000 at V=262144: 104 GB), and the notebook
    failed; now the trace is refused before anything large is allocated, and says why."""
    from stagelab.measure import memory, shapes, step_timeline
    from stagelab.run import context

    monkeypatch.setattr(memory, "free_host_bytes", lambda: 2**20)
    allocated = []
    monkeypatch.setattr(torch, "randn", lambda *a, **k: allocated.append(a))
    shape = shapes.resolve_vocabs([1000])[0]
    with pytest.raises(InsufficientMemory, match=r"n=1000 V=1000 \(3 steps\) on the host"):
        step_timeline.record(shape, 1000, 5, torch.float32, None, steps=3, device="cpu")
    assert allocated == []
    ctx = context.NotebookContext("02_logprobs_step", tmp_path)
    trace = ctx.trace("step_timeline", "", step_timeline.record, shape, 100_000, 5,
                      torch.float32, None, steps=3, device="cpu")
    assert trace is None and not list(tmp_path.rglob("*.gz"))
    words = read_timeline.overlap_words(read_timeline.read(trace), ctx.untraced)
    assert "n=100000 V=1000" in words and "GiB" in words and "stagelab measure" not in words
