"""The gate's decision for a family of cells (PORT, CLOSE or INCONCLUSIVE) from paired timings
(checked, and their plain speedup, in :mod:`stagelab.analyse.paired`). The rule in prose, with
its calibration: docs/decision-rule.md.

Timings come in rounds: each round runs every arm once, in a balanced order, so ``baseline[i]``
and ``candidate[i]`` share whatever the machine was doing in round ``i``; the statistics keep
that pairing.

* **The effect** is the speedup ``mean(baseline) / mean(candidate)``, because an engine pays the
  mean; the median of per-round ratios is reported beside it and flagged when it falls on the
  other side of the bar. **Its CI** is a seeded bootstrap over whole rounds
  (:mod:`stagelab.analyse.resample`), widened for rounds that are not independent, resampled
  within a bimodal baseline's regimes at the family's mix (:mod:`stagelab.analyse.regimes`),
  and corrected for carry-over with its error where the order's rows show it
  (:mod:`stagelab.analyse.carryover`).
* **The rule** is equivalence testing against a smallest effect of interest (``min_speedup``,
  :func:`min_speedup_for`): CLOSE when the upper bound at one-sided ``1 - confidence`` lies below
  it; PORT when the lower bound at Holm's level across the family (each step at the max-T level
  where the cells share a regime mix's error, :func:`stagelab.analyse.regimes.family_level`)
  lies above it and above the A/A
  twin's CI, still with one more round like the family's worst (a pseudo-count for the rarest
  rounds: a stall one cell holds is charged to every cell), and every cell can support it
  (:func:`decide_family`: 149 rounds, its mean non-inferior, its p99 tail not shown heavier
  beyond delta; intersection-union). Every PORT bound is charged for one unseen candidate
  stall (``stall_allowance`` times an ordinary call) among the family's rounds
  (:func:`stagelab.core.design.unseen_stall_charge`): a sample that missed a stall rarer than
  its rounds shows the candidate faster than it is. Every cell and a family PORT state the
  rarest candidate stall their rounds cannot exclude, and a PORT the stall it survives beyond
  the charged one (:mod:`stagelab.analyse.stalls`).
* **Bad input never crashes the decision**: a non-finite, zero or negative time, a missing,
  non-numeric or wrongly shaped series, bad regimes or carry-over, or a bad bar make the cell
  INCONCLUSIVE with the reason.

The three questions' fixed sequence and the change recommended: :mod:`stagelab.analyse.sequence`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stagelab.analyse import regimes, resample, stalls
from stagelab.analyse.paired import BadTimings, median_of_ratios, positive_timings, same_lengths
from stagelab.analyse.resample import RatioOfMeans, Samples, TailRatio
from stagelab.core import design

PORT, CLOSE, INCONCLUSIVE = "PORT", "CLOSE", "INCONCLUSIVE"
TAIL_HEAVIER, TAIL_NOT_HEAVIER, TAIL_UNRESOLVED = "heavier", "not heavier", "unresolved"
FAMILY_METHOD = ("Holm step-down across cells for PORT (each step at the max-T level of the "
                 "cells' one-factor correlation where they share a baseline's regime mix), "
                 "with every cell's mean non-inferior "
                 "(its one-sided lower bound above 1 - delta, intersection-union), no cell's p99 "
                 "tail shown heavier beyond delta (its upper bound at the family's one-sided level "
                 f"below 1 - delta) and at least {design.TAIL_ROUNDS} rounds; intersection-union "
                 "(every cell closes) for CLOSE")


@dataclass
class Decision:
    """The gate's answer for one comparison, with the evidence behind it."""

    decision: str
    reason: str
    speedup: float | None = None  # mean(baseline) / mean(candidate)
    ci_low: float | None = None
    ci_high: float | None = None
    min_speedup: float | None = None
    median_speedup: float | None = None  # median of per-round ratios, reported only
    port_bound: float | None = None  # the lower bound the PORT test used (Holm's level)
    port_level: float | None = None  # its one-sided error level
    close_bound: float | None = None  # the upper bound the CLOSE test used (one-sided 1 - conf.)
    one_more_bound: float | None = None  # port_bound with one more round like the worst
    twin_speedup: float | None = None
    twin_ci_low: float | None = None
    twin_ci_high: float | None = None
    saved_seconds: float | None = None  # mean(baseline) - mean(candidate)
    n_rounds: int = 0
    note: str = ""  # e.g. the median of per-round ratios on the other side of the bar
    noninferior_bound: float | None = None  # one-sided lower bound (1 - confidence) of the mean
    tail_speedup: float | None = None  # p99(baseline) / p99(candidate)
    tail_ci_low: float | None = None
    tail_ci_high: float | None = None
    tail_bound: float | None = None  # its lower bound at the family's one-sided level
    tail_upper_bound: float | None = None  # its upper bound at the family's one-sided level
    tail: str = ""  # the tail test: heavier, not heavier or unresolved ('' when not measured)
    port_blocked: str = ""  # why this cell keeps the family from PORT ('' when it does not)
    dependence: float = 1.0  # the CI's widening for rounds that are not independent
    carry_over_bias: float | None = None  # the speedup divided by 1 + this (carry-over)
    carry_over_se: float | None = None  # ... whose standard error widened the CI
    stalls_unexcluded: int | None = None  # a candidate stall rarer than 1 in this many rounds
    # could be absent from the cell's rounds (design.rarest_unexcluded)
    stall_budget: float | None = None  # a PORT's: the stall (x slower) at 1 in
    # stalls_unexcluded rounds that would bring its port_bound down to the bar (stall_budget)
    stall_charge: float | None = None  # the share of the candidate's mean port_bound charges
    # for an unseen stall (design.unseen_stall_charge over the family's rounds)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class FamilyDecision:
    """One decision for a family of cells, the per-cell decisions and how they were combined."""

    decision: str
    reason: str
    cells: list[Decision] = field(default_factory=list)
    method: str = FAMILY_METHOD
    confidence: float = 0.95
    stall_budget: float | None = None  # a PORT's: the stall (x slower) at the rarest rate the
    # family's rounds cannot exclude that would erase the smallest margin of a carrying cell
    stall_allowance: float = design.STALL_ALLOWANCE  # the unseen stall (x an ordinary call)
    # charged in every PORT bound, once over the family's rounds

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


