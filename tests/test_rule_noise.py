"""The rule under the noise a GPU node makes (issue 49), on a generator of this file's own, not
the calibration's: noise that persists within an arm across rounds, rare stalls that one cell
of a family holds and the others miss, a baseline with two regimes, carry-over from the arm
timed before."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stagelab.analyse import carryover, regimes, resample, stalls, stats
from stagelab.analyse.resample import RatioOfMeans
from stagelab.core import design

DELTA = 0.02
BAR = 1 / (1 - DELTA)


def persistent(rng: np.random.Generator, phi: float, rounds: int, sigma: float = 0.02):
    """Log-noise of one arm whose rounds follow an AR(1) of correlation ``phi``."""
    shocks = rng.normal(0, sigma, rounds)
    out = np.empty(rounds)
    out[0] = shocks[0]
    for i in range(1, rounds):
        out[i] = phi * out[i - 1] + math.sqrt(1 - phi ** 2) * shocks[i]
    return out


def arms(rng, speedup, rounds=160, phi=0.0, sigma=0.02):
    """Baseline and candidate seconds, the candidate ``speedup`` faster in its mean."""
    baseline = np.exp(persistent(rng, phi, rounds, sigma))
    candidate = np.exp(persistent(rng, phi, rounds, sigma)) / speedup
    return baseline, candidate


@pytest.mark.parametrize("phi, low, high", [(0.0, 1.0, 1.2), (0.3, 1.2, 1.6), (0.7, 1.9, 2.9)])
def test_the_dependence_factor_reads_the_rounds_autocorrelation(phi, low, high):
    rng = np.random.default_rng(5)
    factors = [design.inflation(design.lag1(list(persistent(rng, phi, 400)))) for _ in range(20)]
    assert low <= np.median(factors) <= high  # sqrt((1 + phi) / (1 - phi)): 1, 1.36, 2.38


def test_the_dependence_factor_is_one_where_it_cannot_be_read():
    assert design.inflation(design.lag1([1.0] * 50)) == 1.0
    assert design.inflation(design.lag1([1.0, 2.0, 3.0])) == 1.0
    alternating = [(-1.0) ** i for i in range(100)]  # negative correlation: no extra precision
    assert design.inflation(design.lag1(alternating)) == 1.0


def test_a_ci_over_dependent_rounds_covers_the_truth():
    """Before: the bootstrap over rounds took AR(1) rounds (phi 0.7) for independent and its
    95 % CI covered the true speedup in about half the samples."""
    rng = np.random.default_rng(11)
    covered, plain_covered = 0, 0
    for _ in range(120):
        b, c = arms(rng, 1.0, phi=0.7)
        widened = resample.dependent(b, c, seed=0).interval(0.95)
        plain = RatioOfMeans(b, c).interval(0.95)
        covered += widened[0] <= 1.0 <= widened[1]
        plain_covered += plain[0] <= 1.0 <= plain[1]
    assert plain_covered / 120 < 0.75  # the failure the widening fixes is there to fix
    assert covered / 120 >= 0.88


def test_the_stop_rule_does_not_resolve_on_a_falsely_narrow_interval():
    rng = np.random.default_rng(2)
    stopped = 0
    for _ in range(60):
        b, c = arms(rng, BAR, rounds=200, phi=0.7)
        stopped += design.resolved(list(b), list(c), BAR)
    assert stopped / 60 <= 0.15  # at the bar, a 95 % CI clears it rarely


def family_at(speedup, stall_cell=None, cells=6, rounds=160, seed=0):
    """Six cells whose candidate looks ``speedup`` faster; ``stall_cell`` holds one 3x stall."""
    rng = np.random.default_rng(seed)
    out = []
    for index in range(cells):
        b, c = arms(rng, speedup, rounds, sigma=0.01)
        if index == stall_cell:
            c[rounds // 2] *= 3
        out.append({"baseline": b, "candidate": c, "twin": None, "min_speedup": BAR})
    return out


def test_a_stall_seen_in_one_cell_is_charged_to_every_cell_of_the_family():
    """Before: each cell added one more round like its own worst, so the five cells whose
    sample missed the candidate's rare stall ported on a mean 1 % too fast."""
    clean = stats.decide_family(family_at(BAR * 1.012))
    assert clean.decision == stats.PORT  # the family would port without the stall
    stalled = stats.decide_family(family_at(BAR * 1.012, stall_cell=0))
    assert stalled.decision != stats.PORT
    assert all(c.one_more_bound <= BAR for c in stalled.cells)
    alone = stats.decide_family(family_at(BAR * 1.012, cells=2)[1:], stall_allowance=1.0)
    assert alone.decision == stats.PORT  # the cell alone, no stall seen, still ports


