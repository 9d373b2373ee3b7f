"""The decision rule's error rates, measured on simulated timings with a known true speedup.

The simulation is independent of the rule's own assumptions: it draws each sample of a round
(baseline, candidate, A/A twin, in the balanced order the bench uses) from one of eleven noise
models, some of which break what a bootstrap over rounds takes for granted (independent,
identically distributed rounds):

* lognormal per-sample noise of 2, 5 and 15 %;
* an AR(1) drift over the sequence of samples (5 % stationary spread, correlation 0.98 from one
  sample to the next), plus 2 % noise;
* heavy tails (Student's t with 3 degrees of freedom, 2 % scale) and 1 % of samples 5x slower;
* bimodal timings: 30 % of samples in a mode 1.3x slower, plus 2 % noise;
* a linear trend: every sample 10 % slower by the end of the run, plus 2 % noise;
* an order effect: the first sample of each round 3 % slower, plus 2 % noise;
* a biased twin: the A/A twin 1 % slower than the baseline it copies, plus 2 % noise;
* stalls in one arm: the candidate (or the baseline) 4x slower in 2 % of its rounds, plus 2 %
  noise, its other rounds faster (or the baseline's) so that the mean still carries the truth: a
  sample of few rounds usually holds no stall and shows the arm faster than it is.

Each model is simulated at three truths (no effect, 1.00; exactly at the bar ``1/(1 - delta)``;
a saving of 3 delta, ``1/(1 - 3 delta)``), at a fixed number of rounds and with rounds until
resolved (:mod:`stagelab.core.design`, the bench's own stop rule, up to a cap), per cell
(:func:`stagelab.analyse.stats.decide`) and for a family of cells (:func:`stagelab.analyse.stats.decide_family`).
The requirements: PORT in at most 5 % of runs at 1.00 and at the bar; where the CI reaches its
target half-width (delta/2), CLOSE in at least 80 % at 1.00 and, with the rounds a PORT needs,
PORT in at least 90 % at 3 delta. Each rate is judged on its Wilson interval (95 %): "met" only
when the whole interval lies on the right side of the requirement, so a row near 5 % needs about
1000 trials to be met. A row that misses its requirement is shown, not hidden: that is where the
rule falls short. Rounds until resolved start at the rounds a PORT needs, as the bench's stop rule
does (:data:`stagelab.core.design.TAIL_ROUNDS`). What was measured: docs/decision-rule.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from stagelab.analyse import carryover, sequence, stats
from stagelab.core import design

FamilyRule = Callable[..., stats.FamilyDecision]
REQUIREMENTS = ("PORT in at most 5 % of runs at a true 1.00 and at the bar, per cell and for the "
                "family; where the CI reaches delta/2, family CLOSE in at least 80 % at 1.00 "
                f"and, with at least {design.TAIL_ROUNDS} rounds, PORT in at least 90 % at 3 delta;"
                " each judged on its 95 % Wilson interval (met only when the whole interval lies "
                "on the right side)")
ARMS = ("baseline", "candidate", "twin")
AR1_CORRELATION = 0.98


@dataclass(frozen=True)
class Noise:
    """One noise model: every sample is multiplied by each factor that applies."""

    name: str
    sigma: float = 0.02  # per-sample lognormal (or t) scale
    t_df: float = 0.0  # Student's t degrees of freedom for the per-sample noise; 0: normal
    ar1: float = 0.0  # stationary spread of an AR(1) drift over the sample sequence
    outlier_rate: float = 0.0
    outlier_scale: float = 5.0
    slow_share: float = 0.0  # bimodal: share of samples in the slow mode
    slow_factor: float = 1.3
    trend: float = 0.0  # how much slower the last sample is than the first
    first_penalty: float = 0.0  # order effect: the round's first sample is this much slower
    twin_bias: float = 0.0  # the twin is this much slower than the baseline
    stall_rate: float = 0.0  # share of one arm's samples that stall
    stall_factor: float = 4.0
    stall_arm: str = "candidate"  # or "baseline"
    arm_ar1: float = 0.0  # each arm's per-sample noise an AR(1) across rounds, this correlation
    carry_over: float = 0.0  # the call after a carrying arm is this much slower
    carry_after: str = "candidate"  # the carrying arm: the candidate, or "baseline" (and twin)
    regime_share: float = 0.0  # the fresh-vector arms' (baseline, twin) calls in a slow regime
    regime_factor: float = 1.5  # ... this much slower
    regime_rounds: bool = False  # the regime hits whole rounds (else each call alone)


NOISES = (
    Noise("lognormal 2 %", 0.02),
    Noise("lognormal 5 %", 0.05),
    Noise("lognormal 15 %", 0.15),
    Noise("AR(1) drift 5 % + 2 %", ar1=0.05),
    Noise("t(3) tails + 1 % at 5x", t_df=3.0, outlier_rate=0.01),
    Noise("bimodal 30 % at 1.3x", slow_share=0.3),
    Noise("linear trend +10 %", trend=0.10),
    Noise("first in round +3 %", first_penalty=0.03),
    Noise("biased twin +1 %", twin_bias=0.01),
    Noise("candidate stalls 2 % at 4x", stall_rate=0.02),
    Noise("baseline stalls 2 % at 4x", stall_rate=0.02, stall_arm="baseline"),
)
TRUTHS = {"1.00": 0.0, "at the bar": 1.0, "3 delta": 3.0}  # saving in deltas


def true_speedup(truth: str, delta: float) -> float:
    """The step speedup a truth names: a saving of 0, delta or 3 delta of the step."""
    saving = TRUTHS[truth] * delta
    return 1.0 / (1.0 - saving)


def positions(trials: int, rounds: int, seed: int) -> np.ndarray:
    """Each arm's position in each round, ``[trials, 3, rounds]``: the bench's balanced order,
    seeded per trial."""
    out = np.empty((trials, len(ARMS), rounds), dtype=np.int64)
    seeds = np.random.SeedSequence(seed).generate_state(trials)
    for trial, trial_seed in enumerate(seeds):
        for r, order in enumerate(design.balanced_orders(ARMS, rounds, int(trial_seed))):
            for place, arm in enumerate(order):
                out[trial, ARMS.index(arm), r] = place
    return out


def _ar1(rng: np.random.Generator, trials: int, length: int, spread: float) -> np.ndarray:
    """An AR(1) series per trial with stationary standard deviation ``spread``."""
    shocks = rng.normal(0.0, spread * math.sqrt(1 - AR1_CORRELATION ** 2), (trials, length))
    series = np.empty((trials, length))
    series[:, 0] = rng.normal(0.0, spread, trials)
    for step in range(1, length):
        series[:, step] = AR1_CORRELATION * series[:, step - 1] + shocks[:, step]
    return series


@dataclass(frozen=True)
class Draw:
    """Simulated cells: timings ``[trials, 3, rounds]`` of baseline, candidate and twin, each
    arm's position in each round, and whether each call ran in the slow regime."""

    times: np.ndarray
    place: np.ndarray
    slow: np.ndarray