@dataclass
class _Cell:
    """One cell on its way to a decision: its evidence, or the decision it already has."""

    bar: float
    evidence: dict[str, Any]
    effect: RatioOfMeans | None = None
    one_more: RatioOfMeans | None = None  # the effect with one more round like the worst
    remake: Any = None  # (baseline, candidate, strata) -> the effect, built as ``effect`` was
    series: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None  # b, c, strata
    settled: Decision | None = None  # decided before the family's PORT test (or undecidable)
    blocked: str = ""  # why the cell cannot support a family PORT ('' when it can)
    loading: float = 0.0  # its standardised error's loading on the family's shared mix error


def _check_common(min_samples: int, confidence: float, stall_allowance: float) -> None:
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
        raise ValueError(f"min_samples must be at least 2, got {min_samples!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    if (isinstance(stall_allowance, bool) or not isinstance(stall_allowance, (int, float))
            or not (math.isfinite(stall_allowance) and stall_allowance >= 1)):
        raise ValueError(f"stall_allowance must be a finite number >= 1 (times an ordinary "
                         f"call), got {stall_allowance!r}")


def _bar(cell: Any) -> float:
    """The cell's bar, ``min_speedup``; ValueError naming it when it is missing or not >= 1."""
    if not isinstance(cell, Mapping):
        raise ValueError(f"a cell must be a dict of baseline, candidate, twin and min_speedup, "
                         f"got {type(cell).__name__}")
    bar = cell.get("min_speedup")
    if isinstance(bar, bool) or not isinstance(bar, (int, float, np.number)) or not bar >= 1:
        raise ValueError(f"min_speedup must be a number >= 1 (a speedup), got {bar!r}")
    return float(bar)


