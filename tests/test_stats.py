"""The statistics of the gate: paired speedups, the equivalence rule, paired arm comparisons."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from stagelab.analyse import calibration, paired, sequence, stats

ONES = np.ones(12)
# per-round ratios: median 1.10, all within 1 %, in a shuffled order (in rising order they are a
# perfect trend across rounds, which the rule reads as rounds that are not independent)
AROUND_1_10 = np.random.default_rng(3).permutation(np.linspace(1.09, 1.11, 12))
# the rule's other parts on a dozen rounds (a PORT needs 149), no unseen stall charged (over a
# dozen rounds one 3x stall would be 15 % of the mean)
FEW = {"port_min_rounds": 10, "stall_allowance": 1.0}


def test_paired_speedup_of_constant_ratios_is_exact():
    assert paired.paired_speedup(2.0 * ONES, ONES) == (2.0, 2.0, 2.0)


def test_paired_speedup_is_the_ratio_of_mean_times_and_is_seeded():
    point, low, high = paired.paired_speedup(AROUND_1_10 * 3.0, 3.0 * ONES, seed=4)
    assert point == pytest.approx(np.mean(AROUND_1_10)) and 1.09 <= low < point < high <= 1.11
    assert paired.paired_speedup(AROUND_1_10 * 3.0, 3.0 * ONES, seed=4) == (point, low, high)


def test_a_slow_round_moves_the_speedup_as_it_moves_what_the_engine_pays():
    candidate = ONES.copy()
    candidate[3] = 100.0  # one round where the candidate took 100 times as long
    point = paired.paired_speedup(AROUND_1_10, candidate)[0]
    assert point == pytest.approx(np.sum(AROUND_1_10) / np.sum(candidate))
    assert point < 0.2  # the median of per-round ratios would still say 1.10x


def _mixture(fast, slow, slow_share, rounds=40, seed=0):
    """Per-round values: ``slow`` in ``slow_share`` of the rounds (spread over the run), ``fast``
    elsewhere, times 0.5 % noise."""
    rng = np.random.default_rng(seed)
    values = np.full(rounds, fast)
    values[rng.permutation(rounds)[: round(slow_share * rounds)]] = slow
    return values * np.exp(rng.normal(0, 0.005, rounds))


def test_a_baseline_slow_in_some_rounds_ports_by_the_mean():
    # the case: the baseline is 1.5x slow in 30 % of rounds, mean speedup 1.15; the
    # median of per-round ratios is 1.00, which would close
    baseline, candidate = _mixture(1.0, 1.5, 0.3), np.exp(np.random.default_rng(1).normal(
        0, 0.005, 40))
    decision = stats.decide(baseline, candidate, min_speedup=1 / 0.98, twin=baseline * np.exp(
        np.random.default_rng(2).normal(0, 0.005, 40)), **FEW)
    assert decision.median_speedup == pytest.approx(1.0, abs=0.01)
    assert decision.speedup == pytest.approx(1.15, abs=0.01)
    assert decision.decision == stats.PORT
    assert "median of per-round ratios (1.0" in decision.note and "follows the mean" in decision.note


def test_a_candidate_faster_in_most_rounds_but_a_net_loss_closes_by_the_mean():
    # the case: 3 % faster in 85 % of rounds, 3x slower in 15 %: a net loss (~0.78)
    baseline = np.exp(np.random.default_rng(3).normal(0, 0.005, 40))
    candidate = _mixture(0.97, 3.0, 0.15, seed=4)
    decision = stats.decide(baseline, candidate, min_speedup=1 / 0.98)
    assert decision.median_speedup > 1 / 0.98  # the median alone would port
    assert decision.speedup < 0.85 and decision.decision == stats.CLOSE
    assert "other side of the minimum" in decision.note


def _unpaired_ratio_of_medians(baseline, candidate, seed=0):
    result = sps.bootstrap((baseline, candidate),
                           lambda b, c, axis: np.median(b, axis=axis) / np.median(c, axis=axis),
                           vectorized=True, n_resamples=2000, method="percentile",
                           rng=np.random.default_rng(seed))
    return result.confidence_interval


def test_pairing_cancels_drift_shared_by_a_round():
    rng = np.random.default_rng(1)
    drift = np.exp(rng.normal(0, 0.3, 30))  # the machine's state changes a lot between rounds
    baseline = drift * np.exp(rng.normal(0, 0.01, 30))
    candidate = drift / 1.5 * np.exp(rng.normal(0, 0.01, 30))
    _, low, high = paired.paired_speedup(baseline, candidate)
    assert 1.48 < low < high < 1.52
    # negative control: bootstrapping the arms apart, the drift swamps the interval
    unpaired = _unpaired_ratio_of_medians(baseline, candidate)
    assert unpaired.high - unpaired.low > 10 * (high - low)


def test_paired_ci_covers_the_true_speedup_at_its_confidence():
    def coverage(confidence):
        covered = 0
        for seed in range(200):
            baseline, candidate, _ = calibration.simulate(
                calibration.Noise("", 0.08, ar1=0.05, outlier_rate=0.02, outlier_scale=3.0),
                1.0, 30, 1, seed)[0]
            _, low, high = paired.paired_speedup(baseline, candidate, confidence=confidence,
                                                n_resamples=1000, seed=seed)
            covered += low <= 1.0 <= high
        return covered / 200

    assert 0.90 <= coverage(0.95) <= 0.99
    assert coverage(0.50) < 0.70  # negative control: the check sees a narrower interval


@pytest.mark.parametrize("kwargs, message", [
    (dict(baseline=ONES, candidate=ONES[:5]), "baseline has 12, candidate has 5 rounds"),
    (dict(baseline=ONES[:1], candidate=ONES[:1]), "at least 2 rounds, got 1"),
    (dict(baseline=ONES, candidate=-ONES), "candidate must hold positive, finite"),
    (dict(baseline=np.full(12, np.nan), candidate=ONES), "baseline must hold positive, finite"),
    (dict(baseline=ONES, candidate=ONES, confidence=1.0), "confidence must lie in"),
    (dict(baseline=ONES, candidate=ONES, n_resamples=0), "n_resamples must be positive"),
])
def test_paired_speedup_bad_input_names_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        paired.paired_speedup(**kwargs)


@pytest.mark.parametrize("delta, part, step, expected", [
    (0.02, 1.0, 1.0, 1 / 0.98),  # the whole step must be 2 % faster
    (0.1, 0.5, 1.0, 1.25),  # half the step must save a tenth of it
    (0.1, 0.1, 1.0, math.inf),  # even a free part saves exactly delta, not more
    (0.1, 0.05, 1.0, math.inf),
])
def test_min_speedup_for(delta, part, step, expected):
    assert stats.min_speedup_for(delta, part_seconds=part, step_seconds=step) == pytest.approx(
        expected)


@pytest.mark.parametrize("delta, part, step, message", [
    (0.0, 1.0, 1.0, "delta must lie in"), (1.0, 1.0, 1.0, "delta must lie in"),
    (math.nan, 1.0, 1.0, "delta must lie in"), (0.02, 0.0, 1.0, "part_seconds must be positive"),
    (0.02, 1.0, math.inf, "step_seconds must be positive"),
    (0.02, 2.0, 1.0, "part_seconds .* cannot exceed step_seconds"),
])
def test_min_speedup_for_bad_input(delta, part, step, message):
    with pytest.raises(ValueError, match=message):
        stats.min_speedup_for(delta, part_seconds=part, step_seconds=step)


@pytest.mark.parametrize("ratios, min_speedup, expected, words", [
    (AROUND_1_10, 1.05, stats.PORT, "speedup 1.100x (95% CI [1.09"),
    (AROUND_1_10, 1.20, stats.CLOSE, "lies below the minimum 1.200x"),
    (AROUND_1_10 / 1.37, 1.02, stats.CLOSE, "lies below the minimum 1.020x"),  # a slowdown
    (AROUND_1_10, 1.105, stats.CLOSE, "upper bound at one-sided 5%"),  # just above the estimate
    (AROUND_1_10, 1.10, stats.INCONCLUSIVE, "straddles the minimum 1.100x"),
])
def test_decide_follows_the_rule(ratios, min_speedup, expected, words):
    baseline = 0.004 * ratios
    decision = stats.decide(baseline, 0.004 * ONES, min_speedup=min_speedup, **FEW)
    assert decision.decision == expected and words in decision.reason
    assert decision.n_rounds == 12 and decision.min_speedup == min_speedup
    assert decision.saved_seconds == pytest.approx(np.mean(baseline) - 0.004)
    assert decision.twin_speedup is None


def test_decide_ports_above_a_quiet_twin():
    twin = AROUND_1_10 / np.linspace(0.995, 1.005, 12)
    decision = stats.decide(AROUND_1_10, ONES, min_speedup=1.05, twin=twin, **FEW)
    assert decision.decision == stats.PORT and "above the A/A twin's CI" in decision.reason
    assert decision.twin_ci_low < 1.0 < decision.twin_ci_high < decision.ci_low


@pytest.mark.parametrize("twin_ratios", [np.full(12, 1.08), np.full(12, 1 / 1.08)])
def test_decide_is_inconclusive_when_the_twin_differs(twin_ratios):
    decision = stats.decide(AROUND_1_10, ONES, min_speedup=1.05, twin=AROUND_1_10 / twin_ratios)
    assert decision.decision == stats.INCONCLUSIVE
    assert not 0.952 <= decision.twin_ci_low <= decision.twin_ci_high <= 1.050
    assert "[0.952, 1.050]" in decision.reason  # the twin's allowed interval, named


def test_decide_is_inconclusive_when_the_effect_does_not_clear_the_twin():
    effect = np.full(12, 1.04)
    twin = effect / np.linspace(0.95, 1.10, 12)  # A/A CI about [0.98, 1.07]: wide but around 1
    decision = stats.decide(effect, ONES, min_speedup=1.02, twin=twin, **FEW)
    assert decision.decision == stats.INCONCLUSIVE
    assert 1.02 < decision.ci_low <= decision.twin_ci_high  # clears the bar, not the twin


def test_decide_closes_when_even_a_free_candidate_saves_too_little():
    decision = stats.decide(AROUND_1_10, ONES, min_speedup=math.inf)
    assert decision.decision == stats.CLOSE and "min_speedup is infinite" in decision.reason
    assert decision.speedup == pytest.approx(1.10)
    too_few = stats.decide(ONES[:3], ONES[:3], min_speedup=math.inf)
    assert too_few.decision == stats.INCONCLUSIVE  # not even an infinite bar decides on 3 rounds


@pytest.mark.parametrize("rounds", [0, 1, 9])
def test_decide_is_inconclusive_with_too_few_rounds(rounds):
    decision = stats.decide(AROUND_1_10[:rounds], ONES[:rounds], min_speedup=1.02,
                            twin=ONES[:rounds])
    assert decision.decision == stats.INCONCLUSIVE and decision.n_rounds == rounds
    assert decision.reason == f"fewer rounds than the minimum ({rounds} < 10)"


@pytest.mark.parametrize("kwargs, message", [
    (dict(candidate=ONES[:11]), "baseline has 12, candidate has 11 rounds"),
    (dict(twin=ONES[:10]), "baseline has 12, candidate has 12, twin has 10 rounds"),
    (dict(min_speedup=0.99), "min_speedup must be a number >= 1"),
    (dict(min_speedup=math.nan), "min_speedup must be a number >= 1"),
    (dict(min_speedup="2"), "min_speedup must be a number >= 1"),
    (dict(baseline=None), "baseline is missing"),
    (dict(candidate=["fast"] * 12), "candidate is not a series of numbers"),
    (dict(twin=np.ones((12, 2))), "twin must be one-dimensional"),
    (dict(baseline=[[1.0, 2.0], [3.0]]), "baseline is not a series of numbers"),
])
def test_bad_input_makes_the_cell_inconclusive_naming_it(kwargs, message):
    arguments = {"baseline": AROUND_1_10, "candidate": ONES, "min_speedup": 1.02, **kwargs}
    decision = stats.decide(**arguments)
    assert decision.decision == stats.INCONCLUSIVE and decision.reason.startswith("bad input: ")
    assert message in decision.reason
    family = stats.decide_family([arguments, _cell(AROUND_1_10)], **FEW)
    assert [c.decision for c in family.cells] == [stats.INCONCLUSIVE, stats.PORT]
    assert family.decision == stats.INCONCLUSIVE  # a cell that cannot be read cannot support it


def test_a_bad_parameter_of_the_call_still_raises_naming_it():
    with pytest.raises(ValueError, match="min_samples must be at least 2, got 1"):
        stats.decide(AROUND_1_10, ONES, min_speedup=1.02, min_samples=1)


@pytest.mark.parametrize("arm, values, words", [
    ("twin", np.zeros(12), "twin must hold positive, finite timings: round 0 holds 0.0"),
    ("baseline", np.where(np.arange(12) == 5, np.nan, AROUND_1_10), "round 5 holds nan"),
    ("candidate", -ONES, "candidate must hold positive, finite timings"),
    ("candidate", np.where(np.arange(12) == 2, np.inf, ONES), "round 2 holds inf"),
])
def test_bad_timings_make_the_cell_inconclusive_never_a_crash(arm, values, words):
    arguments = {"baseline": AROUND_1_10, "candidate": ONES, "twin": AROUND_1_10, arm: values}
    decision = stats.decide(**arguments, min_speedup=1.02)
    assert decision.decision == stats.INCONCLUSIVE and decision.n_rounds == 12
    assert decision.reason.startswith("bad timings: ") and words in decision.reason
    family = stats.decide_family([{**arguments, "min_speedup": 1.02},
                                  {"baseline": AROUND_1_10, "candidate": ONES,
                                   "twin": AROUND_1_10, "min_speedup": 1.02}], **FEW)
    assert [c.decision for c in family.cells] == [stats.INCONCLUSIVE, stats.PORT]


def _cell(ratios, bar=1.02, twin_ratios=None):
    return {"baseline": 0.004 * ratios, "candidate": 0.004 * ONES,
            "twin": 0.004 * ratios / (np.linspace(0.999, 1.001, 12) if twin_ratios is None
                                      else twin_ratios), "min_speedup": bar}


def test_decide_family_returns_one_decision_and_the_cells():
    family = stats.decide_family([_cell(AROUND_1_10), _cell(AROUND_1_10 / 1.10)], **FEW)
    assert family.decision == stats.PORT and len(family.cells) == 2
    assert [c.decision for c in family.cells] == [stats.PORT, stats.CLOSE]
    assert "Holm" in family.method and family.to_dict()["cells"][0]["decision"] == stats.PORT


def test_the_family_closes_only_when_every_cell_closes():
    close = _cell(AROUND_1_10 / 1.10)
    assert stats.decide_family([close, close]).decision == stats.CLOSE
    straddles = _cell(AROUND_1_10, bar=1.10)
    family = stats.decide_family([close, straddles])
    assert family.decision == stats.INCONCLUSIVE and "unresolved" in family.reason


def test_a_port_with_another_cell_slower_beyond_the_bar_is_inconclusive():
    family = stats.decide_family([_cell(AROUND_1_10), _cell(AROUND_1_10 / 1.20)], **FEW)
    assert family.decision == stats.INCONCLUSIVE and "could be slower beyond delta" in family.reason


def _simulated(speedup, sigma, seed, rounds=160, bar=1 / 0.98):
    baseline, candidate, twin = calibration.simulate(calibration.Noise("", sigma), speedup,
                                                     rounds, 1, seed)[0]
    return {"baseline": baseline, "candidate": candidate, "twin": twin, "min_speedup": bar}


def test_a_tail_left_unresolved_does_not_block_and_the_port_names_each_cells_role():
    """Before: a null cell whose p99 bound was merely wide blocked the family ('a PORT is
    blocked: the candidate's tail could be heavier'), although nothing was heavier."""
    family = stats.decide_family([_simulated(1 / 0.94, 0.02, 3), _simulated(1.0, 0.02, 103),
                                  _simulated(1.0, 0.005, 203)])
    assert [(c.decision, c.tail) for c in family.cells] == [
        (stats.PORT, stats.TAIL_NOT_HEAVIER), (stats.CLOSE, stats.TAIL_UNRESOLVED),
        (stats.CLOSE, stats.TAIL_NOT_HEAVIER)]
    unresolved = family.cells[1]
    assert unresolved.tail_bound < 0.98 < unresolved.tail_upper_bound  # wide, not heavier
    assert unresolved.port_blocked == "" and family.decision == stats.PORT
    # each cell named in its role: the saving, then shown harmless, then unresolved
    assert family.reason.startswith("1 of 3 cell(s)") and "Holm" in family.reason
    reason = family.reason
    assert reason.index("(cell 0)") < reason.index("cell 2") < reason.index("cell 1;")
    # the rarest candidate stall not excluded: by the family's 480 rounds, by one cell's 160
    assert "1 in 160 calls" in reason and "1 in 53)" in reason


def test_a_bimodal_candidate_slower_in_its_median_is_stopped_by_its_heavier_tail():
    # 70 % of rounds 8 % slower than the baseline, 30 % much faster: the mean saves 12 %, the
    # median and the p99 are slower
    rng = np.random.default_rng(0)
    baseline = np.exp(rng.normal(0, 0.02, 160))
    candidate = np.where(rng.random(160) < 0.7, 1.08, 0.6) * np.exp(rng.normal(0, 0.02, 160))
    decision = stats.decide(baseline, candidate, min_speedup=1 / 0.98)
    assert decision.ci_low > 1 / 0.98 and decision.median_speedup < 1  # the mean alone would port
    assert decision.tail == stats.TAIL_HEAVIER and decision.tail_upper_bound < 0.98
    assert decision.decision == stats.INCONCLUSIVE
    assert "heavier" in decision.port_blocked and decision.port_blocked in decision.reason
    assert f"{decision.tail_upper_bound:.3f}" in decision.port_blocked


def test_rare_candidate_stalls_in_a_saving_cell_are_shown_heavier_when_the_sample_holds_them():
    rng = np.random.default_rng(1)
    baseline = np.exp(rng.normal(0, 0.02, 160))
    candidate = 0.9 * baseline * np.where(np.arange(160) % 20 == 7, 4.0, 1.0)  # 1 in 20 at 4x
    decision = stats.decide(baseline, candidate, min_speedup=1 / 0.98)
    assert decision.tail == stats.TAIL_HEAVIER and decision.decision == stats.INCONCLUSIVE


def test_a_saving_that_rests_on_a_sample_short_of_its_stalls_does_not_port():
    """Before (once the tail blocked only on evidence): a candidate at the bar that stalls 4x in
    2 % of its rounds, sampled with one stall in 160, ported alone in 12 % of simulated cells
    (3.9 % with the pseudo-count of one more worst round; 1000 trials)."""
    rng = np.random.default_rng(2)
    baseline = np.exp(rng.normal(0, 0.02, 160))
    candidate = np.exp(rng.normal(0, 0.02, 160)) / (1.06 / 0.98)  # the mean, at 2 % stalls: the bar
    candidate[40] *= 4.0  # the sample holds one stall, not the three expected
    # the check of one more worst round alone: no unseen stall charged (1.24 % over 160 rounds)
    decision = stats.decide(baseline, candidate, min_speedup=1 / 0.98, stall_allowance=1.0)
    assert decision.port_bound > 1 / 0.98 >= decision.one_more_bound
    assert decision.decision == stats.INCONCLUSIVE and decision.tail != stats.TAIL_HEAVIER
    assert decision.port_blocked == "" and f"({decision.one_more_bound:.3f})" in decision.reason
    clean = stats.decide(baseline, candidate * np.where(np.arange(160) == 40, 0.25, 1.0),
                         min_speedup=1 / 0.98)
    assert clean.decision == stats.PORT  # without the stall nothing marks it (1 in 25 samples)


def test_holm_tests_at_a_stricter_level_with_more_cells():
    # a speedup just clear of the bar at one cell's level is not clear at six cells' first step
    rng = np.random.default_rng(0)
    ratios = 1.035 * np.exp(rng.normal(0, 0.04, 60))  # lower bounds 1.025 alone, 1.020 at 1/6
    cell = {"baseline": ratios, "candidate": np.ones(60), "twin": None, "min_speedup": 1.02}
    alone = stats.decide_family([cell], **FEW)
    assert alone.cells[0].port_level == pytest.approx(0.025)
    at_bar = {**cell, "baseline": np.ones(60)}  # five cells that cannot port
    six = stats.decide_family([cell] + [at_bar] * 5, **FEW)
    assert six.cells[0].port_level == pytest.approx(0.025 / 6)
    assert six.cells[0].port_bound < alone.cells[0].port_bound
    assert alone.cells[0].decision == stats.PORT and six.cells[0].decision == stats.INCONCLUSIVE


def test_holm_steps_down_once_a_cell_is_declared():
    clear = _cell(AROUND_1_10 * 1.2)
    family = stats.decide_family([clear, clear, _cell(AROUND_1_10, bar=1.05)], **FEW)
    assert [c.decision for c in family.cells] == [stats.PORT] * 3
    assert family.cells[0].port_level == pytest.approx(0.025 / 3)
    assert family.cells[2].port_level == pytest.approx(0.025 / 3)


@pytest.mark.parametrize("cells, message", [([], "cells must be a non-empty list"),
                                            ({"baseline": ONES}, "cells must be a non-empty list")])
def test_decide_family_bad_input_names_the_parameter(cells, message):
    with pytest.raises(ValueError, match=message):
        stats.decide_family(cells)


def test_decide_is_deterministic_for_a_seed():
    baseline, candidate, twin = calibration.simulate(calibration.Noise("", 0.05), 1.03, 30, 1,
                                                     5)[0]
    first = stats.decide(baseline, candidate, min_speedup=1.02, twin=twin, seed=7)
    assert stats.decide(baseline, candidate, min_speedup=1.02, twin=twin, seed=7) == first
    assert first.to_dict()["n_rounds"] == 30 and set(first.to_dict()) >= {
        "decision", "reason", "speedup", "ci_low", "ci_high", "twin_ci_high", "saved_seconds"}


def test_summarize_gives_robust_statistics():
    frame = pd.DataFrame({"arm": ["a"] * 4 + ["b"] * 4, "seconds": [1, 2, 3, 4, 10, 10, 10, 10]})
    out = paired.summarize(frame, ["arm"]).set_index("arm")
    assert out.loc["a", "median"] == 2.5 and out.loc["a", "iqr"] == 1.5
    assert out.loc["b", "iqr_over_median"] == 0 and out.loc["b", "n"] == 4


def _false_alarm_and_power(confidence_per_twin: float | None, noise, *, twins: int = 8,
                           rounds: int = 12, trials: int = 150, twin_bias: float = 0.0):
    """Share of simulated runs with any twin flagged: per-twin CIs at ``confidence_per_twin``,
    or (None) :func:`paired.twin_checks` over the run's twins."""
    from dataclasses import replace

    times = calibration.simulate(replace(noise, twin_bias=twin_bias), 1.0, rounds,
                                 trials * twins, seed=7)
    flagged = 0
    for trial in range(trials):
        pairs = [(times[trial * twins + c, 0], times[trial * twins + c, 2]) for c in range(twins)]
        if confidence_per_twin is None:
            _, checks = paired.twin_checks(pairs, delta=0.02, seed=trial)
            flagged += any(check["differs"] for check in checks)
        else:
            intervals = [paired.paired_speedup(b, t, confidence=confidence_per_twin,
                                              seed=trial)[1:] for b, t in pairs]
            flagged += any(low > 1.02 or high < 0.98 for low, high in intervals)
    return flagged / trials