def simulate(noise: Noise, speedup: float, rounds: int, trials: int, seed: int,
             base_seconds: float = 0.01) -> np.ndarray:
    """Timings ``[trials, 3, rounds]`` of baseline, candidate and twin (in that order), the
    candidate ``speedup`` times faster in expectation, under ``noise``."""
    return draw(noise, speedup, rounds, trials, seed, base_seconds).times


def _per_sample(noise: Noise, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standardised per-sample draws: normal or Student's t, and with ``arm_ar1`` an AR(1)
    across each arm's rounds (stationary variance 1)."""
    if noise.t_df:
        draws = rng.standard_t(noise.t_df, shape) / math.sqrt(noise.t_df / (noise.t_df - 2))
    else:
        draws = rng.normal(0.0, 1.0, shape)
    if noise.arm_ar1:
        phi, scale = noise.arm_ar1, math.sqrt(1 - noise.arm_ar1 ** 2)
        for step in range(1, shape[-1]):
            draws[..., step] = phi * draws[..., step - 1] + scale * draws[..., step]
    return draws


def _slow_regime(noise: Noise, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Which calls of the fresh-vector arms (baseline, twin) ran in the slow regime."""
    slow = np.zeros(shape, dtype=bool)
    if noise.regime_share:
        if noise.regime_rounds:
            hit = rng.random((shape[0], 1, shape[2])) < noise.regime_share
            slow[:, [0, 2]] = hit
        else:
            slow[:, [0, 2]] = rng.random((shape[0], 2, shape[2])) < noise.regime_share
    return slow


def _carried(noise: Noise, place: np.ndarray) -> np.ndarray:
    """Per call, whether the arm timed just before it in its round is a carrying arm."""
    carrying = [1] if noise.carry_after == "candidate" else [0, 2]
    at = np.argsort(place, axis=1)  # [trials, position, rounds]: the arm at each position
    before = np.take_along_axis(at, np.maximum(place - 1, 0), axis=1)
    return (place > 0) & np.isin(before, carrying)


def draw(noise: Noise, speedup: float, rounds: int, trials: int, seed: int,
         base_seconds: float = 0.01) -> Draw:
    """:func:`simulate`'s timings with the positions and regimes behind them."""
    if not (speedup > 0 and rounds >= 1 and trials >= 1):
        raise ValueError(f"speedup, rounds and trials must be positive, got {speedup}, "
                         f"{rounds}, {trials}")
    rng = np.random.default_rng(seed)
    place = positions(trials, rounds, seed)
    sample = np.arange(rounds)[None, None, :] * len(ARMS) + place  # order in the run
    shape = place.shape
    factor = np.exp(noise.sigma * _per_sample(noise, rng, shape))
    if noise.ar1:
        drift = _ar1(rng, trials, rounds * len(ARMS), noise.ar1)
        factor *= np.exp(np.take_along_axis(drift, sample.reshape(trials, -1), axis=1)
                         .reshape(shape))
    factor *= np.where(rng.random(shape) < noise.outlier_rate, noise.outlier_scale, 1.0)
    factor *= np.where(rng.random(shape) < noise.slow_share, noise.slow_factor, 1.0)
    factor *= 1.0 + noise.trend * sample / max(rounds * len(ARMS) - 1, 1)
    factor *= np.where(place == 0, 1.0 + noise.first_penalty, 1.0)
    factor *= np.where(_carried(noise, place), 1.0 + noise.carry_over, 1.0)
    slow = _slow_regime(noise, rng, shape)
    factor *= np.where(slow, noise.regime_factor, 1.0)
    fresh = 1 + noise.regime_share * (noise.regime_factor - 1)  # the fresh vector's mean
    level = np.array([1.0, fresh / speedup, 1.0 + noise.twin_bias])
    if noise.stall_rate:
        arm = ARMS.index(noise.stall_arm)
        stalls = rng.random((trials, rounds)) < noise.stall_rate
        factor[:, arm] *= np.where(stalls, noise.stall_factor, 1.0)
        level[arm] /= 1 + noise.stall_rate * (noise.stall_factor - 1)  # the mean keeps the truth
    return Draw(base_seconds * level[None, :, None] * factor, place, slow)


def rule_cell(drawn: Draw, trial: int, rounds: int, bar: float) -> dict[str, Any]:
    """One simulated cell as the rule takes it, cut at ``rounds``: the three arms' timings, the
    fresh vectors' regime per round, and the carry-over correction the order's rows call for
    (:func:`stagelab.analyse.carryover.correction`)."""
    times, place = drawn.times[trial, :, :rounds], drawn.place[trial, :, :rounds]
    calls = carryover.calls_from_arrays(times, place)
    return {"baseline": times[0], "candidate": times[1], "twin": times[2], "min_speedup": bar,
            "regime": drawn.slow[trial, 0, :rounds], "twin_regime": drawn.slow[trial, 2, :rounds],
            "carry_over": carryover.correction(calls, len(ARMS), 0, 1)}


def half_widths(baseline: np.ndarray, candidate: np.ndarray, confidence: float) -> np.ndarray:
    """:func:`stagelab.core.design.speedup_half_width` for each row of ``[trials, rounds]`` arrays."""
    n = baseline.shape[1]
    mean_c = candidate.mean(axis=1)
    ratio = baseline.mean(axis=1) / mean_c
    residuals = baseline - ratio[:, None] * candidate
    rho = lag1(residuals)
    z = np.array([design.expanded_z(0.5 + confidence / 2, design.effective_df(n, float(r)))
                  for r in rho])
    spread = np.sqrt((1 + rho) / (1 - rho))
    return z * residuals.std(axis=1, ddof=1) / math.sqrt(n) / mean_c * spread


def lag1(residuals: np.ndarray) -> np.ndarray:
    """:func:`stagelab.core.design.lag1` for each row of ``[trials, rounds]``."""
    n = residuals.shape[1]
    if n < 10:
        return np.zeros(residuals.shape[0])
    deviations = residuals - residuals.mean(axis=1, keepdims=True)
    variance = (deviations ** 2).sum(axis=1)
    lagged = (deviations[:, 1:] * deviations[:, :-1]).sum(axis=1)
    rho = np.divide(lagged, variance, out=np.zeros_like(variance), where=variance > 0)
    return np.where(variance > 0, np.clip(rho + (1 + 4 * rho) / n, 0.0, design.DEPENDENCE_CAP), 0)


def stop_rounds(baseline: np.ndarray, candidate: np.ndarray, *, rounds: int, max_rounds: int,
                bar: float, every: int = 5, confidence: float = 0.95) -> np.ndarray:
    """The rounds the bench's stop rule runs per trial (:func:`stagelab.core.design.resolved`):
    the first check (at ``rounds``, then every ``every`` rounds, and at the cap) where the CI
    lies wholly on one side of ``bar``, else the cap."""
    checks = sorted({*range(rounds, max_rounds + 1, every), max_rounds})
    stops = np.full(baseline.shape[0], max_rounds)
    open_trials = np.ones(baseline.shape[0], dtype=bool)
    for n in checks:
        b, c = baseline[:, :n], candidate[:, :n]
        ratio, width = b.mean(axis=1) / c.mean(axis=1), half_widths(b, c, confidence)
        done = open_trials & ((ratio - width > bar) | (ratio + width < bar))
        stops[done] = n
        open_trials &= ~done
    return stops


@dataclass(frozen=True)
class Setting:
    """What one calibration row simulates."""

    noise: Noise
    truth: str
    rounds: int
    max_rounds: int  # == rounds: fixed rounds; more: rounds until resolved up to this cap


def _cells(times: np.ndarray, stops: np.ndarray, bar: float) -> list[dict]:
    """Cell dicts for the rule, each cut at its stop."""
    return [{"baseline": t[0, :n], "candidate": t[1, :n], "twin": t[2, :n], "min_speedup": bar}
            for t, n in zip(times, stops)]


def _row(setting: Setting, *, trials: int, cells: int, delta: float, seed: int,
         rule: FamilyRule, min_samples: int, confidence: float) -> dict:
    """Simulate one setting: ``trials`` families of ``cells`` cells; the first cell of each
    family is also decided alone."""
    speedup = true_speedup(setting.truth, delta)
    bar = 1.0 / (1.0 - delta)
    times = simulate(setting.noise, speedup, setting.max_rounds, trials * cells, seed)
    if setting.max_rounds > setting.rounds:
        stops = stop_rounds(times[:, 0], times[:, 1], rounds=setting.rounds,
                            max_rounds=setting.max_rounds, bar=bar, confidence=confidence)
    else:
        stops = np.full(trials * cells, setting.rounds)
    family_answers, cell_answers, widths = [], [], []
    kwargs = dict(min_samples=min_samples, confidence=confidence, seed=0)
    for trial in range(trials):
        part = slice(trial * cells, (trial + 1) * cells)
        members = _cells(times[part], stops[part], bar)
        family_answers.append(rule(members, **kwargs).decision)
        alone = rule(members[:1], **kwargs).cells[0]
        cell_answers.append(alone.decision)
        if alone.ci_low is not None and alone.ci_high is not None:
            widths.append((alone.ci_high - alone.ci_low) / 2)
    family, cell = np.array(family_answers), np.array(cell_answers)
    half_width = float(np.median(widths)) if widths else math.nan
    rates = {"cell_port": cell == stats.PORT, "cell_close": cell == stats.CLOSE,
             "family_port": family == stats.PORT, "family_close": family == stats.CLOSE,
             "family_inconclusive": family == stats.INCONCLUSIVE}
    row = {"noise": setting.noise.name, "truth": setting.truth, "true_speedup": speedup,
           "rounds": (f"{setting.rounds}" if setting.max_rounds == setting.rounds
                      else f"until resolved, {setting.rounds}-{setting.max_rounds}"),
           "median_rounds": float(np.median(stops)),
           "at_cap": float(np.mean(stops >= setting.max_rounds)) if setting.max_rounds >
           setting.rounds else math.nan,
           "median_ci_half_width": half_width, "trials": trials, "cells": cells,
           "min_rounds": int(np.min(stops))}
    for name, hits in rates.items():
        row[name] = float(np.mean(hits))
        if name != "family_inconclusive":
            row[f"{name}_low"], row[f"{name}_high"] = wilson(int(hits.sum()), trials)
    row["requirement"], row["met"] = _requirement(row, delta)
    return row


# What notebook 04 says where a run asks for no trials (``calibration_trials = 0``, the quick
# profile): the rule and its calibration do not depend on the run's timings, only on its rounds.
NOT_SIMULATED = (
    "Not simulated in this run (`calibration_trials = 0`): fewer than 73 trials could not show a "
    "false-PORT rate under 5 % anyway. The rule's calibration, at up to 1000 trials per row, is "
    "in `docs/decision-rule.md`; the gate and full profiles simulate it at their own rounds, "
    "and `calibration_trials` sets it here.")


# The fewest trials whose Wilson interval, with no hit at all, lies under 5 %: fewer cannot
# show a false-PORT rate within its requirement, whatever the rule does.
MIN_TRIALS_FOR_5_PERCENT = 73


def wilson(hits: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a rate of ``hits`` in ``trials`` (scipy)."""
    ci = sps.binomtest(hits, trials).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def _requirement(row: dict, delta: float) -> tuple[str, bool | None]:
    """The row's requirement in words and whether it is met on the Wilson intervals (None:
    nothing is required): at most a rate is met when the interval's high end is within it, at
    least one when its low end is."""
    precise = row["median_ci_half_width"] <= delta / 2
    rare_port = row["family_port_high"] <= 0.05 and row["cell_port_high"] <= 0.05
    if row["truth"] in ("1.00", "at the bar") and wilson(0, row["trials"])[1] > 0.05:
        return (f"none judged: {row['trials']} trials cannot show a rate under 5 % "
                f"({MIN_TRIALS_FOR_5_PERCENT} or more can)"), None
    if row["truth"] == "1.00" and precise:
        return "PORT <= 5 %, family CLOSE >= 80 %", bool(rare_port and
                                                          row["family_close_low"] >= 0.80)
    if row["truth"] in ("1.00", "at the bar"):
        return "PORT <= 5 %", bool(rare_port)
    if row["min_rounds"] < design.TAIL_ROUNDS:
        return f"none: fewer than the {design.TAIL_ROUNDS} rounds a PORT needs", None
    if precise:
        return "PORT >= 90 %", bool(row["family_port_low"] >= 0.90
                                    and row["cell_port_low"] >= 0.90)
    return "none: the CI is wider than delta/2 here", None


def _resolved_at(pairs: Sequence[tuple[np.ndarray, np.ndarray]], *, rounds: int,
                 max_rounds: int, bar: float) -> np.ndarray:
    """Per trial, the rounds the bench's stop rule runs a cell whose comparisons are ``pairs``
    (``[trials, max_rounds]`` baseline and candidate arrays): the first check at which every
    one is resolved, else the cap; ``rounds`` everywhere with fixed rounds."""
    if max_rounds <= rounds:
        return np.full(pairs[0][0].shape[0], rounds)
    start = min(max(rounds, design.TAIL_ROUNDS), max_rounds)
    return np.max([stop_rounds(b, c, rounds=start, max_rounds=max_rounds, bar=bar)
                   for b, c in pairs], axis=0)


def family_port_rate(noise: Noise, speedups: Sequence[float], *, rounds: int, trials: int,
                     delta: float = 0.02, seed: int = 0,
                     rule: FamilyRule = stats.decide_family,
                     max_rounds: int | None = None) -> dict:
    """How often ``rule`` PORTs (and CLOSEs) a family whose cells have different true
    ``speedups`` (e.g. one cell slower beside others saving 3 delta), over ``trials`` simulated
    runs of ``rounds`` rounds (with ``max_rounds``: rounds until resolved, each cell cut where
    the bench's stop rule would stop it, its candidate and A/A twin resolved), each cell as the
    rule takes it (:func:`rule_cell`: regimes and the carry-over correction): the rates and the
    PORT's Wilson interval, and the median rounds run."""
    bar = 1.0 / (1.0 - delta)
    cap = max(rounds, max_rounds or rounds)
    per_cell = [draw(noise, s, cap, trials, seed * 7919 + i) for i, s in enumerate(speedups)]
    stops = [_resolved_at([(d.times[:, 0], d.times[:, 1]), (d.times[:, 0], d.times[:, 2])],
                          rounds=rounds, max_rounds=cap, bar=bar) for d in per_cell]
    answers = [rule([rule_cell(d, trial, int(n[trial]), bar) for d, n in zip(per_cell, stops)],
                    seed=0).decision for trial in range(trials)]
    ports, closes = answers.count(stats.PORT), answers.count(stats.CLOSE)
    low, high = wilson(ports, trials)
    return {"noise": noise.name, "speedups": list(speedups), "rounds": rounds,
            "max_rounds": cap, "median_rounds": float(np.median(stops)),
            "trials": trials, "family_port": ports / trials, "family_port_low": low,
            "family_port_high": high, "family_close": closes / trials}


# each question of the sequence: (baseline, candidate, A/A twin) arms, indices into the
# simulated arms fresh, reused, pinned, twin and, where deferring is simulated, pinned deferred
QUESTIONS = {"bundle": (0, 2, 3), "reuse": (0, 1, 3), "pinning": (1, 2, None),
             "deferral": (2, 4, None)}


def recommendation_rates(reuse: float, pinning: float, deferral: float | None = None, *,
                         rounds: int, trials: int, cells: int = 6, delta: float = 0.02,
                         sigma: float = 0.02, seed: int = 0,
                         max_rounds: int | None = None) -> dict[str, float]:
    """How often each change is recommended (:func:`stagelab.analyse.sequence.recommend`, then
    :func:`stagelab.analyse.sequence.recommend_deferral`) when reuse alone has the true speedup
    ``reuse`` over the fresh vector, pinning ``pinning`` over the reused buffer (the bundle:
    their product) and, where given, deferring the wait ``deferral`` over the pinned scratch
    (the fourth question, tested last, only where the pinned scratch is ported; None: not
    measured, as in the gate), every cell of a family alike, with lognormal ``sigma`` noise per
    sample and an A/A twin of the fresh vector: the questions decided as families, in their
    fixed sequence, on the same simulated rounds. With ``max_rounds``, rounds until resolved:
    each cell runs until its questions and its twin are resolved (the bench's stop rule), or the
    cap."""
    rng = np.random.default_rng(seed)
    bar = 1.0 / (1.0 - delta)
    cap = max(rounds, max_rounds or rounds)
    pinned = 1.0 / (reuse * pinning)
    level = np.array([1.0, 1.0 / reuse, pinned, 1.0]  # fresh, reused, pinned, twin
                     + ([] if deferral is None else [pinned / deferral]))  # pinned deferred
    times = level[None, None, :, None] * np.exp(
        sigma * rng.normal(size=(trials, cells, len(level), cap)))
    asked = {q: arms for q, arms in QUESTIONS.items() if max(arms[:2]) < len(level)}
    flat = times.reshape(trials * cells, len(level), cap)
    compared = [(b, c) for b, c, _ in asked.values()] + [(0, 3)]  # and the A/A twin
    stops = _resolved_at([(flat[:, b], flat[:, c]) for b, c in compared],
                         rounds=rounds, max_rounds=cap, bar=bar).reshape(trials, cells)
    counts: dict[str, int] = {}
    for trial, cut in zip(times, stops):
        answers: dict[str, stats.FamilyDecision | None] = dict.fromkeys(QUESTIONS)
        for question, (base, cand, twin) in asked.items():
            family = [{"baseline": cell[base, :n], "candidate": cell[cand, :n],
                       "twin": None if twin is None else cell[twin, :n], "min_speedup": bar}
                      for cell, n in zip(trial, cut)]
            answers[question] = stats.decide_family(family)
        bundle = answers["bundle"]
        assert bundle is not None  # always asked
        change, reason = sequence.recommend(bundle, answers["pinning"], answers["reuse"])
        change = sequence.recommend_deferral(change, reason, answers["deferral"])[0]
        counts[change] = counts.get(change, 0) + 1
    return {change: n / trials for change, n in counts.items()}


@dataclass(frozen=True)
class Plan:
    """What a calibration simulates, besides its noise models, truths and rule: ``trials``
    families of ``cells`` cells per row at ``rounds`` fixed rounds (and until resolved up to
    ``max_rounds``), a bar of ``delta``, the rule's ``min_samples`` and ``confidence``, and the
    seed. Checked on construction: a bad plan names its parameter (ValueError)."""

    trials: int = 200
    rounds: int = 30
    delta: float = 0.02
    seed: int = 0
    cells: int = 6
    max_rounds: int = 400
    min_samples: int = 10
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"trials must be positive, got {self.trials}")
        if self.rounds < 2:
            raise ValueError(f"rounds must be at least 2, got {self.rounds}")
        if not 0 < self.delta < 0.3:
            raise ValueError(f"delta must lie in (0, 0.3) (3 delta is a saving), got {self.delta}")
        if self.max_rounds < self.rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) must be at least rounds "
                             f"({self.rounds})")


