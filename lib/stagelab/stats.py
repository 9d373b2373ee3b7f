"""Statistics of paired timings and the gate's decision (PORT, CLOSE or INCONCLUSIVE).

Timings come in rounds: each round runs every arm once, in a shuffled order, so ``baseline[i]``
and ``candidate[i]`` share whatever the machine was doing in round ``i`` (clock, cache, a
neighbour's load). The statistics keep that pairing.

* **The effect** is the speedup ``baseline / candidate`` (above 1 the candidate is faster),
  estimated as the **median of the per-round ratios** ``median(baseline[i] / candidate[i])``,
  not as the ratio of medians. Why: a slowdown shared by both arms of a round cancels inside that
  round's ratio, before any summary; and a rare outlier spoils one ratio, which the median
  ignores. The ratio of medians only cancels drift on average and lets an outlier move each arm's
  median separately.
* **Its CI** comes from a bootstrap that resamples whole rounds (resampling the per-round ratios
  does exactly that: each ratio carries its round's two arms together), BCa first, the percentile
  interval where BCa degenerates. It is seeded: the same data gives the same answer.
* **The rule** is equivalence testing against a smallest effect of interest: ``min_speedup`` is the
  speedup that saves a fraction delta of the step (:func:`min_speedup_for`). PORT when the whole
  CI lies above it, CLOSE when the whole CI lies below it, INCONCLUSIVE otherwise. An A/A twin (the
  baseline measured again as another arm) checks the harness rather than defining a band.
  :mod:`stagelab.calibration` proves the rule's error rates by simulation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

PORT, CLOSE, INCONCLUSIVE = "PORT", "CLOSE", "INCONCLUSIVE"


def summarize(frame: pd.DataFrame, by: Sequence[str], value: str = "seconds") -> pd.DataFrame:
    """Median, quartiles, IQR, IQR/median and count of ``value`` per group."""
    grouped = frame.groupby(list(by), observed=True, dropna=False)[value]
    out = grouped.agg(median="median", q1=lambda s: s.quantile(0.25),
                      q3=lambda s: s.quantile(0.75), n="count").reset_index()
    out["iqr"] = out["q3"] - out["q1"]
    out["iqr_over_median"] = out["iqr"] / out["median"]
    return out


def _timings(values: Sequence[float], name: str) -> np.ndarray:
    """``values`` as a 1-D float array of positive, finite seconds; a ValueError naming ``name``
    otherwise."""
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one timing per round), "
                         f"got shape {array.shape}")
    if not np.all(np.isfinite(array) & (array > 0)):
        raise ValueError(f"{name} must hold positive, finite timings")
    return array


def _same_lengths(**arrays: np.ndarray | None) -> None:
    lengths = {name: len(a) for name, a in arrays.items() if a is not None}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(f"paired arms need one timing per round each, but {listed} rounds")


def _median_ratio(ratios: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(ratios, axis=axis)


def paired_speedup(baseline: Sequence[float], candidate: Sequence[float], *,
                   confidence: float = 0.95, n_resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """(speedup, ci_low, ci_high) of baseline/candidate; baseline[i] and candidate[i] come from
    round i. The speedup is the median of per-round ratios; the CI a bootstrap over rounds, BCa
    with a percentile fallback where BCa gives no finite interval around the estimate (ties, or
    the jackknife of a median on few rounds)."""
    b, c = _timings(baseline, "baseline"), _timings(candidate, "candidate")
    _same_lengths(baseline=b, candidate=c)
    if len(b) < 2:
        raise ValueError(f"baseline and candidate need at least 2 rounds, got {len(b)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")
    ratios = b / c
    point = float(_median_ratio(ratios))
    low = high = math.nan
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degenerate BCa is handled by the fallback below
            result = sps.bootstrap((ratios,), _median_ratio, confidence_level=confidence,
                                   n_resamples=n_resamples, method=method, vectorized=True,
                                   rng=np.random.default_rng(seed))
        low, high = (float(x) for x in result.confidence_interval)
        if np.isfinite(low) and np.isfinite(high) and low <= point <= high:
            break
    return point, low, high


@dataclass
class Decision:
    """The gate's answer for one comparison, with the evidence behind it."""

    decision: str
    reason: str
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    min_speedup: float | None = None
    twin_speedup: float | None = None
    twin_ci_low: float | None = None
    twin_ci_high: float | None = None
    saved_seconds: float | None = None  # median(baseline) - median(candidate)
    n_rounds: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def min_speedup_for(delta: float, *, part_seconds: float, step_seconds: float) -> float:
    """The speedup of a part (the copy; or the whole step when part_seconds == step_seconds) that
    saves delta x step_seconds; inf when even a free part would save less. delta outside (0, 1):
    ValueError naming delta.

    Speeding the part up by ``s`` saves ``part (1 - 1/s)``; setting that to ``delta * step`` gives
    ``s = part / (part - delta * step)``."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    for name, value in (("part_seconds", part_seconds), ("step_seconds", step_seconds)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, got {value}")
    if part_seconds > step_seconds:
        raise ValueError(f"part_seconds ({part_seconds}) cannot exceed step_seconds "
                         f"({step_seconds}): the part is inside the step")
    saving = delta * step_seconds
    return part_seconds / (part_seconds - saving) if part_seconds > saving else math.inf


def _ci_words(speedup: float, low: float, high: float, confidence: float) -> str:
    return f"{speedup:.3f}x ({confidence:.0%} CI [{low:.3f}, {high:.3f}])"


def decide(baseline: Sequence[float], candidate: Sequence[float], *, min_speedup: float,
           twin: Sequence[float] | None = None, min_samples: int = 10,
           confidence: float = 0.95, seed: int = 0) -> Decision:
    """PORT, CLOSE or INCONCLUSIVE for replacing ``baseline`` with ``candidate``.

    Inputs are per-round timings (index i = round i); ``twin`` is the baseline measured again as if
    it were another arm (A/A).

    * INCONCLUSIVE when fewer rounds than ``min_samples`` were measured, or when the twin's CI lies
      entirely above ``min_speedup`` or entirely below ``1/min_speedup`` (the harness sees a
      difference between identical arms).
    * PORT: the speedup's CI lies above ``min_speedup`` (and above the twin's CI where measured).
    * CLOSE: the CI lies below ``min_speedup``: any benefit is too small to be worth a change, and
      a slowdown is CLOSE too. ``min_speedup = inf`` (even a free candidate saves too little) is
      CLOSE whatever was measured, given enough rounds.
    * INCONCLUSIVE otherwise, saying which bound the CI straddles.
    """
    if not min_samples >= 2:
        raise ValueError(f"min_samples must be at least 2, got {min_samples}")
    if not min_speedup >= 1:  # also catches NaN
        raise ValueError(f"min_speedup must be >= 1 (a speedup), got {min_speedup}")
    b, c = _timings(baseline, "baseline"), _timings(candidate, "candidate")
    t = None if twin is None else _timings(twin, "twin")
    _same_lengths(baseline=b, candidate=c, twin=t)
    n = len(b)
    if n < min_samples:
        return Decision(INCONCLUSIVE, f"fewer rounds than the minimum ({n} < {min_samples})",
                        min_speedup=min_speedup, n_rounds=n)
    evidence: dict = dict(min_speedup=min_speedup, n_rounds=n,
                          saved_seconds=float(np.median(b) - np.median(c)))
    evidence.update(zip(("speedup", "ci_low", "ci_high"),
                        paired_speedup(b, c, confidence=confidence, seed=seed)))
    if t is not None:
        evidence.update(zip(("twin_speedup", "twin_ci_low", "twin_ci_high"),
                            paired_speedup(b, t, confidence=confidence, seed=seed)))
    if math.isinf(min_speedup):
        return Decision(CLOSE, "min_speedup is infinite: even a candidate that took no time "
                        "would save less than the smallest effect of interest", **evidence)
    return _apply_rule(evidence, confidence)


def _apply_rule(evidence: dict, confidence: float) -> Decision:
    """The equivalence rule on a measured speedup, its CI and the twin's."""
    bar = evidence["min_speedup"]
    low, high = evidence["ci_low"], evidence["ci_high"]
    effect = _ci_words(evidence["speedup"], low, high, confidence)
    twin_high = evidence.get("twin_ci_high")
    if twin_high is not None:
        twin_low = evidence["twin_ci_low"]
        twin = _ci_words(evidence["twin_speedup"], twin_low, twin_high, confidence)
        if twin_low > bar or twin_high < 1 / bar:
            return Decision(INCONCLUSIVE, f"the harness sees a difference between identical "
                            f"arms: the A/A twin's speedup {twin} lies outside "
                            f"[{1 / bar:.3f}, {bar:.3f}]", **evidence)
    if low > bar and (twin_high is None or low > twin_high):
        return Decision(PORT, f"speedup {effect} lies above the minimum {bar:.3f}x"
                        + ("" if twin_high is None else
                           f" and above the A/A twin's CI (up to {twin_high:.3f})"), **evidence)
    if high < bar:
        return Decision(CLOSE, f"speedup {effect} lies below the minimum {bar:.3f}x: any "
                        f"benefit is smaller than worth a change", **evidence)
    if low > bar:
        return Decision(INCONCLUSIVE, f"speedup {effect} lies above the minimum {bar:.3f}x but "
                        f"not above the A/A twin's CI (up to {twin_high:.3f})", **evidence)
    return Decision(INCONCLUSIVE, f"speedup {effect} straddles the minimum {bar:.3f}x: more "
                    f"rounds or less noise are needed to tell", **evidence)