@pytest.mark.parametrize("noise", [calibration.Noise("bimodal 20 % at 3x", slow_share=0.2,
                                                     slow_factor=3.0),
                                   calibration.Noise("lognormal 40 %", 0.4)],
                         ids=lambda noise: noise.name)
def test_the_harness_check_keeps_a_quiet_runs_false_alarms_near_five_percent(noise):
    """Identical twins in eight cells of noisy copies at the quick profile's 12 rounds (what a
    2-core machine shows for small copies): one 95 % CI per twin calls about a third of quiet
    runs untrustworthy; the family check stays near 5 %."""
    assert _false_alarm_and_power(0.95, noise) > 0.2
    assert _false_alarm_and_power(None, noise) <= 0.10


def test_the_harness_check_still_sees_a_twin_that_differs():
    quiet = calibration.Noise("lognormal 2 %", 0.02)
    assert _false_alarm_and_power(None, quiet, twin_bias=0.10) >= 0.95


def test_twin_checks_name_bad_pairs_and_bad_parameters():
    level, checks = paired.twin_checks([([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]), ([1.0], [1.0]),
                                       ([1.0, float("nan")], [1.0, 1.0])], delta=0.02)
    assert level == pytest.approx(1 - 0.05 / 3)
    assert checks[0]["differs"] is False and checks[0]["twin_speedup"] == 1.0
    assert [c["differs"] for c in checks[1:]] == [None, None]
    assert "at least 2 rounds" in checks[1]["note"] and checks[2]["note"]
    with pytest.raises(ValueError, match="delta"):
        paired.twin_checks([], delta=0)
    with pytest.raises(ValueError, match="confidence"):
        paired.twin_checks([], delta=0.02, confidence=1.0)


