"""The analysis floor: comparisons, decompositions, goals, recommendations and plain-words findings,
computed from tidy tables (:mod:`stagelab.core.schema`) alone. Torch-free, so that the verdict, the
report and ``stagelab compare`` never load the measuring code.

Every comparison pairs arms by round (the ``round`` column): interleaved rounds share drift, and
the paired bootstrap of :mod:`stagelab.analyse.stats` cancels it. Every goal is one row of one shape:
``goal, target, measured, status, note`` with status ``met``, ``not met`` or ``not measured``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from stagelab.analyse import stats
from stagelab.core import catalogue, forward, schema
from stagelab.core.catalogue import STAGES, TOTAL, aa_name

UNATTRIBUTED = "unattributed"  # what no timed stage accounts for
FORWARD = "forward"  # the decode forward queued before the step, which the step waits behind
SPLIT = (FORWARD, *STAGES, UNATTRIBUTED)  # the parts of a step that add up to its total
DWARFED_SHARE = 0.10  # the copy counts as dwarfed below this share of the seed's step
MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"
GOAL_COLUMNS = ("goal", "target", "measured", "status", "note")


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


def hardware_summary(snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """The machine in four facts, for verdicts and comparisons: GPU name, PCIe link GB/s per
    direction (NVML's maximum), CPU model and torch version from a hardware snapshot
    (``stagelab env --json``); None where the snapshot does not say."""
    snap = snapshot or {}
    return {"gpu": (snap.get("gpu") or {}).get("name"),
            "link_gbps": (snap.get("nvml") or {}).get("pcie_max_gbps_per_direction"),
            "cpu": (snap.get("host") or {}).get("cpu_model"),
            "torch": (snap.get("torch") or {}).get("torch")}


# ----------------------------------------------------------------------------- comparisons

def compare(frame: pd.DataFrame, baseline: str, candidate: str, by: Sequence[str], *,
            stage: str = "total", twin: bool = False, confidence: float = 0.95,
            seed: int = 0) -> pd.DataFrame:
    """Per cell of ``by``: the candidate's paired speedup over the baseline (ratio of mean times)
    with its CI, the ms it saves per call on average, and, with ``twin``, the A/A speedup of the
    baseline over its twin. A cell whose timings are not positive and finite gets no speedup and
    a ``note`` saying why."""
    for column in ("log_softmax", "overlap_order"):  # two places, two orders: two cells each
        if column in frame and frame[column].nunique() > 1:
            by = [*by, column]
    out = []
    for key, part in cells(frame, by):
        base, cand = paired_rounds(part, baseline, candidate, stage=stage)
        row: dict[str, Any] = {**key, "baseline": baseline, "candidate": candidate,
                               "n_rounds": len(base)}
        try:
            if len(base) >= 2:
                row["speedup"], row["ci_low"], row["ci_high"] = stats.paired_speedup(
                    base, cand, confidence=confidence, seed=seed)
                row["saved_ms"] = 1e3 * float(np.mean(base) - np.mean(cand))
            if twin:
                a, b = paired_rounds(part, baseline, aa_name(baseline), stage=stage)
                if len(a) >= 2:
                    row["twin_speedup"], row["twin_ci_low"], row["twin_ci_high"] = (
                        stats.paired_speedup(a, b, confidence=confidence, seed=seed))
        except stats.BadTimings as exc:
            row["note"] = f"bad timings: {exc}"
        out.append(row)
    return pd.DataFrame(out)


def where_log_softmax(frame: pd.DataFrame, place: str) -> pd.DataFrame:
    """The step rows measured with the log-softmax on ``place`` (``device`` or ``host``); rows
    that do not say (tables kept before the choice existed) ran it on the device."""
    return frame[frame["log_softmax"].fillna("device") == place]


def where_overlap(frame: pd.DataFrame, order: str) -> pd.DataFrame:
    """The step rows measured in overlap ``order`` (``queued`` or ``waited``,
    :data:`stagelab.core.forward.OVERLAP_ORDERS`); rows that do not say (tables kept before the
    order was recorded) queued the forward and are read as ``queued``."""
    if "overlap_order" not in frame:
        return frame if order == forward.QUEUED else frame.iloc[0:0]
    return frame[frame["overlap_order"].fillna(forward.QUEUED) == order]


def overlap_orders(frame: pd.DataFrame) -> list[str]:
    """The overlap orders the step rows record, ``queued`` first (rows that do not say count
    as ``queued``); empty for a table without rows."""
    if frame.empty:
        return []
    found = (set(frame["overlap_order"].fillna(forward.QUEUED)) if "overlap_order" in frame
             else {forward.QUEUED})
    return [order for order in forward.OVERLAP_ORDERS if order in found]


def overlap_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per cell and seed arm, the mean step (ms) in each overlap order and ``waited`` over
    ``queued``: what waiting on the forward before the allocation costs each arm; empty when
    the run measured one order only."""
    columns = ["rows", "vocab", "k", "arm", "queued_ms", "waited_ms", "waited_over_queued"]
    timed = ok_timings(frame)
    if "overlap_order" not in timed:
        return pd.DataFrame(columns=columns)
    timed = timed[timed["overlap_order"].isin(forward.OVERLAP_ORDERS)]  # a stranger's: known only
    if timed["overlap_order"].nunique() < len(forward.OVERLAP_ORDERS):
        return pd.DataFrame(columns=columns)
    means = timed.pivot_table(index=["rows", "vocab", "k", "arm"], columns="overlap_order",
                              values="seconds", aggfunc="mean", observed=True) * 1e3
    means = means.rename(columns={order: f"{order}_ms" for order in forward.OVERLAP_ORDERS})
    means = means.dropna().reset_index()
    means["waited_over_queued"] = means["waited_ms"] / means["queued_ms"]
    return pd.DataFrame(means, columns=columns)


MAPPED_FRESH = "mapped fresh"  # the seed vector's regime that never touches the process's heap


def regimes(frame: pd.DataFrame) -> list[str]:
    """The seed vector's allocation regimes the rows record, the process's malloc first."""
    found = sorted({str(r) for r in frame["regime"].dropna()}) if "regime" in frame else []
    return sorted(found, key=lambda regime: regime == MAPPED_FRESH)


def where_regime(frame: pd.DataFrame, regime: str | None = None) -> pd.DataFrame:
    """The rows measured under the seed vector's allocation ``regime`` (None: the first the rows
    record, the process's malloc before ``mapped fresh``); rows that do not say (tables kept
    before the choice existed) ran under the process's malloc and are kept."""
    recorded = regimes(frame)
    regime = regime or (recorded[0] if recorded else None)
    if regime is None or "regime" not in frame:
        return frame
    keep = frame["regime"] == regime
    if regime != MAPPED_FRESH:
        keep |= frame["regime"].isna()
    return frame[keep]


def log_softmax_places(frame: pd.DataFrame) -> pd.DataFrame:
    """Per cell and seed arm, the mean step with the log-softmax on the device and on the host
    and their ratio; empty when the run measured one place only."""
    timed = ok_timings(frame)
    timed = timed[timed["log_softmax"].notna()]
    if timed["log_softmax"].nunique() < 2:
        return pd.DataFrame(columns=["rows", "vocab", "k", "arm", "device_ms", "host_ms",
                                     "host_over_device"])
    means = timed.pivot_table(index=["rows", "vocab", "k", "arm"], columns="log_softmax",
                              values="seconds", aggfunc="mean", observed=True) * 1e3
    means = means.rename(columns={"device": "device_ms", "host": "host_ms"}).reset_index()
    means["host_over_device"] = means["host_ms"] / means["device_ms"]
    return pd.DataFrame(means)


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


def read_rate_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The one-pass kernel's figure of merit per size: GB/s of logits read, L2 warm and cold,
    and the share of the GPU's HBM peak (the step's ``read_rate`` rows, measured once per size
    outside the timed calls); one line saying why where there are none."""
    rows = frame[(frame["metric"] == schema.READ_RATE) & (frame["status"] == "ok")]
    if rows.empty:
        failed = frame[(frame["metric"] == schema.READ_RATE) & (frame["status"] != "ok")]
        why = (f"failed: {failed['note'].iloc[0]}" if not failed.empty else
               f"not measured: the run did not time the {catalogue.ONE_PASS} arm")
        return pd.DataFrame([{"read rate": why}])
    table = rows.assign(
        l2=rows["stage"].str.removeprefix("l2_"), read_gb_per_s=rows["bytes"] / rows["seconds"] / 1e9,
        call_us=rows["seconds"] * 1e6, hbm_percent=rows["value"] * 100)
    return table[["rows", "vocab", "k", "dtype", "l2", "call_us", "read_gb_per_s", "hbm_percent",
                  "note"]].reset_index(drop=True)


def clock_disagreements(frame: pd.DataFrame) -> dict[str, int]:
    """How many timed calls had a host clock that disagreed with the CUDA events (and how many
    were cross-checked at all)."""
    timed = ok_timings(frame)
    checked = timed["clock_agrees"].dropna()
    return {"checked": int(len(checked)), "disagree": int((~checked.astype(bool)).sum())}


def sync_warnings(frame: pd.DataFrame) -> str | None:
    """What torch's sync debug mode flagged, per arm (the most over the cells), in one sentence;
    None where it did not run (no CUDA device)."""
    rows = frame[(frame["metric"] == "sync_warnings") & (frame["status"] == "ok")]
    if rows.empty:
        return None
    most = rows.sort_values("value").groupby("arm", observed=True).tail(1).sort_values("arm")
    parts = [f"{r.arm} {int(r.value)}" + (f" ({r.note})" if r.note else "")
             for r in most.itertuples()]
    return ("Synchronizing operations flagged by torch's sync debug mode, one call per arm (each "
            "arm's designed wait is one synchronize, and the seed's arms also copy into pageable "
            "memory): " + "; ".join(parts) + ".")


def nothing_measured(frame: pd.DataFrame, what: str) -> str | None:
    """One clear sentence when no timing of ``what`` is ok: which cells and arms, why, what to
    change; None when something was measured."""
    if not ok_timings(frame).empty:
        return None
    if frame.empty:
        return f"Nothing was measured in {what}: no cell was given."
    reasons = frame.drop_duplicates("note")[["status", "note"]]
    why = "; ".join(f"{r.status}: {r.note}" for r in reasons.itertuples() if r.note)
    cells_seen = frame.dropna(subset=["rows"]).drop_duplicates(["rows", "vocab"])
    sizes = ", ".join(f"n={r.rows} V={r.vocab}"
                      for r in cells_seen.sort_values(["vocab", "rows"]).itertuples())
    return (f"Nothing was measured in {what} (cells {sizes}). Why: {why or 'no arm ran'}. "
            "Change the sizes or arms in the parameters (smaller rows or vocabularies, arms "
            "that exist on this machine) and run it again.")


def measured_summary(frame: pd.DataFrame, what: str) -> str:
    """A notebook's first words after measuring: the device and the arms timed, or one clear
    sentence saying that nothing could be measured, why, and what to change."""
    empty = nothing_measured(frame, what)
    if empty:
        return f"**{empty}**"
    timed = sorted(ok_timings(frame)["arm"].unique())
    missing = frame[frame["status"] != "ok"].drop_duplicates("arm")
    lines = [f"**Device:** `{frame['device'].dropna().iloc[0]}` · **arms timed:** "
             f"{', '.join(timed)}"]
    lines += [f"- `{r.arm}` {r.status}: {r.note}" for r in missing.itertuples()]
    return "\n".join(lines)


def closing(frame: pd.DataFrame, what: str) -> str:
    """A notebook's last words: what was measured, or why nothing was."""
    empty = nothing_measured(frame, what)
    if empty:
        return f"**{empty}**"
    timed = ok_timings(frame)
    cells = timed.drop_duplicates(["rows", "vocab", "k", "chunk"]).shape[0]
    failed = sorted(frame.loc[frame["status"] == "failed", "arm"].unique())
    tail = f" Failed: {', '.join(failed)} (see the table above)." if failed else ""
    return (f"Measured in {what}: {len(timed)} timed calls over {cells} cell(s) and "
            f"{timed['arm'].nunique()} arm(s).{tail}")


