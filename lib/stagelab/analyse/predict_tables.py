"""The cost model's inputs as tables: the GPU platforms (``data/platforms.csv``), the host rates a
run recorded, the host classes (``data/hosts.csv``), a cell, and the knobs at whose every corner the
model is evaluated. Torch-free."""

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

from stagelab.core import catalogue, forward, paths

HOST_METRIC = "host_rate"  # the rows of stagelab.measure.hostrates
BASELINE, CANDIDATE = catalogue.baseline(catalogue.STEP), catalogue.candidate(catalogue.STEP)
REUSED = catalogue.REUSE_LEVER[catalogue.STEP]
DEVICE_TOP_K = catalogue.DEVICE_TOP_K
ONE_PASS = catalogue.ONE_PASS
DEFERRED = catalogue.DEFERRED_WAIT
MODEL_ARMS = (BASELINE, REUSED, CANDIDATE, DEFERRED, DEVICE_TOP_K, ONE_PASS)
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