def _family_of(*decisions):
    cells = [stats.Decision(d, "") for d in decisions]
    answer = (stats.PORT if stats.PORT in decisions else
              stats.CLOSE if set(decisions) == {stats.CLOSE} else stats.INCONCLUSIVE)
    return stats.FamilyDecision(answer, "", cells)


@pytest.mark.parametrize("bundle, pinning, reuse, change, words", [
    (stats.CLOSE, None, None, sequence.CLOSE_CHANGE, "saves less than delta"),
    (stats.CLOSE, stats.CLOSE, stats.INCONCLUSIVE, sequence.CLOSE_CHANGE, "not shown to save more"),
    (stats.CLOSE, stats.CLOSE, stats.PORT, sequence.PORT_REUSED, "pinning takes back what reuse"),
    (stats.INCONCLUSIVE, stats.PORT, stats.PORT, stats.INCONCLUSIVE, "not resolved"),
    (stats.PORT, stats.PORT, None, sequence.PORT_PINNED, "pinning adds a saving above delta"),
    (stats.PORT, None, stats.PORT, stats.INCONCLUSIVE, "pinning alone was not measured"),
    (stats.PORT, stats.INCONCLUSIVE, stats.PORT, stats.INCONCLUSIVE, "more rounds are needed"),
    (stats.PORT, stats.CLOSE, stats.PORT, sequence.PORT_REUSED, "reuse alone saves more than"),
    (stats.PORT, stats.CLOSE, stats.CLOSE, sequence.PORT_PINNED, "only the two together"),
    (stats.PORT, stats.CLOSE, stats.INCONCLUSIVE, stats.INCONCLUSIVE, "is unresolved"),
    (stats.PORT, stats.CLOSE, None, stats.INCONCLUSIVE, "is not measured"),
])
def test_every_answer_the_sequence_can_give(bundle, pinning, reuse, change, words):
    assert sequence.recommend(bundle, pinning, reuse)[0] == change
    assert words in sequence.recommend(bundle, pinning, reuse)[1]


