"""A baseline with regimes: a fresh vector's calls that fall into a slow or a fast mode (mapped
fresh or reused from the heap, transparent huge pages or not), recorded per call.

A mode hit in 30 % of calls at 1.5x makes the baseline's mean wander by about 1.5 % between two
samples of 160 rounds from the mix alone, so a bootstrap over rounds cannot see a saving of 2
delta through it. With the regime recorded per round, the family's cells share one estimate of
the mix (:func:`family_mix`, pooled over every cell's baseline and A/A twin): each cell's fresh
vector is reweighted to that mix (:func:`reweighted`), its rounds are resampled within their
regime, and the uncertainty of the pooled mix is added to the interval (:func:`mix_error`),
so the decision is on the saving at the mix the family measured, with the mix's own sampling
error counted once rather than per cell.

That error is the same draw of the mix in every cell, so the cells' bounds move together
(correlated about 0.9 when it dominates), while Holm's step-down treats them as separate tests.
With two regimes the shared error is one factor: each cell's standardised error is its loading
on it (:func:`mix_loading` over the cell's whole standard error) plus its own, independent part,
and the family's level at each of Holm's steps is the max-T one of that one-factor model
(:func:`family_level`), which for loadings near 1 approaches a single test's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import integrate, optimize, special


@dataclass(frozen=True)
class Mix:
    """The regimes' shares over a family's fresh-vector calls, and the calls they rest on
    (effective: a round whose baseline and twin share their regime counts once)."""

    shares: dict[str, float]
    calls: float


def _labels(cell: Mapping[str, Any], key: str) -> np.ndarray | None:
    labels = cell.get(key) if isinstance(cell, Mapping) else None
    return None if labels is None else np.asarray(labels).astype(str).ravel()


def family_mix(cells: Sequence[Any]) -> Mix | None:
    """The regimes' pooled shares over every cell's ``regime`` (the baseline's per-round
    labels) and ``twin_regime``; None where no cell records a regime, or only one regime is
    seen. The twin's labels count as further calls in proportion to how little they agree
    with the baseline's round by round (identical: the same rounds counted once)."""
    pooled: list[np.ndarray] = []
    calls = 0.0
    for cell in cells:
        base, twin = _labels(cell, "regime"), _labels(cell, "twin_regime")
        if base is None:
            continue
        pooled.append(base)
        calls += len(base)
        if twin is not None and len(twin) == len(base):
            pooled.append(twin)
            calls += len(twin) * (1 - _agreement(base, twin))
    if not pooled:
        return None
    labels = np.concatenate(pooled)
    names, counts = np.unique(labels, return_counts=True)
    if len(names) < 2:
        return None
    return Mix({str(n): float(c) / len(labels) for n, c in zip(names, counts)}, calls)


def _agreement(first: np.ndarray, second: np.ndarray) -> float:
    """How far two label series agree beyond chance (Cohen's kappa, clipped to [0, 1])."""
    observed = float(np.mean(first == second))
    names = np.union1d(first, second)
    expected = sum(float(np.mean(first == n)) * float(np.mean(second == n)) for n in names)
    if expected >= 1:
        return 1.0
    return min(max((observed - expected) / (1 - expected), 0.0), 1.0)


def _target(labels: np.ndarray, mix: Mix) -> dict[str, float]:
    """The mix's shares over the labels this series holds, renormalised."""
    present = {label: mix.shares.get(label, 0.0) for label in np.unique(labels)}
    total = sum(present.values())
    if total <= 0:
        return {label: 1 / len(present) for label in present}
    return {label: share / total for label, share in present.items()}


def reweighted(values: np.ndarray, labels: np.ndarray, mix: Mix) -> np.ndarray:
    """``values`` scaled per regime so that their mean is the mean at the family's mix: each
    call times its regime's pooled share over its share in this series."""
    target = _target(labels, mix)
    own = {label: float(np.mean(labels == label)) for label in target}
    factor = np.array([target[label] / own[label] for label in labels])
    return values * factor


