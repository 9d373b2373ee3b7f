"""The whole step (notebook 02): its conditions as row filters, its stages split and shared out,
the copy's share, the levers' savings, and the step's own tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from stagelab.analyse import roofline, stats
from stagelab.analyse.timings import cells, compare, not_measured_reason, ok_timings
from stagelab.core import catalogue, schema
from stagelab.core.catalogue import STAGES, TOTAL

UNATTRIBUTED = "unattributed"  # what no timed stage accounts for
FORWARD = "forward"  # the decode forward queued before the step, which the step waits behind
SPLIT = (FORWARD, *STAGES, UNATTRIBUTED)  # the parts of a step that add up to its total
DWARFED_SHARE = 0.10  # the copy counts as dwarfed below this share of the seed's step


def read_condition(frame: pd.DataFrame, condition: catalogue.Condition) -> pd.Series:
    """Each row's value of a step condition, read by the condition's rule: a row written before
    its column existed reads as its ``old_rows`` value, a value it does not know as missing."""
    if condition.column not in frame:
        return pd.Series(condition.old_rows, index=frame.index, dtype=object)
    return frame[condition.column].map(condition.reads).astype(object)


def where_condition(frame: pd.DataFrame, condition: catalogue.Condition,
                    value: str) -> pd.DataFrame:
    """The step rows measured with ``condition`` at ``value`` (rows read by its rule)."""
    return frame[read_condition(frame, condition) == value]


def condition_values(frame: pd.DataFrame, condition: catalogue.Condition) -> list[str]:
    """The values of a condition the rows record, in the catalogue's order (the deciding value
    first); empty for a table without rows."""
    found = set(read_condition(frame, condition).dropna())
    return [value for value in condition.values if value in found]


def at_first_values(frame: pd.DataFrame, conditions: Mapping[str, Sequence[str]] | None,
                    but: str = "") -> pd.DataFrame:
    """The step rows at each condition's first value of ``conditions`` (by name; a condition
    left out: its deciding value), every value of the condition ``but``: what notebook 02
    shows before each condition's own table."""
    for condition in catalogue.CONDITIONS:
        if condition.name != but:
            values = (conditions or {}).get(condition.name) or (condition.decides,)
            frame = where_condition(frame, condition, values[0])
    return frame


def condition_table(frame: pd.DataFrame, condition: catalogue.Condition) -> pd.DataFrame:
    """Per cell and seed arm, the mean step (ms) under each value of a step ``condition``
    (``<value>_ms``) and each other value's over the deciding one (``<other>_over_<decides>``):
    what the other value costs each arm; empty unless the rows record every value (rows that do
    not say, and a stranger's value, are left out)."""
    others = [value for value in condition.values if value != condition.decides]
    columns = ["rows", "vocab", "k", "arm", *(f"{value}_ms" for value in condition.values),
               *(f"{other}_over_{condition.decides}" for other in others)]
    timed, column = ok_timings(frame), condition.column
    if column not in timed:
        return pd.DataFrame(columns=columns)
    timed = timed[timed[column].isin(condition.values)]
    if timed[column].nunique() < len(condition.values):
        return pd.DataFrame(columns=columns)
    means = timed.pivot_table(index=["rows", "vocab", "k", "arm"], columns=column,
                              values="seconds", aggfunc="mean", observed=True) * 1e3
    means = means.rename(columns={value: f"{value}_ms" for value in condition.values})
    means = means.dropna().reset_index()
    for other in others:
        means[f"{other}_over_{condition.decides}"] = (means[f"{other}_ms"]
                                                      / means[f"{condition.decides}_ms"])
    return pd.DataFrame(means, columns=columns)


def measured_on_cpu(frame: pd.DataFrame) -> bool:
    """Whether a table's rows were all measured on the CPU (its ``device`` column), so that the
    stage called "device" ran on the host; False for a table without rows."""
    devices = set(frame["device"].dropna()) if "device" in frame else set()
    return bool(devices) and devices <= {"cpu"}