def test_the_recommendation_names_the_cells_pinning_would_help():
    names = ["n=16", "n=64", "n=256"]
    helps = _family_of(stats.CLOSE, stats.INCONCLUSIVE, stats.PORT)
    change, reason = sequence.recommend(_family_of(stats.PORT), helps, stats.PORT, cells=names)
    assert change == sequence.PORT_PINNED
    helps_in, less_in, unresolved_in = reason[reason.index("(pinning"):].split("; ")
    assert helps_in.endswith(" in n=256") and less_in.endswith(" in n=16")
    assert unresolved_in.startswith("is unresolved") and unresolved_in.endswith(" in n=64)")
    change, reason = sequence.recommend(stats.PORT, _family_of(stats.CLOSE, stats.CLOSE,
                                                            stats.CLOSE), stats.PORT, cells=names)
    assert change == sequence.PORT_REUSED
    helps_in = reason[reason.index("(pinning"):].split("; ")[0]
    assert "in every cell (pinning" in reason and helps_in.endswith(" in no cell")
    straddles = _family_of(stats.CLOSE, stats.INCONCLUSIVE, stats.CLOSE)
    change, reason = sequence.recommend(stats.PORT, straddles, stats.PORT, cells=names)
    assert change == stats.INCONCLUSIVE and "is unresolved in n=64)" in reason


def test_deferring_the_wait_is_tested_last_and_only_where_the_pinned_scratch_is_ported():
    ported, why = sequence.PORT_PINNED, "the bundle ports"
    assert sequence.recommend_deferral(ported, why, stats.PORT)[0] == sequence.PORT_PINNED_DEFERRED
    assert "one step late" in sequence.recommend_deferral(ported, why, stats.PORT)[1]
    for answer in (stats.CLOSE, stats.INCONCLUSIVE, None):
        change, reason = sequence.recommend_deferral(ported, why, answer)
        assert change == sequence.PORT_PINNED and reason.startswith(why) and reason != why
    for change in (sequence.PORT_REUSED, sequence.CLOSE_CHANGE, stats.INCONCLUSIVE):
        assert sequence.recommend_deferral(change, why, stats.PORT) == (change, why)