def test_every_port_states_the_rarest_stall_its_rounds_cannot_exclude():
    assert design.rarest_unexcluded(160) == 53 and design.rarest_unexcluded(960) == 320
    assert design.rarest_unexcluded(design.TAIL_ROUNDS) >= 1 / design.STALL_RATE
    family = stats.decide_family(family_at(BAR * 1.05))
    assert family.decision == stats.PORT
    assert "stall rarer than 1 in 320 calls cannot be excluded by the family's 960 rounds" in (
        family.reason)
    assert {c.stalls_unexcluded for c in family.cells} == {53}


def bimodal(rng, speedup, rounds=160, share=0.3, factor=1.5, whole_rounds=False):
    """A fresh-vector baseline (and its twin) slow by ``factor`` in ``share`` of calls, the
    candidate ``speedup`` faster than the baseline's mean; with the regimes recorded."""
    slow_b = rng.random(rounds) < share
    slow_t = slow_b if whole_rounds else rng.random(rounds) < share
    noise = np.exp(rng.normal(0, 0.02, (3, rounds)))
    mean = 1 + share * (factor - 1)
    return {"baseline": np.where(slow_b, factor, 1.0) * noise[0],
            "candidate": mean / speedup * noise[1],
            "twin": np.where(slow_t, factor, 1.0) * noise[2], "min_speedup": BAR,
            "regime": np.where(slow_b, "mapped", "heap"),
            "twin_regime": np.where(slow_t, "mapped", "heap")}


def without_regimes(cell):
    return {k: v for k, v in cell.items() if k not in ("regime", "twin_regime")}


def test_the_regimes_make_a_real_saving_under_a_bimodal_baseline_reachable():
    """Before: a 30 % slow mode at 1.5x in the fresh vector hid a saving of 2 delta (the issue:
    0 of 18 families ported)."""
    rng = np.random.default_rng(4)
    ported, plain = 0, 0
    for _ in range(10):
        family = [bimodal(rng, 1 / (1 - 2 * DELTA)) for _ in range(6)]
        ported += stats.decide_family(family).decision == stats.PORT
        plain += stats.decide_family([without_regimes(c) for c in family]).decision == stats.PORT
    assert ported >= 8 and plain <= 2


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_regimes_do_not_port_a_family_at_the_bar():
    rng = np.random.default_rng(9)
    ports = sum(stats.decide_family([bimodal(rng, BAR) for _ in range(6)]).decision == stats.PORT
                for _ in range(100))
    assert ports <= 6  # the mix's own error is in the interval: about 2.5 % expected


def test_the_family_mix_pools_calls_and_counts_shared_rounds_once():
    rng = np.random.default_rng(0)
    independent = regimes.family_mix([bimodal(rng, 1.0) for _ in range(3)])
    shared = regimes.family_mix([bimodal(rng, 1.0, whole_rounds=True) for _ in range(3)])
    assert independent is not None and shared is not None
    assert independent.calls > 900 and shared.calls == pytest.approx(480)
    assert independent.shares["mapped"] == pytest.approx(0.3, abs=0.05)
    assert regimes.family_mix([without_regimes(bimodal(rng, 1.0))]) is None