def _series(cell: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The cell's baseline, candidate and twin timings, checked (ValueError, BadTimings too,
    naming the series and what is wrong)."""
    arrays = {}
    for name in ("baseline", "candidate", "twin"):
        value = cell.get(name)
        if value is None:
            if name != "twin":
                raise ValueError(f"{name} is missing")
            continue
        try:
            arrays[name] = np.asarray(value, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} is not a series of numbers ({exc})") from None
        if arrays[name].ndim != 1:
            raise ValueError(f"{name} must be one-dimensional (one timing per round), "
                             f"got shape {arrays[name].shape}")
    same_lengths(**arrays)
    checked = {name: positive_timings(array, name) for name, array in arrays.items()}
    return checked["baseline"], checked["candidate"], checked.get("twin")


def _prepare(cell: Any, *, min_samples: int, confidence: float, seed: int,
             port_min_rounds: int, mix: regimes.Mix | None = None) -> _Cell:
    """A cell's evidence (speedup, CI, twin, median, tail, non-inferiority bound), or its
    decision where the input cannot be decided (bad input, too few rounds) or the bar is
    infinite; and why it cannot support a family PORT, if so."""
    try:
        bar = _bar(cell)
    except ValueError as exc:
        return _Cell(math.nan, {}, settled=Decision(INCONCLUSIVE, f"bad input: {exc}"),
                     blocked="bad input")
    try:
        b, c, t = _series(cell)
    except BadTimings as exc:
        n = len(np.atleast_1d(np.asarray(cell["baseline"], dtype=float)))
        return _Cell(bar, {}, settled=Decision(INCONCLUSIVE, f"bad timings: {exc}",
                                               min_speedup=bar, n_rounds=n),
                     blocked="bad timings")
    except ValueError as exc:
        return _Cell(bar, {}, settled=Decision(INCONCLUSIVE, f"bad input: {exc}",
                                               min_speedup=bar), blocked="bad input")
    n = len(b)
    if n < min_samples:
        return _Cell(bar, {}, settled=Decision(
            INCONCLUSIVE, f"fewer rounds than the minimum ({n} < {min_samples})",
            min_speedup=bar, n_rounds=n), blocked="too few rounds")
    try:
        strata, twin_strata = resample.round_labels(cell, "regime", n), resample.round_labels(cell, "twin_regime", n)
        bias, bias_se = resample.carry_over(cell)
    except (ValueError, KeyError, TypeError) as exc:
        return _Cell(bar, {}, settled=Decision(INCONCLUSIVE, f"bad input: {exc}",
                                               min_speedup=bar, n_rounds=n), blocked="bad input")
    mix_se = shared = 0.0
    if mix is not None and strata is not None:
        mix_se, shared = regimes.mix_error(b, strata, mix), regimes.mix_loading(b, strata, mix)
        b = regimes.reweighted(b, strata, mix)
        t = t if t is None or twin_strata is None else regimes.reweighted(t, twin_strata, mix)
    remake = resample.effect_maker(seed, bias, math.hypot(bias_se, mix_se))
    effect = remake(b, c, strata)
    low, high = effect.interval(confidence)
    evidence: dict[str, Any] = dict(
        min_speedup=bar, n_rounds=n, saved_seconds=float(b.mean() - c.mean()),
        speedup=effect.point, ci_low=low, ci_high=high, median_speedup=median_of_ratios(b, c),
        noninferior_bound=effect.bound(1 - confidence),
        dependence=design.inflation(resample.lag1(b, c)),
        carry_over_bias=bias if bias_se else None, carry_over_se=bias_se or None,
        stalls_unexcluded=design.rarest_unexcluded(n),
        **_tail_evidence(TailRatio(b, c, seed=seed, strata=strata), bar, confidence))
    if t is not None:
        pairs = None if strata is None and twin_strata is None else np.char.add(
            resample.labels_or(strata, n), resample.labels_or(twin_strata, n))
        twin = resample.dependent(b, t, seed=seed, strata=pairs)
        evidence.update(zip(("twin_speedup", "twin_ci_low", "twin_ci_high"),
                            (twin.point, *twin.interval(confidence))))
    evidence["note"] = _median_note(evidence)
    prepared = _Cell(bar, evidence, effect, remake=remake, series=(b, c, strata),
                     blocked=_port_blocked(evidence, port_min_rounds),
                     loading=_loading(effect, shared))
    if math.isinf(bar):
        prepared.blocked = ""
        prepared.settled = Decision(CLOSE, "min_speedup is infinite: even a candidate that took "
                                    "no time would save less than the smallest effect of "
                                    "interest", **evidence)
    elif t is not None and (evidence["twin_ci_low"] > bar or evidence["twin_ci_high"] < 1 / bar):
        twin_words = _ci_words(evidence["twin_speedup"], evidence["twin_ci_low"],
                               evidence["twin_ci_high"], confidence)
        prepared.blocked = "the A/A twin differs"
        prepared.settled = Decision(
            INCONCLUSIVE, f"the harness sees a difference between identical arms: the A/A "
            f"twin's speedup {twin_words} lies outside [{1 / bar:.3f}, {bar:.3f}]", **evidence)
    return prepared


def _loading(effect: RatioOfMeans, shared: float) -> float:
    """The cell's loading on the family's shared mix error: that error (signed,
    :func:`stagelab.analyse.regimes.mix_loading`) over the whole relative standard error of the
    cell's effect (its replicates' spread, the shared error already added in)."""
    spread = float(np.std(effect.replicates)) / effect.point
    return min(max(shared / spread, -1.0), 1.0) if spread > 0 and shared else 0.0


def _excess(cell: _Cell) -> float:
    """How much worse than its typical round the candidate's worst round is, against the
    baseline: the largest per-round ratio ``candidate / baseline`` over their median (1 for a
    cell not measured)."""
    if cell.series is None:
        return 1.0
    ratio = cell.series[1] / cell.series[0]
    return float(ratio.max() / np.median(ratio))


def _one_more_worst(cell: _Cell, excess: float) -> RatioOfMeans:
    """The speedup with one more round like the family's worst: at the cell's worst round, the
    candidate ``excess`` times its median ratio to the baseline, ``excess`` the largest of any
    cell of the family (:func:`_excess`; the cell's own worst round where that is worse). A
    pseudo-count for the rarest rounds: a saving must not rest on a sample that happened to hold
    a rare stall fewer times than the candidate has it. One 3x stall in 200 calls is absent from
    a cell of 160 rounds 45 % of the time, but from six such cells 0.8 %: a stall seen in one
    cell of the family is charged to every cell, since it is the same candidate. With plain
    noise one more worst round moves the mean by a tenth of a percent."""
    assert cell.series is not None and cell.remake is not None  # a measured cell
    baseline, candidate, strata = cell.series
    ratio = candidate / baseline
    worst = int(np.argmax(ratio))
    stalled = max(float(candidate[worst]), float(baseline[worst] * np.median(ratio) * excess))
    more = None if strata is None else np.append(strata, strata[worst])
    return cell.remake(np.append(baseline, baseline[worst]), np.append(candidate, stalled), more)


def _tail_evidence(tail: TailRatio, bar: float, confidence: float) -> dict[str, Any]:
    """The p99 tail speedup, its CI, its bounds at the family's one-sided level ``(1 -
    confidence) / 2`` and the test's answer: ``heavier`` when the upper bound lies below ``1 -
    delta`` (``1 / bar``: shown heavier beyond delta), ``not heavier`` when the lower bound lies
    above it, ``unresolved`` otherwise."""
    alpha = (1 - confidence) / 2
    lower, upper = tail.bound(alpha), tail.bound(1 - alpha)
    floor = 1 / bar
    verdict = (TAIL_HEAVIER if upper < floor else TAIL_NOT_HEAVIER if lower > floor
               else TAIL_UNRESOLVED)
    ci_low, ci_high = tail.interval(confidence)
    return dict(tail_speedup=tail.point, tail_ci_low=ci_low, tail_ci_high=ci_high,
                tail_bound=lower, tail_upper_bound=upper, tail=verdict)


def _port_blocked(evidence: dict[str, Any], port_min_rounds: int) -> str:
    """Why a measured cell cannot support a PORT, in words ('' when it can): too few rounds to
    have seen a rare stall, a mean that could be slower beyond delta, or a tail shown heavier
    beyond delta (a tail merely unresolved does not block)."""
    floor = 1 / evidence["min_speedup"]
    if evidence["n_rounds"] < port_min_rounds:
        return (f"{evidence['n_rounds']} rounds, fewer than the {port_min_rounds} a PORT needs "
                "(to have seen a 1-in-50 stall with 95 % probability)")
    if not evidence["noninferior_bound"] > floor:
        bound = evidence["noninferior_bound"]
        return f"it could be slower beyond delta: its lower bound {bound:.3f} lies below {floor:.3f}"
    if evidence["tail"] == TAIL_HEAVIER:
        return (f"the candidate's tail is heavier beyond delta: the p99 speedup "
                f"{evidence['tail_speedup']:.3f}x has its upper bound "
                f"{evidence['tail_upper_bound']:.3f} below {floor:.3f}")
    return ""


def _median_note(evidence: dict[str, Any]) -> str:
    """Words when the median of per-round ratios falls on the other side of the bar."""
    bar, mean, median = evidence["min_speedup"], evidence["speedup"], evidence["median_speedup"]
    if math.isinf(bar) or (mean > bar) == (median > bar):
        return ""
    return (f"the median of per-round ratios ({median:.3f}x) lies on the other side of the "
            f"minimum {bar:.3f}x than the mean ({mean:.3f}x): a few rounds carry the "
            "difference; the decision follows the mean, which the engine pays")


def _port_bound(cell: _Cell, level: float, charge: stalls.StallCharge) -> float:
    """The cell's PORT bound: its lower bound at one-sided error ``level``, charged for the
    family's unseen stall."""
    assert cell.effect is not None  # a cell still to decide
    return charge.charged(cell.effect.bound(level))


