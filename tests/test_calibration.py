"""The decision rule's error rates on simulated cells (issue 18's requirements), with negative
controls that show the calibration can fail."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stagelab.analyse import calibration, calibration_cases, sequence, stats
from stagelab.core import design

DELTA = 0.02
BAR = 1 / (1 - DELTA)
QUIET, NOISY = calibration.NOISES[0], calibration.NOISES[1]  # lognormal 2 % and 5 %
assert (QUIET.sigma, NOISY.sigma) == (0.02, 0.05)


def _row(noise, truth, *, trials, adaptive=False, rule=stats.decide_family, rounds=30):
    table = calibration.calibrate(calibration.Plan(trials=trials, rounds=rounds), noises=[noise],
                                  truths=[truth], adaptive=[adaptive], rule=rule)
    assert len(table) == 1
    return table.iloc[0]


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_family_false_port_stays_under_5_percent_with_every_cell_at_the_bar():
    # at the rounds a PORT needs, with enough trials that the Wilson interval can show it
    row = _row(QUIET, "at the bar", trials=1000, rounds=design.TAIL_ROUNDS)
    assert row["true_speedup"] == pytest.approx(BAR) and row["cells"] == 6
    assert row["family_port"] > 0  # the test can fail: PORT is reachable at these rounds
    assert row["family_port_high"] <= 0.05 and row["cell_port_high"] <= 0.05 and row["met"]


def test_family_closes_at_least_80_percent_at_1_with_2_percent_noise_at_60_rounds():
    # 60, not 30: at 30 rounds the dependence's own estimate leaves the CI about 17 degrees of
    # freedom (design.effective_df), and family CLOSE is reached in 79 % of 200 trials
    row = _row(QUIET, "1.00", trials=200, rounds=60)
    assert row["rounds"] == "60" and row["median_rounds"] == 60
    assert row["family_close_low"] >= 0.80 and row["family_port"] == 0 and row["met"]


@pytest.mark.slow  # a long simulation of the rule: make test (family_closes stays fast)
def test_family_ports_at_least_90_percent_at_3_delta_with_5_percent_noise_until_resolved():
    row = _row(NOISY, "3 delta", trials=100, adaptive=True)
    assert row["true_speedup"] == pytest.approx(1 / (1 - 3 * DELTA))
    assert design.TAIL_ROUNDS <= row["median_rounds"] < 400 and row["at_cap"] == 0
    assert row["rounds"] == f"until resolved, {design.TAIL_ROUNDS}-400"
    assert row["family_port_low"] >= 0.90


def _any_cell_ports(cells, **kwargs):
    """Negative control: every cell decided alone, no unseen stall charged, the family ports
    when any cell does."""
    decisions = [stats.decide(c["baseline"], c["candidate"], min_speedup=c["min_speedup"],
                              twin=c["twin"], stall_allowance=1.0, **kwargs) for c in cells]
    answers = {d.decision for d in decisions}
    answer = (stats.PORT if stats.PORT in answers else
              stats.CLOSE if answers == {stats.CLOSE} else stats.INCONCLUSIVE)
    return stats.FamilyDecision(answer, "any cell", decisions)


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_negative_control_without_multiplicity_control_the_family_ports_too_often():
    def any_cell_alone(cells, **kwargs):
        return _any_cell_ports(cells, **kwargs, port_min_rounds=2)

    row = _row(QUIET, "at the bar", trials=300, rule=any_cell_alone, rounds=design.TAIL_ROUNDS)
    assert row["family_port"] > 0.05 and not row["met"]


def test_negative_control_a_fixed_order_turns_a_position_effect_into_a_fixed_bias(monkeypatch):
    order_effect = next(n for n in calibration.NOISES if n.first_penalty)
    balanced = _row(order_effect, "1.00", trials=100)
    assert balanced["family_port"] == 0 and balanced["family_close"] > 0.5

    def baseline_always_first(trials, rounds, seed):  # the baseline pays the penalty each round
        return np.broadcast_to(np.array([0, 1, 2])[None, :, None], (trials, 3, rounds)).copy()

    monkeypatch.setattr(calibration, "positions", baseline_always_first)
    biased = _row(order_effect, "1.00", trials=100)
    # CLOSE becomes unreachable at a true 1.00 (the A/A twin, not penalised, flags the harness)
    assert biased["family_close"] < 0.2
    slowed = calibration.simulate(order_effect, 1.0, 30, 50, seed=0)
    assert np.mean(slowed[:, 0]) / np.mean(slowed[:, 1]) > 1.02  # a 3 % bias no rerun removes


def test_simulated_positions_are_balanced_per_trial():
    place = calibration.positions(4, 31, seed=2)
    assert place.shape == (4, 3, 31)
    for trial in range(4):
        assert sorted(place[trial, :, 0]) == [0, 1, 2]
        for arm in range(3):
            counts = np.bincount(place[trial, arm], minlength=3)
            assert counts.max() - counts.min() <= 1


def test_simulation_carries_the_true_speedup_and_is_seeded():
    flat = calibration.Noise("none", sigma=0.0)
    times = calibration.simulate(flat, 1.5, 20, 3, seed=0)
    assert times.shape == (3, 3, 20)
    assert np.allclose(times[:, 0] / times[:, 1], 1.5) and np.allclose(times[:, 0], times[:, 2])
    first = calibration.simulate(NOISY, 1.0, 20, 3, seed=1)
    assert np.array_equal(first, calibration.simulate(NOISY, 1.0, 20, 3, seed=1))
    assert not np.array_equal(first, calibration.simulate(NOISY, 1.0, 20, 3, seed=2))
    biased = calibration.simulate(calibration.Noise("twin", sigma=0.0, twin_bias=0.01), 1.0, 5,
                                  1, seed=0)
    assert np.allclose(biased[0, 2] / biased[0, 0], 1.01)


def test_the_vectorised_half_width_is_the_benchs_own():
    rng = np.random.default_rng(0)
    baseline, candidate = np.exp(rng.normal(0, 0.05, (3, 40))), np.exp(rng.normal(0, 0.05, (3, 40)))
    ours = calibration.half_widths(baseline, candidate, 0.95)
    theirs = [design.speedup_half_width(list(b), list(c)) for b, c in zip(baseline, candidate)]
    assert np.allclose(ours, theirs)


def test_stop_rounds_follow_the_benchs_checks():
    rng = np.random.default_rng(1)
    baseline = np.exp(rng.normal(0, 0.05, (8, 400)))
    candidate = np.exp(rng.normal(0, 0.05, (8, 400))) / np.linspace(1.0, 1.08, 8)[:, None]
    stops = calibration.stop_rounds(baseline, candidate, rounds=30, max_rounds=400, bar=1.02)
    assert len(set(stops)) > 2  # the stop follows the distance to the bar
    for b, c, n in zip(baseline, candidate, stops):
        assert (n - 30) % 5 == 0 or n == 400
        assert design.resolved(list(b[:n]), list(c[:n]), 1.02) or n == 400
        if n > 30:
            assert not design.resolved(list(b[:n - 5]), list(c[:n - 5]), 1.02)
    capped = calibration.stop_rounds(baseline, candidate, rounds=30, max_rounds=50, bar=1.0)
    assert capped.max() <= 50


def test_calibrate_has_one_row_per_setting_and_is_deterministic():
    table = calibration.calibrate(calibration.Plan(trials=3, cells=2),
                                  noises=calibration.NOISES[:2], truths=["1.00", "3 delta"],
                                  adaptive=[False])
    assert len(table) == 4 and list(table["noise"]) == ["lognormal 2 %"] * 2 + ["lognormal 5 %"] * 2
    assert {"cell_port", "family_port", "family_close", "median_rounds", "requirement",
            "met"} <= set(table.columns)
    again = calibration.calibrate(calibration.Plan(trials=3, cells=2),
                                  noises=calibration.NOISES[:2], truths=["1.00", "3 delta"],
                                  adaptive=[False])
    assert table.equals(again)


@pytest.mark.parametrize("kwargs, message", [
    (dict(trials=0), "trials must be positive"), (dict(rounds=1), "rounds must be at least 2"),
    (dict(delta=0.5), "delta must lie in"), (dict(max_rounds=10), "max_rounds .* at least"),
])
def test_calibrate_bad_input_names_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        calibration.Plan(**{"trials": 2, **kwargs})
    with pytest.raises(ValueError, match="truths: unknown"):
        calibration.calibrate(calibration.Plan(trials=2), truths=["2.00"])


def test_calibrate_takes_its_plan_as_one_frozen_value():
    """Before: calibrate took 12 parameters; the plan is one frozen value, and no more than ten
    remain."""
    assert len(inspect.signature(calibration.calibrate).parameters) <= 10
    with pytest.raises(dataclasses.FrozenInstanceError):
        calibration.Plan().trials = 3  # type: ignore[misc]


def test_the_summary_names_the_worst_false_port_and_the_rows_short_of_their_requirement():
    table = calibration.calibrate(calibration.Plan(trials=3, cells=2),
                                  noises=calibration.NOISES[:1], adaptive=[False])
    table.loc[1, "family_port"] = 0.5  # the worst false PORT, at the bar
    table.loc[2, ["met", "family_port"]] = [False, 0.5]  # a row short of its requirement
    sentence = calibration.summary(table.to_dict("records"))
    head, short = sentence.split("; ")[0], sentence.split("; ")[2]
    assert all(said in head for said in ("30 rounds", "3 simulated families", "2 cells", "3 rows",
                                         "50.0%"))  # the worst false PORT
    assert "short" in short and "lognormal 2 %, 3 delta, 30 rounds (family PORT 50%" in short
    # 3 trials cannot show a rate under 5 % on its Wilson interval: those rows are not judged,
    # whatever their stored verdict says
    table.loc[0, "met"] = False
    sentence = calibration.summary(table.to_dict("records"))
    assert "1.00, 30 rounds" not in sentence
    assert "; 2 rows not judged: 3 trials" in sentence
    assert f"({calibration.MIN_TRIALS_FOR_5_PERCENT} or more" in sentence


CANDIDATE_STALLS, BASELINE_STALLS = calibration.NOISES[-2], calibration.NOISES[-1]


def test_stalls_fall_in_one_arm_and_the_mean_keeps_the_truth():
    times = calibration.simulate(CANDIDATE_STALLS, 1.0, 400, 200, seed=3)
    slow = times[:, 1] > 2.5 * np.median(times[:, 1])
    assert 0.015 < slow.mean() < 0.025 and (times[:, 0] < 0.013).all()  # 2 % stalls, candidate only
    assert np.mean(times[:, 0]) / np.mean(times[:, 1]) == pytest.approx(1.0, abs=0.01)
    swapped = calibration.simulate(BASELINE_STALLS, 1.0, 400, 200, seed=3)
    assert (swapped[:, 1] < 0.013).all() and (swapped[:, 0] > 0.025).mean() > 0.015


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_a_net_loss_candidate_with_rare_stalls_does_not_port():
    # the issue's case: 5 % faster in most rounds, 4x slower in 2 %: a net loss (about 0.99x)
    net_loss = 1.05 / (1 + 0.02 * 3)
    rate = calibration.family_port_rate(CANDIDATE_STALLS, [net_loss] * 6,
                                        rounds=design.TAIL_ROUNDS, trials=300, seed=1)
    assert rate["family_port_high"] <= 0.05


def test_negative_control_on_few_rounds_any_cell_ports_the_net_loss():
    net_loss = 1.05 / (1 + 0.02 * 3)

    def any_cell_on_30_rounds(cells, **kwargs):
        return _any_cell_ports(cells, **kwargs, port_min_rounds=2)

    rate = calibration.family_port_rate(CANDIDATE_STALLS, [net_loss] * 6, rounds=30,
                                        trials=100, seed=1, rule=any_cell_on_30_rounds)
    assert rate["family_port_low"] > 0.5  # a sample of 30 rounds usually holds no stall


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_one_cell_slower_by_1_5_delta_keeps_five_cells_saving_3_delta_from_porting():
    slower, saving = 1 / (1 + 1.5 * DELTA), 1 / (1 - 3 * DELTA)
    rate = calibration.family_port_rate(QUIET, [slower] + [saving] * 5,
                                        rounds=design.TAIL_ROUNDS, trials=300, seed=2)
    assert rate["family_port_high"] <= 0.05
    alone = calibration.family_port_rate(QUIET, [saving] * 6, rounds=design.TAIL_ROUNDS,
                                         trials=50, seed=2)
    assert alone["family_port"] >= 0.9  # the same five cells without it port


def test_the_stall_rows_are_shown_in_both_directions():
    table = calibration.calibrate(calibration.Plan(trials=20, rounds=30, cells=2),
                                  noises=[CANDIDATE_STALLS, BASELINE_STALLS], truths=["1.00"],
                                  adaptive=[False])
    assert list(table["noise"]) == ["candidate stalls 2 % at 4x", "baseline stalls 2 % at 4x"]


def test_met_is_judged_on_the_wilson_interval():
    assert calibration.wilson(0, 300)[1] < 0.0127 and calibration.wilson(29, 1000)[1] < 0.05
    assert calibration.wilson(9, 300)[1] > 0.05  # 3 % of 300: not yet shown under 5 %


AT_BAR, SAVES_3_DELTA = 1 / (1 - DELTA), 1 / (1 - 3 * DELTA)


@pytest.mark.slow  # make check's fast lane leaves it to make test
@pytest.mark.parametrize("reuse, pinning, wrong, trials", [
    (1.0, AT_BAR, "port the pinned scratch", 300),  # the bundle at the bar, all of it pinning's
    (AT_BAR, 1.0, "port a reused pageable buffer", 300),  # the bundle at the bar: reuse's
    # the bundle ports; pinning sits at the bar: near the level, so enough trials to show it
    (SAVES_3_DELTA, AT_BAR, "port the pinned scratch", 1000),
])
def test_each_question_ports_falsely_at_most_5_percent_at_the_bar(reuse, pinning, wrong, trials):
    rates = calibration.recommendation_rates(reuse, pinning, rounds=design.TAIL_ROUNDS,
                                             trials=trials, cells=3, seed=4)
    ports = sum(v for k, v in rates.items() if k.startswith("port"))
    assert calibration.wilson(round(rates.get(wrong, 0.0) * trials), trials)[1] <= 0.05
    assert calibration.wilson(round(ports * trials), trials)[1] <= 0.05 or reuse > AT_BAR


@pytest.mark.slow  # a long simulation of the rule: make test (family_closes stays fast)
def test_a_clear_split_is_recommended_as_such():
    pinned = calibration.recommendation_rates(1.0, SAVES_3_DELTA, rounds=design.TAIL_ROUNDS,
                                              trials=30, cells=3, seed=5)
    assert pinned.get("port the pinned scratch", 0) >= 0.9
    reused = calibration.recommendation_rates(SAVES_3_DELTA, 1.0, rounds=design.TAIL_ROUNDS,
                                              trials=30, cells=3, seed=6)
    assert reused.get("port a reused pageable buffer", 0) >= 0.9


def test_too_few_trials_to_show_5_percent_are_not_judged_and_said_so():
    """With no false PORT at all, 20 trials still leave a Wilson interval above 5 %: such rows
    are not judged (neither met nor short), and the summary says why instead of 'none short'."""
    lowest = next(n for n in range(1, 200) if calibration.wilson(0, n)[1] <= 0.05)
    assert calibration.MIN_TRIALS_FOR_5_PERCENT == lowest
    table = calibration.calibrate(calibration.Plan(trials=20, rounds=12, cells=2),
                                  noises=calibration.NOISES[:1], truths=["1.00"],
                                  adaptive=[False])
    assert table["met"].isna().all()
    assert table["requirement"].str.startswith("none judged: 20 trials").all()
    said = calibration.summary(table.to_dict("records"))
    assert "1 rows not judged: 20 trials" in said and f"({lowest} or more" in said


DONE_ROUNDS = 160  # the issue's families: six cells at 160 rounds


def _blocks_on_doubt(cells, **kwargs):
    """Negative control: the tail blocks unless shown not heavier (the rule before)."""
    family = stats.decide_family(cells, **kwargs)
    if family.decision == stats.PORT and any(c.tail != stats.TAIL_NOT_HEAVIER
                                             for c in family.cells):
        return stats.FamilyDecision(stats.INCONCLUSIVE, "a tail is not shown harmless",
                                    family.cells)
    return family


@pytest.mark.slow  # a long simulation of the rule: make test (family_closes stays fast)
def test_four_saving_cells_beside_two_null_cells_port_at_least_80_percent():
    """Before: every failure was a null cell's p99 bound merely wide (56 % at 2 % noise)."""
    speedups = [SAVES_3_DELTA] * 4 + [1.0] * 2
    rate = calibration.family_port_rate(QUIET, speedups, rounds=DONE_ROUNDS, trials=60, seed=5)
    assert rate["family_port_low"] >= 0.80
    doubt = calibration.family_port_rate(QUIET, speedups, rounds=DONE_ROUNDS, trials=60, seed=5,
                                         rule=_blocks_on_doubt)
    assert doubt["family_port_high"] < 0.80  # negative control: blocking on doubt fails it