def test_a_reweighted_baseline_has_the_mix_weighted_mean_of_its_regimes():
    values = np.array([1.0, 1.0, 1.0, 2.0])
    labels = np.array(["a", "a", "a", "b"])
    mix = regimes.Mix({"a": 0.5, "b": 0.5}, 100)
    assert regimes.reweighted(values, labels, mix).mean() == pytest.approx(1.5)
    assert regimes.mix_error(values, labels, mix) == pytest.approx(0.05 / 1.5)


def tax_cell(rng, speedup, tax, after, rounds=160):
    """Three arms in the bench's balanced order: the call after ``after`` is ``tax`` slower.
    Returns the rule's cell and the order's calls."""
    names = ["baseline", "candidate", "twin"]
    level = {"baseline": 1.0, "candidate": 1 / speedup, "twin": 1.0}
    seconds, positions = np.empty((3, rounds)), np.empty((3, rounds), dtype=int)
    for r, order in enumerate(design.balanced_orders(names, rounds, int(rng.integers(1 << 30)))):
        for place, name in enumerate(order):
            taxed = place and order[place - 1] in after
            seconds[names.index(name), r] = (level[name] * (1 + tax * taxed)
                                             * math.exp(rng.normal(0, 0.02)))
            positions[names.index(name), r] = place
    calls = carryover.calls_from_arrays(seconds, positions)
    return {"baseline": seconds[0], "candidate": seconds[1], "twin": seconds[2],
            "min_speedup": BAR}, calls


@pytest.mark.parametrize("after, sign", [(("candidate",), 1), (("baseline", "twin"), -1)])
def test_carry_over_is_corrected_with_its_error(after, sign):
    """Before: a 5 % tax on the call after the candidate was flagged in words and the cell
    decided on the biased speedup (six cells at the bar ported 100 %)."""
    rng = np.random.default_rng(8)
    cell, calls = tax_cell(rng, BAR, 0.05, after)
    found = carryover.correction(calls, 3, 0, 1)
    assert found is not None and sign * found["bias"] > 0.01
    assert 0 < found["bias_se"] < 0.004
    plain = stats.decide(cell["baseline"], cell["candidate"], min_speedup=BAR)
    fixed = stats.decide_family([{**cell, "carry_over": found}]).cells[0]
    assert abs(fixed.speedup - BAR) < abs(plain.speedup - BAR)
    assert fixed.carry_over_bias == pytest.approx(found["bias"])
    assert fixed.ci_high - fixed.ci_low > plain.ci_high - plain.ci_low


def test_no_carry_over_asks_no_correction_in_most_cells():
    rng = np.random.default_rng(3)
    corrected = sum(carryover.correction(tax_cell(rng, 1.0, 0.0, ())[1], 3, 0, 1) is not None
                    for _ in range(40))
    assert corrected <= 6  # a two-sided 5 % test


@pytest.mark.parametrize("key, value, words", [
    ("regime", ["a"] * 5, "regime must hold one label per round"),
    ("carry_over", {"bias": math.nan, "bias_se": 0.0}, "carry_over must hold a finite bias"),
    ("carry_over", {"bias_se": 0.0}, "bias"),
])
def test_bad_regimes_or_carry_over_make_the_cell_inconclusive(key, value, words):
    rng = np.random.default_rng(0)
    b, c = arms(rng, 1.1, rounds=20)
    cell = {"baseline": b, "candidate": c, "twin": None, "min_speedup": BAR, key: value}
    decision = stats.decide_family([cell]).cells[0]
    assert decision.decision == stats.INCONCLUSIVE and words in decision.reason


