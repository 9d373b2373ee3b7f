"""Timing rows selected, paired by round and compared arm against arm: where every experiment's
analysis starts.

Computed from tidy tables (:mod:`stagelab.core.schema`) alone and torch-free, so that the verdict,
the report and ``stagelab compare`` never load the measuring code. Every comparison pairs arms by
round (the ``round`` column): interleaved rounds share drift, and the paired bootstrap of
:mod:`stagelab.analyse.stats` cancels it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from stagelab.analyse import paired
from stagelab.core import catalogue
from stagelab.core.catalogue import aa_name

# ------------------------------------------------------------------------------- selecting

def ok_timings(frame: pd.DataFrame, stage: str | None = "total") -> pd.DataFrame:
    """The timing rows that measured something (status ok), of one stage (None: every stage)."""
    rows = frame[(frame["metric"] == "time") & (frame["status"] == "ok")]
    return rows if stage is None else rows[rows["stage"] == stage]


def _timed(frame: pd.DataFrame, stage: str) -> pd.DataFrame:
    """The ok timing rows of one stage, only the columns a pairing reads (one filter of the
    whole frame, however many arms are then paired)."""
    chosen = (frame["metric"] == "time") & (frame["status"] == "ok") & (frame["stage"] == stage)
    return frame.loc[chosen, ["arm", "round", "seconds"]]


def _arm_rounds(timed: pd.DataFrame, arm: str) -> pd.Series:
    rows = timed[timed["arm"] == arm]
    if rows["round"].duplicated().any():
        raise ValueError(f"arm {arm!r} has several timings for one round: the frame mixes "
                         "cells; split it by the size columns that tell them apart")
    return rows.set_index("round")["seconds"].astype(float)


def by_round(frame: pd.DataFrame, arm: str, stage: str = "total") -> pd.Series:
    """One arm's seconds indexed by round (``round``); several timings of one round mean the
    frame mixes cells, which is refused rather than averaged."""
    return _arm_rounds(_timed(frame, stage), arm)


def paired_rounds(frame: pd.DataFrame, *arms: str, stage: str = "total") -> list[np.ndarray]:
    """The arms' seconds over the rounds where every one of them was timed, in round order."""
    timed = _timed(frame, stage)
    joined = pd.concat([_arm_rounds(timed, arm) for arm in arms], axis=1,
                       join="inner").sort_index()
    return [joined.iloc[:, i].to_numpy(dtype=float) for i in range(len(arms))]


def not_measured_reason(frame: pd.DataFrame, arm: str) -> str:
    """Why an arm has no timings: its unavailable, skipped or failed row's note."""
    rows = frame[(frame["arm"] == arm) & (frame["status"] != "ok")]
    if rows.empty:
        return f"{arm} was not measured in this run"
    return f"{arm} {rows['status'].iloc[0]}: {rows['note'].iloc[0]}"


def cells(frame: pd.DataFrame, by: Sequence[str]) -> list[tuple[dict, pd.DataFrame]]:
    """The frame split by the size columns ``by``, each part with its key as a dict."""
    return [(dict(zip(by, key if isinstance(key, tuple) else (key,))), part)
            for key, part in frame.groupby(list(by), observed=True, sort=True)]


# ----------------------------------------------------------------------------- comparisons

def compare(frame: pd.DataFrame, baseline: str, candidate: str, by: Sequence[str], *,
            stage: str = "total", twin: bool = False, confidence: float = 0.95,
            seed: int = 0) -> pd.DataFrame:
    """Per cell of ``by``: the candidate's paired speedup over the baseline (ratio of mean times)
    with its CI, the ms it saves per call on average, and, with ``twin``, the A/A speedup of the
    baseline over its twin with its own rounds (``twin_n_rounds``). A cell whose timings are not
    positive and finite gets no speedup and a ``note`` saying why; so does one where the
    candidate shares no round with the baseline (its ``n_rounds`` 0 beside the twin's CI read
    as a CI from no round: notebook 02's decisive table on a CPU)."""
    for condition in catalogue.CONDITIONS:  # two places, two orders...: two cells each
        if condition.column in frame and frame[condition.column].nunique() > 1:
            by = [*by, condition.column]
    out = []
    for key, part in cells(frame, by):
        base, cand = paired_rounds(part, baseline, candidate, stage=stage)
        row: dict[str, Any] = {**key, "baseline": baseline, "candidate": candidate,
                               "n_rounds": len(base)}
        try:
            if len(base) >= 2:
                row["speedup"], row["ci_low"], row["ci_high"] = paired.paired_speedup(
                    base, cand, confidence=confidence, seed=seed)
                row["saved_ms"] = 1e3 * float(np.mean(base) - np.mean(cand))
            elif not len(base):
                row["note"] = not_measured_reason(part, candidate)
            if twin:
                a, b = paired_rounds(part, baseline, aa_name(baseline), stage=stage)
                row["twin_n_rounds"] = len(a)
                if len(a) >= 2:
                    row["twin_speedup"], row["twin_ci_low"], row["twin_ci_high"] = (
                        paired.paired_speedup(a, b, confidence=confidence, seed=seed))
        except paired.BadTimings as exc:
            row["note"] = f"bad timings: {exc}"
        out.append(row)
    return pd.DataFrame(out)


def spread(frame: pd.DataFrame, by: Sequence[str] = ("rows", "vocab", "arm"),
           noisy_at: float = 0.10) -> pd.DataFrame:
    """Median, quartiles and IQR/median per cell and arm; ``noisy`` where IQR/median reaches 10 %
    (where ``torch.utils.benchmark`` warns)."""
    out = paired.summarize(ok_timings(frame), list(by))
    return out.assign(noisy=out["iqr_over_median"] >= noisy_at)


def checks_table(frame: pd.DataFrame, metrics: Sequence[str], index: Sequence[str]) -> pd.DataFrame:
    """The agreement checks (``max_abs_error``, mismatches...) per cell and arm, one column per
    check: long rather than wide, so that it fits the page whatever the number of arms. A
    ``tile`` in ``index`` keeps the configurations without one (missing there)."""
    checks = frame[frame["metric"].isin(list(metrics)) & (frame["status"] == "ok")]
    if checks.empty:
        return pd.DataFrame()
    table = _tiles_filled(checks).pivot_table(index=[*index, "arm"], columns="metric",
                                              values="value", aggfunc="max", observed=True)
    table = table.reindex(columns=[m for m in metrics if m in table.columns]).reset_index()
    return _tiles_restored(table)


# A configuration without a vocabulary tile while grouping: pandas drops rows whose key is missing.
NO_TILE = 0


def _tiles_filled(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a missing ``tile`` (every method but head_fused) as :data:`NO_TILE`."""
    if "tile" not in frame:
        return frame.assign(tile=NO_TILE)
    return frame.assign(tile=frame["tile"].astype("Int64").fillna(NO_TILE))


def _tiles_restored(table: pd.DataFrame) -> pd.DataFrame:
    """A grouped table's :data:`NO_TILE` as missing again."""
    if "tile" in table:
        tiles = table["tile"].astype("Int64")
        table = table.assign(tile=tiles.mask(tiles == NO_TILE))
    return table