def calibrate(plan: Plan | None = None, *, noises: Sequence[Noise] = NOISES,
              truths: Sequence[str] = tuple(TRUTHS), adaptive: Sequence[bool] = (False, True),
              rule: FamilyRule = stats.decide_family) -> pd.DataFrame:
    """One row per noise model x truth x (fixed rounds, rounds until resolved): how often ``rule``
    answers PORT or CLOSE for one cell and for a family of ``plan.cells`` cells, over
    ``plan.trials`` simulated runs, with the median rounds run, the share stopped at the cap, the
    median CI half-width, the requirement and whether it is met. Every row sees its own seeded
    data; another ``rule`` is judged on the same data. ``plan``: :class:`Plan`'s defaults where
    None."""
    plan = plan or Plan()
    unknown = [t for t in truths if t not in TRUTHS]
    if unknown:
        raise ValueError(f"truths: unknown {unknown}; valid: {list(TRUTHS)}")
    rounds, max_rounds = plan.rounds, plan.max_rounds
    rows = []
    for n_noise, noise in enumerate(noises):
        for n_truth, truth in enumerate(truths):
            for precise in adaptive:
                start = min(max(rounds, design.TAIL_ROUNDS), max_rounds) if precise else rounds
                setting = Setting(noise, truth, start, max_rounds if precise else rounds)
                row_seed = plan.seed * 1_000_003 + n_noise * 101 + n_truth * 11 + int(precise)
                rows.append(_row(setting, trials=plan.trials, cells=plan.cells,
                                 delta=plan.delta, seed=row_seed, rule=rule,
                                 min_samples=plan.min_samples, confidence=plan.confidence))
    return pd.DataFrame(rows)


