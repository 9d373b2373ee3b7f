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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize

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
    memory_gb: float = math.inf  # the GPU's memory: a configuration beyond it is not predicted
    memory_source: str = ""
    host_classes: tuple[str, ...] = ()  # its usual hosts (data/hosts.csv), the default host range

    def matches(self, gpu_name: str) -> bool:
        """Whether a GPU's name holds one of the row's fragments as whole words (``L4`` is not
        ``L40S``, ``H200`` not ``GH200``)."""
        return any(fragment and re.search(rf"(?<![\w]){re.escape(fragment)}(?!\w)", gpu_name)
                   for fragment in self.gpu_match)


# A figure published as one point (one bandwidthTest run) is widened by this share each way, so
# that its interval does not collapse to a point no second server would repeat (assumed).
POINT_WIDENING = 0.10


def widened(low: float, high: float, source: str) -> tuple[tuple[float, float], str]:
    """A published range as it is, a point widened by :data:`POINT_WIDENING` each way, saying so."""
    if low != high:
        return (low, high), source
    return ((low * (1 - POINT_WIDENING), high * (1 + POINT_WIDENING)),
            f"{source}; a point figure widened +-{POINT_WIDENING:.0%} (assumed)")


def load_platforms(path: Path | str = paths.PLATFORMS_FILE) -> dict[str, Platform]:
    """Every platform of the table by name (standard library csv); point figures widened."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    out = {}
    for r in rows:
        pinned = widened(float(r["pinned_d2h_gbps_low"]), float(r["pinned_d2h_gbps_high"]),
                         r["pinned_source"])
        pageable = widened(float(r["pageable_d2h_gbps_low"]),
                           float(r["pageable_d2h_gbps_high"]), r["pageable_source"])
        out[r["platform"]] = Platform(
            r["platform"], tuple(r["gpu_match"].split("|")), r["link"], *pinned, *pageable,
            float(r["hbm_gbps"]), r["hbm_source"], r["host_type"],
            float(r.get("memory_gb") or math.inf), r.get("memory_source") or "",
            tuple(h for h in (r.get("host_classes") or "").split("|") if h))
    return out


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
    origin: str = "measured"
    notes: list[str] = field(default_factory=list)  # rows refused by the physical bounds

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


# Physical bounds on a recorded host term: a positive, finite time under a minute, moving its
# bytes at most 10 TB/s (no host streams that, not even from its caches). A row beyond them is
# refused, and said so, before the model sees it.
HOST_SECONDS_MAX = 60.0
HOST_GBPS_MAX = 10_000.0


def host_rate_fault(seconds: float, nbytes: int) -> str | None:
    """Why a host term's ``seconds`` at ``nbytes`` is physically impossible; None when it is not."""
    if not math.isfinite(seconds) or seconds <= 0:
        return f"{seconds!r} s is not a positive time"
    if seconds > HOST_SECONDS_MAX:
        return f"{seconds:.3g} s is over {HOST_SECONDS_MAX:g} s"
    if nbytes / seconds / 1e9 > HOST_GBPS_MAX:
        return f"{nbytes / seconds / 1e9:.3g} GB/s is over {HOST_GBPS_MAX:g} GB/s"
    return None


def host_rates(frame: pd.DataFrame, origin: str = "measured") -> HostRates:
    """The host-rate rows of a step table (every cell, every repeat) by size, each checked
    against the physical bounds (refused rows are counted in ``notes``)."""
    rows = frame[(frame["metric"] == HOST_METRIC) & (frame["status"] == "ok")]
    rates = HostRates(origin=origin)
    for (nbytes, term), part in rows.groupby(["bytes", "stage"], observed=True):
        kept: list[float] = []
        refused: list[str] = []
        for value in part["seconds"].dropna():
            fault = host_rate_fault(float(value), int(nbytes))
            if fault:
                refused.append(fault)
            else:
                kept.append(float(value))
        if kept:
            rates.samples.setdefault(int(nbytes), {})[str(term)] = kept
        if refused:
            rates.notes.append(f"host term {term} at {int(nbytes):,} B: {len(refused)} row(s) "
                               f"refused by the physical bounds ({refused[0]})")
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


