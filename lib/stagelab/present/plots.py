"""The suite's seaborn figures, one function per figure, each safe on empty data (it then says
what is missing on the axes instead of raising), and the suite's one plot theme (:func:`use_theme`,
set by every notebook's context, never on import)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

import matplotlib.colors as mcolors
import matplotlib.patches as mpatches
import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D

from stagelab.analyse import prompt_analysis, step_analysis, timings
from stagelab.core import catalogue

DECISION_COLORS = {"PORT": "tab:green", "CLOSE": "tab:gray", "INCONCLUSIVE": "tab:orange"}
MEASURED = "measured"  # a cell shown for context, not a decision: drawn in its arm's colour


THEME = {"style": "whitegrid", "context": "notebook"}


def _catalogue_arm_names() -> tuple[str, ...]:
    """Every arm name a figure can show: first the arms every reader looks for (each
    experiment's baseline and candidate, the prompt-logprob methods with and without overlap,
    the reuse levers), then the others in catalogue order."""
    prompt = [catalogue.prompt_arm(a.name, overlap)
              for overlap in (False, True) for a in catalogue.arms(catalogue.PROMPT)]
    first = [catalogue.baseline(catalogue.STAGING), catalogue.candidate(catalogue.STAGING),
             catalogue.baseline(catalogue.STEP), catalogue.candidate(catalogue.STEP), *prompt,
             *catalogue.REUSE_LEVER.values()]
    return tuple(dict.fromkeys([*first, *(a.name for a in catalogue.ARMS)]))


# One colour per arm name, fixed by the catalogue's order, so that an arm keeps its colour in every
# figure of every notebook and run, whatever other arms a figure shows (seaborn's default palette
# colours by position among the arms drawn, which changes from panel to panel).
# tab20's strong colours first, then its light ones: the ten arms read most get strong hues.
_TAB20 = sns.color_palette("tab20", 20).as_hex()
# Past twenty arms, tab20b's darkest hues, one per group.
ARM_COLORS = dict(zip(_catalogue_arm_names(), _TAB20[0::2] + _TAB20[1::2]
                      + sns.color_palette("tab20b", 20).as_hex()[0::4]))
UNKNOWN_ARM_COLOR = "#000000"  # an arm the catalogue does not name (an older table)


def arm_color(arm: str) -> str:
    """The colour of one arm in every figure; an A/A twin is its arm's colour, lightened (it is
    the same arm timed again), and an arm the catalogue does not name is black."""
    if catalogue.is_twin(arm):
        red, green, blue = mcolors.to_rgb(arm_color(arm.removesuffix(catalogue.AA_SUFFIX)))
        return mcolors.to_hex((0.5 + 0.5 * red, 0.5 + 0.5 * green, 0.5 + 0.5 * blue))
    return ARM_COLORS.get(arm, UNKNOWN_ARM_COLOR)


def arm_palette(arms: Iterable[str]) -> dict[str, str]:
    """A seaborn ``palette`` for the arms a figure draws: each arm's own colour."""
    return {arm: arm_color(arm) for arm in dict.fromkeys(arms)}


