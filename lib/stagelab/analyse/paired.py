"""Statistics of paired timings: each checked, the speedup with its CI, and the A/A harness check.

Timings come in rounds: ``baseline[i]`` and ``candidate[i]`` share whatever the machine was doing
in round ``i``, so every statistic here keeps that pairing. The gate's decision built on them:
:mod:`stagelab.analyse.stats`.

**The harness check** (:func:`twin_checks`) asks of every A/A twin of a run, as one family
(Bonferroni), whether identical arms differ by more than delta.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from stagelab.analyse.resample import N_RESAMPLES, RatioOfMeans, Samples


def summarize(frame: pd.DataFrame, by: Sequence[str], value: str = "seconds") -> pd.DataFrame:
    """Median, quartiles, IQR, IQR/median and count of ``value`` per group."""
    grouped = frame.groupby(list(by), observed=True, dropna=False)[value]
    out = grouped.agg(median="median", q1=lambda s: s.quantile(0.25),
                      q3=lambda s: s.quantile(0.75), n="count").reset_index()
    out["iqr"] = out["q3"] - out["q1"]
    out["iqr_over_median"] = out["iqr"] / out["median"]
    return out


class BadTimings(ValueError):
    """Timings that are not positive and finite: the cell cannot be decided."""


def positive_timings(values: Samples, name: str) -> np.ndarray:
    """``values`` as a 1-D float array of positive, finite seconds; BadTimings (a ValueError)
    naming ``name`` and the first bad value otherwise."""
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one timing per round), "
                         f"got shape {array.shape}")
    bad = ~(np.isfinite(array) & (array > 0))
    if bad.any():
        first = int(np.argmax(bad))
        raise BadTimings(f"{name} must hold positive, finite timings: round {first} holds "
                         f"{float(array[first])!r} ({int(bad.sum())} bad of {len(array)})")
    return array


def same_lengths(**arrays: np.ndarray | None) -> None:
    lengths = {name: len(a) for name, a in arrays.items() if a is not None}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(f"paired arms need one timing per round each, but {listed} rounds")


def paired_speedup(baseline: Samples, candidate: Samples, *,
                   confidence: float = 0.95, n_resamples: int = N_RESAMPLES,
                   seed: int = 0) -> tuple[float, float, float]:
    """(speedup, ci_low, ci_high) of baseline/candidate; baseline[i] and candidate[i] come from
    round i. The speedup is the ratio of the arms' mean times; the CI a percentile bootstrap over
    whole rounds."""
    b, c = positive_timings(baseline, "baseline"), positive_timings(candidate, "candidate")
    same_lengths(baseline=b, candidate=c)
    if len(b) < 2:
        raise ValueError(f"baseline and candidate need at least 2 rounds, got {len(b)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")
    ratio = RatioOfMeans(b, c, n_resamples=n_resamples, seed=seed)
    return (ratio.point, *ratio.interval(confidence))


TWIN_METHOD = "Bonferroni across the run's A/A twins"


def twin_checks(pairs: Sequence[tuple[Samples, Samples]], *, delta: float,
                confidence: float = 0.95, seed: int = 0) -> tuple[float, list[dict[str, Any]]]:
    """The A/A harness check of a family of twins: each ``(baseline, twin)`` pair's speedup and
    CI at the Bonferroni level ``1 - (1 - confidence) / m`` (m pairs), and whether the CI lies
    wholly outside ``1 +- delta`` (``differs``). Returns (that level, one dict per pair).

    Why the family: a run holds a twin per cell, and a 95 % CI per twin misses its truth in 5 %
    of cells, so eight cells of noisy copies would raise a false alarm in about a third of quiet
    runs (simulated in the tests); corrected, the run's false alarms stay near 1 - confidence.
    A pair with bad timings or fewer than 2 rounds gets ``differs`` None and a ``note``."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    level = 1 - (1 - confidence) / max(len(pairs), 1)
    out: list[dict[str, Any]] = []
    for baseline, twin in pairs:
        try:
            speedup, low, high = paired_speedup(baseline, twin, confidence=level, seed=seed)
        except ValueError as exc:  # BadTimings too
            out.append({"n_rounds": len(baseline), "twin_speedup": None, "twin_ci_low": None,
                        "twin_ci_high": None, "differs": None, "note": str(exc)})
            continue
        out.append({"n_rounds": len(baseline), "twin_speedup": speedup, "twin_ci_low": low,
                    "twin_ci_high": high, "differs": bool(low > 1 + delta or high < 1 - delta),
                    "note": ""})
    return level, out


def median_of_ratios(baseline: Samples, candidate: Samples) -> float:
    """The median of per-round ratios ``baseline[i] / candidate[i]`` (reported beside the
    mean, never deciding)."""
    return float(np.median(np.asarray(baseline, float) / np.asarray(candidate, float)))