def step_context(frame: pd.DataFrame, delta: float) -> str:
    """The step's context in Markdown, stated next to its results: the device work queued before
    each step, what delta is a share of, where the log-softmax ran, how many rounds each cell ran
    and why it stopped."""
    forward = frame[(frame["metric"] == "forward_ms") & (frame["status"] == "ok")]
    values = sorted(set(forward["value"].dropna()))
    how = "; ".join(sorted(set(forward["note"].dropna())))
    on_cpu = measured_on_cpu(frame)
    places = [catalogue.log_softmax_place(p, on_cpu)
              for p in sorted(set(frame["log_softmax"].dropna()))]
    lines = [f"**Context.** Device work queued before each step: forward_ms = "
             f"{', '.join(f'{v:.2f}' for v in values) or 'not recorded'} ({how or '-'}). "
             f"delta = {delta:.0%} of the decode step (forward + logprobs step), so each timed "
             f"step is a decode step; with forward_ms = 0 the saving is its upper bound. "
             f"The log-softmax runs on the "
             f"{' and on the '.join(dict.fromkeys(places)) or catalogue.log_softmax_place('device', on_cpu)}."]
    stops = frame[frame["metric"] == "rounds"]
    for row in stops.itertuples():
        lines.append(f"- n={row.rows}, V={row.vocab}, K={row.k}: {int(row.value)} rounds "
                     f"({row.note})")
    return "\n".join(lines)


def forward_seconds(frame: pd.DataFrame, by: Sequence[str] = ("rows", "vocab", "k")) -> pd.Series:
    """Per cell, the seconds of the decode forward queued before each step: the measured
    duration of the queued device work (``forward_measured_ms``) where recorded, else the nominal
    ``forward_ms``."""
    ok = frame[(frame["status"] == "ok") & frame["value"].notna()]
    out = pd.Series(dtype=float)
    for metric in ("forward_ms", "forward_measured_ms"):  # measured last: it wins
        rows = ok[ok["metric"] == metric]
        if not rows.empty:
            found = rows.groupby(list(by), observed=True)["value"].mean() / 1e3
            out = found.combine_first(out) if len(out) else found
    return out


def decomposition(frame: pd.DataFrame, by: Sequence[str] = ("rows", "vocab", "k")) -> pd.DataFrame:
    """Mean seconds per stage and in total, per arm and cell, with each part's share of the total.

    Means, because the median of each stage does not add up to the median of the total; here the
    parts add up to the total exactly: the decode forward queued before each step is its own
    part, ``forward`` (its measured duration where recorded, else its nominal one; 0 on a CPU),
    and what no timed stage accounts for (untimed work between stages, or, negative, stages
    that overlap: the host's allocation runs while the forward does) is ``unattributed``. Each
    call counts where its total was timed; a stage an arm has no row for counts as 0.
    """
    timed = ok_timings(frame, stage=None)
    if timed.empty:
        return pd.DataFrame(columns=[*by, "arm", *SPLIT, TOTAL])
    per_call = timed.pivot_table(index=[*by, "arm", "round"], columns="stage", values="seconds",
                                 aggfunc="mean", observed=True)
    per_call = per_call.reindex(columns=[*STAGES, TOTAL])
    per_call = per_call[per_call[TOTAL].notna()].fillna(0.0)
    forward = forward_seconds(frame, by)
    cell_of = per_call.index.droplevel(["arm", "round"])
    per_call[FORWARD] = (forward.reindex(cell_of).fillna(0.0).to_numpy() if len(forward)
                         else 0.0)
    per_call[UNATTRIBUTED] = (per_call[TOTAL] - per_call[list(STAGES)].sum(axis=1)
                              - per_call[FORWARD])
    means = per_call.groupby(level=[*by, "arm"], observed=True)[[*SPLIT, TOTAL]].mean()
    means = means.reset_index()
    for stage in SPLIT:
        means[f"{stage}_share"] = means[stage] / means[TOTAL]
    return pd.DataFrame(means)


def _ci_or_none(part: np.ndarray, whole: np.ndarray, confidence: float,
                seed: int) -> tuple[float, float | None, float | None]:
    """``mean(part) / mean(whole)`` over paired rounds with its bootstrap CI over rounds (None
    with fewer than two rounds or a whole that is not positive)."""
    point = float(part.mean() / whole.mean())
    if len(part) < 2 or not (np.isfinite(whole).all() and (whole > 0).all()):
        return point, None, None
    ratio = stats.RatioOfMeans(part.astype(float), whole.astype(float), seed=seed)
    return (point, *ratio.interval(confidence))