def in_words(frame: pd.DataFrame, column: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """The frame with its arm column as legends say it (an A/A twin in words) and the palette
    for those labels, each in its arm's colour."""
    palette = {catalogue.arm_words(arm): arm_color(arm) for arm in dict.fromkeys(frame[column])}
    return frame.assign(**{column: frame[column].map(catalogue.arm_words)}), palette


def use_theme() -> None:
    """Set the suite's plot theme (seaborn's white grid at notebook scale) for what follows."""
    sns.set_theme(**THEME)


def _axes(ax: plt.Axes | None, size: tuple[float, float]) -> plt.Axes:
    return ax if ax is not None else plt.subplots(figsize=size)[1]


EMPTY = "stagelab_empty"  # a figure's attribute: why it has no data (see :func:`empty_reason`)


def nothing(ax: plt.Axes, text: str) -> plt.Axes:
    """An empty panel that says why it is empty; the figure remembers the reason, so that a
    notebook shows the sentence instead of an empty frame (:func:`empty_reason`)."""
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    reasons = getattr(ax.figure, EMPTY, None) or []
    setattr(ax.figure, EMPTY, [*reasons, text] if text else reasons)
    return ax


def empty_reason(figure: plt.Figure) -> str | None:
    """Why a figure has nothing drawn (every panel empty), in one sentence; None where any panel
    shows data."""
    drawn = [ax for ax in figure.axes if ax.axison]
    reasons = getattr(figure, EMPTY, None)
    return "; ".join(reasons) if reasons is not None and not drawn else None


def chunk_ticks(ax: plt.Axes, chunks: Iterable[int]) -> None:
    """A log axis of chunk sizes ticked at the chunks measured, in plain numbers (not 6 x 10^1)."""
    shown = sorted({int(c) for c in chunks})
    ax.xaxis.set_minor_locator(mticker.NullLocator())
    ax.set_xticks(shown, [str(c) for c in shown])


def _cell_label(frame: pd.DataFrame) -> pd.Series:
    label = frame["rows"].astype(str) + "×" + frame["vocab"].astype(str)
    return label + (" K" + frame["k"].astype(str) if "k" in frame else "")


def bandwidth(frame: pd.DataFrame, link_gbps: float | None = None,
              ax: plt.Axes | None = None) -> plt.Axes:
    """Median GB/s per arm against bytes per copy (band: interquartile range), the link dashed."""
    ax = _axes(ax, (8, 4.5))
    timed = timings.ok_timings(frame)
    if timed.empty:
        return nothing(ax, "No copy was timed in this run")
    timed, palette = in_words(timed, "arm")
    sns.lineplot(data=timed, x="bytes", y="gb_per_s", hue="arm", estimator="median",
                 errorbar=("pi", 50), marker="o", ax=ax, palette=palette)
    ax.set_xscale("log")
    ax.set(xlabel="bytes per copy", ylabel="GB/s (median)", title="Staging bandwidth by arm")
    if link_gbps:
        ax.axhline(link_gbps, ls="--", color="k", lw=1, label=f"PCIe link {link_gbps} GB/s")
        ax.legend()
    return ax


def speedups(compared: pd.DataFrame, ax: plt.Axes | None = None,
             title: str = "Paired speedup over the baseline") -> plt.Axes:
    """Each candidate's paired speedup (ratio of mean times) with its 95 % CI, one row per
    ``n × V`` cell, one colour per arm, the line at 1 dotted: what a heat map hid in its
    annotations, readable at a glance (above 1 the candidate is faster)."""
    measured = (compared.dropna(subset=["speedup"]) if "speedup" in compared
                else compared.iloc[:0])
    if measured.empty:
        return nothing(_axes(ax, (8, 3)), "No pair of arms was timed in the same rounds")
    candidates = list(dict.fromkeys(measured["candidate"]))
    keys = measured[["rows", "vocab"]].drop_duplicates().sort_values(["vocab", "rows"])
    ax = _axes(ax, (8, 0.45 * len(keys) * len(candidates) + 1.8))
    labels = [f"n={r} V={v}" for r, v in keys.itertuples(index=False)]
    step = 0.8 / len(candidates)
    for i, candidate in enumerate(candidates):
        part = measured[measured["candidate"] == candidate].set_index(["rows", "vocab"])
        at = [(y, part.loc[key]) for y, key in enumerate(keys.itertuples(index=False, name=None))
              if key in part.index]
        ys = [y - 0.4 + step * (i + 0.5) for y, _ in at]
        rows = [row for _, row in at]
        ax.errorbar([r["speedup"] for r in rows], ys,
                    xerr=[[r["speedup"] - r["ci_low"] for r in rows],
                          [r["ci_high"] - r["speedup"] for r in rows]],
                    fmt="o", capsize=3, color=arm_color(candidate),
                    label=catalogue.arm_words(candidate))
    ax.axvline(1.0, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="speedup over the baseline, ratio of mean times, 95 % CI (log scale; dotted: "
                  "1, no change)", title=title)
    ax.legend(title="arm", loc="best", fontsize=8)
    return ax


def saved_ms(compared: pd.DataFrame, ax: plt.Axes | None = None,
             title: str = "Saving over the baseline") -> plt.Axes:
    """Milliseconds each candidate saves per call on average (difference of mean times, as
    :func:`stagelab.analyse.timings.compare` computes it), per cell."""
    ax = _axes(ax, (8, 4))
    if "saved_ms" not in compared or compared["saved_ms"].isna().all():
        return nothing(ax, "Nothing to compare: no pair of arms was timed")
    shown, palette = in_words(compared.assign(cell=_cell_label(compared)), "candidate")
    sns.barplot(data=shown, x="cell", y="saved_ms", hue="candidate", ax=ax, palette=palette,
                saturation=1)
    ax.set(xlabel="n × V, K", ylabel="ms saved per call (mean)", title=title)
    ax.tick_params(axis="x", rotation=45)
    return ax


def pcie(frame: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """NVML's link throughput sampled during the copy loops, per copy size."""
    ax = _axes(ax, (8, 3.5))
    rows = frame[(frame["metric"] == "pcie_tx_bytes_per_s") & (frame["status"] == "ok")]
    if rows.empty:
        notes = frame.loc[frame["metric"] == "pcie_tx_bytes_per_s", "note"]
        return nothing(ax, "PCIe throughput not measured: "
                       + (notes.iloc[0] if len(notes) else "no sampler ran"))
    sns.boxplot(data=rows.assign(gb_per_s=rows["value"] / 1e9), x="bytes", y="gb_per_s", ax=ax)
    ax.set(xlabel="bytes per copy", ylabel="NVML TX GB/s", title="Link throughput during the loop")
    return ax


CLIP_OVER_BASELINE = 1.6  # a bar taller than this many times the seed's step is cut and labelled


def stage_bars(parts: pd.DataFrame) -> plt.Figure:
    """Mean ms per part of the step (the parts add up to the total), stacked, per arm; one panel
    per ``n × V × K`` cell. A bar far taller than the seed's step (the fused arm on a CPU) is cut
    at the top of the panel and labelled with its total, so it cannot squash the seed's bars."""
    cells = parts[["rows", "vocab", "k"]].drop_duplicates().reset_index(drop=True)
    cols = max(1, min(4, len(cells)))
    lines = max(1, -(-len(cells) // cols))
    fig, axes = plt.subplots(lines, cols, figsize=(4.2 * cols, 3.6 * lines), squeeze=False)
    if cells.empty:
        nothing(axes[0][0], "No step was timed in this run")
    for ax, (_, cell) in zip(axes.flat, cells.iterrows()):
        sub = parts[(parts["rows"] == cell["rows"]) & (parts["vocab"] == cell["vocab"])
                    & (parts["k"] == cell["k"])].set_index("arm")
        (1e3 * sub[list(step_analysis.SPLIT)]).rename(columns=catalogue.STAGE_WORDS).plot.bar(
            stacked=True, ax=ax, legend=False, rot=60)
        ax.set(title=f"n={cell['rows']} V={cell['vocab']} K={cell['k']}", ylabel="ms (mean)",
               xlabel="")
        _clip_tall_bars(ax, 1e3 * sub[catalogue.TOTAL])
    for ax in list(axes.flat)[len(cells):]:
        ax.axis("off")
    fig.tight_layout()
    if not cells.empty:  # one legend above the panels, never over a bar
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, title="part of the step", loc="lower center",
                   ncol=len(labels), bbox_to_anchor=(0.5, 1.0))
    return fig


def _clip_tall_bars(ax: plt.Axes, totals_ms: pd.Series) -> None:
    """Cut the panel at ``CLIP_OVER_BASELINE`` times the seed's step; label each bar cut off
    with its total in ms (↑: it goes on above)."""
    baseline = catalogue.baseline(catalogue.STEP)
    if baseline not in totals_ms.index:
        return
    top = CLIP_OVER_BASELINE * float(totals_ms[baseline])
    if float(totals_ms.max()) <= top:
        return
    ax.set_ylim(top=top)
    for x, total in enumerate(totals_ms):
        if total > top:
            ax.text(x, 0.97 * top, f"↑{total:.3g}", ha="center", va="top", fontsize=7,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})


def copy_share(parts: pd.DataFrame, arm: str = catalogue.baseline(catalogue.STEP),
               ax: plt.Axes | None = None) -> plt.Axes:
    """The copy's share of the seed's step per cell, with the "dwarfed" line."""
    ax = _axes(ax, (7, 3.5))
    seed = parts[parts["arm"] == arm]
    if seed.empty:
        return nothing(ax, f"{arm} was not timed in this run")
    sns.barplot(data=seed.assign(cell=_cell_label(seed)), x="cell", y="copy_share", ax=ax,
                color=arm_color(arm), saturation=1)
    ax.axhline(step_analysis.DWARFED_SHARE, ls="--", color="k", lw=1)
    ax.set(ylabel="copy share of the seed's step", xlabel="n × V, K",
           title="The copy's share of the seed's step")
    ax.tick_params(axis="x", rotation=45)
    return ax


MEASURED_PEAKS = ("peak_device_bytes", "peak_host_bytes")
MODEL_PEAK = "predicted_peak_bytes"


TILE_MARKERS = ("o", "s", "^", "D", "v", "P")  # head_fused's tiles, in the order swept


def series_colors(frame: pd.DataFrame) -> dict[str, str]:
    """Each prompt configuration's colour (:func:`stagelab.analyse.prompt_analysis.prompt_series`):
    its arm's for its smallest tile, darker for each larger head-fused tile, so that tiles of
    one arm stay apart and keep their colour in every figure."""
    colors: dict[str, str] = {}
    shades: dict[str, int] = {}
    tiles = frame["tile"].astype("Int64").fillna(0) if "tile" in frame else 0
    ordered = frame.assign(series=prompt_analysis.prompt_series(frame), order=tiles)
    ordered = ordered.sort_values("order", kind="stable")
    for arm, series in dict.fromkeys(zip(ordered["arm"], ordered["series"])):
        shade = shades[arm] = shades.get(arm, -1) + 1
        red, green, blue = (part * 0.7**shade for part in mcolors.to_rgb(arm_color(arm)))
        colors[series] = mcolors.to_hex((red, green, blue))
    return colors


def prompt_memory(frame: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """Peak extra memory per chunk: measured solid, the model's prediction dashed, both in the
    configuration's colour (an arm, and head_fused's tile by its marker) for every one that has
    them; dotted, head_fused's bound (a share of one fp32 ``[C, V]`` chunk) where it ran."""
    ax = _axes(ax, (8, 4.5))
    mem = frame[frame["metric"].isin([*MEASURED_PEAKS, MODEL_PEAK]) & (frame["status"] == "ok")]
    if not mem["metric"].isin(MEASURED_PEAKS).any():
        return nothing(ax, "Peak memory was not measured in this run")
    mem = mem.assign(MiB=mem["bytes"].astype(float) / 2**20, series=prompt_analysis.prompt_series(mem))
    where = "device" if (mem["metric"] == "peak_device_bytes").any() else "host"
    colors = series_colors(mem)
    tiles = list(dict.fromkeys(mem["tile"].dropna().astype(int)))
    markers = {series: TILE_MARKERS[tiles.index(int(tile)) % len(TILE_MARKERS)]
               if pd.notna(tile) else "o" for series, tile in zip(mem["series"], mem["tile"])}
    for series in colors:
        for metrics, style in ((MEASURED_PEAKS, "-"), ((MODEL_PEAK,), "--")):
            part = mem[(mem["series"] == series) & mem["metric"].isin(metrics)]
            part = part.sort_values("chunk")
            if not part.empty:
                ax.plot(part["chunk"], part["MiB"], style, marker=markers[series],
                        color=colors[series])
    handles = [Line2D([], [], color=color, marker=markers[series],
                      label=catalogue.arm_words(series)) for series, color in colors.items()]
    if tiles:
        chunks = np.array(sorted(mem["chunk"].astype(int).unique()), dtype=float)
        share = prompt_analysis.HEAD_FUSED_MEMORY_SHARE
        ax.plot(chunks, share * chunks * float(mem["vocab"].iloc[0]) * 4 / 2**20, ":",
                color="k")
        handles.append(Line2D([], [], color="k", ls=":",
                              label=f"{catalogue.HEAD_FUSED} bound: {share} x fp32 [C, V]"))
    ax.set(xscale="log", yscale="log", xlabel="chunk rows C",
           ylabel=f"peak extra memory on the {where} (MiB)",
           title="Peak working memory: measured (solid) and the model (dashed)")
    chunk_ticks(ax, mem["chunk"])
    handles += [Line2D([], [], color="k", ls="-", label="measured"),
                Line2D([], [], color="k", ls="--", label="model")]
    ax.legend(handles=handles, fontsize=8, loc="best")
    return ax


def prompt_time(frame: pd.DataFrame) -> plt.Figure:
    """Mean time per prompt against chunk size (band: 95 % CI of the mean over rounds), and
    relative to the same arm unchunked: means, as the chunk recommendation compares them."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    timed = timings.ok_timings(frame)
    if timed.empty:
        nothing(axes[0], "No prompt configuration was timed")
        nothing(axes[1], "")
        return fig
    timed = timed.assign(configuration=prompt_analysis.prompt_series(timed))
    palette = series_colors(timed)
    sns.lineplot(data=timed.assign(ms=1e3 * timed["seconds"]), x="chunk", y="ms",
                 hue="configuration",
                 estimator="mean", errorbar=("ci", 95), seed=0, marker="o", ax=axes[0],
                 palette=palette)
    axes[0].set(xscale="log", xlabel="chunk rows C", ylabel="ms per prompt (mean, 95 % CI)",
                title="Time per prompt")
    chunk_ticks(axes[0], timed["chunk"])
    relative = prompt_analysis.prompt_time_relative(frame)
    sns.lineplot(data=relative.assign(configuration=prompt_analysis.prompt_series(relative)),
                 x="chunk", y="relative", hue="configuration", marker="o", ax=axes[1],
                 palette=palette)
    axes[1].axhline(1.05, ls="--", color="k", lw=1)
    axes[1].set(xscale="log", xlabel="chunk rows C", ylabel="mean time / mean unchunked",
                title="Relative to unchunked (dashed: 1.05)")
    chunk_ticks(axes[1], timed["chunk"])
    return fig


def verdict_key(verdict: dict) -> plt.Axes:
    """The verdict's key plot: the decisive cells where the candidate was measured; otherwise,
    labelled as no decision, the reuse lever at step level (what a machine without pinned memory
    can measure)."""
    if any(c.get("speedup") is not None for c in verdict["decisive"]):
        return verdict_forest(verdict["decisive"],
                              "Pinned grow-only vs the seed's fresh vector: the whole step")
    reuse = [{**lever, "decision": MEASURED} for lever in verdict["step_levers"]
             if lever["candidate"] == catalogue.REUSE_LEVER[catalogue.STEP]
             and lever.get("speedup") is not None]
    if reuse:
        return verdict_forest(reuse, "No decision here (pinned arm not measured). Measured "
                                     "instead: the reuse lever, grow-only pageable vs fresh vector")
    return verdict_forest(verdict["decisive"], "No decision here")


def verdict_forest(cells: list[dict], title: str, ax: plt.Axes | None = None) -> plt.Axes:
    """Each cell's paired speedup with its CI, coloured by decision (a decision's name beside
    it), the A/A twin's CI (grey band) and the smallest speedup that counts (black tick) where a
    cell has them: the verdict's key plot. The caption names only what is drawn."""
    shown = [c for c in cells if c.get("speedup") is not None]
    ax = _axes(ax, (8, 0.5 * len(shown) + 1.6))
    if not shown:
        reasons = sorted({c.get("reason", "") for c in cells}) or ["no decisive cell"]
        return nothing(ax, "Not decided here:\n" + "\n".join(
            textwrap.fill(r, 90) for r in reasons[:3]))
    caption = ["speedup of the whole step, 95 % CI", "dotted: 1 (no change)"]
    for y, cell in enumerate(shown):
        color = (arm_color(cell.get("candidate", "")) if cell["decision"] == MEASURED
                 else DECISION_COLORS[cell["decision"]])
        if cell.get("twin_ci_low") is not None:
            ax.fill_betweenx([y - 0.35, y + 0.35], cell["twin_ci_low"], cell["twin_ci_high"],
                             color="0.85", lw=0)
            caption.append("grey band: the A/A twin's CI")
        ax.errorbar(cell["speedup"], y, xerr=[[cell["speedup"] - cell["ci_low"]],
                                              [cell["ci_high"] - cell["speedup"]]],
                    fmt="o", color=color, capsize=4)
        if cell.get("min_speedup"):
            ax.plot([cell["min_speedup"]] * 2, [y - 0.3, y + 0.3], color="k", lw=1.5)
            caption.append("black tick: the smallest speedup that counts, 1/(1-delta)")
        if cell["decision"] != MEASURED:
            ax.text(cell["ci_high"], y + 0.18, f"  {cell['decision']}", color=color, fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8, ls=":")
    ax.set_yticks(range(len(shown)), [f"n={c['rows']} V={c['vocab']} K={c.get('k', '-')}"
                                      for c in shown])
    ax.set_xlabel("; ".join(dict.fromkeys(caption)))
    ax.set_title(title)
    return ax


def prediction_bands(curves: pd.DataFrame) -> plt.Figure:
    """The predicted saving per step (bundle) against n x V as small multiples, one panel per
    platform: per vocabulary, the band (the interval from the published and assumed ranges), its
    midpoint line and the platform's bar (delta of its decode step) dotted in the same colour;
    light grey only marks the sizes whose host rates were measured (elsewhere extrapolated)."""
    platforms = sorted(curves["platform"].unique()) if not curves.empty else []
    cols = max(1, min(3, len(platforms)))
    lines = max(1, -(-len(platforms) // cols))
    figure, axes = plt.subplots(lines, cols, figsize=(4.6 * cols, 3.4 * lines), squeeze=False,
                                sharex=True, sharey=True)
    if not platforms:
        nothing(axes[0][0], "no prediction: no cell")
        return figure
    vocabs = sorted(curves["vocab"].unique())
    palette = sns.color_palette("tab10", 3)  # blue, orange, green: never grey
    colours = {vocab: palette[i % 3] for i, vocab in enumerate(vocabs)}
    floor = 1e-4  # ms: a log axis shows no saving at or below 0
    for ax, platform in zip(axes.flat, platforms):
        shown = curves[curves["platform"] == platform]
        for vocab, part in shown.groupby("vocab", sort=True):
            colour = colours[vocab]
            ax.fill_between(part["n_x_v"], part["saving_low_ms"].clip(lower=floor),
                            part["saving_high_ms"].clip(lower=floor), color=colour, alpha=0.2)
            ax.plot(part["n_x_v"], part["saving_ms"].clip(lower=floor), color=colour,
                    label=f"V = {vocab:,}")
            ax.plot(part["n_x_v"], part["bar_ms"], color=colour, linestyle=":", linewidth=1)
        measured = shown[~shown["extrapolated"].astype(bool)]["n_x_v"]
        if len(measured):
            ax.axvspan(measured.min(), measured.max(), color="0.92", zorder=0)
        ax.set(xscale="log", yscale="log", title=platform)
    for ax in list(axes.flat)[len(platforms):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("n x V (logprobs per step)")
    for ax in axes[:, 0]:
        ax.set_ylabel("predicted saving, ms")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    handles += [Line2D([], [], color="k", ls=":", lw=1),
                mpatches.Patch(color="0.92")]
    labels += ["dotted: the platform's bar", "grey: host rates measured here"]
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize="small",
                  bbox_to_anchor=(0.5, 1.0))
    figure.suptitle("Predicted saving per step of the bundle (band: the model's interval)",
                    y=1.08)
    figure.tight_layout()
    return figure


# One colour per stage of a step in the timeline, fixed by the suite's stage names.
_STAGE_ORDER = ("forward", "device", "alloc", "copy", "wait", "host_softmax", "host_gather",
                "free")
STAGE_COLORS = dict(zip(_STAGE_ORDER, sns.color_palette("Set2", len(_STAGE_ORDER)).as_hex()))


def timeline(frame: pd.DataFrame) -> plt.Figure:
    """The step's timeline (:mod:`stagelab.analyse.timeline`): one panel per arm, a host row
    and (where there is a device) a device row, each span a bar from its start to its end,
    coloured by stage and named in the suite's stage words, so that a reader sees whether the
    copy and the host top-K ran beside the next forward."""
    arms = list(dict.fromkeys(frame["arm"])) if not frame.empty else []
    fig, axes = plt.subplots(max(1, len(arms)), 1, figsize=(10, 0.4 + 1.1 * max(1, len(arms))),
                             squeeze=False, sharex=True)  # one time scale: arms compared
    if not arms:
        nothing(axes[0][0], "No timeline was recorded in this run")
        return fig
    lanes = [lane for lane in ("device", "host") if (frame["lane"] == lane).any()]
    for ax, arm in zip(axes[:, 0], arms):
        spans = frame[frame["arm"] == arm]
        for y, lane in enumerate(lanes):
            for stage, group in spans[spans["lane"] == lane].groupby("stage"):
                ax.broken_barh(list(zip(group["start_ms"], group["end_ms"] - group["start_ms"])),
                               (y - 0.4, 0.8), color=STAGE_COLORS.get(str(stage), "#999999"))
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_title(arm, loc="left", fontsize=9)
    axes[-1][0].set_xlabel("ms from the arm's first step")
    shown = [s for s in _STAGE_ORDER if s in set(frame["stage"])]
    fig.tight_layout()
    fig.legend([mpatches.Patch(color=STAGE_COLORS[s]) for s in shown],
               [catalogue.STAGE_WORDS.get(s, s) for s in shown], title="stage",
               loc="lower center", ncol=len(shown), bbox_to_anchor=(0.5, 1.0))
    return fig