def _clears_port(cell: _Cell, level: float, charge: stalls.StallCharge) -> bool:
    """Whether the cell's PORT bound at one-sided error ``level`` (:func:`_port_bound`) lies
    above its bar and above its twin's CI, and its lower bound still above its bar with one
    more round like the family's worst."""
    assert cell.effect is not None and cell.one_more is not None  # a cell still to decide
    bound = _port_bound(cell, level, charge)
    twin_high = cell.evidence.get("twin_ci_high")
    return (bound > cell.bar and (twin_high is None or bound > twin_high)
            and cell.one_more.bound(level) > cell.bar)


def _holm(cells: list[_Cell], alpha: float,
          charge: stalls.StallCharge) -> tuple[set[int], dict[int, float]]:
    """Holm's step-down at family-wise one-sided level ``alpha``: test the open cells at the
    family level of the cells not yet declared (alpha / their count, or the max-T level where
    they share the mix's error: :func:`stagelab.analyse.regimes.family_level`), declare those
    that clear, repeat until none clears. The cells declared PORT, and the level each open cell
    was last tested at. A cell blocked from PORT (too few rounds, a heavier tail) is tested but
    never declared."""
    open_cells = {i for i, c in enumerate(cells) if c.settled is None}
    declared: set[int] = set()
    levels: dict[int, float] = {}
    while open_cells:
        level = regimes.family_level(
            [c.loading for i, c in enumerate(cells) if i not in declared], alpha)
        levels.update(dict.fromkeys(open_cells, level))
        cleared = {i for i in open_cells
                   if not cells[i].blocked and _clears_port(cells[i], level, charge)}
        if not cleared:
            break
        declared |= cleared
        open_cells -= cleared
    return declared, levels


