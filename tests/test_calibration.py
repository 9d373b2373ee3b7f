"""The decision rule's error rates on simulated timings, with negative controls that show the
calibration can fail."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from stagelab import calibration, stats

DELTA = 0.02
NOISE = dict(sigma=0.0, drift_sigma=0.0, outlier_rate=0.0, outlier_scale=3.0)


@pytest.fixture(scope="module")
def table():
    return calibration.calibrate().set_index("scenario")


def test_calibration_has_one_row_per_scenario(table):
    assert list(table.columns) == [
        "true_speedup", "sigma", "trials", "port_rate", "close_rate", "inconclusive_rate",
        "median_ci_half_width", "requirement", "met"]
    assert len(table) == 3 and (table["trials"] == 200).all()
    rates = table[["port_rate", "close_rate", "inconclusive_rate"]].sum(axis=1)
    assert np.allclose(rates, 1.0)


def test_no_effect_under_realistic_noise_rarely_ports(table):
    row = table.loc["no effect, realistic noise"]
    assert row["true_speedup"] == 1.0 and row["port_rate"] <= 0.05 and row["met"]
    assert row["median_ci_half_width"] > DELTA  # the noise is really too large to decide


def test_no_effect_under_quiet_noise_closes(table):
    row = table.loc["no effect, quiet noise"]
    assert row["true_speedup"] == 1.0 and row["median_ci_half_width"] <= DELTA / 2
    assert row["close_rate"] >= 0.80 and row["met"]


def test_a_real_speedup_of_three_deltas_ports(table):
    row = table.loc["true speedup 1 + 3 delta, quiet noise"]
    assert row["true_speedup"] == pytest.approx(1 + 3 * DELTA)
    assert row["median_ci_half_width"] <= DELTA / 2
    assert row["port_rate"] >= 0.90 and row["met"]


def _point_estimate_rule(baseline, candidate, *, min_speedup, twin, seed):
    """Ports whenever the estimate clears the minimum, ignoring its uncertainty."""
    speedup = float(np.median(baseline / candidate))
    return stats.Decision(stats.PORT if speedup > min_speedup else stats.CLOSE, "point estimate",
                          speedup=speedup, ci_low=speedup, ci_high=speedup)


def _unpaired_speedup(baseline, candidate, *, confidence=0.95, n_resamples=2000, seed=0):
    """Ratio of medians with a bootstrap that resamples each arm on its own: rounds torn apart."""
    result = sps.bootstrap((baseline, candidate),
                           lambda b, c, axis: np.median(b, axis=axis) / np.median(c, axis=axis),
                           confidence_level=confidence, n_resamples=n_resamples,
                           method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return float(np.median(baseline) / np.median(candidate)), float(low), float(high)


def test_negative_control_porting_on_the_point_estimate_breaks_requirement_1():
    row = calibration.calibrate(trials=100, rule=_point_estimate_rule).iloc[0]
    assert row["scenario"] == "no effect, realistic noise"
    assert row["port_rate"] > 0.05 and not row["met"]


def test_negative_control_an_unpaired_bootstrap_breaks_requirement_2(monkeypatch):
    monkeypatch.setattr(stats, "paired_speedup", _unpaired_speedup)  # the same rule, unpaired
    row = calibration.calibrate(trials=100).iloc[1]
    assert row["scenario"] == "no effect, quiet noise"
    assert row["close_rate"] < 0.80 and row["median_ci_half_width"] > DELTA / 2
    assert not row["met"]


def test_calibrate_is_deterministic_for_a_seed():
    first = calibration.calibrate(trials=4, seed=3)
    assert first.equals(calibration.calibrate(trials=4, seed=3))


@pytest.mark.parametrize("kwargs, message", [
    (dict(trials=0), "trials must be positive"), (dict(rounds=1), "rounds must be at least 2"),
    (dict(delta=1.5), "delta must lie in"),
])
def test_calibrate_bad_input_names_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        calibration.calibrate(**{"trials": 2, **kwargs})


def test_simulated_rounds_carry_the_true_speedup_and_share_the_drift():
    baseline, candidate, twin = calibration.simulate_rounds(
        1.5, 30, **{**NOISE, "drift_sigma": 0.3}, seed=0)
    assert baseline.shape == candidate.shape == twin.shape == (30,)
    assert np.ptp(baseline) > 0.01 * baseline.mean()  # the drift moves the rounds...
    assert np.allclose(baseline / candidate, 1.5) and np.array_equal(baseline, twin)  # ...together


def test_simulated_noise_outliers_and_seed():
    quiet = calibration.simulate_rounds(1.0, 30, **NOISE, seed=0)
    assert all(np.allclose(arm, 0.01) for arm in quiet)
    spoiled = calibration.simulate_rounds(1.0, 30, **{**NOISE, "outlier_rate": 1.0}, seed=0)
    assert all(np.allclose(arm, 0.03) for arm in spoiled)
    noisy = dict(NOISE, sigma=0.05, drift_sigma=0.05, outlier_rate=0.1)
    first = calibration.simulate_rounds(1.0, 30, **noisy, seed=1)
    assert all(np.array_equal(a, b) for a, b in
               zip(first, calibration.simulate_rounds(1.0, 30, **noisy, seed=1)))
    assert not np.array_equal(first[0], calibration.simulate_rounds(1.0, 30, **noisy, seed=2)[0])
    assert not np.array_equal(first[0], first[2])  # the twin has its own noise


@pytest.mark.parametrize("name, value", [("true_speedup", 0.0), ("rounds", 0), ("sigma", -0.1),
                                         ("outlier_rate", 1.5), ("base_seconds", 0.0)])
def test_simulate_rounds_bad_input_names_the_parameter(name, value):
    arguments = {"true_speedup": 1.0, "rounds": 5, **NOISE, "seed": 0, name: value}
    with pytest.raises(ValueError, match=f"{name} is out of range"):
        calibration.simulate_rounds(**arguments)
