"""The decision rule's error rates, measured on simulated timings with a known true speedup.

:func:`simulate_rounds` draws paired per-round timings the way a GPU run produces them: lognormal
noise on every sample, a drift shared by all arms of a round (clock, cache, a neighbour's load),
and rare large outliers (a preemption, a page fault storm). :func:`calibrate` feeds many such runs
to :func:`stagelab.stats.decide` and reports how often it answers PORT, CLOSE or INCONCLUSIVE in
three scenarios, each with the requirement the rule must meet:

1. no effect under realistic noise: PORT in at most 5 % of trials (few false ports);
2. no effect under noise small enough that the CI half-width is at most delta/2: CLOSE in at least
   80 % (CLOSE is reachable);
3. a true speedup of 1 + 3 delta under that noise: PORT in at least 90 % (a real effect is found).

Realistic noise is 8 % per sample, a 5 % drift per round and 2 % of samples tripled. The quiet
noise keeps that drift and those outliers but has 1.4 % per sample, which puts the CI half-width
over 30 rounds just under delta/2 for the default delta of 2 %: the requirement at its edge.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stagelab import stats

Rule = Callable[..., stats.Decision]


def simulate_rounds(true_speedup: float, rounds: int, *, sigma: float, drift_sigma: float,
                    outlier_rate: float, outlier_scale: float, seed: int,
                    base_seconds: float = 0.01) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(baseline, candidate, twin) timings of ``rounds`` interleaved rounds.

    Each sample is ``base_seconds`` (divided by ``true_speedup`` for the candidate) times the
    round's drift ``exp(N(0, drift_sigma))``, shared by the round's three arms, times its own
    ``exp(N(0, sigma))``; with probability ``outlier_rate`` it is further multiplied by
    ``outlier_scale``. The twin is the baseline again, so its true speedup is 1."""
    checks = {"true_speedup": (true_speedup, true_speedup > 0), "rounds": (rounds, rounds >= 1),
              "sigma": (sigma, sigma >= 0), "drift_sigma": (drift_sigma, drift_sigma >= 0),
              "outlier_rate": (outlier_rate, 0 <= outlier_rate <= 1),
              "outlier_scale": (outlier_scale, outlier_scale > 0),
              "base_seconds": (base_seconds, base_seconds > 0)}
    for name, (value, ok) in checks.items():
        if not ok:
            raise ValueError(f"{name} is out of range: {value}")
    rng = np.random.default_rng(seed)
    drift = np.exp(rng.normal(0.0, drift_sigma, size=(1, rounds)))
    noise = np.exp(rng.normal(0.0, sigma, size=(3, rounds)))
    outliers = np.where(rng.random((3, rounds)) < outlier_rate, outlier_scale, 1.0)
    scale = np.array([[1.0], [1.0 / true_speedup], [1.0]])
    baseline, candidate, twin = base_seconds * scale * drift * noise * outliers
    return baseline, candidate, twin


@dataclass(frozen=True)
class Scenario:
    """One simulated situation, with what the rule must achieve in it."""

    name: str
    effect_in_deltas: float  # true speedup = 1 + effect_in_deltas * delta
    sigma: float
    requirement: str
    outcome: str  # the rate the requirement bounds: "port" or "close"
    at_least: bool  # the rate must be >= bound (else <= bound)
    bound: float
    quiet: bool  # the requirement assumes a CI half-width of at most delta/2


DRIFT_SIGMA, OUTLIER_RATE, OUTLIER_SCALE = 0.05, 0.02, 3.0
REALISTIC_SIGMA, QUIET_SIGMA = 0.08, 0.013  # quiet: CI half-width under delta/2 ...
QUIET_AT_ROUNDS, QUIET_AT_DELTA = 30, 0.02  # ... at 30 rounds and delta 2 %; scaled to others


def quiet_sigma(rounds: int, delta: float) -> float:
    """Per-sample noise that keeps the CI half-width just under delta/2 at ``rounds`` rounds (the
    half-width shrinks as the square root of the rounds and must scale with delta)."""
    return QUIET_SIGMA * (delta / QUIET_AT_DELTA) * math.sqrt(rounds / QUIET_AT_ROUNDS)

SCENARIOS = (
    Scenario("no effect, realistic noise", 0.0, REALISTIC_SIGMA,
             "PORT in at most 5 % of trials", "port", False, 0.05, False),
    Scenario("no effect, quiet noise", 0.0, QUIET_SIGMA,
             "CLOSE in at least 80 % of trials, CI half-width <= delta/2", "close", True, 0.80,
             True),
    Scenario("true speedup 1 + 3 delta, quiet noise", 3.0, QUIET_SIGMA,
             "PORT in at least 90 % of trials, CI half-width <= delta/2", "port", True, 0.90,
             True),
)


def _scenario_row(scenario: Scenario, trial_seeds: np.ndarray, rounds: int, delta: float,
                  rule: Rule) -> dict:
    """Run ``rule`` on one simulated run per seed and summarise its answers."""
    true_speedup = 1.0 + scenario.effect_in_deltas * delta
    sigma = quiet_sigma(rounds, delta) if scenario.quiet else scenario.sigma
    min_speedup = stats.min_speedup_for(delta, part_seconds=1.0, step_seconds=1.0)
    answers, half_widths = [], []
    for trial_seed in trial_seeds:
        baseline, candidate, twin = simulate_rounds(
            true_speedup, rounds, sigma=sigma, drift_sigma=DRIFT_SIGMA,
            outlier_rate=OUTLIER_RATE, outlier_scale=OUTLIER_SCALE, seed=int(trial_seed))
        decision = rule(baseline, candidate, min_speedup=min_speedup, twin=twin,
                        seed=int(trial_seed))
        answers.append(decision.decision)
        if decision.ci_low is not None:
            half_widths.append((decision.ci_high - decision.ci_low) / 2)
    answers = np.array(answers)
    rates = {name: float(np.mean(answers == value)) for name, value in
             (("port_rate", stats.PORT), ("close_rate", stats.CLOSE),
              ("inconclusive_rate", stats.INCONCLUSIVE))}
    half_width = float(np.median(half_widths)) if half_widths else float("nan")
    rate = rates[f"{scenario.outcome}_rate"]
    met = rate >= scenario.bound if scenario.at_least else rate <= scenario.bound
    if scenario.quiet:
        met = met and half_width <= delta / 2
    return dict(scenario=scenario.name, true_speedup=true_speedup, sigma=sigma,
                trials=len(trial_seeds), **rates, median_ci_half_width=half_width,
                requirement=scenario.requirement, met=bool(met))


def calibrate(trials: int = 200, rounds: int = 30, delta: float = 0.02, seed: int = 0,
              rule: Rule = stats.decide) -> pd.DataFrame:
    """One row per scenario: how often ``rule`` (by default :func:`stagelab.stats.decide`, the
    gate) answers PORT, CLOSE or INCONCLUSIVE over ``trials`` simulated runs of ``rounds`` rounds,
    the median CI half-width, the requirement in words and whether it is met. The minimum speedup
    is the step speedup that saves ``delta`` of the step, ``1/(1 - delta)``. Every scenario sees
    the same trial seeds, so another ``rule`` is judged on the same simulated data."""
    if trials < 1:
        raise ValueError(f"trials must be positive, got {trials}")
    if rounds < 2:
        raise ValueError(f"rounds must be at least 2, got {rounds}")
    trial_seeds = np.random.SeedSequence(seed).generate_state(trials)
    return pd.DataFrame([_scenario_row(s, trial_seeds, rounds, delta, rule) for s in SCENARIOS])