def summary(rows: Sequence[dict]) -> str:
    """A calibration table in one sentence: the worst false PORT at 1.00 and at the bar (family
    and single cell), CLOSE at 1.00 under 2 % noise, and the rows that miss their requirement."""
    table = pd.DataFrame(list(rows))
    null = table[table["truth"].isin(["1.00", "at the bar"])]
    quiet = table[(table["noise"] == NOISES[0].name) & (table["truth"] == "1.00")]
    # judged from the trials, not the stored requirement: older verdicts judged point estimates
    unjudged = table["truth"].isin(["1.00", "at the bar"]) & (
        wilson(0, int(table["trials"].iloc[0]))[1] > 0.05)
    short = table[table["met"].eq(False) & ~unjudged]
    missed = "; ".join(f"{r.noise}, {r.truth}, {r.rounds} rounds (family PORT "
                       f"{r.family_port:.0%}, CLOSE {r.family_close:.0%}; cell PORT "
                       f"{r.cell_port:.0%})" for r in short.itertuples())
    first = table.iloc[0]
    return (f"Calibration of the rule at {first['rounds']} rounds, {first['trials']} simulated "
            f"families of {first['cells']} cells per row, {len(table)} rows (noise model x "
            f"truth): false PORT at most {null['family_port'].max():.1%} for the family and "
            f"{null['cell_port'].max():.1%} for one cell; family CLOSE at a true 1.00 under "
            f"{NOISES[0].name} noise {quiet['family_close'].max():.0%}; short of a requirement "
            f"(on its Wilson interval): "
            f"{missed or 'none'}"
            + (f"; {int(unjudged.sum())} rows not judged: {first['trials']} trials cannot show "
               f"a rate under 5 % ({MIN_TRIALS_FOR_5_PERCENT} or more can)" if unjudged.any()
               else "") + ".")