def _cell_decision(cell: _Cell, ported: bool, family_size: int, confidence: float,
                   charge: stalls.StallCharge) -> Decision:
    """The decision of one open cell once Holm has run."""
    ev = cell.evidence
    bar, low, high = cell.bar, ev["ci_low"], ev["ci_high"]
    effect = _ci_words(ev["speedup"], low, high, confidence)
    twin_high = ev.get("twin_ci_high")
    twin_words = "" if twin_high is None else f" and above the A/A twin's CI (up to {twin_high:.3f})"
    level_words = (f"its lower bound at the family's level, {charge.words()} "
                   f"({ev['port_bound']:.3f}, one-sided {ev['port_level']:.2%}, Holm over "
                   f"{family_size} cell(s))")
    if ported:
        budget = stalls.stall_budget(ev["port_bound"], bar, ev["stalls_unexcluded"])
        return Decision(PORT, f"speedup {effect}: {level_words} lies above the minimum "
                        f"{bar:.3f}x{twin_words}; a candidate stall rarer than 1 in "
                        f"{ev['stalls_unexcluded']} cannot be excluded, and one {budget:.2f}x "
                        "slower at that rate, beyond the charged one, would erase the margin",
                        stall_budget=budget, **ev)
    if ev["close_bound"] < bar:
        return Decision(CLOSE, f"speedup {effect}: its upper bound at one-sided "
                        f"{1 - confidence:.0%} ({ev['close_bound']:.3f}) lies below the minimum "
                        f"{bar:.3f}x: any benefit is smaller than worth a change", **ev)
    if ev["port_bound"] > bar and cell.blocked:
        return Decision(INCONCLUSIVE, f"speedup {effect} lies above the minimum {bar:.3f}x, but "
                        f"a PORT is blocked: {cell.blocked}", **ev)
    if ev["port_bound"] > bar and ev["one_more_bound"] <= bar:
        return Decision(INCONCLUSIVE, f"speedup {effect}: {level_words} lies above the minimum "
                        f"{bar:.3f}x, but not with one more round like the candidate's worst "
                        f"({ev['one_more_bound']:.3f}): the saving may rest on a sample that "
                        "missed a rare slow round; more rounds are needed", **ev)
    if ev["port_bound"] > bar and twin_high is not None:
        return Decision(INCONCLUSIVE, f"speedup {effect} lies above the minimum {bar:.3f}x but "
                        f"not above the A/A twin's CI (up to {twin_high:.3f})", **ev)
    if low > bar:
        return Decision(INCONCLUSIVE, f"speedup {effect} lies above the minimum {bar:.3f}x, but "
                        f"not {level_words}: more rounds are needed", **ev)
    return Decision(INCONCLUSIVE, f"speedup {effect} straddles the minimum {bar:.3f}x: more "
                    f"rounds or less noise are needed to tell", **ev)


