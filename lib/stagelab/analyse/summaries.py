"""What a run measured, in a notebook's words: the device and the arms timed, or why nothing was;
the closing line; the clock and sync checks; the machine in four facts."""

from __future__ import annotations

from typing import Any

import pandas as pd

from stagelab.analyse.timings import ok_timings
from stagelab.core import catalogue


def hardware_summary(snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """The machine in four facts, for verdicts and comparisons: GPU name, PCIe link GB/s per
    direction (NVML's maximum), CPU model and torch version from a hardware snapshot
    (``stagelab env --json``); None where the snapshot does not say."""
    snap = snapshot or {}
    return {"gpu": (snap.get("gpu") or {}).get("name"),
            "link_gbps": (snap.get("nvml") or {}).get("pcie_max_gbps_per_direction"),
            "cpu": (snap.get("host") or {}).get("cpu_model"),
            "torch": (snap.get("torch") or {}).get("torch")}


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
    cells = timed.drop_duplicates([c for c in SWEEP_CELL if c in timed]).shape[0]
    failed = sorted(frame.loc[frame["status"] == "failed", "arm"].unique())
    tail = f" Failed: {', '.join(failed)} (see the table above)." if failed else ""
    arms = f"{timed['arm'].nunique()} arm(s)"
    configured = [c for c in CONFIGURATION if c in timed and timed[c].notna().any()]
    if configured:  # a prompt's arms at each chunk and tile: its sweep cell's arms
        count = timed[["arm", *configured]].astype(str).drop_duplicates().shape[0]
        arms = f"{count} configuration(s) of {arms}"
    return (f"Measured in {what}: {len(timed)} timed calls over {cells} cell(s) and "
            f"{arms}.{tail}")


# The columns that tell a sweep's cells apart, as its progress lines count them ("cell i/N"):
# the sizes and the step's conditions; a configuration's chunk and tile are not a cell's.
SWEEP_CELL = ("rows", "vocab", "k", *(condition.column for condition in catalogue.CONDITIONS))
CONFIGURATION = ("chunk", "tile")


def as_bullets(sentences: list[str]) -> str:
    """Sentences as a Markdown list."""
    return "\n".join(f"- {s}" for s in sentences)