def stage_shares(frame: pd.DataFrame, arm: str = catalogue.baseline(catalogue.STEP), *,
                 confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Per cell of the seed's step, with CIs over rounds: the copy's share of the step, the share
    of alloc + copy + free (what pinned grow-only staging removes or shrinks: the vector's
    zero-fill and its free go, the copy gets faster), and the zero-fill of the native vector in
    ms (the ``alloc`` stage: the value-initialised ``std::vector`` itself, not a stand-in)."""
    timed = ok_timings(frame, stage=None)
    timed = timed[timed["arm"] == arm]
    out = []
    for key, part in cells(timed, ["rows", "vocab", "k"]):
        per_round = part.pivot_table(index="round", columns="stage", values="seconds",
                                     aggfunc="mean", observed=True)
        per_round = per_round.reindex(columns=[*STAGES, TOTAL]).dropna(subset=[TOTAL]).fillna(0.0)
        if per_round.empty:
            continue
        total = per_round[TOTAL].to_numpy(dtype=float)
        copy = per_round["copy"].to_numpy(dtype=float)
        removed = per_round[["alloc", "copy", "free"]].sum(axis=1).to_numpy(dtype=float)
        alloc = per_round["alloc"].to_numpy(dtype=float)
        row = {**key, "rounds": len(total)}
        for name, (num, den) in {"copy_share": (copy, total), "pinning_share": (removed, total),
                                 "zero_fill_s": (alloc, np.ones_like(alloc))}.items():
            row[name], row[f"{name}_low"], row[f"{name}_high"] = _ci_or_none(
                num, den, confidence, seed)
        out.append(row)
    return pd.DataFrame(out)


def share_words(row: Any, name: str) -> str:
    """``30% (CI 28-32%)``, or the share alone where there is no CI."""
    low, high = row[f"{name}_low"], row[f"{name}_high"]
    if low is None or pd.isna(low):
        return f"{row[name]:.1%} (one round: no CI)"
    return f"{row[name]:.1%} (CI {low:.1%}-{high:.1%})"


def _dwarfed_words(row: Any) -> str:
    """Dwarfed only when the whole CI of the copy's share lies under the threshold."""
    low, high = row["copy_share_low"], row["copy_share_high"]
    if low is None or pd.isna(low):
        low = high = row["copy_share"]
    if high < DWARFED_SHARE:
        return "dwarfed"
    if low >= DWARFED_SHARE:
        return "not dwarfed"
    return "undecided: its CI straddles the threshold"


def copy_dwarfed(frame: pd.DataFrame,
                 arm: str = catalogue.baseline(catalogue.STEP)) -> list[str]:
    """Plain sentences, one per cell, answering "is the copy dwarfed?" for the seed's step, on
    the CI of the copy's share (a share printed as 10 % may be 10.03 % or 9.9 %), beside the
    share pinning removes or shrinks (alloc + copy + free)."""
    parts = decomposition(frame)
    shares = stage_shares(frame, arm)
    sentences = []
    for _, row in parts[parts["arm"] == arm].iterrows():
        share = shares[(shares["rows"] == row["rows"]) & (shares["vocab"] == row["vocab"])
                       & (shares["k"] == row["k"])].iloc[0]
        sentences.append(
            f"n={row['rows']}, V={row['vocab']}, K={row['k']}: the copy took "
            f"{1e3 * row['copy']:.2f} ms of a {1e3 * row['total']:.2f} ms step "
            f"({share_words(share, 'copy_share')}); zero-fill {1e3 * row['alloc']:.2f} ms, "
            f"host top-K {1e3 * row['host_gather']:.2f} ms ({row['host_gather_share']:.0%}), "
            f"free {1e3 * row['free']:.2f} ms, log-softmax {1e3 * row['device']:.2f} ms, "
            f"unattributed {1e3 * row['unattributed']:.2f} ms (means; the parts add up to the "
            f"step). The copy is {_dwarfed_words(share)} (under {DWARFED_SHARE:.0%} counts as "
            f"dwarfed); alloc + copy + free, which pinning removes or shrinks, are "
            f"{share_words(share, 'pinning_share')} of the step.")
    return sentences or [f"The seed's step ({arm}) was not timed in this run: "
                         + not_measured_reason(frame, arm) + "."]


def lever_savings(frame: pd.DataFrame, baseline: str = catalogue.baseline(catalogue.STEP),
                  seed: int = 0) -> pd.DataFrame:
    """Per cell and lever: paired speedup of the whole step over the seed's arm, its CI, ms saved."""
    measured = set(ok_timings(frame)["arm"])
    levers = sorted(a for a in measured if a != baseline and not catalogue.is_twin(a))
    parts = [compare(frame, baseline, arm, ["rows", "vocab", "k"], seed=seed) for arm in levers]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def stage_means(frame: pd.DataFrame, arm: str, stage: str) -> pd.DataFrame:
    """Mean seconds of one arm's stage per ``(rows, vocab, k)`` cell: means, as the stage split
    (:func:`decomposition`) and the verdict's findings quote them."""
    rows = ok_timings(frame, stage)
    rows = rows[rows["arm"] == arm]
    return rows.groupby(["rows", "vocab", "k"], observed=True)["seconds"].mean().reset_index()


def host_gather_backends(frame: pd.DataFrame) -> pd.DataFrame:
    """The host top-K stage, native (the seed's C++) against numpy, per cell, mean ms: the
    same statistic as the seed step's stage split, so the two never quote two figures for one
    stage."""
    native = stage_means(frame, catalogue.baseline(catalogue.STEP), "host_gather").rename(
        columns={"seconds": "native_ms"})
    numpy_ = stage_means(frame, catalogue.NUMPY_TOP_K, "host_gather").rename(
        columns={"seconds": "numpy_ms"})
    both = native.merge(numpy_, on=["rows", "vocab", "k"])
    both[["native_ms", "numpy_ms"]] *= 1e3
    both["numpy_over_native"] = both["numpy_ms"] / both["native_ms"]
    return both


def read_rate_table(frame: pd.DataFrame, gpu_name: str | None = None) -> pd.DataFrame:
    """The one-pass kernel's figure of merit per size: GB/s of logits read, L2 warm and cold,
    and the share of the GPU's HBM peak (the step's ``read_rate`` rows, measured once per size
    outside the timed calls), beside the share the roofline *model* predicts from the
    kernel's compiled cubins (not a measurement) for the GPU they were measured on
    (``gpu_name``, CUDA's name: :func:`stagelab.analyse.roofline.gpu_of_device`; why not,
    where that GPU is not modelled), or without one (a CPU's run) for the lease's
    (:data:`stagelab.analyse.roofline.LEASE_GPU`, so named); one line saying why where there
    are none."""
    rows = frame[(frame["metric"] == schema.READ_RATE) & (frame["status"] == "ok")]
    if rows.empty:
        failed = frame[(frame["metric"] == schema.READ_RATE) & (frame["status"] != "ok")]
        why = (f"failed: {failed['note'].iloc[0]}" if not failed.empty else
               f"not measured: the run did not time the {catalogue.ONE_PASS} arm")
        return pd.DataFrame([{"read rate": why}])
    gpu = roofline.gpu_of_device(gpu_name) if gpu_name else roofline.GPUS[roofline.LEASE_GPU]
    table = rows.assign(
        l2=rows["stage"].str.removeprefix("l2_"), read_gb_per_s=rows["bytes"] / rows["seconds"] / 1e9,
        call_us=rows["seconds"] * 1e6, hbm_percent=rows["value"] * 100,
        model_gpu=gpu_name or f"{roofline.LEASE_GPU} (the lease's: no GPU ran this)",
        model_hbm_percent=[roofline.percent_range(int(r), int(v), int(k), str(d), gpu) if gpu
                           else f"no model: {gpu_name} is not modelled"
                           for r, v, k, d in zip(rows["rows"], rows["vocab"], rows["k"],
                                                 rows["dtype"], strict=True)])
    return table[["rows", "vocab", "k", "dtype", "l2", "call_us", "read_gb_per_s", "hbm_percent",
                  "model_gpu", "model_hbm_percent", "note"]].reset_index(drop=True)