T3_SHARED = calibration.Noise("t(3) 3 % on every arm", 0.03, t_df=3.0)


@pytest.mark.slow  # a long simulation of the rule (37 s under load): make test
def test_six_saving_cells_under_heavy_tails_on_every_arm_port_at_least_80_percent():
    rate = calibration.family_port_rate(T3_SHARED, [SAVES_3_DELTA] * 6, rounds=DONE_ROUNDS,
                                        trials=60, seed=6)
    assert rate["family_port_low"] >= 0.80
    doubt = calibration.family_port_rate(T3_SHARED, [SAVES_3_DELTA] * 6, rounds=DONE_ROUNDS,
                                         trials=60, seed=6, rule=_blocks_on_doubt)
    assert doubt["family_port_high"] < 0.80


@pytest.mark.slow  # a long simulation of the rule: make test (family_closes stays fast)
def test_reuse_3_delta_with_pinning_2_delta_recommends_the_pinned_scratch():
    trials = 60
    rates = calibration.recommendation_rates(SAVES_3_DELTA, 1 / (1 - 2 * DELTA),
                                             rounds=DONE_ROUNDS, trials=trials, seed=7)
    pinned = round(rates.get(sequence.PORT_PINNED, 0.0) * trials)
    reused = round(rates.get(sequence.PORT_REUSED, 0.0) * trials)
    assert calibration.wilson(pinned, trials)[0] >= 0.80
    assert reused == 0  # at most 5 %: 60 trials cannot show it on a Wilson interval (1000 can)


