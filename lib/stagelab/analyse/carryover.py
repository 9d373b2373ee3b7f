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
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

METHOD = ("least squares on log seconds: round (demeaned), arm, position and previous-arm "
          "effects; SEs clustered by round; carry-over of an arm = the next call's time after it "
          "against after any other arm")


@dataclass(frozen=True)
class Calls:
    """A cell's timed calls, one entry per call, as arrays: the arm's index, the round, the
    position in the round, the arm timed just before in the same round (-1 for the first) and
    the log seconds."""

    arm: np.ndarray
    round: np.ndarray
    position: np.ndarray
    previous: np.ndarray
    log_seconds: np.ndarray


def calls_from_rows(cell: pd.DataFrame) -> tuple[Calls, list[str]]:
    """The cell's timed calls (stage total, ok, positive seconds, round and position known) and
    the arms' names, sorted."""
    timed = cell[(cell["stage"] == "total") & (cell["metric"] == "time")
                 & (cell["status"] == "ok") & (cell["seconds"] > 0)
                 & cell["round"].notna() & cell["position"].notna()]
    timed = timed[["arm", "round", "position", "seconds"]].astype(
        {"arm": str, "round": int, "position": int, "seconds": float})
    timed = timed.sort_values(["round", "position"]).reset_index(drop=True)
    arms = sorted(set(timed["arm"]))
    index = timed["arm"].map({arm: i for i, arm in enumerate(arms)}).to_numpy(int)
    rounds = timed["round"].to_numpy(int)
    previous = np.where(np.r_[False, rounds[1:] == rounds[:-1]], np.r_[-1, index[:-1]], -1)
    return Calls(index, rounds, timed["position"].to_numpy(int), previous,
                 np.log(timed["seconds"].to_numpy())), arms


def calls_from_arrays(seconds: np.ndarray, positions: np.ndarray) -> Calls:
    """The calls of one cell given as ``[arms, rounds]`` seconds and the position each arm took
    in each round (0 first), as the calibration simulates them."""
    arms, rounds = seconds.shape
    order = np.argsort(positions, axis=0)  # [position, round]: the arm at that position
    arm = order.T.ravel()
    previous = np.concatenate([np.full((rounds, 1), -1), order.T[:, :-1]], axis=1).ravel()
    return Calls(arm, np.repeat(np.arange(rounds), arms), np.tile(np.arange(arms), rounds),
                 previous, np.log(seconds[arm, np.repeat(np.arange(rounds), arms)]))


def _demeaned(values: np.ndarray, rounds: np.ndarray) -> np.ndarray:
    """``values`` (rows: calls) less their mean over each round's calls."""
    _, group = np.unique(rounds, return_inverse=True)
    sums = np.zeros((group.max() + 1, *values.shape[1:]))
    np.add.at(sums, group, values)
    counts = np.bincount(group).reshape(-1, *([1] * (values.ndim - 1)))
    return values - (sums / counts)[group]


def _design(calls: Calls, arms: int) -> tuple[np.ndarray, dict[str, int]]:
    """Columns: arms but the first, positions but 0, every previous arm; demeaned per round."""
    columns: dict[str, int] = {}
    blocks = []
    for arm in range(1, arms):
        columns[f"arm:{arm}"] = len(columns)
        blocks.append(calls.arm == arm)
    for position in sorted(set(calls.position.tolist()) - {0}):
        columns[f"position:{position}"] = len(columns)
        blocks.append(calls.position == position)
    for arm in range(arms):
        columns[f"after:{arm}"] = len(columns)
        blocks.append(calls.previous == arm)
    x = np.column_stack(blocks).astype(float)
    return _demeaned(x, calls.round), columns


def _cluster_scale(rounds: np.ndarray) -> float:
    groups = len(np.unique(rounds))
    return groups / max(groups - 1, 1)


def _clustered(weights: np.ndarray, residual: np.ndarray, rounds: np.ndarray) -> np.ndarray:
    """The covariance, clustered by round, of linear estimates ``weights @ y`` (rows of
    ``weights``: one per estimate) given the model's residuals."""
    _, group = np.unique(rounds, return_inverse=True)
    scores = np.zeros((group.max() + 1, weights.shape[0]))
    np.add.at(scores, group, (weights * residual).T)
    return _cluster_scale(rounds) * scores.T @ scores


