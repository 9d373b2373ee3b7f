"""A step's timeline read back: the Chrome trace of one short sequence per step arm
(:mod:`stagelab.measure.timeline` records it) as rows of spans, and whether the host's work
overlapped the device's. Torch-free.

Each span is a row: ``arm``, ``lane`` (``host``: the stage ranges the arm's code names;
``device``: the kernels and copies the profiler saw on the GPU), ``stage`` (the suite's stage
names: ``forward``, ``device`` for the log-softmax or the device top-K, ``copy``, ``wait``,
``host_gather`` ...), ``start_ms`` and ``end_ms`` from the arm's first span (the profiler's
own start-up, before it, is left out).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pandas as pd

from stagelab.core import catalogue

COLUMNS = ["arm", "lane", "stage", "start_ms", "end_ms"]
HOST, DEVICE = "host", "device"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
NO_OVERLAP_ON_CPU = ("No overlap on a CPU: there is no device, so each copy completes at once "
                     "and the host runs every stage in turn; the timeline shows the stages' "
                     "order, not an overlap (a run on a GPU draws the device's row too).")


def device_stage(name: str) -> str:
    """The stage a device event belongs to, from its kernel or copy name: the busy kernel that
    stands in for the forward, a device-to-host copy, else the step's device work."""
    lowered = name.lower()
    if "sleep" in lowered:
        return "forward"
    if "memcpy" in lowered or "memset" in lowered:
        return "copy"
    return "device"


def _span(event: dict[str, Any]) -> tuple[float, float]:
    start = float(event["ts"])
    return start, start + float(event.get("dur") or 0.0)


def spans(trace: dict[str, Any]) -> pd.DataFrame:
    """The trace's spans per arm (:data:`COLUMNS`): each stage range on the host, each kernel
    and copy on the device, placed in the arm whose range contains its start."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    arms = [(e["name"].removeprefix(catalogue.TIMELINE_ARM_PREFIX), *_span(e)) for e in events
            if str(e.get("name", "")).startswith(catalogue.TIMELINE_ARM_PREFIX)]
    rows = []
    for event in events:
        name, (start, end) = str(event.get("name", "")), _span(event)
        if name.startswith(catalogue.TIMELINE_STAGE_PREFIX):
            lane, stage = HOST, name.removeprefix(catalogue.TIMELINE_STAGE_PREFIX)
        elif event.get("cat") in DEVICE_CATEGORIES:
            lane, stage = DEVICE, device_stage(name)
        else:
            continue
        for arm, arm_start, arm_end in arms:
            if arm_start <= start <= arm_end:
                rows.append({"arm": arm, "lane": lane, "stage": stage, "start_ms": start / 1e3,
                             "end_ms": end / 1e3})
                break
    frame = pd.DataFrame(rows, columns=COLUMNS)
    first = frame.groupby("arm")["start_ms"].transform("min")  # the arm's first span at 0
    return frame.assign(start_ms=frame.start_ms - first, end_ms=frame.end_ms - first)


def read(path: Path | str | None) -> pd.DataFrame:
    """A compressed Chrome trace's spans (:func:`spans`); none where there is no trace."""
    if path is None:
        return pd.DataFrame(columns=COLUMNS)
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return spans(json.load(handle))


def _overlap_ms(first: pd.DataFrame, second: pd.DataFrame) -> float:
    """Milliseconds during which a span of ``first`` and one of ``second`` both ran."""
    total = 0.0
    for a_start, a_end in zip(first.start_ms, first.end_ms):
        for b_start, b_end in zip(second.start_ms, second.end_ms):
            total += max(0.0, min(a_end, b_end) - max(a_start, b_start))
    return total


def overlap(frame: pd.DataFrame) -> pd.DataFrame:
    """Per arm, the host top-K's milliseconds and the share of them the device's forward ran
    beside (empty without device rows: a CPU's trace)."""
    rows = []
    for arm, spans_of in frame.groupby("arm", sort=False):
        forward = spans_of[(spans_of.lane == DEVICE) & (spans_of.stage == "forward")]
        gather = spans_of[(spans_of.lane == HOST) & (spans_of.stage == "host_gather")]
        if forward.empty or gather.empty:
            continue
        busy = float((gather.end_ms - gather.start_ms).sum())
        rows.append({"arm": arm, "host_top_k_ms": busy,
                     "beside_forward": _overlap_ms(gather, forward) / busy if busy else 0.0})
    return pd.DataFrame(rows, columns=["arm", "host_top_k_ms", "beside_forward"])


FROM_MEASURED = ("a run over a measured folder reads the node's rows, and `stagelab measure` "
                 "records no timeline")


def overlap_words(frame: pd.DataFrame, untraced: str | None = None) -> str:
    """What the timeline shows, in one paragraph: no overlap on a CPU, else the share of each
    arm's host top-K that ran beside the device's forward; with no spans, why none was
    recorded (``untraced``, e.g. the cell would not fit; None: a run over a measured folder)."""
    if frame.empty:
        return f"No timeline was recorded: {untraced or FROM_MEASURED}."
    if not (frame.lane == DEVICE).any():
        return NO_OVERLAP_ON_CPU
    shares = overlap(frame)
    if shares.empty:
        return "No forward ran on the device during the timeline: nothing could overlap it."
    return "Share of each arm's host top-K that ran beside the device's forward: " + "; ".join(
        f"`{r.arm}` {100 * r.beside_forward:.0f} % of {r.host_top_k_ms:.2f} ms"
        for r in shares.itertuples()) + "."
