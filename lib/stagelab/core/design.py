"""The timing experiment's design, shared by the measuring floor and the calibration: the order of
arms in each round and the rule that says when a cell has enough rounds. Standard library only.

* **Balanced order** (:func:`balanced_orders`): across a cell's rounds every arm takes every
  position in the round equally often, within one, at every prefix of the rounds (so a cell cut
  short stays balanced). The orders are the rows of a Williams design (a Latin square in which,
  for an even number of arms, each arm also follows every other equally often; for an odd number
  the square and its mirror), with the arms' labels and the rows within each square shuffled by
  a seed. The seed is drawn per run and per cell (:func:`order_seed`): a position effect (the
  first arm of a round paying for a cold cache, say) then averages out over the rounds instead of
  becoming a fixed bias that no rerun removes.
* **Rounds until resolved** (:func:`resolved`): the paired speedup's CI, ``mean(baseline) /
  mean(candidate)``, by the delta method (:func:`speedup_half_width`: the ratio of means over
  paired rounds, widened for dependent rounds and read at their effective degrees of freedom,
  :func:`effective_df`, as the rule reads its bounds). A sweep adds rounds while the CI of any of its
  comparisons (the bundle, reuse alone, pinning alone) still straddles its bar and a cap on
  rounds or seconds allows, and stops as soon as every one lies wholly on one side: rounds go
  where the answer needs them (near the bar), not where a half-width target puts them. That is
  optional stopping (it looks at the effect), so its error rates are measured, with this very
  rule, in :mod:`stagelab.analyse.calibration` (the rows "until resolved").
* **Rounds to see a stall** (:func:`rounds_to_see`, :data:`TAIL_ROUNDS`): an arm slow in one
  round of 50 shows no slow round at all in ``0.98^n`` of samples of ``n`` rounds; a sample
  without one looks faster than the arm is, and stopping on precision locks that in. 149 rounds
  see at least one such stall with probability 95 %, so a PORT needs that many.
* **The stall the rounds may have missed** (:func:`unseen_stall_charge`,
  :data:`STALL_ALLOWANCE`): a PORT charges the candidate's mean for one stall 3x an ordinary
  call among the family's rounds, since a sample that holds no stall rarer than its rounds shows
  the candidate faster than it is.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from statistics import NormalDist

RESOLVED, ROUND_CAP, TIME_CAP, FIXED = "resolved", "round cap", "time cap", "fixed rounds"
STALL_RATE = 1 / 50  # the rarest stall a decision must have had the chance to see
STALL_SEEN = 0.95  # ... with this probability


def rounds_to_see(rate: float = STALL_RATE, probability: float = STALL_SEEN) -> int:
    """The fewest rounds in which an event of per-round ``rate`` shows at least once with
    ``probability``: the smallest ``n`` with ``1 - (1 - rate)^n >= probability``."""
    if not (0 < rate < 1 and 0 < probability < 1):
        raise ValueError(f"rate and probability must lie in (0, 1), got {rate!r}, {probability!r}")
    return math.ceil(math.log(1 - probability) / math.log(1 - rate) - 1e-9)


TAIL_ROUNDS = rounds_to_see()  # 149: the rounds a PORT needs


def rarest_unexcluded(rounds: int, probability: float = STALL_SEEN) -> int:
    """``N`` such that a stall of 1 in ``N`` rounds or rarer is absent from ``rounds`` rounds
    with more than ``1 - probability`` chance: the sample cannot exclude it (the inverse of
    :func:`rounds_to_see`; 160 rounds exclude stalls down to 1 in 53)."""
    if rounds < 1 or not 0 < probability < 1:
        raise ValueError(f"rounds must be positive and probability in (0, 1), got {rounds!r}, "
                         f"{probability!r}")
    return math.floor(1 / (1 - (1 - probability) ** (1 / rounds)))


STALL_ALLOWANCE = 3.0  # the unseen candidate stall a PORT charges, in ordinary calls


def unseen_stall_charge(rounds: int, size: float = STALL_ALLOWANCE) -> float:
    """The share of the candidate's mean a PORT charges for a stall its ``rounds`` may have
    missed: one call ``size`` times an ordinary one among ``rounds + 1`` (a pseudo-count),
    ``(size - 1) / (rounds + 1)``; 0 at ``size`` 1.

    Why: a stall rarer than the rounds is absent from most samples, and a sample without it
    shows the candidate faster than it is by ``rate (size - 1)``; the charge offsets that for a
    stall no larger than ``size`` and no more frequent than one in ``rounds + 1``, and a more
    frequent one shows in the rounds (in 63 % of samples at that rate, more above it), where the
    check of one more round like the family's worst charges it. 0.21 % for a 3x stall over
    960 rounds."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if not (math.isfinite(size) and size >= 1):
        raise ValueError(f"size (the stall allowance) must be a finite number >= 1, got {size!r}")
    return (size - 1) / (rounds + 1)


