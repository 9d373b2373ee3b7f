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


DECISION_COLORS = {"PORT": "tab:green", "CLOSE": "tab:gray", "INCONCLUSIVE": "tab:orange"}


def verdict_forest(cells: list[dict], title: str, ax: plt.Axes | None = None) -> plt.Axes:
    """Each cell's speedup with its CI, its A/A noise band (shaded) and minimum effect (tick),
    coloured by decision: the verdict's key plot."""
    cells = [c for c in cells if c.get("speedup") is not None]
    ax = ax or plt.subplots(figsize=(8, 0.5 * len(cells) + 1.6))[1]
    for y, cell in enumerate(cells):
        color = DECISION_COLORS[cell["decision"]]
        noise = cell.get("noise_half_width") or 0.0
        ax.fill_betweenx([y - 0.35, y + 0.35], 1 - noise, 1 + noise, color="0.85", lw=0)
        ax.errorbar(cell["speedup"], y, xerr=[[cell["speedup"] - cell["ci_low"]],
                                              [cell["ci_high"] - cell["speedup"]]],
                    fmt="o", color=color, capsize=4)
        if cell.get("min_speedup"):
            ax.plot([cell["min_speedup"]] * 2, [y - 0.3, y + 0.3], color="k", lw=1.5)
        ax.text(cell["ci_high"], y + 0.18, f"  {cell['decision']}", color=color, fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8, ls=":")
    ax.set_yticks(range(len(cells)), [f"n={c['rows']} V={c['vocab']}" for c in cells])
    ax.set_xlabel("speedup over the fresh pageable buffer (95 % CI); grey: A/A noise band; "
                  "bar: minimum effect")
    ax.set_title(title)
    return ax
