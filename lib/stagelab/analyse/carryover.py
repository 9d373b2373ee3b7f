"""First-order carry-over from the balanced order's rows: does an arm slow (or speed) the one
timed after it?

In a cell's rounds the arms run in the rows of a Williams design (:mod:`stagelab.core.design`),
balanced so that each arm follows every other equally often: the effect of the previous call on
the next can then be estimated from the rows already taken, beside the arm and position
effects. A fresh vector's 40-270 MB ``munmap`` (TLB shootdowns, cold caches) could tax the call
after it; in the balanced order the baseline follows its twin (another fresh vector) a third of
the time and each candidate follows a fresh vector two thirds, so such a tax biases the speedup.

The model, on log seconds of every timed call (stage ``total``): a round effect (each round's
calls demeaned together), an arm effect, a position effect, and a carry-over effect of the arm
timed just before in the same round (the first of a round has none). An arm's **carry-over** is
how much slower the next call runs after it than after any other arm (the difference of its
effect from the mean of the others', as a ratio minus 1): a 5 % tax after one arm reads +5 %
for it (and about -5 %/(arms-1) for each other). Least squares with standard errors clustered by
round (the calls of a round share its drift); the CI is normal. A cell is **flagged** when some
arm's carry-over CI excludes 0 and its estimate is beyond delta/2: enough to move a decision at
the bar. ``decisive_bias`` says how far carry-over moves the decisive comparison: the
geometric-mean speedup with the carry-over terms in the model against without them.
Torch-free.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

METHOD = ("least squares on log seconds: round (demeaned), arm, position and previous-arm "
          "effects; SEs clustered by round; carry-over of an arm = the next call's time after it "
          "against after any other arm")


def _calls(cell: pd.DataFrame) -> pd.DataFrame:
    """The cell's timed calls (stage total, ok, positive seconds) with their round, position
    and the arm timed just before in the same round (None for the first)."""
    timed = cell[(cell["stage"] == "total") & (cell["metric"] == "time")
                 & (cell["status"] == "ok") & (cell["seconds"] > 0)
                 & cell["round"].notna() & cell["position"].notna()]
    timed = timed[["arm", "round", "position", "seconds"]].astype(
        {"arm": str, "round": int, "position": int, "seconds": float})
    timed = timed.sort_values(["round", "position"]).reset_index(drop=True)
    previous = timed.groupby("round")["arm"].shift(1)
    return timed.assign(previous=previous.where(previous.notna(), None))


def _design(calls: pd.DataFrame, arms: list[str]) -> tuple[np.ndarray, dict[str, int]]:
    """Columns: arms but the first, positions but 0, every previous arm; demeaned per round."""
    columns: dict[str, int] = {}
    blocks = []
    for arm in arms[1:]:
        columns[f"arm:{arm}"] = len(columns)
        blocks.append((calls["arm"] == arm).to_numpy(float))
    for position in sorted(set(calls["position"]) - {0}):
        columns[f"position:{position}"] = len(columns)
        blocks.append((calls["position"] == position).to_numpy(float))
    for arm in arms:
        columns[f"after:{arm}"] = len(columns)
        blocks.append((calls["previous"] == arm).to_numpy(float))
    x = np.column_stack(blocks) if blocks else np.zeros((len(calls), 0))
    frame = pd.DataFrame(x).groupby(calls["round"].to_numpy()).transform("mean")
    return x - frame.to_numpy(), columns


def _fit(y: np.ndarray, x: np.ndarray, rounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients (minimum norm: only estimable contrasts are read) and their covariance,
    clustered by round."""
    bread = np.linalg.pinv(x.T @ x)
    beta = bread @ x.T @ y
    residual = y - x @ beta
    meat = np.zeros_like(bread)
    groups = np.unique(rounds)
    for group in groups:
        score = x[rounds == group].T @ residual[rounds == group]
        meat += np.outer(score, score)
    scale = len(groups) / max(len(groups) - 1, 1)
    return beta, scale * bread @ meat @ bread