def test_deferring_the_wait_is_recommended_only_where_it_saves():
    """The fourth question in the calibration: deferring the pinned scratch's wait, asked last
    and only where the pinned scratch is ported (two cells, 160 rounds)."""
    kwargs = dict(rounds=DONE_ROUNDS, trials=12, cells=2, seed=9)
    saves = calibration.recommendation_rates(SAVES_3_DELTA, SAVES_3_DELTA, SAVES_3_DELTA,
                                             **kwargs)
    assert saves.get(sequence.PORT_PINNED_DEFERRED, 0.0) >= 0.9
    none = calibration.recommendation_rates(SAVES_3_DELTA, SAVES_3_DELTA, 1.0, **kwargs)
    assert none.get(sequence.PORT_PINNED, 0.0) >= 0.9
    assert sequence.PORT_PINNED_DEFERRED not in none
    unasked = calibration.recommendation_rates(1.0, 1.0, SAVES_3_DELTA, **kwargs)
    assert sequence.PORT_PINNED_DEFERRED not in unasked  # no pinned scratch, no deferring


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_reuse_3_delta_with_pinning_2_delta_recommends_a_reused_buffer_at_most_5_percent():
    rates = calibration.recommendation_rates(SAVES_3_DELTA, 1 / (1 - 2 * DELTA),
                                             rounds=DONE_ROUNDS, trials=300, seed=8)
    assert calibration.wilson(round(rates.get(sequence.PORT_REUSED, 0.0) * 300), 300)[1] <= 0.05