# ------------------------------------------------------------------------------ host classes

# glibc's dynamic mmap threshold never rises above 32 MiB on 64-bit (mallopt(3),
# DEFAULT_MMAP_THRESHOLD_MAX): a larger vector is mmapped, munmapped at its free and faulted in
# afresh each step; a smaller one may come back from the heap with its pages still mapped.
GLIBC_MMAP_MAX = 32 * 2**20
REGIMES = ("faulted", "mapped", "auto")
THP_MODES = ("always", "madvise", "never")
HOST_RATES = ("first_touch_4k", "first_touch_thp", "warm_fill", "memcpy", "top_k", "free",
              "free_mapped", "host_softmax")


@dataclass(frozen=True)
class HostClass:
    """One row of ``data/hosts.csv``: the host-side rates (GB/s of the ``[n, V]`` fp32 vector) of
    a kind of host, each a range with its source, the THP modes it may run, and the allocator
    regime assumed for the fresh vector (``auto``: by size, as glibc does)."""

    name: str
    description: str
    thp: tuple[str, ...]
    gbps: dict[str, tuple[float, float]]
    sources: dict[str, str]
    cores: tuple[int, int] = (1, 1)
    regime: str = "auto"

    @property
    def origin(self) -> str:
        return f"host class {self.name}"

    @property
    def sizes(self) -> list[int]:
        return []  # nothing measured: never extrapolated

    @property
    def notes(self) -> list[str]:
        return []

    def first_touch(self) -> tuple[float, float]:
        """The fresh vector's first-touch GB/s over the class's THP modes (2 MiB faults under
        ``always``; 4 KiB ones otherwise: glibc's malloc does not madvise)."""
        ranges = [self.gbps["first_touch_thp" if mode == "always" else "first_touch_4k"]
                  for mode in self.thp]
        return min(r[0] for r in ranges), max(r[1] for r in ranges)

    def faulted_share(self, nbytes: int) -> tuple[float, float]:
        """The share of the vector's pages faulted in afresh each step: 1 when faulted, 0 when
        found mapped; by size under ``auto`` (above glibc's 32 MiB ceiling, mmapped: faulted;
        below it, either)."""
        if self.regime == "faulted" or (self.regime == "auto" and nbytes > GLIBC_MMAP_MAX):
            return 1.0, 1.0
        return (0.0, 0.0) if self.regime == "mapped" else (0.0, 1.0)

    def regime_words(self, nbytes: int) -> str:
        low, high = self.faulted_share(nbytes)
        return ("faulted afresh every step" if low == 1 else "pages found mapped" if high == 0
                else "either faulted or found mapped (glibc below its 32 MiB mmap ceiling)")

    def term_ms(self, term: str, nbytes: int) -> None:
        """Host classes give rates, not measured terms (:func:`class_knobs`)."""
        return None

    def options(self, thp: str | None = None, regime: str | None = None) -> HostClass:
        """The class under a stated THP mode and allocator regime (None: as the table says)."""
        if thp is not None and thp not in THP_MODES:
            raise ValueError(f"thp: unknown {thp!r}; known: {', '.join(THP_MODES)}")
        if regime is not None and regime not in REGIMES:
            raise ValueError(f"regime: unknown {regime!r}; known: {', '.join(REGIMES)}")
        return replace(self, thp=(thp,) if thp else self.thp, regime=regime or self.regime)