def test_the_prediction_can_fail_and_says_where():
    """Before: out_of_sample held intervals and `outside` flags that nothing read."""
    from stagelab.analyse import predict_check

    def figure(name, measured, low=1.0, high=2.0):
        return {"name": name, "predicted_ms": 1.5, "low_ms": low, "high_ms": high,
                "measured_ms": measured, "error": None,
                "outside": measured is not None and not low <= measured <= high}

    def cell(host, total):
        return {"rows": 16, "vocab": 152064, "k": 5, "host": host, "notes": [],
                "stages": [figure("alloc", 1.2)], "arms": [figure("seed_pageable", total)],
                "questions": [figure("bundle", None)]}

    held = predict_check.falsification([cell("a", 1.9), cell("b", 2.5)])  # one host holds it
    assert held["held"] is True and held["figures"] == 2 and held["failed_at"] == []
    failed = predict_check.falsification([cell("a", 2.5), cell("b", 2.6)])
    assert failed["held"] is False
    assert failed["failed_at"] == ["seed_pageable at n=16, V=152064, K=5"]
    assert "the model failed at 1 of 2 figures" in failed["words"]
    assert predict_check.falsification([])["held"] is None
    words = predict_check.out_of_sample_words({"falsification": failed, "cells": [],
                                               "platform": "H200"})
    assert words[0].startswith("Out of sample, the model failed at 1 of 2 figures")


def test_the_rounds_a_cheaper_answer_needs_are_stated_and_grow_near_the_bar():
    at_half, near = design.rounds_to_close(0.5), design.rounds_to_close(0.8)
    assert at_half <= 200 < near  # the gate's cap reaches 0.5 delta, not 0.8 delta
    assert near == pytest.approx(at_half * 6.25, rel=0.05)  # the inverse square of the distance
    with pytest.raises(ValueError, match="saving must lie in"):
        design.rounds_to_close(1.0)


def test_the_rule_says_whether_carry_over_and_regimes_reach_the_decision():
    from stagelab.analyse import verdict_decision

    inputs = {"baseline": [1.0], "candidate": [1.0], "carry_over": {"bias": 0.01, "bias_se": 0.0},
              "regime": [True], "twin_regime": [True]}
    assert verdict_decision._as_ruled(inputs, verdict_decision.Rule()) == inputs
    bare = verdict_decision._as_ruled(inputs, verdict_decision.Rule(carry_over=False,
                                                                    regimes=False))
    assert set(bare) == {"baseline", "candidate"}
    assert verdict_decision.Rule().as_dict()["carry_over"] is True


# --- issue 49's remaining gaps: dependent rounds' degrees of freedom, a family's shared mix,
# the stall a PORT survives


@pytest.mark.parametrize("df, probability, tolerance", [
    (5, 0.975, 0.002), (5, 0.004, 0.007), (10, 0.975, 0.0005), (10, 0.004, 0.0005),
    (30, 0.0005, 0.0001), (150, 0.025, 0.00001)])
def test_the_t_quantile_of_the_standard_library_matches_scipys(df, probability, tolerance):
    from scipy import stats as sps
    exact = float(sps.t.ppf(probability, df))
    assert design.t_quantile(probability, df) == pytest.approx(exact, rel=tolerance)


def test_effective_degrees_of_freedom_shrink_with_dependence_and_its_estimate():
    assert design.effective_df(9, 0.5) == 8  # fewer than 10 rounds read no rho
    assert design.effective_df(160, 0.0, estimated=False) == pytest.approx(159)
    # 1 / df = 1 / (n_eff - 1) + 2 share / ((1 - rho^2) n), share 1 at rho 0.7, n_eff 160 * 0.3 / 1.7
    n_eff = 160 * 0.3 / 1.7
    assert design.effective_df(160, 0.7) == pytest.approx(1 / (1 / (n_eff - 1) + 2 / (0.51 * 160)))
    assert design.effective_df(160, 0.7) == pytest.approx(16.33, abs=0.01)
    assert design.effective_df(160, 0.0) == pytest.approx(94.79, abs=0.01)  # a third: clipped
    assert design.clipped_share(0.0) == pytest.approx(0.5 - 0.5 / math.pi)
    with pytest.raises(ValueError, match="rho"):
        design.effective_df(160, 1.0)