@pytest.mark.slow  # make check's fast lane leaves it to make test
@pytest.mark.parametrize("speedups, noise", [
    ([AT_BAR] * 6, QUIET),  # six cells at the bar
    ([1.05 / (1 + 0.02 * 3)] * 6, CANDIDATE_STALLS),  # a net loss: 4x stalls in 2 % of rounds
    ([1 / (1 + 1.5 * DELTA)] + [SAVES_3_DELTA] * 5, QUIET),  # one cell 1.5 delta slower
    ([AT_BAR], CANDIDATE_STALLS),  # one cell at the bar whose candidate stalls 4x in 2 % of rounds
])
def test_what_must_not_port_ports_at_most_5_percent_at_160_rounds(speedups, noise):
    rate = calibration.family_port_rate(noise, speedups, rounds=DONE_ROUNDS, trials=1000, seed=9)
    assert rate["family_port"] <= 0.05 and rate["family_port_high"] <= 0.07


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_rounds_until_resolved_keep_six_cells_at_the_bar_from_porting():
    """Optional stopping: the stop looks at the effect, so its false PORT is measured, up to
    the gate's own cap of rounds."""
    rate = calibration.family_port_rate(QUIET, [AT_BAR] * 6, rounds=DONE_ROUNDS, trials=1000,
                                        seed=10, max_rounds=calibration_cases.gate_cap())
    assert rate["median_rounds"] > DONE_ROUNDS  # near the bar it goes on
    assert rate["family_port"] <= 0.05 and rate["family_port_high"] <= 0.07