def _check_cells(cells: Sequence[Mapping[str, Any]]) -> None:
    if not isinstance(cells, (list, tuple)) or not cells:
        raise ValueError("cells must be a non-empty list of dicts with baseline, candidate, twin "
                         "and min_speedup")


def decide_family(cells: Sequence[Mapping[str, Any]], *, min_samples: int = 10,
                  confidence: float = 0.95, seed: int = 0,
                  port_min_rounds: int = design.TAIL_ROUNDS,
                  stall_allowance: float = design.STALL_ALLOWANCE) -> FamilyDecision:
    """One PORT, CLOSE or INCONCLUSIVE for a family of cells, and each cell's decision.

    ``cells``: dicts with ``baseline``, ``candidate``, ``twin`` (per-round timings, paired by
    index; ``twin`` may be None) and ``min_speedup`` (the cell's bar).

    * A cell PORTs when its lower bound at Holm's one-sided level (``(1 - confidence) / 2``
      divided by the cells not yet declared, or the max-T level of those cells where they share
      a regime mix's error), charged for one unseen candidate stall ``stall_allowance`` times an
      ordinary call among the family's rounds (:func:`stagelab.core.design.unseen_stall_charge`;
      1 charges nothing), lies above its bar and above its twin's CI, it has
      at least ``port_min_rounds`` rounds, and its p99 tail is not shown heavier beyond delta.
    * A cell CLOSEs when its upper bound at one-sided ``1 - confidence`` lies below its bar (the
      two one-sided tests of equivalence testing, at the usual 5 %: each cell's CLOSE is a test
      of its own, and the family CLOSEs only when all do, which needs no correction).
    * A cell is INCONCLUSIVE otherwise, and whenever its input is bad (missing, non-numeric,
      wrongly shaped, non-finite, zero or negative timings; a bad bar), it has fewer rounds than
      ``min_samples``, or its A/A twin differs beyond the bar.

    The family is PORT when a cell PORTs and every cell could support it (its mean non-inferior:
    the one-sided ``1 - confidence`` lower bound above ``1/min_speedup``; its p99 tail not shown
    heavier: the tail speedup's upper bound at one-sided ``(1 - confidence) / 2`` not below
    ``1/min_speedup``; ``port_min_rounds`` rounds), CLOSE when every cell CLOSEs, INCONCLUSIVE
    otherwise. Each cell's ``tail`` says what its tail test found (an unresolved tail does not
    block, and the family PORT names it).
    """
    _check_cells(cells)
    _check_common(min_samples, confidence, stall_allowance)
    mix = regimes.family_mix(cells)
    prepared = [_prepare(c, min_samples=min_samples, confidence=confidence, seed=seed,
                         port_min_rounds=port_min_rounds, mix=mix) for c in cells]
    excess = max(_excess(cell) for cell in prepared)
    for cell in prepared:
        if cell.settled is None:
            cell.one_more = _one_more_worst(cell, excess)
    charge = stalls.StallCharge(float(stall_allowance),
                          sum(len(c.series[0]) for c in prepared if c.series is not None))
    alpha = (1 - confidence) / 2
    ported, levels = _holm(prepared, alpha, charge)
    decisions = []
    for index, cell in enumerate(prepared):
        if cell.settled is not None:
            cell.settled.port_blocked = cell.blocked
            decisions.append(cell.settled)
            continue
        assert cell.effect is not None  # a cell still to decide has its effect
        cell.evidence["port_level"] = levels[index]
        cell.evidence["port_bound"] = _port_bound(cell, levels[index], charge)
        cell.evidence["stall_charge"] = charge.share
        cell.evidence["close_bound"] = cell.effect.bound(confidence)
        assert cell.one_more is not None
        cell.evidence["one_more_bound"] = cell.one_more.bound(levels[index])
        decision = _cell_decision(cell, index in ported, len(prepared), confidence, charge)
        decision.port_blocked = cell.blocked
        decisions.append(decision)
    return _family(decisions, confidence, charge)