def as_bullets(sentences: list[str]) -> str:
    """Sentences as a Markdown list."""
    return "\n".join(f"- {s}" for s in sentences)


def spread(frame: pd.DataFrame, by: Sequence[str] = ("rows", "vocab", "arm"),
           noisy_at: float = 0.10) -> pd.DataFrame:
    """Median, quartiles and IQR/median per cell and arm; ``noisy`` where IQR/median reaches 10 %
    (where ``torch.utils.benchmark`` warns)."""
    out = stats.summarize(ok_timings(frame), list(by))
    return out.assign(noisy=out["iqr_over_median"] >= noisy_at)


def copy_comparisons(frame: pd.DataFrame, baseline: str = catalogue.baseline(catalogue.STAGING),
                     seed: int = 0) -> pd.DataFrame:
    """Every measured staging arm against the seed's fresh buffer, per cell, with the A/A twin."""
    measured = set(ok_timings(frame)["arm"])
    parts = [compare(frame, baseline, c, ["rows", "vocab"], twin=True, seed=seed)
             for c in catalogue.arm_names(catalogue.STAGING)
             if c != baseline and c in measured and baseline in measured]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def copy_finding(frame: pd.DataFrame, compared: pd.DataFrame) -> str:
    """Notebook 01's finding in words: at the largest copy measured, each arm against the seed's
    fresh buffer (paired speedup with its CI, ms saved per copy), the A/A twin, and whether the
    proposal itself could be measured here."""
    empty = nothing_measured(frame, "the staging sweep")
    if empty:
        return f"**{empty}**"
    measured = compared.dropna(subset=["speedup"]) if "speedup" in compared else compared.iloc[:0]
    if measured.empty:
        return ("**Finding:** no arm was timed beside the seed's fresh buffer in a shared round, "
                "so nothing can be compared; see the arms timed above.")
    sizes = measured["rows"] * measured["vocab"]
    cell = measured[sizes == sizes.max()]
    first = cell.iloc[0]
    arms = "; ".join(f"`{r.candidate}` {r.speedup:.2f}x (CI {r.ci_low:.2f}-{r.ci_high:.2f}, "
                     f"{r.saved_ms:.2f} ms saved per copy)" for r in cell.itertuples())
    twin = (f" The A/A twin reads {first['twin_speedup']:.3f}x (CI {first['twin_ci_low']:.3f}-"
            f"{first['twin_ci_high']:.3f}): the harness's own noise."
            if pd.notna(first.get("twin_speedup")) else " No A/A twin was timed.")
    proposal = catalogue.candidate(catalogue.STAGING)
    missing = ("" if proposal in set(cell["candidate"])
               else f" The proposal `{proposal}` was not measured: "
                    f"{not_measured_reason(frame, proposal)}.")
    return (f"**Finding at the largest copy measured (n={first['rows']}, V={first['vocab']}):** "
            f"against the seed's fresh zero-filled buffer (its time over the arm's; above 1 the "
            f"arm is faster): {arms}.{twin}{missing} This is the copy alone: whether it matters "
            "for the engine is decided on the whole step (notebook 02, decided in 04).")