def load_hosts(path: Path | str = paths.HOSTS_FILE) -> dict[str, HostClass]:
    """Every host class of the table by name (standard library csv)."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {r["host"]: HostClass(
        r["host"], r["description"], tuple(r["thp"].split("|")),
        {rate: (float(r[f"{rate}_gbps_low"]), float(r[f"{rate}_gbps_high"]))
         for rate in HOST_RATES},
        {rate: r[f"{rate}_source"] for rate in (*HOST_RATES, "thp", "cores")},
        (int(r["cores_low"]), int(r["cores_high"]))) for r in rows}


def host_named(name: str, hosts: Mapping[str, HostClass] | None = None) -> HostClass:
    """A host class by its name (case-insensitive); ValueError naming the choices."""
    hosts = hosts or load_hosts()
    for key, host in hosts.items():
        if key.lower() == name.lower():
            return host
    raise ValueError(f"host: unknown {name!r}; known: {', '.join(hosts)} (or 'this')")


def hosts_of(platform: Platform, hosts: Mapping[str, HostClass] | None = None) -> list[HostClass]:
    """A platform's usual hosts (its ``host_classes``), the default host range of its answers."""
    hosts = hosts or load_hosts()
    return [host_named(name, hosts) for name in platform.host_classes]


def class_knobs(host: HostClass, cell: Cell) -> dict[str, Knob]:
    """The knobs of a host class at one cell: its rates (GB/s) and the faulted share."""
    origin = f"{host.origin}: "
    low, high = host.first_touch()
    knobs = {"first_touch_gbps": Knob(low, high, origin + f"THP {'|'.join(host.thp)}; "
                                      + host.sources["first_touch_4k"]),
             "faulted_share": Knob(*host.faulted_share(cell.nbytes),
                                   origin + host.regime_words(cell.nbytes))}
    rates = ["warm_fill", "top_k", "free", "free_mapped"]
    if cell.log_softmax == "host":
        rates.append("host_softmax")
    for rate in rates:
        knobs[f"{rate}_gbps"] = Knob(*host.gbps[rate], origin + host.sources[rate])
    return knobs