def _stall_words(cells: Sequence[Decision]) -> str:
    """:func:`stagelab.analyse.stalls.stall_words` over the family's measured cells."""
    return stalls.stall_words([d.n_rounds for d in cells if d.stalls_unexcluded])


def _family_budget(cells: Sequence[Decision]) -> tuple[float, str]:
    """A family PORT's stall budget (:func:`stagelab.analyse.stalls.stall_budget` of the
    carrying cell with the smallest margin, at the rarest rate the family's rounds together
    cannot exclude: the same candidate stalls in every cell) and its words."""
    rounds = sum(d.n_rounds for d in cells if d.stalls_unexcluded)
    unexcluded = design.rarest_unexcluded(rounds)
    carrying = [d for d in cells if d.decision == PORT]
    margin = min(carrying, key=lambda d: (d.port_bound or 0) / (d.min_speedup or 1))
    assert margin.port_bound is not None and margin.min_speedup is not None  # a PORT cell's
    budget = stalls.stall_budget(margin.port_bound, margin.min_speedup, unexcluded)
    return budget, (f"; a stall {budget:.2f}x slower at 1 in {unexcluded:,}, beyond the "
                    "charged one, would erase the smallest margin of a carrying cell")


def _family(decisions: list[Decision], confidence: float,
            charge: stalls.StallCharge) -> FamilyDecision:
    """The family's one decision from its cells' decisions."""
    answers = [d.decision for d in decisions]
    ported = [i for i, d in enumerate(answers) if d == PORT]
    blocked = [i for i, d in enumerate(decisions) if d.port_blocked]
    each = "; ".join(f"cell {i}: {d.decision}" for i, d in enumerate(decisions))
    if ported and not blocked:
        roles = port_roles([(d.decision, d.tail) for d in decisions])
        budget, budget_words = _family_budget(decisions)
        return FamilyDecision(PORT, f"{roles}; every PORT bound {charge.words()}; "
                              f"{_stall_words(decisions)}{budget_words} ({each})", decisions,
                              confidence=confidence, stall_budget=budget,
                              stall_allowance=charge.allowance)
    if all(a == CLOSE for a in answers):
        return FamilyDecision(CLOSE, f"all {len(decisions)} cells close: every CI lies below "
                              "its bar", decisions, confidence=confidence,
                              stall_allowance=charge.allowance)
    counts = {a: answers.count(a) for a in sorted(set(answers))}
    extra = ("; a PORT is blocked by " + "; ".join(
        f"cell {i} ({decisions[i].port_blocked})" for i in blocked)) if ported and blocked else ""
    return FamilyDecision(INCONCLUSIVE, f"the cells disagree or are unresolved ({counts})"
                          f"{extra}", decisions, confidence=confidence,
                          stall_allowance=charge.allowance)