def holdings(frame: pd.DataFrame) -> pd.DataFrame:
    """Per cell and arm: the host allocations it made over the cell (a count), the pinned bytes
    it holds and its host buffer's capacity in bytes, one column each."""
    held = frame[frame["metric"].isin(["pinned_bytes_held", "allocations"])]
    if held.empty:
        return pd.DataFrame(columns=["rows", "vocab", "arm", "allocations", "pinned_held_bytes",
                                     "buffer_capacity_bytes"])
    keys = ["rows", "vocab", "arm"]
    pinned = held[held["metric"] == "pinned_bytes_held"].set_index(keys)["bytes"]
    counted = held[held["metric"] == "allocations"].set_index(keys)
    table = pd.DataFrame({"allocations": counted["value"], "pinned_held_bytes": pinned,
                          "buffer_capacity_bytes": counted["bytes"]})
    return table.reset_index().sort_values(keys, ignore_index=True)


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


def prompt_series(frame: pd.DataFrame) -> pd.Series:
    """Each row's configuration as figures and tables name it: the arm, and for head_fused its
    tile (``head_fused+overlap · tile 1024``)."""
    tiles = frame["tile"].astype("Int64") if "tile" in frame else pd.Series(pd.NA, frame.index)
    words = " · tile " + tiles.astype("string")
    return frame["arm"].astype("string") + words.fillna("")


