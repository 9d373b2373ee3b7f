"""Interleaved timing in a balanced order, and rounds until precise (the statistics are tested in
test_stats.py)."""

from __future__ import annotations

import itertools
import time
from collections import Counter

import numpy as np
import pytest

from stagelab.core import design
from stagelab.measure import bench


def _timings(records):
    return [r for r in records if r.get("stage") == "total"]


def test_interleaved_discards_warmup_and_changes_the_order_between_rounds():
    calls: list[tuple[str, int]] = []
    arms = {name: (lambda r, name=name: calls.append((name, r))) for name in "abcd"}
    records = bench.interleaved(arms, rounds=5, warmup=2, seed=3)
    assert len(calls) == 4 * 7 and len(_timings(records)) == 4 * 5
    assert sorted({r["round"] for r in _timings(records)}) == [0, 1, 2, 3, 4]
    orders = {tuple(name for name, r in calls if r == i) for i in range(7)}
    assert len(orders) > 1, "the order must change between rounds"
    again: list[tuple[str, int]] = []
    bench.interleaved({n: (lambda r, n=n: again.append((n, r))) for n in "abcd"}, rounds=5,
                      warmup=2, seed=3)
    assert again == calls  # the same seed gives the same order
    seeds = [r for r in records if r.get("metric") == "order_seed"]
    assert len(seeds) == 1 and seeds[0]["value"] == 3.0


@pytest.mark.parametrize("arms, rounds", [(2, 7), (3, 30), (4, 9), (7, 30), (7, 31)])
def test_every_arm_takes_every_position_equally_often_within_one(arms, rounds):
    names = [f"arm{i}" for i in range(arms)]
    records = bench.interleaved({n: (lambda r: None) for n in names}, rounds=rounds, warmup=1,
                                seed=11)
    counts = Counter((r["arm"], r["position"]) for r in _timings(records))
    for position in range(arms):
        at = [counts[(name, position)] for name in names]
        assert max(at) - min(at) <= 1, (position, at)
    for round_index in range(rounds):  # each round: every arm once, positions 0..arms-1
        positions = sorted(r["position"] for r in _timings(records) if r["round"] == round_index)
        assert positions == list(range(arms))


def test_a_fixed_shuffle_is_not_balanced_negative_control():
    import random

    shuffler, first = random.Random(0), Counter()
    for _ in range(30):  # the old order: one shuffle sequence, seed 0, in every cell and run
        order = list("abc")
        shuffler.shuffle(order)
        first[order[0]] += 1
    assert max(first.values()) - min(first.values()) > 1


def test_the_order_seed_differs_per_run_and_cell_and_is_stable():
    seeds = {design.order_seed(run, cell) for run, cell in
             itertools.product(["run1", "run2"], ["n=16", "n=64"])}
    assert len(seeds) == 4 and design.order_seed("run1", "n=16") == design.order_seed("run1",
                                                                                       "n=16")


def test_interleaved_records_stages_an_arm_reports():
    records = bench.interleaved({"x": lambda r: {"copy": 0.5, "gather": 0.25}}, rounds=2,
                                warmup=0)
    timed = [r for r in records if "stage" in r]
    assert sorted((r["stage"], r["round"]) for r in timed) == [
        ("copy", 0), ("copy", 1), ("gather", 0), ("gather", 1), ("total", 0), ("total", 1)]
    assert {r["seconds"] for r in timed if r["stage"] == "copy"} == {0.5}


def test_a_call_of_several_steps_records_its_total_per_step_and_its_stages_as_given():
    """Each call's total is divided by its steps (the host clock too, on a GPU); the stages an
    arm reports are its own per-step figures, left as they are."""
    records = bench.interleaved({"x": lambda r: {"copy": 0.5}}, rounds=2, warmup=0, steps=4)
    total = bench._round_records("x", 0, 0, 4e-3, 5e-3, {"copy": 0.5}, "cuda_event", steps=4)
    assert total[0]["seconds"] == 1e-3 and total[0]["host_seconds"] == pytest.approx(1.25e-3)
    # 1 ms apart over the whole call is past its slack (0.9 ms); per step it would pass
    assert total[0]["clock_agrees"] is False
    assert [r["seconds"] for r in total[1:]] == [0.5]
    assert {r["seconds"] for r in records if r.get("stage") == "copy"} == {0.5}
    with pytest.raises(ValueError, match="steps"):
        bench.interleaved({"x": lambda r: None}, rounds=1, steps=0)


def test_a_failing_arm_drops_out_and_the_others_keep_contiguous_positions():
    def broken(r):
        raise RuntimeError("no")

    records = bench.interleaved({"a": lambda r: None, "b": broken, "c": lambda r: None},
                                rounds=4, warmup=0, seed=1)
    failed = [r for r in records if r.get("status") == "failed"]
    assert [r["arm"] for r in failed] == ["b"]
    for round_index in range(1, 4):
        positions = sorted(r["position"] for r in _timings(records) if r["round"] == round_index)
        assert positions == [0, 1]


def _timed_by_value(monkeypatch):
    """Each arm returns its own seconds for the round; the timer reports them."""
    monkeypatch.setattr(bench.Timer, "time", lambda self, call: (call(), None, None))


