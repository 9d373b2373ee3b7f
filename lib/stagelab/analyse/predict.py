"""A predicted answer before the lease: a cost model of the seed's step per arm, fed the host's
measured rates (:mod:`stagelab.measure.hostrates`, recorded in every step table) and a platform's
published link and memory figures (``data/platforms.csv``), checked against every measurement.

Each arm's step is a sum of named terms (ms)::

    seed_pageable        overlap(forward + log_softmax, alloc) + copy_fresh + wait + top_k + free
    seed_pageable_reused forward + log_softmax + copy_reused + wait + top_k
    seed_pinned          forward + log_softmax + copy_pinned + wait + top_k
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

import csv
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stagelab.core import catalogue, forward, paths

HOST_METRIC = "host_rate"  # the rows of stagelab.measure.hostrates
BASELINE, CANDIDATE = catalogue.baseline(catalogue.STEP), catalogue.candidate(catalogue.STEP)
REUSED = catalogue.REUSE_LEVER[catalogue.STEP]
DEVICE_TOP_K = catalogue.DEVICE_TOP_K
ONE_PASS = catalogue.ONE_PASS
MODEL_ARMS = (BASELINE, REUSED, CANDIDATE, DEVICE_TOP_K, ONE_PASS)
# The questions the verdict asks, each as (baseline, candidate).
QUESTIONS = {"bundle": (BASELINE, CANDIDATE), "reuse": (BASELINE, REUSED),
             "pinning": (REUSED, CANDIDATE)}
PORT, CLOSE = "PORT", "CLOSE"
CPU_PLATFORM = "this CPU"
# Assumed, stated in docs/prediction.md: what share of peak HBM bandwidth a memory-bound kernel
# reaches, the cost of one synchronize, a top-K kernel's fixed cost.
HBM_EFFICIENCY = (0.6, 0.9)
WAIT_MS = (0.005, 0.02)
DEVICE_TOP_K_FIXED_MS = (0.02, 0.1)
LOGITS_BYTES = 2  # bf16 logits on a GPU


# ------------------------------------------------------------------------------- platforms

@dataclass(frozen=True)
class Platform:
    """One row of ``data/platforms.csv``: GB/s ranges and where each figure comes from."""

    name: str
    gpu_match: tuple[str, ...]
    link: str
    pinned_gbps: tuple[float, float]
    pinned_source: str
    pageable_gbps: tuple[float, float]
    pageable_source: str
    hbm_gbps: float
    hbm_source: str
    host_type: str

    def matches(self, gpu_name: str) -> bool:
        """Whether a GPU's name holds one of the row's fragments as whole words (``L4`` is not
        ``L40S``, ``H200`` not ``GH200``)."""
        return any(fragment and re.search(rf"(?<![\w]){re.escape(fragment)}(?!\w)", gpu_name)
                   for fragment in self.gpu_match)


def load_platforms(path: Path | str = paths.PLATFORMS_FILE) -> dict[str, Platform]:
    """Every platform of the table by name (standard library csv)."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {r["platform"]: Platform(
        r["platform"], tuple(r["gpu_match"].split("|")), r["link"],
        (float(r["pinned_d2h_gbps_low"]), float(r["pinned_d2h_gbps_high"])), r["pinned_source"],
        (float(r["pageable_d2h_gbps_low"]), float(r["pageable_d2h_gbps_high"])),
        r["pageable_source"], float(r["hbm_gbps"]), r["hbm_source"], r["host_type"])
        for r in rows}


def platform_named(name: str, platforms: Mapping[str, Platform] | None = None) -> Platform:
    """A platform by its name (case-insensitive); ValueError naming the choices."""
    platforms = platforms or load_platforms()
    for key, platform in platforms.items():
        if key.lower() == name.lower():
            return platform
    raise ValueError(f"platform: unknown {name!r}; known: {', '.join(platforms)}")


def platform_of_gpu(gpu_name: str | None,
                    platforms: Mapping[str, Platform] | None = None) -> Platform | None:
    """The table's platform for a GPU name (the most specific match), None when none matches."""
    if not gpu_name:
        return None
    found = [p for p in (platforms or load_platforms()).values() if p.matches(gpu_name)]
    return max(found, key=lambda p: max(len(f) for f in p.gpu_match), default=None)


