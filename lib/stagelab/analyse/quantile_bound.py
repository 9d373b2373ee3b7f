"""A distribution-free upper bound on a step's p99 that uses the number of rounds honestly.

The engine pays for a rare stall in its tail, not in its mean: a p99 step. A sample of ``n``
rounds bounds the ``q`` quantile from above, whatever the distribution, by its ``k``-th smallest
value, where ``k`` is the fewest with ``P(Binomial(n, q) < k) >= confidence`` (the number of
rounds below the true quantile is binomial). With ``k = n`` (the slowest round) that needs
``1 - q ** n >= confidence``: 299 rounds for the 99th percentile at 95 %. Fewer rounds bound no
p99 at all, and the bound says so: the slowest round then bounds only a lower quantile, and a
stall rarer than 1 in ``N`` rounds (:func:`stagelab.core.design.rarest_unexcluded`) cannot be
excluded. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from stagelab.core import design

QUANTILE, CONFIDENCE = 0.99, 0.95


def min_rounds(quantile: float = QUANTILE, confidence: float = CONFIDENCE) -> int:
    """The fewest rounds whose slowest bounds the ``quantile`` at ``confidence``: the smallest
    ``n`` with ``1 - quantile ** n >= confidence`` (299 for the p99 at 95 %)."""
    _check(quantile, confidence)
    return math.ceil(math.log(1 - confidence) / math.log(quantile))


def upper_order(rounds: int, quantile: float = QUANTILE,
                confidence: float = CONFIDENCE) -> int | None:
    """The 1-based order statistic of ``rounds`` values that bounds the ``quantile`` from above
    at ``confidence`` (the smallest ``k`` with ``P(Binomial(rounds, quantile) <= k - 1) >=
    confidence``); None where even the slowest round cannot."""
    _check(quantile, confidence)
    if rounds < 1:
        raise ValueError(f"rounds must be positive, got {rounds!r}")
    k = int(sps.binom.ppf(confidence, rounds, quantile)) + 1
    while k > 1 and sps.binom.cdf(k - 2, rounds, quantile) >= confidence:
        k -= 1  # ppf's float edge: keep the smallest order that holds
    return k if k <= rounds else None


def bounded_quantile(rounds: int, confidence: float = CONFIDENCE) -> float:
    """The highest quantile the slowest of ``rounds`` values bounds at ``confidence``:
    ``(1 - confidence) ** (1 / rounds)``."""
    _check(0.5, confidence)
    if rounds < 1:
        raise ValueError(f"rounds must be positive, got {rounds!r}")
    return (1 - confidence) ** (1 / rounds)


@dataclass(frozen=True)
class QuantileBound:
    """One arm's tail: its rounds, the point ``quantile`` (ms), the distribution-free upper bound
    (ms, None where the rounds cannot give one), the order statistic used, the quantile the
    slowest round does bound, the rarest stall the rounds cannot exclude, and words."""

    arm: str
    rounds: int
    quantile: float
    confidence: float
    point_ms: float | None
    upper_ms: float | None
    order: int | None
    min_rounds: int
    slowest_ms: float | None
    slowest_bounds: float | None
    stall_unexcluded: int | None
    words: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the verdict's ``p99_step``."""
        return asdict(self)


def bound(seconds: Sequence[float] | np.ndarray, arm: str, quantile: float = QUANTILE,
          confidence: float = CONFIDENCE) -> QuantileBound:
    """The ``quantile`` step of ``arm``'s per-round ``seconds`` with its distribution-free upper
    bound at ``confidence`` (:func:`upper_order`), or, with too few rounds, what cannot be
    excluded (the words say which)."""
    values = np.sort(np.asarray(seconds, dtype=float))
    values = values[np.isfinite(values)]
    n, need = len(values), min_rounds(quantile, confidence)
    label = f"p{quantile * 100:g}"
    if n == 0:
        return QuantileBound(arm, 0, quantile, confidence, None, None, None, need, None, None,
                             None, f"{arm}: no rounds, no {label} step")
    point, slowest = 1e3 * float(np.quantile(values, quantile)), 1e3 * float(values[-1])
    order = upper_order(n, quantile, confidence)
    reach, unexcluded = bounded_quantile(n, confidence), design.rarest_unexcluded(n, confidence)
    if order is not None:
        upper = 1e3 * float(values[order - 1])
        words = (f"{arm}: the {label} step is at most {upper:.4g} ms ({confidence:.0%}, the "
                 f"{order}th of {n} rounds, distribution-free; point {point:.4g} ms)")
        return QuantileBound(arm, n, quantile, confidence, point, upper, order, need, slowest,
                             reach, unexcluded, words)
    words = (f"{arm}: {n} rounds bound no {label} step (a distribution-free bound at "
             f"{confidence:.0%} needs {need}); the slowest, {slowest:.4g} ms, bounds only the "
             f"p{reach * 100:.1f}: a stall rarer than 1 in {unexcluded:,} cannot be excluded")
    return QuantileBound(arm, n, quantile, confidence, point, None, None, need, slowest, reach,
                         unexcluded, words)


def _check(quantile: float, confidence: float) -> None:
    if not (0 < quantile < 1 and 0 < confidence < 1):
        raise ValueError(f"quantile and confidence must lie in (0, 1), got {quantile!r}, "
                         f"{confidence!r}")