def _fit(y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares map from ``y`` to coefficients (minimum norm: only estimable contrasts
    are read), ``[columns, calls]``, and the residuals."""
    hat = np.linalg.pinv(x.T @ x) @ x.T
    return hat, y - x @ (hat @ y)


def estimate(cell: pd.DataFrame, *, delta: float, confidence: float = 0.95,
             baseline: str | None = None, candidate: str | None = None) -> dict[str, Any]:
    """Each arm's first-order carry-over onto the next in one cell, with its CI, whether the
    cell is flagged, and (with ``baseline`` and ``candidate``) how much carry-over moves
    their comparison, with its standard error. ``estimated`` False, with the reason, where the
    rows cannot say (fewer than 3 arms or 10 rounds, or no position recorded)."""
    calls, arms = calls_from_rows(cell)
    rounds = len(np.unique(calls.round))
    if len(arms) < 3 or rounds < 10:
        return {"estimated": False, "flagged": False, "arms": [],
                "reason": f"{len(arms)} arms and {rounds} rounds with positions: carry-over "
                          "needs at least 3 arms (2 always alternate) and 10 rounds"}
    y = _demeaned(calls.log_seconds, calls.round)
    x, columns = _design(calls, len(arms))
    hat, residual = _fit(y, x)
    beta, cov = hat @ y, _clustered(hat, residual, calls.round)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    out = []
    for index, arm in enumerate(arms):
        contrast = np.full(len(columns), 0.0)
        for other in range(len(arms)):
            contrast[columns[f"after:{other}"]] = 1.0 if other == index else -1 / (len(arms) - 1)
        value, se = float(contrast @ beta), math.sqrt(max(float(contrast @ cov @ contrast), 0))
        low, high = value - z * se, value + z * se
        effect = math.expm1(value)
        flagged = (low > 0 or high < 0) and abs(effect) > delta / 2
        out.append({"arm": arm, "carry_over": effect, "ci_low": math.expm1(low),
                    "ci_high": math.expm1(high), "flagged": bool(flagged)})
    result: dict[str, Any] = {"estimated": True, "rounds": int(rounds), "arms": out,
                              "flagged": any(a["flagged"] for a in out), "reason": ""}
    if baseline is not None and candidate is not None and baseline in arms and candidate in arms:
        result["decisive_bias"] = bias(calls, len(arms), arms.index(baseline),
                                       arms.index(candidate))
    return result


def bias(calls: Calls, arms: int, baseline: int, candidate: int) -> dict[str, float]:
    """How far carry-over moves the comparison of ``candidate`` with ``baseline`` (arm
    indices): the geometric-mean speedup with the carry-over terms in the model
    (``speedup_adjusted``: each arm compared after the same arm before it) and without them
    (``speedup_unadjusted``), ``moved_by`` = their ratio less 1 (the plain speedup's relative
    bias), and its standard error ``moved_by_se`` (a linear contrast of the log times,
    clustered by round with the full model's residuals)."""
    y = _demeaned(calls.log_seconds, calls.round)
    x, columns = _design(calls, arms)
    hat, residual = _fit(y, x)
    plain_columns = [i for name, i in columns.items() if not name.startswith("after:")]
    plain_hat = np.linalg.pinv(x[:, plain_columns].T @ x[:, plain_columns]) @ x[:, plain_columns].T

    def gap(weights: np.ndarray, names: list[str]) -> np.ndarray:
        """The weights over calls of ``log(baseline) - log(candidate)``'s estimate."""
        row = np.zeros(weights.shape[1])
        for arm, sign in ((baseline, 1.0), (candidate, -1.0)):
            if arm:
                row += sign * weights[names.index(f"arm:{arm}")]
        return row

    names = list(columns)
    adjusted_w = gap(hat, names)
    plain_w = gap(plain_hat, [names[i] for i in plain_columns])
    moved = float((plain_w - adjusted_w) @ y)
    variance = float(_clustered((plain_w - adjusted_w)[None, :], residual, calls.round)[0, 0])
    return {"speedup_adjusted": math.exp(float(adjusted_w @ y)),
            "speedup_unadjusted": math.exp(float(plain_w @ y)), "moved_by": math.expm1(moved),
            "moved_by_se": math.exp(moved) * math.sqrt(max(variance, 0.0))}


def correction(calls: Calls, arms: int, baseline: int, candidate: int,
               confidence: float = 0.95) -> dict[str, float] | None:
    """The carry-over correction a cell's decision takes (``bias``, ``bias_se``: the plain
    speedup is divided by ``1 + bias``, and ``bias_se`` widens its CI), or None where the
    order's rows do not show carry-over moving the comparison: where ``moved_by``'s two-sided
    ``confidence`` CI includes 0 (a correction everywhere would widen every CI by its error) or
    the rows cannot estimate it (fewer than 3 arms or 10 rounds)."""
    if arms < 3 or len(np.unique(calls.round)) < 10:
        return None
    moved = bias(calls, arms, baseline, candidate)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    if abs(moved["moved_by"]) <= z * moved["moved_by_se"]:
        return None
    return {"bias": moved["moved_by"], "bias_se": moved["moved_by_se"]}


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
