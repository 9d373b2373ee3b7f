"""Seaborn figures shared by several notebooks (each notebook's one-off plots stay in it)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

sns.set_theme(style="whitegrid", context="notebook")


def speedup_heatmap(compared: pd.DataFrame, title: str, ax: plt.Axes | None = None) -> plt.Axes:
    """A rows x vocab heat map of speedups, each cell annotated with its CI.

    ``compared`` is :func:`stagelab.stats.compare_arms` output grouped by ``rows`` and ``vocab``.
    """
    ax = ax or plt.subplots(figsize=(7, 3.6))[1]
    grid = compared.pivot(index="rows", columns="vocab", values="speedup")
    notes = compared.assign(text=[
        f"{s:.2f}x\n[{lo:.2f}, {hi:.2f}]" if np.isfinite(s) else "n/a"
        for s, lo, hi in zip(compared["speedup"], compared["ci_low"], compared["ci_high"])
    ]).pivot(index="rows", columns="vocab", values="text")
    sns.heatmap(grid, annot=notes, fmt="", cmap="RdYlGn", center=1.0, ax=ax,
                cbar_kws={"label": "speedup (x)"}, annot_kws={"fontsize": 8})
    ax.set_title(title)
    ax.set_xlabel("vocabulary size V")
    ax.set_ylabel("rows per step n")
    return ax


def note_figure(text: str, title: str) -> plt.Figure:
    """A figure that says plainly why a plot could not be drawn from this run's data."""
    fig, ax = plt.subplots(figsize=(7, 1.4))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=10)
    return fig