def rounds_to_close(saving: float, *, delta: float = 0.02, noise: float = 0.02, cells: int = 6,
                    power: float = 0.8, confidence: float = 0.95) -> int:
    """The rounds per cell at which a family of ``cells`` cells whose true saving is ``saving``
    deltas (below 1) all CLOSE with probability ``power``: each cell's one-sided ``1 -
    confidence`` upper bound below the bar ``1 / (1 - delta)`` with probability
    ``power ** (1 / cells)``, its log speedup's standard error ``noise * sqrt(2 / n)`` (two arms
    of per-call spread ``noise``, independent rounds). The cheaper answers (CLOSE; "port a reused
    buffer", which needs pinning's CLOSE) need these rounds; the gate's cap states which it
    reaches."""
    if not (0 <= saving < 1 and 0 < delta < 1 and noise > 0 and cells >= 1
            and 0 < power < 1 and 0 < confidence < 1):
        raise ValueError(f"saving must lie in [0, 1) deltas and delta, noise, cells, power and "
                         f"confidence be valid, got {saving!r}, {delta!r}, {noise!r}, "
                         f"{cells!r}, {power!r}, {confidence!r}")
    distance = math.log((1 - saving * delta) / (1 - delta))
    z = NormalDist().inv_cdf(confidence) + NormalDist().inv_cdf(power ** (1 / cells))
    return math.ceil(2 * (noise * z / distance) ** 2)


DEPENDENCE_CAP = 0.95  # the largest lag-1 correlation read (the factor then is 6.2)


def lag1(residuals: Sequence[float]) -> float:
    """The lag-1 autocorrelation of the paired residuals per round (``baseline[i] - ratio *
    candidate[i]``) with Kendall's small-sample bias added back (``(1 + 4 rho) / n``), clipped
    to ``[0, DEPENDENCE_CAP]``; 0 for fewer than 10 rounds or constant residuals. Never below 0:
    a negative correlation is not taken as extra precision."""
    n = len(residuals)
    if n < 10:
        return 0.0
    mean = math.fsum(residuals) / n
    deviations = [x - mean for x in residuals]
    variance = math.fsum(d * d for d in deviations)
    if not variance > 0:
        return 0.0
    rho = math.fsum(a * b for a, b in zip(deviations, deviations[1:])) / variance
    return min(max(rho + (1 + 4 * rho) / n, 0.0), DEPENDENCE_CAP)


def inflation(rho: float) -> float:
    """The factor ``sqrt((1 + rho) / (1 - rho))`` by which an AR(1) of lag-1 correlation
    ``rho`` widens the standard error of a mean over what independent rounds would give."""
    return math.sqrt((1 + rho) / (1 - rho))


def clipped_share(mean: float) -> float:
    """``Var(max(X, 0))`` for ``X ~ N(mean, 1)``: the share of a normal estimate's variance left
    once it is clipped at 0 (0.34 at ``mean`` 0, 1 far above it, 0 far below)."""
    normal = NormalDist()
    below, density = normal.cdf(mean), normal.pdf(mean)
    first = mean * below + density
    return max((mean * mean + 1) * below + mean * density - first * first, 0.0)


def effective_df(rounds: int, rho: float, estimated: bool = True) -> float:
    """The degrees of freedom of a mean's standard error over ``rounds`` rounds whose noise is an
    AR(1) of lag-1 correlation ``rho``, read from the rounds (``estimated``, by :func:`lag1`) or
    known.

    Two things make the error's estimate less certain than ``rounds - 1`` says. The rounds carry
    the information of ``n_eff = rounds (1 - rho) / (1 + rho)`` independent ones, whose variance
    estimate has ``n_eff - 1`` degrees of freedom. And the widening ``(1 + rho) / (1 - rho)`` is
    itself estimated: ``rho``'s sampling variance ``s^2 = (1 - rho^2) / rounds``, times the share
    that survives :func:`lag1`'s clipping at 0 (:func:`clipped_share` of ``rho / s``: a third at
    ``rho`` 0, all of it from about ``rho`` 3 s), gives the log of the widening a variance ``4
    share / ((1 - rho^2) rounds)`` (its slope in ``rho`` is ``2 / (1 - rho^2)``), what a variance
    estimate of ``(1 - rho^2) rounds / (2 share)`` degrees of freedom has (``Var log s^2 = 2 /
    df``). The two add on the log scale (Satterthwaite): ``1 / df = 1 / (n_eff - 1) + 2 share /
    ((1 - rho^2) rounds)``. Fewer than 10 rounds read no ``rho``: ``rounds - 1``."""
    if rounds < 2 or not 0 <= rho < 1:
        raise ValueError(f"rounds must be at least 2 and rho in [0, 1), got {rounds!r}, {rho!r}")
    if rounds < 10:
        return float(rounds - 1)
    n_eff = rounds * (1 - rho) / (1 + rho)
    spread = 1 / max(n_eff - 1, 1.0)
    if estimated:
        sampling = (1 - rho * rho) / rounds
        spread += 2 * clipped_share(rho / math.sqrt(sampling)) / ((1 - rho * rho) * rounds)
    return 1 / spread