def _arms(speedups, sigma=0.03, rounds=2000, seed=0):
    rng = np.random.default_rng(seed)
    base = np.exp(rng.normal(0, sigma, rounds))
    arms = {"a": lambda r: float(base[r])}
    for name, speedup in speedups.items():
        own = np.exp(rng.normal(0, sigma, rounds)) / speedup
        arms[name] = lambda r, own=own: float(own[r])
    return arms


def _stop(records):
    stop = [r for r in records if r.get("metric") == "rounds"]
    assert len(stop) == 1
    return int(stop[0]["value"]), stop[0]["note"]


def test_rounds_until_resolved_stop_once_every_comparison_is_on_one_side_of_the_bar(monkeypatch):
    _timed_by_value(monkeypatch)
    precision = bench.Precision((("a", "b"), ("a", "c")), bar=1.02, max_rounds=2000, every=5,
                                min_rounds=30)
    records = bench.interleaved(_arms({"b": 1.10, "c": 1.035}), rounds=10, warmup=0,
                                precision=precision)
    done, note = _stop(records)
    assert note.startswith("resolved: ") and "1.0200" in note  # the bar
    assert 30 <= done < 2000 and (done - 10) % 5 == 0
    for name in ("b", "c"):
        assert design.resolved(*bench._paired_totals(records, "a", name), 1.02)
    earlier = [r for r in records if r.get("round", -1) < done - 5]
    assert not all(design.resolved(*bench._paired_totals(earlier, "a", name), 1.02)
                   for name in ("b", "c"))  # it stopped at the first check that resolved both
    alone = bench.Precision((("a", "b"),), bar=1.02, max_rounds=2000, min_rounds=30)
    done_alone, _ = _stop(bench.interleaved(_arms({"b": 1.10, "c": 1.035}), rounds=10, warmup=0,
                                            precision=alone))
    assert done_alone < done  # the comparison near its bar took the extra rounds


def test_rounds_until_resolved_go_on_to_the_cap_at_the_bar_and_say_what_straddles(monkeypatch):
    _timed_by_value(monkeypatch)
    precision = bench.Precision((("a", "b"), ("a", "missing")), bar=1.02, max_rounds=60,
                                min_rounds=30)
    records = bench.interleaved(_arms({"b": 1.02}, sigma=0.3), rounds=10, warmup=0,
                                precision=precision)
    assert _stop(records) == (60, "round cap: 60 rounds; straddling: b vs a")


@pytest.mark.parametrize("cap, seconds, reason", [(20, 1e9, "round cap: 20 rounds"),
                                                  (10_000, 1e-9, "time cap")])
def test_rounds_until_resolved_stop_at_a_cap_and_say_so(monkeypatch, cap, seconds, reason):
    _timed_by_value(monkeypatch)
    precision = bench.Precision((("a", "b"),), bar=1.02, max_rounds=cap, max_seconds=seconds,
                                min_rounds=10_000)  # only a cap can stop it
    records = bench.interleaved(_arms({"b": 1.02}), rounds=10, warmup=0, precision=precision)
    assert _stop(records)[1].startswith(reason)


def test_a_resolved_comparison_does_not_stop_before_the_floor(monkeypatch):
    _timed_by_value(monkeypatch)
    precision = bench.Precision((("a", "b"),), bar=1.02, max_rounds=500, min_rounds=149)
    done, note = _stop(bench.interleaved(_arms({"b": 2.0}), rounds=10, warmup=0,
                                         precision=precision))
    assert note.startswith("resolved") and done == 150  # the first check at or past 149


@pytest.mark.parametrize("kwargs, message", [({"rounds": 0}, "rounds must be positive"),
                                             ({"warmup": -1}, "warmup must be >= 0")])
def test_interleaved_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench.interleaved({"a": lambda r: None}, **{"rounds": 1, **kwargs})


def test_precision_cap_below_rounds_is_refused():
    with pytest.raises(ValueError, match=r"max_rounds \(5\) must be at least rounds \(10\)"):
        bench.interleaved({"a": lambda r: None}, rounds=10,
                          precision=bench.Precision((("a", "a"),), 1.02, max_rounds=5))


def test_rounds_run_with_the_collector_frozen_and_the_load_sampler_quiet():
    import gc

    from stagelab.measure import busy

    seen = []

    def arm(round_index: int) -> None:
        seen.append((gc.isenabled(), busy._PAUSED.is_set(), gc.get_freeze_count() > 0))

    assert gc.isenabled()
    bench.interleaved({"a": arm, "b": arm}, rounds=3, warmup=1)
    assert seen and set(seen) == {(False, True, True)}
    assert gc.isenabled() and not busy._PAUSED.is_set() and gc.get_freeze_count() == 0
    readings = []
    start = busy.Reading(0.0, 0.0, 0.0, 0.0, 0.5, 2)

    def read() -> busy.Reading:
        readings.append(1)
        return start

    with busy.sampling_paused(), busy.LoadWatch(read=read, every_s=0.01) as watch:
        time.sleep(0.2)
    assert watch._loads == [] and len(readings) == 2  # its start and end readings only
