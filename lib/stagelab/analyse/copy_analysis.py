"""The copy alone (notebook 01): every staging arm against the seed's fresh buffer, its finding in
words, and the host memory each arm holds."""

from __future__ import annotations

import pandas as pd

from stagelab.analyse.summaries import nothing_measured
from stagelab.analyse.timings import compare, not_measured_reason, ok_timings
from stagelab.core import catalogue


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