FEW_CASES = ("6 cells at the bar, lognormal 2 %", "reuse 0.5 delta, no pinning effect: close",
             "carry-over: the call after the candidate 5% slower, 6 cells at the bar")


def test_the_cases_table_has_a_row_per_case_with_its_wilson_interval_and_requirement():
    names = [spec[0] for spec in calibration_cases._case_specs(DELTA)]
    assert len(names) == len(set(names)) == 36 and set(FEW_CASES) <= set(names)
    table = calibration_cases.cases(trials=2, until_resolved=False, only=FEW_CASES)
    assert len(table) == 3 and set(table["rounds"]) == {"160"} and (table["trials"] == 2).all()
    assert {"case", "rate", "rate_low", "rate_high", "requirement", "met"} <= set(table.columns)
    assert (table["rate_low"] <= table["rate"]).all() and (table["rate"] <= table["rate_high"]).all()
    at_most = table[table["requirement"] == "<= 0.05"]
    assert at_most["met"].isna().all()  # 2 trials cannot show a rate under 5 %
    with pytest.raises(ValueError, match="trials must be positive"):
        calibration_cases.cases(trials=0)


def test_the_docs_cases_table_is_the_generated_one():
    """The table in docs/decision-rule.md is what scripts/calibrate_rule.py wrote from the rows
    of docs/calibration.csv: never typed. Every case of the code is in it, with its commit and
    the trials its requirement needs."""
    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "decision-rule.md").read_text()
    shown = page.split(calibration_cases.TABLE_BEGIN)[1].split(calibration_cases.TABLE_END)[0]
    assert shown.strip().startswith("Generated by `python3 scripts/calibrate_rule.py`")
    rows = pd.read_csv(root / "docs" / "calibration.csv")
    rows["met"] = rows["met"].map({True: True, False: False, "True": True, "False": False})
    assert shown.strip() == calibration_cases.cases_markdown(rows).strip()
    assert {spec[0] for spec in calibration_cases._case_specs(DELTA)} == set(rows["case"])
    assert rows["commit"].notna().all()
    recomputed = calibration_cases.with_trials_needed(rows)["trials_needed"]
    assert rows["trials_needed"].astype("Int64").equals(recomputed)