def port_roles(answers: Sequence[tuple[str, str]], names: Sequence[str] | None = None) -> str:
    """What a family PORT rests on, in words, from each cell's ``(decision, tail)``: the cells
    that carry the saving (declared by Holm), the others, all non-inferior in the mean, split
    into those shown harmless (p99 tail shown not heavier beyond delta) and those whose tail is
    unresolved (not shown heavier either, so it does not block); ``names`` label the cells
    (default: ``cell i``)."""
    label = list(names) if names is not None else [f"cell {i}" for i in range(len(answers))]
    carry = [label[i] for i, (answer, _) in enumerate(answers) if answer == PORT]
    harmless = [label[i] for i, (answer, tail) in enumerate(answers)
                if answer != PORT and tail == TAIL_NOT_HEAVIER]
    open_tail = [label[i] for i, (_, tail) in enumerate(answers) if tail == TAIL_UNRESOLVED]
    words = (f"{len(carry)} of {len(answers)} cell(s) carry the saving, clearing the bar at "
             f"the family's Holm level ({', '.join(carry)}); every cell's mean is non-inferior "
             "and no cell's p99 tail is shown heavier beyond delta")
    if harmless:
        words += f"; shown harmless (p99 tail shown not heavier): {', '.join(harmless)}"
    if open_tail:
        words += (f"; p99 tail unresolved (neither shown heavier nor shown within delta at these "
                  f"rounds): {', '.join(open_tail)}")
    return words


def decide(baseline: Samples | None, candidate: Samples | None, *,
           min_speedup: float, twin: Samples | None = None, min_samples: int = 10,
           confidence: float = 0.95, seed: int = 0,
           port_min_rounds: int = design.TAIL_ROUNDS,
           stall_allowance: float = design.STALL_ALLOWANCE) -> Decision:
    """PORT, CLOSE or INCONCLUSIVE for replacing ``baseline`` with ``candidate``: the rule of
    :func:`decide_family` for a family of one cell (the same estimand, the ratio of means).

    Inputs are per-round timings (index i = round i); ``twin`` is the baseline measured again as if
    it were another arm (A/A). ``min_speedup = inf`` (even a free candidate saves too little) is
    CLOSE whatever was measured, given enough good rounds. Bad input (None, non-numeric, wrongly
    shaped) is INCONCLUSIVE with the reason, never an exception."""
    cell = {"baseline": baseline, "candidate": candidate, "twin": twin,
            "min_speedup": min_speedup}
    return decide_family([cell], min_samples=min_samples, confidence=confidence, seed=seed,
                         port_min_rounds=port_min_rounds,
                         stall_allowance=stall_allowance).cells[0]
