"""A predicted answer before the lease: a cost model of the seed's step per arm, fed the host's
measured rates (:mod:`stagelab.measure.hostrates`, recorded in every step table) and a platform's
published link and memory figures (``data/platforms.csv``), checked against every measurement.

Each arm's step is a sum of named terms (ms)::

    seed_pageable        overlap(forward + log_softmax, alloc) + copy_fresh + wait + top_k + free
    seed_pageable_reused forward + log_softmax + copy_reused + wait + top_k
    seed_pinned          forward + log_softmax + copy_pinned + wait + top_k
    seed_pinned_deferred max(forward + log_softmax, copy_pinned, wait + top_k) on a GPU (the
                         copy beside the next forward, the host top-K of the step before beside
                         it too); as seed_pinned where nothing runs concurrently
    device_gather        forward + log_softmax + device_top_k + copy_results + wait
    onepass              forward + one_pass + copy_results + wait

``overlap`` is ``max`` on a GPU (the host fills the fresh vector while the queued forward and
log-softmax run) and a sum on a CPU (the host does both in turn). With the log-softmax on the
host, the device only casts the logits and ``host_softmax`` follows the wait.

Where each term comes from, per platform:

* host terms (alloc, top_k, free, host_softmax; on a CPU every term): measured, the spread of the
  repeats at the cell's size (interpolated per byte between measured sizes, clamped beyond them,
  and said so);
* copies: bytes / the platform's pinned or pageable D2H GB/s (published, or a range with its
  reason: ``data/platforms.csv``);
* forward: what one decode step reads (:func:`stagelab.core.forward.forward_bytes`: the active
  bf16 weights once and each sequence's KV cache at the stated context) at the platform's HBM
  bandwidth times an assumed efficiency; unknown (0) for a cell given as a bare vocabulary size;
* log_softmax and device_top_k: bytes through HBM at the same assumed efficiency;
* wait: an assumed 5-20 us for one synchronize.

Ranged inputs are *knobs*; every corner of the knobs' box is evaluated, so each interval is the
exact range of the model over the box (the terms are monotone in each knob). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize

from stagelab.analyse.predict_tables import (
    BASELINE,
    CANDIDATE,
    CPU_PLATFORM,
    DEFERRED,
    DEVICE_TOP_K,
    LOGITS_BYTES,
    MODEL_ARMS,
    ONE_PASS,
    REUSED,
    Cell,
    HostClass,
    HostRates,
    Knob,
    Platform,
    at_mid,
    class_terms_ms,
    corners,
    cpu_knobs,
    gpu_knobs,
)
from stagelab.core import forward

# The questions the verdict asks, each as (baseline, candidate).
QUESTIONS = {"bundle": (BASELINE, CANDIDATE), "reuse": (BASELINE, REUSED),
             "pinning": (REUSED, CANDIDATE), "deferral": (CANDIDATE, DEFERRED)}
PORT, CLOSE = "PORT", "CLOSE"


# ---------------------------------------------------------------------------------- terms

def gpu_terms(platform: Platform, cell: Cell, k: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each term's ms on a GPU platform, at the knob values ``k`` (arrays over corners)."""
    hbm = platform.hbm_gbps * 1e9 * k["hbm_efficiency"]
    elements = cell.rows * cell.vocab
    if "forward_ms" in k:
        forward = k["forward_ms"]
    else:
        forward = 1e3 * cell.forward_bytes / hbm
    softmax_bytes = elements * (LOGITS_BYTES + 4)  # read bf16 logits, write fp32
    copy_bytes = cell.nbytes
    results = cell.rows * (cell.k + 1) * 8 + cell.rows * 4
    host = class_terms_ms(cell.nbytes, k) if "first_touch_gbps" in k else k
    terms = {"forward": forward, "log_softmax": 1e3 * softmax_bytes / hbm,
             "alloc": host["fresh_vector"],
             "copy_fresh": 1e3 * copy_bytes / (k["pageable_gbps"] * 1e9),
             "copy_reused": 1e3 * copy_bytes / (k["pageable_gbps"] * 1e9),
             "copy_pinned": 1e3 * copy_bytes / (k["pinned_gbps"] * 1e9),
             "wait": k["wait_ms"], "top_k": host["top_k"], "free": host["free"],
             "device_top_k": k["device_top_k_fixed_ms"] + 1e3 * elements * 4 / hbm,
             "copy_results": 1e3 * results / (k["pinned_gbps"] * 1e9),
             "host_softmax": host.get("host_softmax", 0.0 * forward),
             # the one-pass kernel: the bf16 logits read once, a kernel's fixed cost
             "one_pass": k["device_top_k_fixed_ms"] + 1e3 * elements * LOGITS_BYTES / hbm}
    return terms