def _table(case: str = "c", rate: float = 0.0, commit: str = "abc1234") -> pd.DataFrame:
    return pd.DataFrame([{"case": case, "rounds": "160", "median_rounds": 160.0, "trials": 80,
                          "rate": rate, "rate_low": 0.0, "rate_high": 0.046,
                          "requirement": "<= 0.05", "met": True, "commit": commit}])


def test_the_table_is_written_between_its_markers_and_nowhere_else():
    page = f"before\n{calibration_cases.TABLE_BEGIN}\nold\n{calibration_cases.TABLE_END}\nafter"
    written = calibration_cases.with_table(page, _table(), "origin")
    assert written.startswith("before\n") and written.endswith("\nafter") and "old" not in written
    assert "| c | 160 | 160 | 80 | 0.0% [0.0%, 4.6%] | <= 0.05 | met | 73 |" in written
    assert "at commit abc1234" in calibration_cases.cases_markdown(_table())
    with pytest.raises(ValueError, match="markers"):
        calibration_cases.with_table("no markers", _table(), "origin")


@pytest.mark.parametrize("rate, requirement, needed", [
    (0.0, "<= 0.05", calibration.MIN_TRIALS_FOR_5_PERCENT),  # no hit: 73 trials show it
    (0.06, "<= 0.05", None), (0.05, "<= 0.05", None),  # on the wrong side: never
    (0.749, ">= 0.80", None), (0.2, "none (reported)", None), (0.2, "", None),
])
def test_trials_needed_at_the_edges(rate, requirement, needed):
    assert calibration_cases.trials_needed(rate, requirement) == needed


