"""Interleaved timing and the statistics of the gate."""

from __future__ import annotations

import numpy as np
import pytest

from stagelab import bench, stats


def test_interleaved_discards_warmup_and_shuffles_each_round():
    calls: list[tuple[str, int]] = []
    arms = {name: (lambda r, name=name: calls.append((name, r))) for name in "abcd"}
    records = bench.interleaved(arms, repeats=5, warmup=2, seed=3)
    assert len(calls) == 4 * 7 and len(records) == 4 * 5
    assert sorted({r["repeat"] for r in records}) == [0, 1, 2, 3, 4]
    orders = {tuple(name for name, r in calls if r == i) for i in range(7)}
    assert len(orders) > 1, "the order must change between rounds"
    again: list[tuple[str, int]] = []
    bench.interleaved({n: (lambda r, n=n: again.append((n, r))) for n in "abcd"}, repeats=5,
                      warmup=2, seed=3)
    assert again == calls  # the same seed gives the same order


def test_interleaved_records_stages_an_arm_reports():
    records = bench.interleaved({"x": lambda r: {"copy": 0.5, "gather": 0.25}}, repeats=2,
                                warmup=0)
    assert sorted((r["stage"], r["repeat"]) for r in records) == [
        ("copy", 0), ("copy", 1), ("gather", 0), ("gather", 1), ("total", 0), ("total", 1)]
    assert {r["seconds"] for r in records if r["stage"] == "copy"} == {0.5}


@pytest.mark.parametrize("kwargs, message", [({"repeats": 0}, "repeats must be positive"),
                                             ({"warmup": -1}, "warmup must be >= 0")])
def test_interleaved_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench.interleaved({"a": lambda r: None}, **{"repeats": 1, **kwargs})


rng = np.random.default_rng(0)
BASE = 10.0 * (1 + 0.01 * rng.standard_normal(40))
TWIN = 10.0 * (1 + 0.01 * rng.standard_normal(40))


def test_ratio_ci_brackets_a_known_speedup_and_is_deterministic():
    fast = BASE / 2.0 * (1 + 0.01 * rng.standard_normal(40))
    point, low, high = stats.ratio_ci(BASE, fast, seed=1)
    assert 1.9 < low < point < high < 2.1
    assert stats.ratio_ci(BASE, fast, seed=1) == (point, low, high)


def test_noise_band_of_an_aa_pair_is_small():
    assert 0 < stats.noise_band(BASE, TWIN) < 0.02


@pytest.mark.parametrize("candidate_scale, min_speedup, expected, words", [
    (0.5, 1.0, stats.PORT, "lies above"),
    (1.0, 1.0, stats.CLOSE, "within the noise band"),
    (1.5, 1.0, stats.CLOSE, "candidate is slower"),
    (0.9, 1.5, stats.CLOSE, "real but below the minimum"),
    (1 / 1.5, 1.5, stats.INCONCLUSIVE, "straddles"),
])
def test_decide_follows_the_rules(candidate_scale, min_speedup, expected, words):
    candidate = TWIN * candidate_scale
    decision = stats.decide(BASE, candidate, noise=0.02, min_speedup=min_speedup)
    assert decision.decision == expected and words in decision.reason
    assert decision.n_baseline == 40 and decision.saved_seconds == pytest.approx(
        np.median(BASE) - np.median(candidate))


def test_decide_is_inconclusive_without_enough_samples():
    assert stats.decide(BASE[:3], TWIN[:3], noise=0.01).reason.startswith("fewer samples")
    assert stats.decide(BASE, [], noise=0.01).reason == "the candidate arm was not measured"


def test_summarize_gives_robust_statistics():
    import pandas as pd

    frame = pd.DataFrame({"arm": ["a"] * 4 + ["b"] * 4, "seconds": [1, 2, 3, 4, 10, 10, 10, 10]})
    out = stats.summarize(frame, ["arm"]).set_index("arm")
    assert out.loc["a", "median"] == 2.5 and out.loc["a", "iqr"] == 1.5
    assert out.loc["b", "iqr_over_median"] == 0 and out.loc["b", "n"] == 4