def test_the_stop_rules_ci_covers_the_truth_under_persistent_noise():
    """Before: the half-width read at the normal quantile with all rounds as degrees of freedom
    missed the truth in 6.4 % of AR(1) samples at phi 0.7 (this generator, seed 3); read at the
    effective degrees of freedom it misses 4.6 %."""
    rng = np.random.default_rng(3)
    missed = 0
    for _ in range(2000):
        b, c = arms(rng, 1.0, 160, phi=0.7)
        width, ratio = design.speedup_half_width(list(b), list(c)), b.mean() / c.mean()
        missed += not ratio - width <= 1.0 <= ratio + width
    assert missed / 2000 <= 0.05


@pytest.mark.parametrize("loadings", [[0.95] * 6, [0.6, 0.8, 0.9, 0.95, 0.3, 0.0],
                                      [0.9, -0.9, 0.9, 0.9, 0.9, 0.9]])
def test_the_max_t_critical_value_holds_its_level_on_simulated_one_factor_normals(loadings):
    load = np.array(loadings)
    critical = regimes.max_t_critical(loadings, 0.025)
    rng = np.random.default_rng(0)
    shared, own = rng.normal(size=(400_000, 1)), rng.normal(size=(400_000, len(load)))
    exceeded = float(((load * shared + np.sqrt(1 - load ** 2) * own).max(axis=1) > critical).mean())
    assert exceeded == pytest.approx(0.025, abs=0.001)  # Monte Carlo error 0.00025


def test_the_max_t_critical_value_runs_from_sidak_to_one_test():
    from scipy import stats as sps
    sidak = float(sps.norm.isf(1 - (1 - 0.025) ** (1 / 6)))
    assert regimes.max_t_critical([0.0] * 6, 0.025) == pytest.approx(sidak, abs=1e-6)
    assert regimes.max_t_critical([0.9] * 6, 0.025) < sidak
    assert regimes.max_t_critical([1.0] * 6, 0.025) == pytest.approx(1.96, abs=0.1)
    assert regimes.family_level([0.0] * 6, 0.025) == pytest.approx(0.025 / 6)  # plain Holm
    assert regimes.family_level([0.95] * 6, 0.025) == pytest.approx(0.0107, abs=0.0002)
    with pytest.raises(ValueError, match="loadings"):
        regimes.max_t_critical([1.5], 0.025)


def test_a_family_sharing_a_regime_mix_is_tested_at_the_max_t_level():
    rng = np.random.default_rng(4)
    family = [bimodal(rng, 1 / (1 - 2 * DELTA), whole_rounds=True) for _ in range(6)]
    shared = stats.decide_family(family)
    first_step = min(c.port_level for c in shared.cells)
    assert 0.025 / 6 < first_step < 0.025  # the cells' bounds move together
    plain = stats.decide_family([without_regimes(c) for c in family])
    assert plain.decision != stats.PORT  # the mix hides the saving without its regimes
    assert [c.port_level for c in plain.cells] == pytest.approx([0.025 / 6] * 6)  # plain Holm


def test_every_port_states_the_stall_it_survives():
    assert stalls.stall_budget(1.03, 1.02, 53) == pytest.approx(1 + 53 * (1.03 / 1.02 - 1))
    family = stats.decide_family(family_at(BAR * 1.05))
    assert family.decision == stats.PORT
    ported = [c for c in family.cells if c.decision == stats.PORT]
    assert ported and all(c.stall_budget == pytest.approx(
        1 + 53 * (c.port_bound / BAR - 1)) for c in ported)
    smallest = min(c.port_bound for c in ported)
    assert family.stall_budget == pytest.approx(1 + 320 * (smallest / BAR - 1))
    assert family.stall_budget > 10  # a 5 % margin over 960 rounds survives a 10x stall
    unported = stats.decide_family(family_at(BAR))
    assert unported.stall_budget is None
    assert all(c.stall_budget is None for c in unported.cells if c.decision != stats.PORT)
    with pytest.raises(ValueError, match="unexcluded"):
        stalls.stall_budget(1.03, 1.02, 0)