def estimate(cell: pd.DataFrame, *, delta: float, confidence: float = 0.95,
             baseline: str | None = None, candidate: str | None = None) -> dict[str, Any]:
    """Each arm's first-order carry-over onto the next in one cell, with its CI, whether the
    cell is flagged, and (with ``baseline`` and ``candidate``) how much carry-over moves
    their comparison. ``estimated`` False, with the reason, where the rows cannot say (fewer
    than 3 arms or 10 rounds, or no position recorded)."""
    calls = _calls(cell)
    arms = sorted(set(calls["arm"]))
    rounds = calls["round"].nunique()
    if len(arms) < 3 or rounds < 10:
        return {"estimated": False, "flagged": False, "arms": [],
                "reason": f"{len(arms)} arms and {rounds} rounds with positions: carry-over "
                          "needs at least 3 arms (2 always alternate) and 10 rounds"}
    y = np.log(calls["seconds"].to_numpy())
    y = y - pd.Series(y).groupby(calls["round"].to_numpy()).transform("mean").to_numpy()
    x, columns = _design(calls, arms)
    beta, cov = _fit(y, x, calls["round"].to_numpy())
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    out = []
    for arm in arms:
        contrast = np.zeros(len(columns))
        contrast[columns[f"after:{arm}"]] = 1.0
        for other in arms:
            if other != arm:
                contrast[columns[f"after:{other}"]] -= 1.0 / (len(arms) - 1)
        value, se = float(contrast @ beta), math.sqrt(max(float(contrast @ cov @ contrast), 0))
        low, high = value - z * se, value + z * se
        effect = math.expm1(value)
        flagged = (low > 0 or high < 0) and abs(effect) > delta / 2
        out.append({"arm": arm, "carry_over": effect, "ci_low": math.expm1(low),
                    "ci_high": math.expm1(high), "flagged": bool(flagged)})
    result: dict[str, Any] = {"estimated": True, "rounds": int(rounds), "arms": out,
                              "flagged": any(a["flagged"] for a in out), "reason": ""}
    if baseline is not None and candidate is not None and baseline in arms and candidate in arms:
        result["decisive_bias"] = _bias(calls, y, x, columns, arms, baseline, candidate)
    return result


def _bias(calls: pd.DataFrame, y: np.ndarray, x: np.ndarray, columns: dict[str, int],
          arms: list[str], baseline: str, candidate: str) -> dict[str, float]:
    """The geometric-mean speedup of ``candidate`` over ``baseline`` with and without the
    carry-over terms in the model: their ratio is what carry-over moves the comparison by."""
    def arm_gap(keep: list[int]) -> float:
        part = x[:, keep]
        beta = np.linalg.pinv(part.T @ part) @ part.T @ y
        effect = {arm: 0.0 for arm in arms}
        for arm in arms[1:]:
            effect[arm] = float(beta[keep.index(columns[f"arm:{arm}"])])
        return math.exp(effect[baseline] - effect[candidate])

    every = list(range(len(columns)))
    without = [i for name, i in columns.items() if not name.startswith("after:")]
    adjusted, plain = arm_gap(every), arm_gap(without)
    return {"speedup_adjusted": adjusted, "speedup_unadjusted": plain,
            "moved_by": plain / adjusted - 1}


def words(carry: dict[str, Any], delta: float) -> str:
    """The sentence a flagged cell's answer carries ('' when not flagged)."""
    if not carry.get("flagged"):
        return ""
    worst = max(carry["arms"], key=lambda a: abs(a["carry_over"]) if a["flagged"] else -1)
    bias = carry.get("decisive_bias") or {}
    moved = (f"; it moves the decisive speedup by {bias['moved_by']:+.1%}"
             if bias.get("moved_by") is not None else "")
    return (f"carry-over: the call after {worst['arm']} runs {worst['carry_over']:+.1%} (CI "
            f"{worst['ci_low']:+.1%} to {worst['ci_high']:+.1%}) against after any other arm, "
            f"beyond delta/2 ({delta / 2:.1%}){moved}: the balanced order averages it, but the "
            "answer is partly the arms' order")
