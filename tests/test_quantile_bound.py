"""The p99 step bound (issue 49): distribution-free, honest about the rounds it needs, and in
every decisive cell of the verdict. The step rows are drawn by this module's own generator."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from scipy import stats as sps

from stagelab.analyse import quantile_bound, verdict
from stagelab.core import design, records, schema

V, K = 152_064, 5


def test_the_p99_needs_299_rounds_at_95_percent_and_no_fewer():
    assert quantile_bound.min_rounds() == 299
    assert 1 - 0.99 ** 298 < 0.95 <= 1 - 0.99 ** 299
    assert quantile_bound.upper_order(298) is None
    assert quantile_bound.upper_order(299) == 299  # the slowest round, only just


@pytest.mark.parametrize("rounds", [299, 500, 1000, 5000])
def test_the_order_is_the_smallest_that_covers(rounds):
    k = quantile_bound.upper_order(rounds)
    assert k is not None and k <= rounds
    assert sps.binom.cdf(k - 1, rounds, 0.99) >= 0.95
    assert sps.binom.cdf(k - 2, rounds, 0.99) < 0.95  # one lower would not cover


def test_the_bound_covers_the_true_p99_at_least_95_percent_of_the_time():
    """Exponential steps (a long tail): over 2000 samples of 400 rounds, the bound lies at or
    above the true p99 in at least 95 % of them (judged on the Wilson interval's high end, so
    the test fails if the order were one too low)."""
    rng = np.random.default_rng(3)
    true_p99 = -np.log(0.01)  # exponential, scale 1
    samples = rng.exponential(1.0, (2000, 400))
    covered = sum(quantile_bound.bound(s, "arm").upper_ms / 1e3 >= true_p99 for s in samples)
    high = sps.binomtest(int(covered), 2000).proportion_ci(method="wilson").high
    assert high >= 0.95 and covered / 2000 < 0.995  # holds, and is not trivially wide


def test_fewer_rounds_say_what_cannot_be_excluded():
    found = quantile_bound.bound(np.full(160, 0.01), "seed_pinned")
    assert found.upper_ms is None and found.order is None and found.min_rounds == 299
    assert found.stall_unexcluded == design.rarest_unexcluded(160) == 53
    assert found.slowest_bounds == pytest.approx(0.05 ** (1 / 160))
    assert "cannot be excluded" in found.words and "1 in 53" in found.words
    assert quantile_bound.bound([], "seed_pinned").rounds == 0


def test_a_stall_of_1_in_50_rounds_shows_in_the_bound_once_the_rounds_allow_it():
    """Own generator: the candidate 3x slower in 1 of 50 rounds (its p99 is a stall). At 600
    rounds the bound reaches the stall; at 160 there is no bound, only what cannot be
    excluded."""
    rng = np.random.default_rng(7)
    steps = 0.01 * np.exp(0.02 * rng.standard_normal(600)) * np.where(
        rng.random(600) < 1 / 50, 3.0, 1.0)
    long = quantile_bound.bound(steps, "seed_pinned")
    assert long.upper_ms is not None and long.upper_ms > 25.0
    assert quantile_bound.bound(steps[:160], "seed_pinned").upper_ms is None


@pytest.mark.parametrize("bad", [dict(quantile=1.0), dict(confidence=0.0)])
def test_bad_levels_raise(bad):
    with pytest.raises(ValueError, match="must lie in"):
        quantile_bound.min_rounds(**bad)


def _rows(rounds: int, speedup: float, seed: int = 0) -> list[dict]:
    """Own generator of one step cell: the seed arm, its twin and the pinned arm ``speedup``
    times faster, a shared lognormal drift per round."""
    rng = np.random.default_rng(seed)
    out = []
    for arm, level in (("seed_pageable", 1.0), ("seed_pageable~aa", 1.0),
                       ("seed_pinned", 1 / speedup)):
        for r in range(rounds):
            seconds = 0.02 * level * np.exp(0.01 * rng.standard_normal())
            out.append(dict(experiment="step", arm=arm, stage="total", round=r,
                            seconds=float(seconds), rows=64, vocab=V, k=K))
    return out


@pytest.mark.parametrize("rounds, bounded", [(160, False), (320, True)])
def test_every_decisive_cell_carries_its_p99_step_and_follows_the_schema(tmp_path, rounds,
                                                                          bounded):
    schema.write_table(schema.make_rows(_rows(rounds, 1.1)), tmp_path, "step")
    built = verdict.build_verdict(tmp_path, decisive_rows=[64], decisive_vocabs=[V],
                                  decisive_ks=[K])
    p99 = built["decisive"][0]["p99_step"]
    assert p99["arm"] == "seed_pinned" and p99["rounds"] == rounds
    assert (p99["upper_ms"] is not None) is bounded
    if bounded:
        assert p99["upper_ms"] >= p99["point_ms"] and p99["order"] == 320
    else:
        assert p99["stall_unexcluded"] == design.rarest_unexcluded(rounds)
    jsonschema.validate(json.loads(json.dumps(built)), records.schema("verdict"))