def test_the_unseen_stall_charge_is_one_stall_among_the_rounds():
    assert design.unseen_stall_charge(960) == pytest.approx(2 / 961)  # 3x: 0.21 %
    assert design.unseen_stall_charge(160, 1.0) == 0.0
    assert design.unseen_stall_charge(160, 4.0) > design.unseen_stall_charge(960, 4.0)
    with pytest.raises(ValueError, match="rounds"):
        design.unseen_stall_charge(0)
    with pytest.raises(ValueError, match="stall allowance"):
        design.unseen_stall_charge(160, 0.5)


@pytest.mark.parametrize("allowance", [0.9, math.inf, math.nan, True, "3"])
def test_a_bad_stall_allowance_is_refused_by_name(allowance):
    with pytest.raises(ValueError, match="stall_allowance"):
        stats.decide_family(family_at(BAR * 1.05), stall_allowance=allowance)


def stalling_family(rng, rate, cells=6, rounds=160, factor=3.0, speedup=BAR):
    """Six cells whose candidate stalls ``factor`` x in ``rate`` of its calls, its mean held at
    ``speedup`` (the bar) by its other calls (0.5 % noise on every arm: a cell's error about a
    twentieth of delta, so that a missed stall's bias matters)."""
    out = []
    for _ in range(cells):
        b, c = arms(rng, speedup, rounds, sigma=0.005)
        stalls = rng.random(rounds) < rate
        c = c * np.where(stalls, factor, 1.0) / (1 + rate * (factor - 1))
        out.append({"baseline": b, "candidate": c, "twin": None, "min_speedup": BAR})
    return out


def test_a_sample_that_missed_a_rare_stall_no_longer_ports():
    """Before: a candidate 3x slower in 1 of 1000 calls, its mean at the bar, showed in the 38 %
    of families of 960 rounds that hold no stall a mean 0.2 % faster than it is, and six cells
    ported in 4.2 % of 3000 families. The PORT bound now charges one unseen 3x stall among the
    family's rounds."""
    rng = np.random.default_rng(3)  # no stall in the sample: the candidate 0.2 % too fast
    unseen = stalling_family(rng, 0.0, speedup=BAR * (1 + 2 / 1000))
    plain = stats.decide_family(unseen, stall_allowance=1.0)
    charged = stats.decide_family(unseen)
    same_level = [(p.port_bound, c.port_bound) for p, c in zip(plain.cells, charged.cells)
                  if p.port_level == c.port_level]  # Holm's later steps differ
    assert same_level and all(c == pytest.approx(p / (1 + 2 / 961)) for p, c in same_level)
    assert [c.stall_charge for c in charged.cells] == pytest.approx([2 / 961] * 6)
    assert charged.stall_allowance == 3.0 and plain.stall_allowance == 1.0
    declared = lambda family: sum(c.decision == stats.PORT for c in family.cells)  # noqa: E731
    assert declared(plain) >= 3 and declared(charged) == 0


def test_a_real_saving_ports_with_the_charge_and_says_so():
    family = stats.decide_family(family_at(1 / (1 - 2 * DELTA)))
    assert family.decision == stats.PORT
    assert "unseen 3x candidate stall in the family's 960 rounds (0.21%" in family.reason
    assert all("unseen 3x" in c.reason for c in family.cells if c.decision == stats.PORT)


@pytest.mark.slow  # 2 x 300 families: make check's fast lane leaves it to make test
def test_rare_stalls_rarer_than_the_rounds_stay_within_the_stated_error():
    """Families at the bar whose candidate stalls 3x in 1 of 1000 calls (this file's generator):
    charged, false PORT at or under 2.5 % of 300; uncharged, the bias shows."""
    rng = np.random.default_rng(21)
    families = [stalling_family(rng, 1 / 1000) for _ in range(300)]
    charged = sum(stats.decide_family(f).decision == stats.PORT for f in families)
    plain = sum(stats.decide_family(f, stall_allowance=1.0).decision == stats.PORT
                for f in families)
    assert charged <= 7 < plain