def class_terms_ms(nbytes: int, k: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A host class's terms (ms) at the knob values: the fresh vector's fill, page faults where
    faulted, the top-K, the free (munmap where faulted), the host log-softmax."""
    mb = nbytes / 1e6  # ms per (GB/s)
    share = k["faulted_share"]
    out = {"fresh_vector": mb * (share / k["first_touch_gbps"]
                                 + (1 - share) / k["warm_fill_gbps"]),
           "top_k": mb / k["top_k_gbps"],
           "free": mb * (share / k["free_gbps"] + (1 - share) / k["free_mapped_gbps"])}
    if "host_softmax_gbps" in k:
        out["host_softmax"] = mb / k["host_softmax_gbps"]
    return out


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


FORWARD_MS_MAX = 10_000.0  # no decode step of these models takes 10 s


def forward_fault(forward_ms: float, platform: Platform, cell: Cell) -> str | None:
    """Why a recorded ``forward_ms`` is physically impossible on a platform: not a positive time
    under 10 s, or faster than reading the cell's weights and KV cache at the datasheet's peak
    HBM bandwidth; None when it is possible."""
    if not math.isfinite(forward_ms) or not 0 < forward_ms <= FORWARD_MS_MAX:
        return f"forward_ms {forward_ms!r} is not a positive time under {FORWARD_MS_MAX:g} ms"
    floor_ms = 1e3 * cell.forward_bytes / (platform.hbm_gbps * 1e9)
    if forward_ms < floor_ms:
        return (f"forward_ms {forward_ms:.3g} is below the {floor_ms:.3g} ms its weights and KV "
                f"cache take at {platform.hbm_gbps:g} GB/s peak")
    return None


def gpu_knobs(platform: Platform, cell: Cell, rates: HostRates | HostClass,
              forward_ms: float | None = None) -> tuple[dict[str, Knob], list[str]]:
    """The knobs of a GPU platform at one cell on a host (measured rates or a host class), and
    notes (host terms extrapolated, missing, refused; a forward out of bounds)."""
    knobs = {"pinned_gbps": Knob(*platform.pinned_gbps, platform.pinned_source),
             "pageable_gbps": Knob(*platform.pageable_gbps, platform.pageable_source),
             "hbm_efficiency": Knob(*HBM_EFFICIENCY, "assumed"),
             "wait_ms": Knob(*WAIT_MS, "assumed"),
             "device_top_k_fixed_ms": Knob(*DEVICE_TOP_K_FIXED_MS, "assumed")}
    notes = list(rates.notes)
    fault = None if forward_ms is None else forward_fault(forward_ms, platform, cell)
    if fault:
        notes.append(f"{fault}: refused, the model's forward used instead")
    elif forward_ms is not None:
        knobs["forward_ms"] = Knob(forward_ms, forward_ms, "measured (queued by the run)")
    if isinstance(rates, HostClass):
        knobs.update(class_knobs(rates, cell))
        return knobs, notes
    terms = ["fresh_vector", "top_k", "free"]
    if cell.log_softmax == "host":
        terms.append("host_softmax")
    notes += _add_host_knobs(knobs, terms, rates, cell.nbytes)
    return knobs, notes


def cpu_knobs(cell: Cell, rates: HostRates) -> tuple[dict[str, Knob], list[str]]:
    """The knobs of a CPU run: every term measured on the host."""
    knobs: dict[str, Knob] = {}
    terms = ["log_softmax", "fresh_vector", "copy_fresh", "copy_reused", "top_k", "free"]
    if cell.log_softmax == "host":
        terms.append("host_softmax")
    notes = list(rates.notes) + _add_host_knobs(knobs, terms, rates, cell.nbytes)
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
        knobs[term] = Knob(low, high, rates.origin + (" (extrapolated)" if outside else ""),
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
            "k": model.cell.k, "log_softmax": model.cell.log_softmax, "host": model.host,
            "fits": True, "arms": arms, "answers": answers, "notes": model.notes,
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
    stages, arms = _stage_and_arm_checks(model, cell)
    return {"platform": model.platform, "rows": rows, "vocab": vocab, "k": k,
            "stages": stages, "arms": arms, "reuse_ratio": _reuse_ratio(model, cell),
            "notes": model.notes + [f"{c['name']}: measured {c['measured_ms']:.3g} ms lies "
                                    f"outside the predicted [{c['low_ms']:.3g}, "
                                    f"{c['high_ms']:.3g}] ms"
                                    for c in stages + arms if c["outside"]]}


def _stage_and_arm_checks(model: Model, cell: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """Each stage of the seed's step and each arm's step: predicted beside measured."""
    stages, arms = [], []
    measured_base = _measured_stage_means(cell, BASELINE)
    ranges, mids = model.parts_range(BASELINE, raw=True), model.parts_mid(BASELINE, raw=True)
    for stage, (low, high) in ranges.items():
        if stage in ("forward", "wait", "host_softmax") and stage not in measured_base:
            continue
        stages.append(_compared(stage, mids[stage], low, high, measured_base.get(stage)))
    for arm in MODEL_ARMS:
        measured = _measured_stage_means(cell, arm).get(catalogue.TOTAL)
        mid, low, high = model.interval(arm)
        if measured is not None and math.isfinite(mid):
            arms.append(_compared(arm, mid, low, high, measured))
    return stages, arms


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
    step, log_softmax = _one_place(step)  # both places measured: the device's are checked
    keys = step[step["metric"] == HOST_METRIC][["rows", "vocab", "k"]].drop_duplicates()
    cells = [check_cell(step, int(r.rows), int(r.vocab), int(r.k), platform=platform,
                        dims=models.get(int(r.vocab)), log_softmax=log_softmax)
             for r in keys.sort_values(["vocab", "rows", "k"]).itertuples()]
    cells = [c for c in cells if c is not None]
    return {"platform": platform.name if platform else CPU_PLATFORM, "cells": cells,
            "kind": IN_SAMPLE_KIND,
            "note": "" if cells else "no cell has both host rates and a timed seed step"}


IN_SAMPLE_KIND = ("additivity: the model fed the cell's own host rates (and, on a GPU, the "
                  "forward the run queued), so it tests that the stages add up, not a prediction")
OUT_OF_SAMPLE_KIND = ("out of sample: the model fed host rates the run did not produce (measured "
                      "before it in another process, or the platform's host classes) and its "
                      "own forward, against the run's measured stages and savings")
PRIOR_ORIGIN = "host rates measured before the run, in another process"


def prior_rates(run_dir: Path | str) -> HostRates | None:
    """The host rates a run measured before its step, in another process
    (:mod:`stagelab.measure.priorrates`), bounded; None where it has none."""
    path = Path(run_dir) / paths.HOST_PRIOR_ROWS
    if not path.is_file():
        return None
    from stagelab.core import schema

    rates = host_rates(schema.make_rows(schema.read_json_lines(path, root=run_dir)),
                       origin=PRIOR_ORIGIN)
    return rates if rates.samples else None


def _question_checks(model: Model, cell: pd.DataFrame) -> list[dict[str, Any]]:
    """Per question the run measured both arms of: the predicted saving per step (point and
    interval) beside the measured one (difference of mean steps), with the error."""
    out = []
    every, mid = corners(model.knobs), at_mid(model.knobs)
    for question, (base_arm, cand_arm) in QUESTIONS.items():
        base = _measured_stage_means(cell, base_arm).get(catalogue.TOTAL)
        cand = _measured_stage_means(cell, cand_arm).get(catalogue.TOTAL)
        saving = model.totals(base_arm, every) - model.totals(cand_arm, every)
        point = float((model.totals(base_arm, mid) - model.totals(cand_arm, mid))[0])
        if base is None or cand is None or not math.isfinite(point):
            continue
        checked = _compared(question, point, float(saving.min()), float(saving.max()),
                            base - cand)
        checked["error_ms"] = point - (base - cand)
        out.append(checked)
    return out


def _step_cells(step: pd.DataFrame) -> list[tuple[int, int, int]]:
    timed = step[(step["metric"] == "time") & (step["arm"] == BASELINE)]
    return sorted({(int(r.rows), int(r.vocab), int(r.k))
                   for r in timed[["rows", "vocab", "k"]].drop_duplicates().itertuples()},
                  key=lambda c: (c[1], c[0], c[2]))


def out_of_sample_run(step: pd.DataFrame | None, gpu_name: str | None,
                      prior: HostRates | None = None,
                      platforms: Mapping[str, Platform] | None = None) -> dict[str, Any]:
    """The model fed inputs the run did not produce, against what it measured, per cell: each
    stage and arm, and each question's saving (the pinning saving where both arms ran). Its
    host: the rates measured before the run in another process, else (a GPU run) its
    platform's usual host classes; its forward: the model's, not the one the run queued.
    JSON-ready, for the verdict (``out_of_sample``)."""
    empty: dict[str, Any] = {"kind": OUT_OF_SAMPLE_KIND, "platform": None, "host": None,
                             "cells": []}
    if step is None or step.empty:
        return {**empty, "note": "no step table: nothing to check"}
    platform = platform_of_gpu(gpu_name, platforms)
    if gpu_name and platform is None:
        return {**empty, "note": f"{gpu_name} has no row in data/platforms.csv: not checked"}
    hosts: list[HostRates | HostClass] = []
    if prior is not None and prior.samples:
        hosts.append(prior)
    elif platform is not None:
        hosts += hosts_of(platform)
    if not hosts:
        return {**empty, "note": "no host rates were measured before this CPU run: nothing out "
                                 "of sample to check (the in-sample check tests additivity)"}
    step, log_softmax = _one_place(step)
    models = models_by_vocab()
    cells = []
    for rows, vocab, k in _step_cells(step):
        frame = step[(step["rows"] == rows) & (step["vocab"] == vocab) & (step["k"] == k)]
        shape = Cell(rows, vocab, k, models.get(vocab), log_softmax)
        for host in hosts:
            model = (gpu_model(platform, shape, host) if platform is not None
                     else cpu_model(shape, host) if isinstance(host, HostRates) else None)
            if model is None:
                continue
            stages, arms = _stage_and_arm_checks(model, frame)
            cells.append({"rows": rows, "vocab": vocab, "k": k, "host": model.host,
                          "stages": stages, "arms": arms,
                          "questions": _question_checks(model, frame), "notes": model.notes})
    return {**empty, "platform": platform.name if platform else CPU_PLATFORM,
            "host": ", ".join(h.origin for h in hosts), "cells": cells,
            "note": "" if cells else "no timed seed step"}


def _one_place(step: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The step rows of one log-softmax placement (the device's, where both were measured)."""
    where = sorted(step["log_softmax"].dropna().unique()) if "log_softmax" in step else []
    log_softmax = "device" if "device" in where or not where else str(where[0])
    if len(where) > 1:
        step = step[step["log_softmax"].isna() | (step["log_softmax"] == log_softmax)]
    return step, log_softmax


def out_of_sample_words(check: Mapping[str, Any]) -> list[str]:
    """The out-of-sample check in sentences: per cell and host, the seed step and each measured
    saving, predicted beside measured with the error."""
    out = []
    for cell in check.get("cells") or []:
        total = next((a for a in cell["arms"] if a["name"] == BASELINE), None)
        parts = []
        if total:
            parts.append(f"seed step predicted {total['predicted_ms']:.2f} ms, measured "
                         f"{total['measured_ms']:.2f} ms ({_percent(total['error'])})")
        parts += [f"{q['name']} saving predicted {q['predicted_ms']:.3g} ms [{q['low_ms']:.3g}, "
                  f"{q['high_ms']:.3g}], measured {q['measured_ms']:.3g} ms ("
                  f"{q['error_ms']:+.3g} ms)" for q in cell["questions"]]
        if parts:
            out.append(f"Out of sample ({check['platform']}, {cell['host']}, n={cell['rows']}, "
                       f"V={cell['vocab']}, K={cell['k']}): {'; '.join(parts)}.")
    return out


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


# The check table's columns in reading order: which cell, what, predicted, measured, the error.
CHECK_COLUMNS = ("rows", "vocab", "k", "host", "level", "name", "predicted_ms", "low_ms",
                 "high_ms", "measured_ms", "error", "outside", "error_ms")


def check_table(check: Mapping[str, Any]) -> pd.DataFrame:
    """The check as one table: per cell (and host, out of sample), each stage, arm and
    question's saving, predicted beside measured."""
    rows = []
    for cell in check.get("cells") or []:
        on = {"host": cell["host"]} if "host" in cell else {}
        for kind in ("stages", "arms", "questions"):
            rows += [{"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"], **on,
                      "level": kind[:-1], **c} for c in cell.get(kind) or []]
        ratio = cell.get("reuse_ratio")
        if ratio:
            rows.append({"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"],
                         "level": "ratio", "name": "reuse lever (x)",
                         "predicted_ms": ratio["predicted"], "low_ms": ratio["low"],
                         "high_ms": ratio["high"], "measured_ms": ratio["measured"],
                         "error": ratio["error"], "outside": ratio["outside"]})
    table = pd.DataFrame(rows)
    order = [c for c in CHECK_COLUMNS if c in table] + [c for c in table if c not in CHECK_COLUMNS]
    return table[order]  # a verdict.json read back has its keys sorted: its order is not ours


# Each level of the check, as its own table's title.
LEVEL_TITLES = {"stage": "Each stage of the seed's step (ms)",
                "arm": "Each arm's whole step (ms)",
                "question": "Each question's saving per step, baseline − candidate (ms)",
                "ratio": "The reuse lever: the ratio of the two arms' steps (x, not ms)"}


def check_tables(check: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """:func:`check_table` as one table per level (stages, arms, questions, the ratio), each
    under its title and with only its own columns: narrower, and the ratio's figures not
    labelled as milliseconds."""
    table = check_table(check)
    if table.empty:
        return {}
    out = {}
    for level, rows in table.groupby("level", sort=False):
        rows = rows.drop(columns="level").dropna(axis=1, how="all").reset_index(drop=True)
        if level == "ratio":
            rows = rows.rename(columns=lambda c: c.removesuffix("_ms"))
        out[LEVEL_TITLES.get(level, str(level))] = rows
    return out