@pytest.mark.parametrize("rate, requirement", [(0.025, "<= 0.05"), (0.041, "<= 0.05"),
                                               (0.9, ">= 0.80"), (0.8125, ">= 0.80")])
def test_trials_needed_is_the_fewest_that_show_the_rate(rate, requirement):
    """At the trials needed the Wilson interval is on the right side; one fewer, it is not."""
    n = calibration_cases.trials_needed(rate, requirement)
    assert n is not None and n > 1
    sign, bound = requirement.split()
    def shown(trials):
        low, high = calibration_cases._wilson_edges(rate, trials)
        return high <= float(bound) if sign == "<=" else low >= float(bound)
    assert shown(n) and not shown(n - 1)
    low, high = calibration.wilson(round(rate * 10_000), 10_000)  # scipy's, at many trials
    assert calibration_cases._wilson_edges(rate, 10_000) == pytest.approx((low, high), abs=1e-4)


def test_a_rerun_case_replaces_its_rows_and_keeps_the_others_in_the_codes_order():
    names = [spec[0] for spec in calibration_cases._case_specs(DELTA)]
    existing = pd.concat([_table(names[2], commit="old"), _table(names[0], commit="old"),
                          _table("a case no longer in the code", commit="old")])
    fresh = pd.concat([_table(names[2], rate=0.01, commit="new")] * 2)
    merged = calibration_cases.merged(existing, fresh)
    assert list(merged["case"]) == [names[0], names[2], names[2]]
    assert list(merged["commit"]) == ["old", "new", "new"]
    assert "at commit new, old" in calibration_cases.origin(merged)


ISSUE_49_BARS = (
    "carry-over: the call after the candidate 2% slower, 6 cells at the bar",
    "carry-over: the call after the fresh vector 5% slower, 6 cells at the bar",
    "AR(1) within each arm across rounds, phi 0.7, 6 cells at the bar",
    "candidate 3x slower in 1 of 200 rounds, mean at the bar, 6 cells",
    "fresh vector 1.5x slower in 30 % of its calls, 6 cells saving 2 delta",
    "reuse 3 delta, pinning 0.5 delta: a reused buffer",
    "reuse 0.5 delta, no pinning effect: close")


@pytest.mark.slow  # the calibration's representatives, in make test
def test_the_noise_a_gpu_node_makes_keeps_the_rules_stated_error():
    """Before (issue 49): carry-over of 2 % ported six cells at the bar 44 %, AR(1) at 0.7
    45.8 %, a 1-in-200 stall 51 %; a bimodal baseline kept a 2 delta saving from porting (0 of
    18); a reused buffer at 0.5 delta of pinning was out of reach at the gate's cap."""
    table = calibration_cases.cases(trials=40, only=ISSUE_49_BARS, seed=3)
    assert len(table) == len(ISSUE_49_BARS) + 7  # until resolved near the bar and at 2 delta
    for row in table.itertuples():
        sign, level = row.requirement.split()
        if sign == "<=":  # consistent with the stated 5 %: its Wilson interval reaches under it
            assert row.rate_low <= float(level) and row.rate <= 0.10, row.case
        else:
            assert row.rate_high >= float(level), row.case


@pytest.mark.parametrize("rate, trials, requirement, met", [
    (1.0, 20, ">= 0.80", True), (0.9, 20, ">= 0.80", False), (0.0, 100, "<= 0.05", True),
    (0.03, 100, "<= 0.05", False), (0.0, 50, "<= 0.05", None), (0.5, 10, "", None)])
def test_a_case_is_met_only_on_its_wilson_interval(rate, trials, requirement, met):
    assert calibration_cases._judged(rate, trials, requirement)[2] == met