# ------------------------------------------------------------------------------ host rates

@dataclass
class HostRates:
    """Measured host terms: per size in bytes, each term's seconds over its repeats."""

    samples: dict[int, dict[str, list[float]]] = field(default_factory=dict)

    @property
    def sizes(self) -> list[int]:
        return sorted(self.samples)

    def term_ms(self, term: str, nbytes: int) -> tuple[float, float, float, bool] | None:
        """``(median, low, high, extrapolated)`` ms of a term at ``nbytes``: the repeats'
        median, min and max, per byte, interpolated in log size between the measured sizes that
        have it (clamped beyond them: ``extrapolated``); None where no size measured it."""
        known = [(size, s[term]) for size, s in sorted(self.samples.items()) if s.get(term)]
        if not known:
            return None
        sizes = np.log([size for size, _ in known])
        at = math.log(nbytes)
        outside = not sizes[0] - 1e-9 <= at <= sizes[-1] + 1e-9

        def at_size(pick: Callable[[list[float]], float]) -> float:
            per_byte = [1e3 * float(pick(v)) / size for size, v in known]
            return float(np.interp(at, sizes, per_byte)) * nbytes

        return at_size(np.median), at_size(min), at_size(max), outside


def host_rates(frame: pd.DataFrame) -> HostRates:
    """The host-rate rows of a step table (every cell, every repeat) by size."""
    rows = frame[(frame["metric"] == HOST_METRIC) & (frame["status"] == "ok")]
    rates = HostRates()
    for (nbytes, term), part in rows.groupby(["bytes", "stage"], observed=True):
        rates.samples.setdefault(int(nbytes), {})[str(term)] = [
            float(s) for s in part["seconds"].dropna()]
    return rates


FAULTED_OVER_WARM = 2.0  # a fresh vector this many times slower than a warm fill faulted afresh


def host_table(rates: HostRates) -> pd.DataFrame:
    """The host rates by size: each term's median and spread (ms), and the fresh vector's
    regime: its page faults' share (``fresh_vector - warm_fill``), and whether its pages were
    faulted in afresh (the allocator returned them to the OS) or found mapped."""
    out = []
    for nbytes in rates.sizes:
        terms = rates.samples[nbytes]
        row: dict[str, Any] = {"bytes": nbytes}
        for term, seconds in sorted(terms.items()):
            row[f"{term}_ms"] = 1e3 * float(np.median(seconds))
        fresh, warm = row.get("fresh_vector_ms"), row.get("warm_fill_ms")
        if fresh is not None and warm:
            row["faults_ms"] = max(fresh - warm, 0.0)
            row["regime"] = ("faulted afresh" if fresh > FAULTED_OVER_WARM * warm
                             else "pages found mapped")
        out.append(row)
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------------- knobs

@dataclass(frozen=True)
class Knob:
    """One ranged input of the model: its interval and where it comes from."""

    low: float
    high: float
    origin: str  # measured, published, assumed, or a mix ("range: not published ...")
    point: float | None = None  # the best single value (a measured median); else the midpoint

    @property
    def mid(self) -> float:
        return (self.low + self.high) / 2 if self.point is None else self.point


@dataclass(frozen=True)
class Cell:
    """A step cell to predict: rows ``n``, vocabulary ``V``, top-K, and the model whose forward
    the step waits for (None: unknown, taken as 0)."""

    rows: int
    vocab: int
    k: int
    model: forward.ModelDims | None = None
    log_softmax: str = "device"

    @property
    def forward_bytes(self) -> float:
        """Bytes the cell's decode forward reads (weights and KV cache); 0 when unknown."""
        return forward.forward_bytes(self.model, self.rows) if self.model else 0.0

    @property
    def nbytes(self) -> int:
        return self.rows * self.vocab * 4

    @property
    def label(self) -> str:
        return f"n={self.rows} V={self.vocab} K={self.k}"