def mix_error(values: np.ndarray, labels: np.ndarray, mix: Mix) -> float:
    """The relative standard error that the pooled mix's own sampling adds to the mean at the
    mix: ``sqrt(sum_k p_k (mu_k - mu)^2 / calls) / mu``, ``mu_k`` this series' mean per regime."""
    target = _target(labels, mix)
    means = {label: float(values[labels == label].mean()) for label in target}
    mean = sum(target[k] * means[k] for k in target)
    spread = sum(target[k] * (means[k] - mean) ** 2 for k in target)
    return math.sqrt(spread / mix.calls) / mean if mix.calls > 0 and mean > 0 else 0.0


def mix_loading(values: np.ndarray, labels: np.ndarray, mix: Mix) -> float:
    """:func:`mix_error` signed by the way this series' mean at the mix moves when the pooled
    share of the mix's second regime (its labels sorted) grows: the series' loading on the one
    shared factor of a two-regime mix. 0 where the mix has more than two regimes (no single
    factor: the family keeps plain Holm) or this series holds only one."""
    names = sorted(mix.shares)
    present = set(np.unique(labels))
    if len(names) != 2 or not set(names) <= present:
        return 0.0
    slower = values[labels == names[1]].mean() - values[labels == names[0]].mean()
    return math.copysign(mix_error(values, labels, mix), float(slower))


LOADING_CAP = 0.999  # a loading of 1 leaves no own error: the integrand's division needs < 1


def _all_below(critical: float, loadings: tuple[float, ...]) -> float:
    """``P(max_i Z_i <= critical)`` for standard normals ``Z_i = l_i U + sqrt(1 - l_i^2) E_i``
    (``U``, ``E_i`` independent standard normals): ``int phi(u) prod_i Phi((c - l_i u) /
    sqrt(1 - l_i^2)) du``, by adaptive quadrature."""
    load = np.clip(np.asarray(loadings, dtype=float), -LOADING_CAP, LOADING_CAP)
    own = np.sqrt(1 - load ** 2)

    def integrand(u: float) -> float:
        return float(math.exp(-u * u / 2) / math.sqrt(2 * math.pi)
                     * np.prod(special.ndtr((critical - load * u) / own)))
    return float(integrate.quad(integrand, -9, 9, epsabs=1e-11, epsrel=1e-10, limit=200)[0])


def max_t_critical(loadings: Sequence[float], alpha: float) -> float:
    """The one-sided critical value ``c`` with ``P(max_i Z_i > c) = alpha`` for correlated
    standard normals with one-factor ``loadings`` (:func:`_all_below`, solved by brentq).
    Loadings all 0: Sidak's ``Phi^-1((1 - alpha)^(1/m))``; all near 1: near one test's."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if not loadings or not all(math.isfinite(x) and -1 <= x <= 1 for x in loadings):
        raise ValueError(f"loadings must be a non-empty list of numbers in [-1, 1], got "
                         f"{list(loadings)!r}")
    return _cached_critical(tuple(sorted(float(x) for x in loadings)), alpha)


@lru_cache(maxsize=4096)
def _cached_critical(loadings: tuple[float, ...], alpha: float) -> float:
    return float(optimize.brentq(lambda c: _all_below(c, loadings) - (1 - alpha), -9, 12,
                                 xtol=1e-10))


def family_level(loadings: Sequence[float], alpha: float) -> float:
    """The one-sided level at which each of a family's cells is tested so that the chance that
    any clears falsely is ``alpha``: the max-T level ``1 - Phi(c)`` of :func:`max_t_critical`
    where some cell loads on the shared mix, Holm's (Bonferroni's) ``alpha / m`` where none does
    (no shared term: Holm holds whatever the correlation); never below ``alpha / m``."""
    bonferroni = alpha / len(loadings)
    if not any(loadings):
        return bonferroni
    return max(float(special.ndtr(-max_t_critical(loadings, alpha))), bonferroni)