def t_quantile(probability: float, df: float) -> float:
    """Student's t quantile at ``probability`` with ``df`` degrees of freedom (standard library
    only: the Cornish-Fisher expansion about the normal quantile, to ``df^-3``; at 5 degrees of
    freedom within 0.2 % of the exact quantile at 0.975 and 0.7 % at 0.004, at 10 within 0.05 %
    at both; a little short of it, the error shrinking as ``df^-4``)."""
    if not (0 < probability < 1 and df > 0):
        raise ValueError(f"probability must lie in (0, 1) and df be positive, got "
                         f"{probability!r}, {df!r}")
    z = NormalDist().inv_cdf(probability)
    z2 = z * z
    return (z + z * (z2 + 1) / (4 * df) + z * (5 * z2 * z2 + 16 * z2 + 3) / (96 * df ** 2)
            + z * (3 * z2 ** 3 + 19 * z2 * z2 + 17 * z2 - 15) / (384 * df ** 3))


def expanded_z(probability: float, df: float) -> float:
    """The normal quantile at which Hesterberg's expanded percentile reads ``probability``:
    ``sqrt((df + 1) / df) t_df(probability)``, ``df`` the standard error's degrees of freedom
    (``rounds - 1`` for independent rounds, :func:`effective_df` for dependent ones)."""
    return math.sqrt((df + 1) / df) * t_quantile(probability, df)


def williams_rows(arms: int) -> list[list[int]]:
    """The rows of a Williams design for ``arms`` arms, as arm indices: ``arms`` rows (one Latin
    square) for an even count, ``2 * arms`` (the square, then its mirror) for an odd one."""
    if arms < 1:
        raise ValueError(f"arms must be positive, got {arms}")
    first, low, high = [0], 1, arms - 1
    while len(first) < arms:
        first.append(low)
        low += 1
        if len(first) < arms:
            first.append(high)
            high -= 1
    square = [[(value + shift) % arms for value in first] for shift in range(arms)]
    return square if arms % 2 == 0 else square + [row[::-1] for row in square]


def balanced_orders(arms: Sequence[str], rounds: int, seed: int) -> list[list[str]]:
    """The order of ``arms`` in each of ``rounds`` rounds: Williams rows, arms relabelled and rows
    shuffled within each square by ``seed``, one square after another. Every arm takes every
    position ``rounds / len(arms)`` times, within one, after any number of rounds."""
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    names = list(arms)
    if not names:
        return [[] for _ in range(rounds)]
    shuffler = random.Random(seed)
    shuffler.shuffle(names)
    rows = williams_rows(len(names))
    squares = [rows[i:i + len(names)] for i in range(0, len(rows), len(names))]
    orders: list[list[str]] = []
    while len(orders) < rounds:
        for square in squares:
            block = list(square)
            shuffler.shuffle(block)
            orders += [[names[i] for i in row] for row in block]
    return orders[:rounds]


def order_seed(run: str | int, cell: str) -> int:
    """A seed for one cell of one run: the same run and cell give the same order, another run or
    cell another one."""
    digest = hashlib.sha256(f"{run}\x00{cell}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


def speedup_half_width(baseline: Sequence[float], candidate: Sequence[float],
                       confidence: float = 0.95) -> float:
    """Half-width of the ``confidence`` CI of ``mean(baseline) / mean(candidate)`` over paired
    rounds, by the delta method: with ``r`` the ratio and ``d[i] = baseline[i] - r *
    candidate[i]``, the ratio's standard error is ``stdev(d) / (sqrt(n) * mean(candidate))``,
    widened by :func:`inflation` of ``d``'s :func:`lag1` and read at the expanded quantile of its
    :func:`effective_df` (:func:`expanded_z`), as the rule's bootstrap reads its bounds: the stop
    rule cannot stop on a CI narrower than the decision's. Infinite with fewer than 3 rounds or a
    non-positive mean."""
    n = len(baseline)
    if n != len(candidate):
        raise ValueError(f"baseline has {n} rounds, candidate {len(candidate)}: they must pair")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if n < 3:
        return math.inf
    mean_b, mean_c = math.fsum(baseline) / n, math.fsum(candidate) / n
    if not (mean_c > 0 and math.isfinite(mean_b) and math.isfinite(mean_c)):
        return math.inf
    ratio = mean_b / mean_c
    residuals = [b - ratio * c for b, c in zip(baseline, candidate)]
    mean_r = math.fsum(residuals) / n
    variance = math.fsum((x - mean_r) ** 2 for x in residuals) / (n - 1)
    rho = lag1(residuals)
    z = expanded_z(0.5 + confidence / 2, effective_df(n, rho))
    return z * math.sqrt(variance / n) / mean_c * inflation(rho)


def resolved(baseline: Sequence[float], candidate: Sequence[float], bar: float,
             confidence: float = 0.95) -> bool:
    """Whether the ``confidence`` CI of ``mean(baseline) / mean(candidate)`` (delta method,
    :func:`speedup_half_width`) lies wholly above or wholly below ``bar``: no more rounds would
    change which side of the bar the comparison is on."""
    width = speedup_half_width(baseline, candidate, confidence)
    if math.isinf(width):
        return False
    ratio = math.fsum(baseline) / math.fsum(candidate)
    return ratio - width > bar or ratio + width < bar