def cpu_terms(cell: Cell, k: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each term's ms on a CPU run: the host measured them all; nothing is queued or awaited."""
    zero = 0.0 * k["top_k"]
    return {"forward": zero, "log_softmax": k["log_softmax"], "alloc": k["fresh_vector"],
            "copy_fresh": k["copy_fresh"], "copy_reused": k["copy_reused"],
            "copy_pinned": zero + np.nan, "wait": zero, "top_k": k["top_k"], "free": k["free"],
            "device_top_k": zero + np.nan, "copy_results": zero + np.nan,
            "host_softmax": k.get("host_softmax", zero), "one_pass": zero + np.nan}


def arm_parts(arm: str, t: Mapping[str, np.ndarray], concurrent: bool,
              log_softmax: str = "device") -> dict[str, np.ndarray]:
    """The terms an arm's step is made of, by the seed's stage names where they have one; on a
    GPU (``concurrent``) the fresh vector's ``alloc`` counts only where it outlasts the queued
    forward and log-softmax it overlaps."""
    softmax = t["log_softmax"] if log_softmax == "device" else 0.0 * t["log_softmax"]
    after = t["host_softmax"] if log_softmax == "host" else 0.0 * t["wait"]
    if arm == DEVICE_TOP_K:
        return {"forward": t["forward"], "device": t["log_softmax"] + t["device_top_k"],
                "copy": t["copy_results"], "wait": t["wait"]}
    if arm == ONE_PASS:
        return {"forward": t["forward"], "device": t["one_pass"], "copy": t["copy_results"],
                "wait": t["wait"]}
    if arm == DEFERRED and concurrent:
        return deferred_parts(t, softmax, after)
    parts = {"forward": t["forward"], "device": softmax}
    if arm == BASELINE:
        hidden = t["forward"] + softmax if concurrent else 0.0 * softmax  # the fill overlaps
        parts.update(alloc=np.maximum(t["alloc"] - hidden, 0.0), copy=t["copy_fresh"],
                     free=t["free"])
    elif arm == REUSED:
        parts["copy"] = t["copy_reused"]
    elif arm in (CANDIDATE, DEFERRED):  # deferred: nothing overlaps on a CPU
        parts["copy"] = t["copy_pinned"]
    else:
        raise ValueError(f"arm: the model has no arm {arm!r}; modelled: {', '.join(MODEL_ARMS)}")
    parts.update(wait=t["wait"], host_softmax=after, host_gather=t["top_k"])
    return parts


def deferred_parts(t: Mapping[str, np.ndarray], softmax: np.ndarray,
                   after: np.ndarray) -> dict[str, np.ndarray]:
    """The deferred arm's step on a GPU, the longest of three paths that run beside each
    other: the device's (forward, log-softmax), the copy engine's (the pinned copy, beside the
    next forward) and the host's (the wait, the host log-softmax, the top-K of the step before,
    beside it too). Its parts add up to that longest: the copy and the host work count only
    where they outlast the paths before them."""
    device_path = t["forward"] + softmax
    host_path = t["wait"] + after + t["top_k"]
    copy_out = np.maximum(t["copy_pinned"] - device_path, 0.0)
    host_out = np.maximum(host_path - np.maximum(device_path, t["copy_pinned"]), 0.0)
    return {"forward": t["forward"], "device": softmax, "copy": copy_out,
            "host_gather": host_out}


def arm_total(arm: str, t: Mapping[str, np.ndarray], concurrent: bool,
              log_softmax: str = "device") -> np.ndarray:
    """An arm's predicted step ms: the sum of its parts (:func:`arm_parts`)."""
    total = np.zeros(1)
    for part in arm_parts(arm, t, concurrent, log_softmax).values():
        total = total + part
    return total


# ------------------------------------------------------------------------------ a platform

@dataclass
class Model:
    """The model at one cell of one platform: its knobs and how terms follow from them."""

    platform: str
    cell: Cell
    knobs: dict[str, Knob]
    terms: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    concurrent: bool
    notes: list[str]
    host: str = ""  # the host whose rates it uses: a host class, or where they were measured

    def totals(self, arm: str, k: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        k = corners(self.knobs) if k is None else k
        return arm_total(arm, self.terms(k), self.concurrent, self.cell.log_softmax)

    def interval(self, arm: str) -> tuple[float, float, float]:
        """``(mid, low, high)`` ms of an arm's step."""
        every = self.totals(arm)
        return float(self.totals(arm, at_mid(self.knobs))[0]), float(every.min()), float(
            every.max())

    def parts_mid(self, arm: str, raw: bool = False) -> dict[str, float]:
        """An arm's parts at the knobs' best values; ``raw``: each stage's own duration, as
        the step times it (the fresh vector's whole fill, even where it overlaps)."""
        parts = arm_parts(arm, self.terms(at_mid(self.knobs)), self.concurrent and not raw,
                          self.cell.log_softmax)
        return {name: float(value[0]) for name, value in parts.items()}

    def parts_range(self, arm: str, raw: bool = False) -> dict[str, tuple[float, float]]:
        parts = arm_parts(arm, self.terms(corners(self.knobs)), self.concurrent and not raw,
                          self.cell.log_softmax)
        return {name: (float(np.min(v)), float(np.max(v))) for name, v in parts.items()}


def gpu_model(platform: Platform, cell: Cell, rates: HostRates | HostClass,
              forward_ms: float | None = None) -> Model:
    knobs, notes = gpu_knobs(platform, cell, rates, forward_ms)
    return Model(platform.name, cell, knobs, lambda k: gpu_terms(platform, cell, k), True, notes,
                 rates.origin)


def cpu_model(cell: Cell, rates: HostRates) -> Model:
    knobs, notes = cpu_knobs(cell, rates)
    return Model(CPU_PLATFORM, cell, knobs, lambda k: cpu_terms(cell, k), False, notes,
                 rates.origin)


def memory_fault(platform: Platform, cell: Cell) -> str | None:
    """Why the cell's configuration cannot run on the platform's GPU (its weights, KV cache at
    the stated context, logits and log-probs exceed the memory): marked, never predicted; None
    where it fits or the model is unknown."""
    if cell.model is None or not math.isfinite(platform.memory_gb):
        return None
    need = forward.memory_bytes(cell.model, cell.rows, cell.vocab)
    if need <= platform.memory_gb * 1e9:
        return None
    weights = (cell.model.params_b or cell.model.active_params_b) * 2
    return (f"does not fit: {need / 1e9:.0f} GB ({weights:.1f} GB of bf16 weights, "
            f"{cell.rows * cell.model.kv_bytes(forward.DEFAULT_CONTEXT) / 1e9:.1f} GB of KV "
            f"cache at {forward.DEFAULT_CONTEXT} tokens) > {platform.memory_gb:g} GB: not "
            "predicted")


# ------------------------------------------------------------------------------- answers

def answer(model: Model, question: str, delta: float) -> dict[str, Any]:
    """One question's predicted answer at a cell: the saving per step (ms) as an interval, the
    bar (delta of the baseline's decode step), PORT, CLOSE or "depends on X", and the term that
    dominates the saving."""
    base_arm, cand_arm = QUESTIONS[question]
    every = corners(model.knobs)

    def margin(k: Mapping[str, np.ndarray]) -> np.ndarray:
        base = model.totals(base_arm, k)
        return base - model.totals(cand_arm, k) - delta * base

    base, cand = model.totals(base_arm, every), model.totals(cand_arm, every)
    if min(base.min(), cand.min()) < 0:
        raise ValueError(f"{model.cell.label} on {model.platform}: a negative step "
                         f"({min(base.min(), cand.min()):.3g} ms): an input is out of bounds")
    saving, margins = base - cand, margin(every)
    mid = at_mid(model.knobs)
    if margins.min() > 0:
        decision, decisive_knob = PORT, None
    elif margins.max() < 0:
        decision, decisive_knob = CLOSE, None
    else:
        decisive_knob = spanning_knob(model.knobs, margin)
        decision = f"depends on {decisive_knob}"
    base_parts, cand_parts = model.parts_mid(base_arm), model.parts_mid(cand_arm)
    gains = {name: base_parts.get(name, 0.0) - cand_parts.get(name, 0.0)
             for name in {*base_parts, *cand_parts}}
    dominant = max(gains, key=lambda name: abs(gains[name]))
    return {"question": question, "baseline": base_arm, "candidate": cand_arm,
            "host": model.host, "decision": decision, "depends_on": decisive_knob,
            "saving_ms": float((model.totals(base_arm, mid) - model.totals(cand_arm, mid))[0]),
            "saving_low_ms": float(saving.min()), "saving_high_ms": float(saving.max()),
            "bar_ms": float(delta * model.totals(base_arm, mid)[0]),
            "bar_low_ms": float(delta * base.min()), "bar_high_ms": float(delta * base.max()),
            "speedup_low": float((base / cand).min()), "speedup_high": float((base / cand).max()),
            "dominant_term": dominant}


def spanning_knob(knobs: Mapping[str, Knob],
                  margin: Callable[[Mapping[str, np.ndarray]], np.ndarray]) -> str:
    """The knob whose range alone, the others at their midpoints, moves the margin across the
    bar; failing one, the knob that moves it most."""
    swings = {}
    for name, knob in knobs.items():
        if knob.high == knob.low:
            continue
        low = float(margin(at_mid(knobs, **{name: knob.low}))[0])
        high = float(margin(at_mid(knobs, **{name: knob.high}))[0])
        swings[name] = (abs(high - low), (low > 0) != (high > 0))
    crossing = [name for name, (_, crosses) in swings.items() if crosses]
    pool = crossing or list(swings)
    return max(pool, key=lambda name: swings[name][0]) if pool else "the measured host terms"


def _margin_at(model: Model, question: str, delta: float, **fixed: float) -> float:
    """The saving less the bar (ms) with every knob at its best value but those given."""
    base_arm, cand_arm = QUESTIONS[question]
    k = at_mid(model.knobs, **fixed)
    base = model.totals(base_arm, k)
    return float((base - model.totals(cand_arm, k) - delta * base)[0])


def _bracket(name: str, knob: Knob) -> tuple[float, float]:
    """Where a knob's flip is looked for: a share in [0, 1]; otherwise a decade beyond its range
    each way."""
    if name in ("faulted_share", "hbm_efficiency"):
        return (0.0 if name == "faulted_share" else 0.05), 1.0
    return knob.low / 10, (knob.high * 10 if knob.high > 0 else 1.0)


def sensitivity(model: Model, question: str, delta: float) -> list[dict[str, Any]]:
    """Per knob, the value at which the answer at the best values flips, the others held there
    (Brent's root of the margin, which is continuous and monotone in each knob: about ten
    evaluations where bisection took fifty), looked for a decade beyond the knob's range;
    ``flips_at`` None where it does not flip there."""
    point = _margin_at(model, question, delta)
    side, other = (PORT, CLOSE) if point > 0 else (CLOSE, PORT)
    out = []
    for name, knob in model.knobs.items():
        low, high = _bracket(name, knob)
        at_low = _margin_at(model, question, delta, **{name: low})
        at_high = _margin_at(model, question, delta, **{name: high})
        flips_at = None
        if (at_low > 0) != (at_high > 0):
            flips_at = float(optimize.brentq(
                lambda value, knob_name=name: _margin_at(model, question, delta,
                                                         **{knob_name: value}),
                low, high, xtol=1e-12 * max(abs(low), abs(high), 1.0)))
        below = (at_low > 0) != (point > 0)
        out.append({"question": question, "knob": name, "low": knob.low, "high": knob.high,
                    "origin": knob.origin, "at_best": side, "flips_to": other,
                    "flips_at": flips_at, "flips_when": "below" if below else "above",
                    "within_range": flips_at is not None and knob.low <= flips_at <= knob.high})
    return out


def sensitivity_words(row: Mapping[str, Any]) -> str:
    """One row of the sensitivity table in words ("flips to CLOSE if pageable_gbps < 95.3")."""
    span = f"its range {row['low']:.3g}-{row['high']:.3g}"
    if row["flips_at"] is None:
        return f"{row['knob']}: no flip within a decade of {span}"
    sign = "<" if row["flips_when"] == "below" else ">"
    return (f"flips to {row['flips_to']} if {row['knob']} {sign} {row['flips_at']:.3g} ({span}"
            + (", inside it)" if row["within_range"] else ")"))


# The rule by which a run falsifies a prediction: stated here, before any run, with the
# intervals (:func:`stated_figures`); the verdict applies it (``out_of_sample.falsification``).
FALSIFICATION_RULE = (
    "stated before the run: a measured figure (a stage's or an arm's mean step, a question's "
    "saving) falsifies the model when it lies outside the predicted interval of every host the "
    "model was fed for its cell; the model held when no figure did")


def stated_figures(model: Model) -> list[dict[str, Any]]:
    """Every figure the model states an interval for at its cell, before any run: each stage of
    the seed's step (its own duration, as the step times it), each arm's step and each
    question's saving per step (baseline - candidate), as ``level``, ``name``,
    ``predicted_ms`` (at the knobs' best values), ``low_ms`` and ``high_ms`` (over every corner
    of the knobs). ``stagelab predict`` states them with :data:`FALSIFICATION_RULE`; the
    verdict judges a run against these same intervals."""
    figures = []
    ranges, mids = model.parts_range(BASELINE, raw=True), model.parts_mid(BASELINE, raw=True)
    for stage, (low, high) in ranges.items():
        figures.append(_figure("stage", stage, mids[stage], low, high))
    for arm in MODEL_ARMS:
        mid, low, high = model.interval(arm)
        if math.isfinite(mid):
            figures.append(_figure("arm", arm, mid, low, high))
    every, best = corners(model.knobs), at_mid(model.knobs)
    for question, (base_arm, cand_arm) in QUESTIONS.items():
        saving = model.totals(base_arm, every) - model.totals(cand_arm, every)
        point = float((model.totals(base_arm, best) - model.totals(cand_arm, best))[0])
        if math.isfinite(point):
            figures.append(_figure("question", question, point, float(saving.min()),
                                   float(saving.max())))
    return figures


def _figure(level: str, name: str, mid: float, low: float, high: float) -> dict[str, Any]:
    return {"level": level, "name": name, "predicted_ms": float(mid), "low_ms": float(low),
            "high_ms": float(high)}


def predict_cell(model: Model, delta: float) -> dict[str, Any]:
    """Every arm's predicted step (ms, interval), every question's answer and the figures that
    would falsify the model (:func:`stated_figures`, with the rule) at one cell."""
    arms = {}
    for arm in MODEL_ARMS:
        mid, low, high = model.interval(arm)
        if math.isfinite(mid):
            arms[arm] = {"mid_ms": mid, "low_ms": low, "high_ms": high,
                         "parts_ms": model.parts_mid(arm)}
    answers = [answer(model, q, delta) for q in QUESTIONS
               if all(a in arms for a in QUESTIONS[q])]
    return {"platform": model.platform, "rows": model.cell.rows, "vocab": model.cell.vocab,
            "k": model.cell.k, "log_softmax": model.cell.log_softmax, "host": model.host,
            "fits": True, "arms": arms, "answers": answers, "notes": model.notes,
            "falsification": {"rule": FALSIFICATION_RULE, "figures": stated_figures(model)},
            "sensitivity": [row for a in answers
                            for row in sensitivity(model, a["question"], delta)],
            "knobs": {name: {"low": kn.low, "high": kn.high, "origin": kn.origin}
                      for name, kn in model.knobs.items()}}


def crossing(platform: Platform, vocab: int, k: int, model: forward.ModelDims | None,
             rates: HostRates | HostClass, delta: float, question: str = "bundle",
             sizes: Iterable[int] | None = None) -> dict[str, Any]:
    """The n x V at which a question's answer crosses the bar on a platform (rows scanned at a
    fixed vocabulary): from where the whole interval lies above the bar (``port_from``) and
    from where any of it does (``may_port_from``); None where it never does in the scan."""
    curve = saving_curve(platform, vocab, k, model, rates, delta, question, sizes)
    sure = curve[curve["margin_low_ms"] > 0]
    maybe = curve[curve["margin_high_ms"] > 0]
    return {"platform": platform.name, "question": question, "vocab": vocab,
            "host": rates.origin, "port_from_nv": int(sure["n_x_v"].min()) if len(sure) else None,
            "may_port_from_nv": int(maybe["n_x_v"].min()) if len(maybe) else None,
            "scanned_nv": [int(curve["n_x_v"].min()), int(curve["n_x_v"].max())],
            "measured_nv": [s // 4 for s in (rates.sizes[0], rates.sizes[-1])] if rates.sizes
            else None}


DEFAULT_ROWS = tuple(2 ** i for i in range(0, 11))  # 1 .. 1024 rows


def saving_curve(platform: Platform, vocab: int, k: int, model: forward.ModelDims | None,
                 rates: HostRates | HostClass, delta: float, question: str = "bundle",
                 rows: Iterable[int] | None = None) -> pd.DataFrame:
    """The predicted saving per step (ms, interval) and the bar against n x V, rows scanned."""
    out = []
    for n in rows or DEFAULT_ROWS:
        predicted = gpu_model(platform, Cell(n, vocab, k, model), rates)
        base_arm, cand_arm = QUESTIONS[question]
        every = corners(predicted.knobs)
        base, cand = predicted.totals(base_arm, every), predicted.totals(cand_arm, every)
        margin = base - cand - delta * base
        mid = at_mid(predicted.knobs)
        base_mid = float(predicted.totals(base_arm, mid)[0])
        out.append({"platform": platform.name, "question": question, "rows": n, "vocab": vocab,
                    "host": rates.origin, "n_x_v": n * vocab,
                    "saving_ms": base_mid - float(predicted.totals(cand_arm, mid)[0]),
                    "saving_low_ms": float((base - cand).min()),
                    "saving_high_ms": float((base - cand).max()),
                    "bar_ms": delta * base_mid, "margin_low_ms": float(margin.min()),
                    "margin_high_ms": float(margin.max()),
                    "extrapolated": any("extrapolated" in note for note in predicted.notes)})
    return pd.DataFrame(out)



def where_deferral_matters(cells: Iterable[Mapping[str, Any]]) -> str:
    """Where deferring the wait saves the most, in one sentence: among predicted cells
    (:func:`predict_cell`'s, any platforms), the largest and the smallest saving of the
    ``deferral`` question per step, as a share of the pinned scratch's step; '' where none
    predicts it (a CPU: nothing overlaps there)."""
    found = []
    for cell in cells:
        pinned = cell.get("arms", {}).get(CANDIDATE)
        for ans in cell.get("answers", []):
            if ans["question"] == "deferral" and pinned and pinned["mid_ms"] > 0:
                found.append((ans["saving_ms"] / pinned["mid_ms"], ans["saving_ms"], cell, ans))
    if not found:
        return ""
    found.sort(key=lambda item: item[0])

    def words(item: tuple[float, float, Mapping[str, Any], Mapping[str, Any]]) -> str:
        share, saving, cell, ans = item
        on = f" ({cell['host']})" if cell.get("host") else ""
        return (f"{cell['platform']} at n={cell['rows']} V={cell['vocab']} K={cell['k']}{on}: "
                f"{saving:.3g} ms per step, {100 * share:.0f} % of the pinned scratch's step "
                f"({ans['decision']})")
    return (f"Deferring the wait matters most on {words(found[-1])}; least on {words(found[0])} "
            "(predicted, never measured).")