def gpu_knobs(platform: Platform, cell: Cell, rates: HostRates,
              forward_ms: float | None = None) -> tuple[dict[str, Knob], list[str]]:
    """The knobs of a GPU platform at one cell, and notes (host terms extrapolated, missing)."""
    knobs = {"pinned_gbps": Knob(*platform.pinned_gbps, platform.pinned_source),
             "pageable_gbps": Knob(*platform.pageable_gbps, platform.pageable_source),
             "hbm_efficiency": Knob(*HBM_EFFICIENCY, "assumed"),
             "wait_ms": Knob(*WAIT_MS, "assumed"),
             "device_top_k_fixed_ms": Knob(*DEVICE_TOP_K_FIXED_MS, "assumed")}
    if forward_ms is not None:
        knobs["forward_ms"] = Knob(forward_ms, forward_ms, "measured (queued by the run)")
    terms = ["fresh_vector", "top_k", "free"]
    if cell.log_softmax == "host":
        terms.append("host_softmax")
    notes = _add_host_knobs(knobs, terms, rates, cell.nbytes)
    return knobs, notes


def cpu_knobs(cell: Cell, rates: HostRates) -> tuple[dict[str, Knob], list[str]]:
    """The knobs of a CPU run: every term measured on the host."""
    knobs: dict[str, Knob] = {}
    terms = ["log_softmax", "fresh_vector", "copy_fresh", "copy_reused", "top_k", "free"]
    if cell.log_softmax == "host":
        terms.append("host_softmax")
    notes = _add_host_knobs(knobs, terms, rates, cell.nbytes)
    return knobs, notes


def _add_host_knobs(knobs: dict[str, Knob], terms: Iterable[str], rates: HostRates,
                    nbytes: int) -> list[str]:
    notes = []
    for term in terms:
        found = rates.term_ms(term, nbytes)
        if found is None:
            notes.append(f"host term {term} was not measured: taken as 0")
            knobs[term] = Knob(0.0, 0.0, "not measured")
            continue
        median, low, high, outside = found
        knobs[term] = Knob(low, high, "measured" + (" (extrapolated)" if outside else ""),
                           median)
        if outside:
            notes.append(f"host term {term} extrapolated to {nbytes:,} B from measured sizes "
                         f"{', '.join(f'{s:,}' for s in rates.sizes)} B")
    return notes


def corners(knobs: Mapping[str, Knob]) -> dict[str, np.ndarray]:
    """Every corner of the knobs' box, as one array per knob (fixed knobs stay one value)."""
    ranged = [name for name, knob in knobs.items() if knob.high != knob.low]
    grid = np.array(list(itertools.product((0, 1), repeat=len(ranged))), dtype=float)
    grid = grid.reshape(-1, len(ranged)) if ranged else np.zeros((1, 0))
    out = {}
    for name, knob in knobs.items():
        if name in ranged:
            column = grid[:, ranged.index(name)]
            out[name] = knob.low + column * (knob.high - knob.low)
        else:
            out[name] = np.full(len(grid), knob.low)
    return out


