"""Statistics of timings: robust summaries, a bootstrap CI of a ratio of medians, the A/A noise
band, and the gate's decision (PORT, CLOSE or INCONCLUSIVE).

Effects are speedups: ``median(baseline) / median(candidate)``; above 1 the candidate is faster.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from stagelab.schema import aa_name

PORT, CLOSE, INCONCLUSIVE = "PORT", "CLOSE", "INCONCLUSIVE"


def summarize(frame: pd.DataFrame, by: Sequence[str], value: str = "seconds") -> pd.DataFrame:
    """Median, quartiles, IQR, IQR/median and count of ``value`` per group."""
    grouped = frame.groupby(list(by), observed=True, dropna=False)[value]
    out = grouped.agg(median="median", q1=lambda s: s.quantile(0.25),
                      q3=lambda s: s.quantile(0.75), n="count").reset_index()
    out["iqr"] = out["q3"] - out["q1"]
    out["iqr_over_median"] = out["iqr"] / out["median"]
    return out


def _ratio_of_medians(baseline: np.ndarray, candidate: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(baseline, axis=axis) / np.median(candidate, axis=axis)


def ratio_ci(baseline: Sequence[float], candidate: Sequence[float], confidence: float = 0.95,
             n_resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Speedup ``median(baseline)/median(candidate)`` and its bootstrap CI. BCa first; the
    percentile interval where BCa degenerates (ties, or an interval that misses the point estimate,
    which the jackknife acceleration of a median can produce on small samples). Deterministic for a
    given ``seed``."""
    b = np.asarray(baseline, dtype=float)
    c = np.asarray(candidate, dtype=float)
    if len(b) < 2 or len(c) < 2:
        raise ValueError(f"need at least 2 samples per arm, got {len(b)} and {len(c)}")
    point = float(_ratio_of_medians(b, c))
    low = high = np.nan
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = sps.bootstrap((b, c), _ratio_of_medians, confidence_level=confidence,
                                   n_resamples=n_resamples, method=method, vectorized=True,
                                   rng=np.random.default_rng(seed))
        low, high = result.confidence_interval
        if np.isfinite(low) and np.isfinite(high) and low <= point <= high:
            break
    return point, float(low), float(high)


def noise_band(arm: Sequence[float], twin: Sequence[float], confidence: float = 0.95,
               seed: int = 0) -> float:
    """Half-width ``h`` of the A/A noise band ``[1 - h, 1 + h]``: how far the same arm measured
    twice, interleaved, can seem to differ from itself."""
    _, low, high = ratio_ci(arm, twin, confidence=confidence, seed=seed)
    return float(max(abs(low - 1.0), abs(high - 1.0)))


@dataclass
class Decision:
    """The gate's answer for one comparison, with the evidence behind it."""

    decision: str
    reason: str
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    noise_half_width: float | None = None
    min_speedup: float | None = None
    saved_seconds: float | None = None
    n_baseline: int = 0
    n_candidate: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def decide(baseline: Sequence[float], candidate: Sequence[float], *, noise: float,
           min_speedup: float = 1.0, min_samples: int = 5, confidence: float = 0.95,
           seed: int = 0) -> Decision:
    """PORT, CLOSE or INCONCLUSIVE for replacing ``baseline`` with ``candidate``.

    * PORT: the speedup's CI lies entirely above the noise band and above ``min_speedup``.
    * CLOSE: the CI lies entirely inside the noise band (no effect), or entirely below it (the
      candidate is slower), or entirely above the band but below ``min_speedup`` (a real effect
      too small to be worth the change).
    * INCONCLUSIVE: too few samples, or the CI straddles a boundary.
    """
    n_b, n_c = len(baseline), len(candidate)
    if n_c == 0:
        return Decision(INCONCLUSIVE, "the candidate arm was not measured", n_baseline=n_b)
    if min(n_b, n_c) < min_samples:
        return Decision(INCONCLUSIVE, f"fewer samples than the minimum ({min(n_b, n_c)} < "
                        f"{min_samples})", n_baseline=n_b, n_candidate=n_c)
    speedup, low, high = ratio_ci(baseline, candidate, confidence=confidence, seed=seed)
    lower, upper = 1.0 - noise, 1.0 + noise
    bar = max(upper, min_speedup)
    evidence = dict(speedup=speedup, ci_low=low, ci_high=high, noise_half_width=noise,
                    min_speedup=min_speedup, n_baseline=n_b, n_candidate=n_c,
                    saved_seconds=float(np.median(baseline) - np.median(candidate)))
    ci = f"{speedup:.3f}x, {confidence:.0%} CI [{low:.3f}, {high:.3f}]"
    band = f"noise band [{lower:.3f}, {upper:.3f}]"
    if low > bar:
        return Decision(PORT, f"speedup {ci} lies above the {band} and the minimum "
                        f"{min_speedup:.3f}x", **evidence)
    if low >= lower and high <= upper:
        return Decision(CLOSE, f"speedup {ci} lies within the {band}: no measurable effect",
                        **evidence)
    if high < lower:
        return Decision(CLOSE, f"speedup {ci} lies below the {band}: the candidate is slower",
                        **evidence)
    if low > upper and high < min_speedup:
        return Decision(CLOSE, f"speedup {ci} is real but below the minimum {min_speedup:.3f}x",
                        **evidence)
    return Decision(INCONCLUSIVE, f"speedup {ci} straddles the {band} or the minimum "
                    f"{min_speedup:.3f}x", **evidence)


def compare_arms(frame: pd.DataFrame, baseline: str, candidate: str, by: Sequence[str],
                 noise_arm: str | None = None, stage: str = "total", confidence: float = 0.95,
                 seed: int = 0) -> pd.DataFrame:
    """Per group of ``by``: the candidate's speedup over the baseline with its CI, the A/A noise
    half-width (from ``noise_arm`` and its twin ``<arm>~aa``), and seconds saved per call."""
    timed = frame[(frame["metric"] == "time") & (frame["stage"] == stage)
                  & (frame["status"] == "ok")]
    out = []
    for key, group in timed.groupby(list(by), observed=True):
        base = group.loc[group["arm"] == baseline, "seconds"].to_numpy()
        cand = group.loc[group["arm"] == candidate, "seconds"].to_numpy()
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row.update(baseline=baseline, candidate=candidate, n_baseline=len(base),
                   n_candidate=len(cand))
        if len(base) >= 2 and len(cand) >= 2:
            row["speedup"], row["ci_low"], row["ci_high"] = ratio_ci(base, cand, confidence,
                                                                     seed=seed)
            row["saved_ms"] = 1e3 * float(np.median(base) - np.median(cand))
        if noise_arm is not None:
            a = group.loc[group["arm"] == noise_arm, "seconds"].to_numpy()
            twin = group.loc[group["arm"] == aa_name(noise_arm), "seconds"].to_numpy()
            if len(a) >= 2 and len(twin) >= 2:
                row["noise_half_width"] = noise_band(a, twin, confidence, seed=seed)
        out.append(row)
    return pd.DataFrame(out)