# ------------------------------------------------------------------------- prompt logprobs

def prompt_time_relative(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds per configuration and its ratio to the same arm's unchunked mean: means, the
    statistic :func:`recommend_chunk` decides on, so that its table, figure and sentence agree."""
    timed = ok_timings(frame)
    if timed.empty:
        return pd.DataFrame(columns=["arm", "tile", "chunk", "rows", "mean_seconds", "relative"])
    means = _tiles_filled(timed).groupby(["arm", "tile", "chunk", "rows"], as_index=False,
                                         observed=True)["seconds"].mean()
    means = means.rename(columns={"seconds": "mean_seconds"})
    unchunked = means[means["chunk"] >= means["rows"]].set_index(["arm", "tile"])["mean_seconds"]
    reference = pd.MultiIndex.from_frame(means[["arm", "tile"]]).map(unchunked.to_dict())
    means["relative"] = means["mean_seconds"] / np.asarray(reference, dtype=float)
    return _tiles_restored(means)


def overlap_effect(frame: pd.DataFrame) -> pd.DataFrame:
    """Per method and chunk: mean seconds with and without overlap, and the ms overlap saves on
    average (means, as every prompt-logprob figure and the chunk recommendation use)."""
    timed = _tiles_filled(ok_timings(frame))
    timed = timed.assign(method=timed["arm"].str.removesuffix(catalogue.OVERLAP_SUFFIX))
    table = timed.pivot_table(index=["method", "tile", "chunk"], columns="overlap",
                              values="seconds", aggfunc="mean", observed=True)
    table = table.rename(columns={True: "overlap_mean_s", False: "plain_mean_s"}).reset_index()
    if {"overlap_mean_s", "plain_mean_s"} <= set(table.columns):
        table["overlap_saves_mean_ms"] = 1e3 * (table["plain_mean_s"] - table["overlap_mean_s"])
    table.columns.name = None
    return _tiles_restored(table)


def recommend_chunk(frame: pd.DataFrame, arm: str = catalogue.PROMPT_RECOMMENDED_ARM,
                    tolerance: float = 0.05, confidence: float = 0.95,
                    seed: int = 0, tile: int | None = None) -> dict[str, Any]:
    """The smallest chunk the run timed (shorter than the prompt) not shown to be more than
    ``tolerance`` slower than the fastest configuration of that arm (unchunked included), with
    the times behind the choice.

    Each chunk's mean time is compared with the fastest's over paired rounds, with a bootstrap CI;
    a chunk qualifies unless the whole CI lies above ``1 + tolerance``. Among those, the smallest
    wins, because a chunk's peak memory grows with its size (chunk x vocabulary). Deciding on CIs
    keeps the choice stable: point estimates on overlapping ranges flipped it between runs. The
    unchunked prompt is the reference, never the recommendation: where no timed chunk qualifies,
    the fastest timed chunk is named and the reason says that chunking bought no time here, only
    bounded memory, at what cost. ``tile``: the head-fused tile whose configurations decide (None:
    those without a tile, or an arm's smallest tile where all of its configurations have one)."""
    timed = _tiles_filled(ok_timings(frame))
    timed = timed[timed["arm"] == arm]
    if tile is None and not timed.empty and not (timed["tile"] == NO_TILE).any():
        tile = int(timed["tile"].min())
    timed = timed[timed["tile"] == (NO_TILE if tile is None else tile)]
    if timed.empty:
        return {"arm": arm, "chunk": None, "reason": f"{arm} was not timed in this run"}
    per_round = timed.pivot_table(index="round", columns="chunk", values="seconds",
                                  aggfunc="mean", observed=True)
    means = per_round.mean().sort_index()
    best_chunk = int(means.idxmin())
    rows = int(timed["rows"].iloc[0])
    ratios = {int(chunk): _ratio_to(per_round, means, int(chunk), best_chunk, confidence, seed)
              for chunk in means.index if chunk < rows}
    if not ratios:
        return {"arm": arm, "chunk": None, "unchunked_rows": rows, "tolerance": tolerance,
                "reason": f"no chunk shorter than the prompt ({rows} rows) was timed: chunking "
                          "was not measured"}
    within = [c for c, (_, low, _) in ratios.items() if low <= 1 + tolerance]
    chunk = min(within) if within else min(ratios, key=lambda c: ratios[c][0])
    ratio, low, high = ratios[chunk]
    best_ms = f"{1e3 * float(means[best_chunk]):#.3g}".rstrip(".")  # as tables show it
    where = "the whole prompt" if best_chunk >= rows else f"chunk {best_chunk}"
    fastest = f"the fastest ({best_ms} ms on average, {where})"
    measured = (f"{fastest}: this chunk itself" if chunk == best_chunk else
                f"{fastest}: {ratio:.3f}x of its mean (CI {low:.3f}-{high:.3f})")
    if within:
        reason = (f"the smallest chunk timed not shown to be more than {tolerance:.0%} slower "
                  f"than {measured}; a smaller chunk holds less memory")
    else:
        reason = (f"every chunk timed is more than {tolerance:.0%} slower than the whole prompt: "
                  f"chunking bought no time here, only bounded memory, and chunk {chunk} costs "
                  f"least against {measured}")
    return {"arm": arm, "chunk": chunk, "mean_seconds": float(means[chunk]),
            "best_seconds": float(means[best_chunk]), "best_chunk": best_chunk,
            "ratio_to_best": ratio, "ratio_ci_low": low, "ratio_ci_high": high,
            "unchunked_rows": rows, "tolerance": tolerance, "reason": reason}


def _ratio_to(per_round: pd.DataFrame, means: pd.Series, chunk: int, best: int,
              confidence: float, seed: int) -> tuple[float, float, float]:
    """A chunk's mean time over the fastest's, paired by round, with its CI (the point alone
    where fewer than two rounds are shared)."""
    paired = per_round[[chunk, best]].dropna().to_numpy(dtype=float)
    try:
        return stats.paired_speedup(paired[:, 0], paired[:, 1], confidence=confidence,
                                    seed=seed)
    except ValueError:  # fewer than two shared rounds, or bad timings: the point alone
        point = float(means[chunk] / means[best])
        return (point, point, point)


def recommendation_sentence(recommendation: dict[str, Any]) -> str:
    """A :func:`recommend_chunk` or :func:`recommend_tile` result in one sentence, as notebook 03
    and the verdict say it."""
    rec = recommendation
    if "tile" in rec:
        at = f", at chunk {rec['chunk']}" if rec.get("chunk") is not None else ""
        return f"Recommended tile: **{rec['tile']}** ({rec.get('arm')}{at}): {rec.get('reason')}."
    return f"Recommended chunk: **{rec.get('chunk')}** ({rec.get('arm')}): {rec.get('reason')}."


# The head-fused method's memory bound: its peak extra memory at most this share of one
# fp32 [C, V] chunk of logits (issue 39's goal at T = 513, V = 152,064, C = 256).
HEAD_FUSED_MEMORY_SHARE = 0.35
EXACT_ATOL = 5e-5  # logprobs within fp32 tolerance of the reference, ids equal: exact


def recommend_tile(frame: pd.DataFrame, arm: str | None = None, chunk: int | None = None,
                   tolerance: float = 0.05, confidence: float = 0.95, seed: int = 0,
                   share: float = HEAD_FUSED_MEMORY_SHARE,
                   atol: float = EXACT_ATOL) -> dict[str, Any]:
    """The head-fused method's vocabulary tile, chosen as :func:`recommend_chunk` chooses a chunk:
    the smallest eligible tile not shown to be more than ``tolerance`` slower than the fastest
    tile timed (paired rounds, a bootstrap CI: a tile qualifies unless its whole CI lies above
    ``1 + tolerance``), because a smaller tile holds less memory (chunk x tile).

    Eligible: exact (ids equal to its unchunked reference, logprobs within ``atol``) and within
    the memory bound (the measured peak, the model's where none was measured, at most ``share``
    of one fp32 ``[C, V]`` chunk). Tiles are compared at ``chunk`` (None: the largest chunk
    shorter than the prompt timed with every tile). ``arm`` None: the head-fused arm timed with
    the most tiles, ``+overlap`` first. ``candidates`` holds each tile's figures."""
    timed = ok_timings(frame)
    timed = timed[timed["tile"].notna()] if "tile" in timed else timed.iloc[0:0]
    arm = arm or _tiled_arm(timed)
    timed = timed[timed["arm"] == arm]
    if arm is None or timed.empty:
        return {"arm": arm, "tile": None, "chunk": None,
                "reason": f"{arm or catalogue.HEAD_FUSED} was not timed at any tile in this run"}
    rows = int(timed["rows"].iloc[0])
    chunk = chunk if chunk is not None else _common_chunk(timed, rows)
    at = timed[timed["chunk"] == chunk]
    per_round = at.pivot_table(index="round", columns="tile", values="seconds", aggfunc="mean",
                               observed=True)
    means = per_round.mean().sort_index()
    best = int(means.idxmin())
    chunk_bytes = int(chunk) * int(timed["vocab"].iloc[0]) * 4
    bound = share * chunk_bytes
    candidates = [_tile_candidate(frame, arm, int(tile), chunk, chunk_bytes, bound, atol,
                                  _ratio_to(per_round, means, int(tile), best, confidence, seed),
                                  float(means[tile])) for tile in means.index]
    eligible = [c for c in candidates if c["exact"] and c["within_bound"]]
    found = {"arm": arm, "chunk": int(chunk), "best_tile": best, "tolerance": tolerance,
             "bound_bytes": int(bound), "candidates": candidates}
    if not eligible:
        return {**found, "tile": None,
                "reason": f"no tile timed is both exact (ids equal, logprobs within {atol:g}) "
                          f"and within {share:.2f} x one fp32 [C, V] chunk: see the table"}
    within = [c for c in eligible if c["ratio_ci_low"] <= 1 + tolerance]
    pick = (min(within, key=lambda c: c["tile"]) if within
            else min(eligible, key=lambda c: c["mean_seconds"]))
    return {**found, "tile": pick["tile"], "mean_seconds": pick["mean_seconds"],
            "ratio_to_best": pick["ratio_to_best"], "reason": _tile_reason(
                pick, best, float(means[best]), bool(within), tolerance, share)}


TILE_COLUMNS = ("tile", "chunk", "mean_seconds", "ratio_to_best", "ratio_ci_low",
                "ratio_ci_high", "id_mismatches", "max_abs_error", "exact", "peak_bytes",
                "peak_of", "chunk_share", "within_bound")


def tile_table(recommendation: dict[str, Any]) -> pd.DataFrame:
    """A :func:`recommend_tile` result's figures, one row per tile timed (empty where none
    was): the table beside its sentence."""
    return pd.DataFrame(recommendation.get("candidates", []), columns=list(TILE_COLUMNS))


def _tiled_arm(timed: pd.DataFrame) -> str | None:
    """The head-fused arm timed with the most tiles, ``+overlap`` first (None: none timed)."""
    arms = [catalogue.prompt_arm(catalogue.HEAD_FUSED, overlap) for overlap in (True, False)]
    counts = {arm: timed.loc[timed["arm"] == arm, "tile"].nunique() for arm in arms}
    arm = max(arms, key=lambda a: counts[a])
    return arm if counts[arm] else None


def _common_chunk(timed: pd.DataFrame, rows: int) -> int:
    """The largest chunk timed with every tile, shorter than the prompt where one is."""
    per_tile = timed.groupby("tile", observed=True)["chunk"].agg(lambda c: set(c.astype(int)))
    common = set.intersection(*per_tile)
    chunked = [c for c in common if c < rows]
    return max(chunked or common or {rows})


def _tile_candidate(frame: pd.DataFrame, arm: str, tile: int, chunk: int, chunk_bytes: int,
                    bound: float, atol: float, ratio: tuple[float, float, float],
                    mean: float) -> dict:
    """One tile's figures at ``chunk``: time against the fastest, exactness, peak, bound."""
    rows = frame[(frame["arm"] == arm) & (frame["tile"] == tile) & (frame["chunk"] == chunk)
                 & (frame["status"] == "ok")]

    def first(metric: str, column: str) -> float | None:
        found = rows.loc[rows["metric"] == metric, column].dropna()
        return float(found.iloc[0]) if not found.empty else None

    ids, error = first("id_mismatches", "value"), first("max_abs_error", "value")
    peak, source = None, "not measured"
    for metric, words in (("peak_device_bytes", "device"), ("peak_host_bytes", "host RSS"),
                          ("predicted_peak_bytes", "model")):
        peak = first(metric, "bytes")
        if peak is not None:
            source = words
            break
    return {"tile": tile, "chunk": chunk, "mean_seconds": mean, "ratio_to_best": ratio[0],
            "ratio_ci_low": ratio[1], "ratio_ci_high": ratio[2],
            "id_mismatches": ids, "max_abs_error": error,
            "exact": ids == 0 and error is not None and error <= atol,
            "peak_bytes": peak, "peak_of": source,
            "chunk_share": None if peak is None else peak / chunk_bytes,
            "within_bound": peak is not None and peak <= bound}


def _tile_reason(pick: dict, best: int, best_seconds: float, within: bool, tolerance: float,
                 share: float) -> str:
    """Why :func:`recommend_tile` chose ``pick``, in words."""
    best_ms = f"{1e3 * best_seconds:#.3g}".rstrip(".")
    fastest = f"the fastest tile ({best_ms} ms on average, tile {best})"
    measured = (f"{fastest}: this tile itself" if pick["tile"] == best else
                f"{fastest}: {pick['ratio_to_best']:.3f}x of its mean (CI "
                f"{pick['ratio_ci_low']:.3f}-{pick['ratio_ci_high']:.3f})")
    held = (f"exact, and its peak ({pick['peak_bytes'] / 2**20:.1f} MiB, {pick['peak_of']}) "
            f"within {share:.2f} x one fp32 [C, V] chunk")
    if within:
        return (f"the smallest exact tile within the memory bound not shown to be more than "
                f"{tolerance:.0%} slower than {measured}; {held}; a smaller tile holds less memory")
    return (f"every exact tile within the memory bound is more than {tolerance:.0%} slower than "
            f"{measured}, and this one costs least; {held}")


def prompt_peaks(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured and predicted peak bytes per arm, tile (head_fused's, else missing) and chunk
    (one column per metric)."""
    mem = frame[frame["metric"].isin(["peak_device_bytes", "peak_host_bytes",
                                      "predicted_peak_bytes"]) & (frame["status"] == "ok")]
    if mem.empty:
        return pd.DataFrame(columns=["arm", "tile", "chunk"])
    table = _tiles_filled(mem).pivot_table(index=["arm", "tile", "chunk"], columns="metric",
                                           values="bytes", aggfunc="first",
                                           observed=True).reset_index()
    table.columns.name = None
    return _tiles_restored(table)


# ------------------------------------------------------------------------------------ goals

def goal(name: str, target: str, measured: str, met: bool | None, note: str = "") -> dict:
    """One goal row: ``met`` / ``not met`` from a boolean, ``not measured`` from None."""
    status = NOT_MEASURED if met is None else (MET if met else NOT_MET)
    return {"goal": name, "target": target, "measured": measured, "status": status, "note": note}


# PCIe's practical ceiling: 256 B payloads under TLP and DLLP overhead leave about 87 % of the
# link's rate (published Gen4/Gen5 D2H copies peak near 86-87 %); the goal sits below it.
LINK_PRACTICAL_CEILING = 0.87
LINK_GOAL_SHARE = 0.80
LINK_TARGET = (f">= {LINK_GOAL_SHARE * 100:.0f} % (practical ceiling about "
               f"{LINK_PRACTICAL_CEILING * 100:.0f} %)")


def staging_goals(frame: pd.DataFrame, snap: dict, big_bytes: int = 64 * 10**6) -> list[dict]:
    """Copy-level goals: pinned grow-only >= 95 % of the raw pinned ceiling; the raw ceiling
    >= :data:`LINK_GOAL_SHARE` of the NVML link for copies of 64 MB and more (else the likely
    cause); the A/A harness's precision; the reuse lever with its CI at the largest cell."""
    pinned = catalogue.candidate(catalogue.STAGING)
    ceiling = catalogue.only_with_role(catalogue.STAGING, catalogue.CEILING)
    fresh, reused = catalogue.baseline(catalogue.STAGING), catalogue.REUSE_LEVER[catalogue.STAGING]
    timed = ok_timings(frame)
    medians = timed.groupby(["arm", "bytes"], observed=True)["gb_per_s"].median().unstack("arm")
    gpu = bool(snap.get("gpu"))
    goals = []
    name = "pinned grow-only vs raw pinned ceiling"
    if gpu and {pinned, ceiling} <= set(medians.columns):
        share = (medians[pinned] / medians[ceiling]).dropna()
        goals.append(goal(name, ">= 95 % in every cell",
                          f"{share.min():.1%} (worst cell) to {share.max():.1%}",
                          bool(share.min() >= 0.95)))
    else:
        goals.append(goal(name, ">= 95 % in every cell", "-", None,
                          "no CUDA device: pinned memory does not exist here" if not gpu
                          else not_measured_reason(frame, pinned)))
    link = (snap.get("nvml") or {}).get("pcie_max_gbps_per_direction")
    big = medians[medians.index >= big_bytes] if ceiling in medians else medians.iloc[:0]
    name = "raw ceiling vs NVML link (copies >= 64 MB)"
    if link and gpu and not big.empty:
        share = float(big[ceiling].median() / link)
        met = share >= LINK_GOAL_SHARE
        goals.append(goal(name, LINK_TARGET, f"{share:.1%} of {link} GB/s", met,
                          "" if met else likely_link_cause(snap)))
    else:
        goals.append(goal(name, LINK_TARGET, "-", None,
                          "no GPU link to compare with (the raw ceiling here is a host-to-host "
                          "copy)" if not gpu else "no copy of 64 MB or more, or NVML unread"))
    aa = compare(frame, fresh, reused, ["rows", "vocab"], twin=True)
    goals.append(harness_goal(aa))
    name, target = "reuse lever: reused vs fresh pageable", "CI above 1 at the largest cell"
    measured = aa.dropna(subset=["speedup"]) if "speedup" in aa else aa.iloc[:0]
    if not measured.empty:
        big_cell = measured.assign(size=measured["rows"] * measured["vocab"]).sort_values(
            "size").iloc[-1]
        goals.append(goal(name, target,
                          f"{big_cell['speedup']:.2f}x [{big_cell['ci_low']:.2f}, "
                          f"{big_cell['ci_high']:.2f}], {big_cell['saved_ms']:.2f} ms per copy "
                          f"at n={big_cell['rows']}, V={big_cell['vocab']}",
                          bool(big_cell["ci_low"] > 1)))
    else:
        goals.append(goal(name, target, "-", None,
                          f"{fresh} and {reused} not both timed"))
    return goals


HARNESS_GOAL = "A/A twin's CI precision (not the trust check)"


def harness_goal(compared: pd.DataFrame, tolerance: float = 0.02) -> dict:
    """The A/A harness's precision: every cell's CI of the baseline against its twin at most
    +-2 % wide (half-width), enough rounds to resolve delta. It quotes the CI's width, never the
    twin's ratio, so that it cannot read as a difference: whether identical arms *differ* (a CI
    wholly outside 1 +- delta, the twins checked as one family) is the verdict's harness check
    (:func:`stagelab.analyse.verdict.harness_check`), which decides trust."""
    target = f"CI half-width <= {tolerance:.0%} in every cell"
    if "twin_ci_low" in compared:
        compared = compared.dropna(subset=["twin_ci_low", "twin_ci_high"])
    if "twin_ci_low" not in compared or compared.empty:
        return goal(HARNESS_GOAL, target, "-", None, "no twin was timed")
    widest = compared.assign(half=(compared["twin_ci_high"] - compared["twin_ci_low"]) / 2)
    widest = widest.sort_values("half").iloc[-1]
    met = bool(widest["half"] <= tolerance)
    return goal(HARNESS_GOAL, target,
                f"widest at n={widest['rows']}, V={widest['vocab']}: half-width "
                f"{widest['half']:.1%} (CI {widest['twin_ci_low']:.3f}-"
                f"{widest['twin_ci_high']:.3f})", met,
                "" if met else "too few rounds to resolve delta here; not a finding that "
                "identical arms differ: the trust check judges that, for all twins at once")


def likely_link_cause(snap: dict) -> str:
    """Plain words for why a raw pinned copy falls short of the link's theoretical bandwidth."""
    nvml = snap.get("nvml") or {}
    causes = []
    if (nvml.get("pcie_current_generation") or 0) < (nvml.get("pcie_max_generation") or 0) or (
            nvml.get("pcie_current_width") or 0) < (nvml.get("pcie_max_width") or 0):
        causes.append(f"the link runs below its maximum (Gen{nvml.get('pcie_current_generation')}"
                      f" x{nvml.get('pcie_current_width')} of Gen{nvml.get('pcie_max_generation')}"
                      f" x{nvml.get('pcie_max_width')}; read it under load to rule out idle "
                      "downtraining)")
    if nvml.get("numa_node") is not None and nvml["numa_node"] >= 0:  # -1: the kernel does not know
        causes.append(f"the GPU hangs off NUMA node {nvml['numa_node']}: a process or buffer on "
                      "another node crosses the socket link (numactl --cpunodebind/--membind)")
    causes.append("the buffer size: small copies pay fixed per-copy latency")
    return "; ".join(causes)


def fused_goal(frame: pd.DataFrame, target_rows: int = 64, target_vocab: int = 152_064,
               target_k: int = 5, factor: float = 10.0) -> dict:
    """The fused arm's goal (>= 10x the seed's step at n=64, V~152k, K=5), at the nearest cell."""
    name, target = "fused step vs the seed's step", f">= {factor:.0f}x at n=64, V~152k, K=5"
    savings = lever_savings(frame)
    if savings.empty or catalogue.FUSED not in set(savings["candidate"]) or (
            "speedup" not in savings):
        return goal(name, target, "-", None, "the fused and seed arms were not both timed")
    fused = savings[(savings["candidate"] == catalogue.FUSED) & savings["speedup"].notna()].copy()
    if fused.empty:
        return goal(name, target, "-", None, "the fused and seed arms share no timed round")
    fused["distance"] = (abs(fused["rows"] - target_rows) / target_rows
                         + abs(fused["vocab"] - target_vocab) / target_vocab
                         + abs(fused["k"] - target_k))
    cell = fused.sort_values("distance").iloc[0]
    where = "the goal's cell" if cell["distance"] == 0 else "the nearest measured cell"
    return goal(name, target, f"{cell['speedup']:.1f}x (CI {cell['ci_low']:.1f}-"
                f"{cell['ci_high']:.1f}x) at {where} n={cell['rows']}, V={cell['vocab']}, "
                f"K={cell['k']}", bool(cell["ci_low"] >= factor))


def prompt_goals(frame: pd.DataFrame) -> list[dict]:
    """Prompt-logprob goals: the fused path's peak extra memory within 1.15 x one chunk of logits,
    and chunked time within 1.05 x unchunked for chunks >= 512; each goal that has nothing to
    judge gets one ``not measured`` row saying why (a short prompt has no such chunk)."""
    goals = []
    peaks = frame[frame["metric"].isin(["peak_device_bytes", "peak_host_bytes"])
                  & (frame["arm"].str.removesuffix(catalogue.OVERLAP_SUFFIX) == catalogue.FUSED)
                  & (frame["status"] == "ok")]
    on_gpu = bool((peaks["metric"] == "peak_device_bytes").any())
    peaks = peaks[peaks["metric"] == ("peak_device_bytes" if on_gpu else "peak_host_bytes")]
    for _, row in peaks.sort_values(["chunk", "arm"]).iterrows():
        ratio = row["bytes"] / (row["chunk"] * row["vocab"] * catalogue.DTYPE_BYTES[row["dtype"]])
        goals.append(goal(f"fused peak extra memory, chunk {row['chunk']} ({row['arm']})",
                          "<= 1.15 x C x V x dtype bytes",
                          f"{ratio:.2f} x ({row['bytes'] / 2**20:.1f} MiB, "
                          f"{'device' if on_gpu else 'host RSS'})", bool(ratio <= 1.15)))
    if peaks.empty:
        goals.append(goal("fused peak extra memory", "<= 1.15 x C x V x dtype bytes", "-", None,
                          "no peak of the fused path was measured"))
    relative = prompt_time_relative(frame)
    large = relative[(relative["chunk"] >= 512) & (relative["chunk"] < relative["rows"])]
    for _, row in large.iterrows():
        goals.append(goal(f"chunked time, chunk {row['chunk']} ({row['arm']})",
                          "<= 1.05 x unchunked", f"{row['relative']:.3f} x",
                          bool(row["relative"] <= 1.05)))
    if large.empty:
        goals.append(goal("chunked time, chunks of 512 or more", "<= 1.05 x unchunked", "-", None,
                          "no chunk of 512 rows or more, shorter than the prompt, was timed"))
    return goals


def goals_frame(goals: list[dict]) -> pd.DataFrame:
    """Goal rows as a table in the one shape."""
    return pd.DataFrame(goals, columns=list(GOAL_COLUMNS))