def at_mid(knobs: Mapping[str, Knob], **fixed: float) -> dict[str, np.ndarray]:
    """Every knob at its best value (a measured median, else the midpoint), but those given."""
    return {name: np.array([fixed.get(name, knob.mid)]) for name, knob in knobs.items()}


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
    terms = {"forward": forward, "log_softmax": 1e3 * softmax_bytes / hbm,
             "alloc": k["fresh_vector"],
             "copy_fresh": 1e3 * copy_bytes / (k["pageable_gbps"] * 1e9),
             "copy_reused": 1e3 * copy_bytes / (k["pageable_gbps"] * 1e9),
             "copy_pinned": 1e3 * copy_bytes / (k["pinned_gbps"] * 1e9),
             "wait": k["wait_ms"], "top_k": k["top_k"], "free": k["free"],
             "device_top_k": k["device_top_k_fixed_ms"] + 1e3 * elements * 4 / hbm,
             "copy_results": 1e3 * results / (k["pinned_gbps"] * 1e9),
             "host_softmax": k.get("host_softmax", 0.0 * forward),
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
    parts = {"forward": t["forward"], "device": softmax}
    if arm == BASELINE:
        hidden = t["forward"] + softmax if concurrent else 0.0 * softmax  # the fill overlaps
        parts.update(alloc=np.maximum(t["alloc"] - hidden, 0.0), copy=t["copy_fresh"],
                     free=t["free"])
    elif arm == REUSED:
        parts["copy"] = t["copy_reused"]
    elif arm == CANDIDATE:
        parts["copy"] = t["copy_pinned"]
    else:
        raise ValueError(f"arm: the model has no arm {arm!r}; modelled: {', '.join(MODEL_ARMS)}")
    parts.update(wait=t["wait"], host_softmax=after, host_gather=t["top_k"])
    return parts


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


def gpu_model(platform: Platform, cell: Cell, rates: HostRates,
              forward_ms: float | None = None) -> Model:
    knobs, notes = gpu_knobs(platform, cell, rates, forward_ms)
    return Model(platform.name, cell, knobs, lambda k: gpu_terms(platform, cell, k), True, notes)


def cpu_model(cell: Cell, rates: HostRates) -> Model:
    knobs, notes = cpu_knobs(cell, rates)
    return Model(CPU_PLATFORM, cell, knobs, lambda k: cpu_terms(cell, k), False, notes)


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
            "decision": decision, "depends_on": decisive_knob,
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


def predict_cell(model: Model, delta: float) -> dict[str, Any]:
    """Every arm's predicted step (ms, interval) and every question's answer at one cell."""
    arms = {}
    for arm in MODEL_ARMS:
        mid, low, high = model.interval(arm)
        if math.isfinite(mid):
            arms[arm] = {"mid_ms": mid, "low_ms": low, "high_ms": high,
                         "parts_ms": model.parts_mid(arm)}
    answers = [answer(model, q, delta) for q in QUESTIONS
               if all(a in arms for a in QUESTIONS[q])]
    return {"platform": model.platform, "rows": model.cell.rows, "vocab": model.cell.vocab,
            "k": model.cell.k, "log_softmax": model.cell.log_softmax, "arms": arms,
            "answers": answers, "notes": model.notes,
            "knobs": {name: {"low": kn.low, "high": kn.high, "origin": kn.origin}
                      for name, kn in model.knobs.items()}}


def crossing(platform: Platform, vocab: int, k: int, model: forward.ModelDims | None,
             rates: HostRates, delta: float, question: str = "bundle",
             sizes: Iterable[int] | None = None) -> dict[str, Any]:
    """The n x V at which a question's answer crosses the bar on a platform (rows scanned at a
    fixed vocabulary): from where the whole interval lies above the bar (``port_from``) and
    from where any of it does (``may_port_from``); None where it never does in the scan."""
    curve = saving_curve(platform, vocab, k, model, rates, delta, question, sizes)
    sure = curve[curve["margin_low_ms"] > 0]
    maybe = curve[curve["margin_high_ms"] > 0]
    return {"platform": platform.name, "question": question, "vocab": vocab,
            "port_from_nv": int(sure["n_x_v"].min()) if len(sure) else None,
            "may_port_from_nv": int(maybe["n_x_v"].min()) if len(maybe) else None,
            "scanned_nv": [int(curve["n_x_v"].min()), int(curve["n_x_v"].max())],
            "measured_nv": [s // 4 for s in (rates.sizes[0], rates.sizes[-1])] if rates.sizes
            else None}


DEFAULT_ROWS = tuple(2 ** i for i in range(0, 11))  # 1 .. 1024 rows


def saving_curve(platform: Platform, vocab: int, k: int, model: forward.ModelDims | None,
                 rates: HostRates, delta: float, question: str = "bundle",
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
                    "n_x_v": n * vocab,
                    "saving_ms": base_mid - float(predicted.totals(cand_arm, mid)[0]),
                    "saving_low_ms": float((base - cand).min()),
                    "saving_high_ms": float((base - cand).max()),
                    "bar_ms": delta * base_mid, "margin_low_ms": float(margin.min()),
                    "margin_high_ms": float(margin.max()),
                    "extrapolated": any("extrapolated" in note for note in predicted.notes)})
    return pd.DataFrame(out)


# ------------------------------------------------------------------- checked against a run

def _measured_stage_means(cell: pd.DataFrame, arm: str) -> dict[str, float]:
    """An arm's mean ms per stage and in total (rounds where its total was timed)."""
    timed = cell[(cell["metric"] == "time") & (cell["status"] == "ok") & (cell["arm"] == arm)]
    return {str(stage): 1e3 * float(part["seconds"].mean())
            for stage, part in timed.groupby("stage", observed=True)}


def _error(predicted: float, measured: float | None) -> float | None:
    if measured is None or not measured or not math.isfinite(predicted):
        return None
    return predicted / measured - 1


def check_cell(step: pd.DataFrame, rows: int, vocab: int, k: int, *,
               platform: Platform | None, dims: forward.ModelDims | None = None,
               log_softmax: str = "device") -> dict[str, Any] | None:
    """One measured cell against the model fed that cell's own host rates: per stage of the
    seed's step and per arm, predicted (interval) beside measured (mean) with the error, a note
    where the measurement lies outside the interval; and the reuse lever's ratio. None where the
    cell has no host rates or no timed seed step."""
    cell = step[(step["rows"] == rows) & (step["vocab"] == vocab) & (step["k"] == k)]
    rates = host_rates(cell)
    if not rates.samples or not _measured_stage_means(cell, BASELINE):
        return None
    forward = cell[(cell["metric"] == "forward_ms") & (cell["status"] == "ok")]["value"].dropna()
    shape = Cell(rows, vocab, k, dims, log_softmax)
    model = (cpu_model(shape, rates) if platform is None else
             gpu_model(platform, shape, rates, float(forward.iloc[0]) if len(forward) else None))
    stages, arms = [], []
    measured_base = _measured_stage_means(cell, BASELINE)
    ranges, mids = model.parts_range(BASELINE, raw=True), model.parts_mid(BASELINE, raw=True)
    for stage, (low, high) in ranges.items():
        if stage in ("forward", "wait", "host_softmax") and stage not in measured_base:
            continue
        mid = mids[stage]
        stages.append(_compared(stage, mid, low, high, measured_base.get(stage)))
    for arm in MODEL_ARMS:
        measured = _measured_stage_means(cell, arm).get(catalogue.TOTAL)
        mid, low, high = model.interval(arm)
        if measured is not None and math.isfinite(mid):
            arms.append(_compared(arm, mid, low, high, measured))
    return {"platform": model.platform, "rows": rows, "vocab": vocab, "k": k,
            "stages": stages, "arms": arms, "reuse_ratio": _reuse_ratio(model, cell),
            "notes": model.notes + [f"{c['name']}: measured {c['measured_ms']:.3g} ms lies "
                                    f"outside the predicted [{c['low_ms']:.3g}, "
                                    f"{c['high_ms']:.3g}] ms"
                                    for c in stages + arms if c["outside"]]}


def _compared(name: str, mid: float, low: float, high: float,
              measured: float | None) -> dict[str, Any]:
    outside = measured is not None and not low <= measured <= high
    return {"name": name, "predicted_ms": mid, "low_ms": low, "high_ms": high,
            "measured_ms": measured, "error": _error(mid, measured), "outside": bool(outside)}


def _reuse_ratio(model: Model, cell: pd.DataFrame) -> dict[str, Any] | None:
    """The reuse lever's ratio of mean steps (fresh vector / reused buffer), predicted beside
    measured."""
    base = _measured_stage_means(cell, BASELINE).get(catalogue.TOTAL)
    reused = _measured_stage_means(cell, REUSED).get(catalogue.TOTAL)
    every = corners(model.knobs)
    ratios = model.totals(BASELINE, every) / model.totals(REUSED, every)
    mid = at_mid(model.knobs)
    predicted = float((model.totals(BASELINE, mid) / model.totals(REUSED, mid))[0])
    measured = base / reused if base and reused else None
    return {"predicted": predicted, "low": float(ratios.min()), "high": float(ratios.max()),
            "measured": measured, "error": _error(predicted, measured),
            "outside": measured is not None and not ratios.min() <= measured <= ratios.max()}


def models_by_vocab() -> dict[int, forward.ModelDims]:
    """Forward dimensions by vocabulary size, from the model table (the first model of each
    vocabulary); the forward of a cell given as a bare size is unknown (0)."""
    out: dict[int, forward.ModelDims] = {}
    for name, row in forward.model_table().items():
        out.setdefault(int(row["vocab"]), forward.model_dims(name))
    return out


def check_run(step: pd.DataFrame | None, gpu_name: str | None,
              platforms: Mapping[str, Platform] | None = None) -> dict[str, Any]:
    """Every measured step cell against the model: a GPU run against its platform's row (when
    the table has one), a CPU run against the host model; JSON-ready, for the verdict."""
    if step is None or step.empty:
        return {"platform": None, "cells": [], "note": "no step table: nothing to check"}
    platform = platform_of_gpu(gpu_name, platforms)
    if gpu_name and platform is None:
        return {"platform": None, "cells": [],
                "note": f"{gpu_name} has no row in data/platforms.csv: not checked"}
    models = models_by_vocab()
    where = sorted(step["log_softmax"].dropna().unique()) if "log_softmax" in step else []
    log_softmax = "device" if "device" in where or not where else str(where[0])
    if len(where) > 1:  # both places measured: the device's cells are checked
        step = step[step["log_softmax"].isna() | (step["log_softmax"] == log_softmax)]
    keys = step[step["metric"] == HOST_METRIC][["rows", "vocab", "k"]].drop_duplicates()
    cells = [check_cell(step, int(r.rows), int(r.vocab), int(r.k), platform=platform,
                        dims=models.get(int(r.vocab)), log_softmax=log_softmax)
             for r in keys.sort_values(["vocab", "rows", "k"]).itertuples()]
    cells = [c for c in cells if c is not None]
    return {"platform": platform.name if platform else CPU_PLATFORM, "cells": cells,
            "note": "" if cells else "no cell has both host rates and a timed seed step"}


def check_words(check: Mapping[str, Any]) -> list[str]:
    """The check in sentences: per cell, the seed step's total and the reuse ratio, predicted
    beside measured with the error, and every disagreement beyond the interval."""
    out = []
    for cell in check.get("cells") or []:
        total = next((a for a in cell["arms"] if a["name"] == BASELINE), None)
        ratio = cell.get("reuse_ratio")
        parts = []
        if total:
            parts.append(f"seed step predicted {total['predicted_ms']:.2f} ms "
                         f"[{total['low_ms']:.2f}, {total['high_ms']:.2f}], measured "
                         f"{total['measured_ms']:.2f} ms ({_percent(total['error'])})")
        if ratio and ratio["measured"] is not None:
            parts.append(f"reuse lever predicted {ratio['predicted']:.2f}x "
                         f"[{ratio['low']:.2f}, {ratio['high']:.2f}], measured "
                         f"{ratio['measured']:.2f}x ({_percent(ratio['error'])})")
        if parts:
            disagree = [n for n in cell["notes"] if "outside the predicted" in n]
            out.append(f"Prediction ({check['platform']}, n={cell['rows']}, V={cell['vocab']}, "
                       f"K={cell['k']}): {'; '.join(parts)}."
                       + (f" Outside the interval: {'; '.join(disagree)}." if disagree else ""))
    return out


def _percent(error: float | None) -> str:
    return "error unknown" if error is None else f"error {error:+.0%}"


def check_table(check: Mapping[str, Any]) -> pd.DataFrame:
    """The check as one table: per cell, each stage and arm, predicted beside measured."""
    rows = []
    for cell in check.get("cells") or []:
        for kind in ("stages", "arms"):
            rows += [{"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"],
                      "level": kind[:-1], **c} for c in cell[kind]]
        ratio = cell.get("reuse_ratio")
        if ratio:
            rows.append({"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"],
                         "level": "ratio", "name": "reuse lever (x)",
                         "predicted_ms": ratio["predicted"], "low_ms": ratio["low"],
                         "high_ms": ratio["high"], "measured_ms": ratio["measured"],
                         "error": ratio["error"], "outside": ratio["outside"]})
    return pd.DataFrame(rows)
