"""Interleaved timing (the statistics are tested in test_stats.py)."""

from __future__ import annotations

import pytest

from stagelab import bench


def test_interleaved_discards_warmup_and_shuffles_each_round():
    calls: list[tuple[str, int]] = []
    arms = {name: (lambda r, name=name: calls.append((name, r))) for name in "abcd"}
    records = bench.interleaved(arms, rounds=5, warmup=2, seed=3)
    assert len(calls) == 4 * 7 and len(records) == 4 * 5
    assert sorted({r["round"] for r in records}) == [0, 1, 2, 3, 4]
    orders = {tuple(name for name, r in calls if r == i) for i in range(7)}
    assert len(orders) > 1, "the order must change between rounds"
    again: list[tuple[str, int]] = []
    bench.interleaved({n: (lambda r, n=n: again.append((n, r))) for n in "abcd"}, rounds=5,
                      warmup=2, seed=3)
    assert again == calls  # the same seed gives the same order


def test_interleaved_records_stages_an_arm_reports():
    records = bench.interleaved({"x": lambda r: {"copy": 0.5, "gather": 0.25}}, rounds=2,
                                warmup=0)
    assert sorted((r["stage"], r["round"]) for r in records) == [
        ("copy", 0), ("copy", 1), ("gather", 0), ("gather", 1), ("total", 0), ("total", 1)]
    assert {r["seconds"] for r in records if r["stage"] == "copy"} == {0.5}


@pytest.mark.parametrize("kwargs, message", [({"rounds": 0}, "rounds must be positive"),
                                             ({"warmup": -1}, "warmup must be >= 0")])
def test_interleaved_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench.interleaved({"a": lambda r: None}, **{"rounds": 1, **kwargs})
