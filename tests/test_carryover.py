"""Carry-over from the balanced order's rows: a planted tax on the call after one arm is
recovered with its CI, and none is found where none was planted."""

from __future__ import annotations

import json
import math
import random

import pytest

from stagelab.analyse import carryover
from stagelab.core import design, schema

ARMS = {"seed_pageable": 10e-3, "seed_pageable~aa": 10e-3, "seed_pageable_reused": 8e-3,
        "seed_pinned": 7e-3}


def simulated(rounds: int, penalty: float, after: str = "seed_pageable", noise: float = 0.03,
              seed: int = 1):
    """Rows of a cell timed in the balanced order: each arm's time, a drift per round, noise,
    and ``penalty`` on every call that follows ``after`` in its round."""
    rng = random.Random(seed)
    rows = []
    for r, order in enumerate(design.balanced_orders(list(ARMS), rounds, seed)):
        drift = math.exp(rng.gauss(0, 0.05))
        for position, arm in enumerate(order):
            tax = 1 + penalty if position and order[position - 1] == after else 1
            seconds = ARMS[arm] * drift * tax * math.exp(rng.gauss(0, noise))
            rows.append({"arm": arm, "round": r, "position": position, "seconds": seconds})
    return schema.make_rows(rows)


def test_a_planted_penalty_is_recovered_with_its_ci_and_flags_the_cell():
    found = carryover.estimate(simulated(150, 0.05), delta=0.02, baseline="seed_pageable",
                               candidate="seed_pinned")
    by_arm = {a["arm"]: a for a in found["arms"]}
    planted = by_arm["seed_pageable"]
    assert planted["ci_low"] < 0.05 < planted["ci_high"]
    assert planted["carry_over"] == pytest.approx(0.05, abs=0.01) and planted["flagged"]
    assert found["flagged"] and found["estimated"]
    # the candidate follows the taxed arm more often than the baseline does: the plain speedup
    # is lower than the one with carry-over in the model
    assert found["decisive_bias"]["moved_by"] < -0.005
    assert "beyond delta/2" in carryover.words(found, 0.02)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_penalty_finds_no_carry_over(seed):
    found = carryover.estimate(simulated(150, 0.0, seed=seed), delta=0.02)
    assert found["estimated"] and not found["flagged"]
    assert all(a["ci_low"] < 0 < a["ci_high"] or abs(a["carry_over"]) < 0.01
               for a in found["arms"])
    assert carryover.words(found, 0.02) == ""


def test_too_few_rounds_or_arms_say_why():
    few = carryover.estimate(simulated(5, 0.05), delta=0.02)
    assert not few["estimated"] and "10 rounds" in few["reason"]
    rows = simulated(30, 0.0)
    two = carryover.estimate(rows[rows.arm.isin(["seed_pageable", "seed_pinned"])], delta=0.02)
    assert not two["estimated"] and "3 arms" in two["reason"]


def step_table(penalty: float):
    rows = simulated(150, penalty).assign(experiment="step", rows=16, vocab=1000, k=5)
    return schema.conform(rows)


@pytest.mark.parametrize("penalty", [0.05, 0.0])
def test_the_verdict_carries_it_and_a_flagged_cell_says_so(tmp_path, penalty):
    from stagelab.analyse import verdict
    from stagelab.core import records

    schema.write_table(step_table(penalty), tmp_path, "step")
    found = verdict.build_verdict(tmp_path, decisive_rows=[16], decisive_vocabs=[1000],
                                  decisive_ks=[5])
    (cell,) = found["carry_over"]["cells"]
    (decisive,) = found["decisive"]
    assert cell["estimated"] and found["carry_over"]["bar"] == 0.01
    assert cell["flagged"] is (penalty > 0) and decisive["carry_over_flagged"] is (penalty > 0)
    assert ("carry-over: the call after seed_pageable" in decisive["reason"]) is (penalty > 0)
    assert found["carry_over"]["flagged"] == (["n=16 V=1000 K=5"] if penalty else [])
    assert any("Carry-over at n=16" in f for f in found["findings"]) is (penalty > 0)
    assert records.shape_errors(json.loads(json.dumps(found)), records.schema("verdict")) == []
