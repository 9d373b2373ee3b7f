"""The machine a run came from, in rows and words: a hardware snapshot
(:func:`stagelab.measure.hardware.snapshot`, also kept in every manifest) as the report, ``stagelab env``
and notebook 00 show it. Standard library only, so that showing a snapshot never loads torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SECTIONS = ("host", "torch", "gpu", "nvml", "machine")
# Sections that snapshots taken before them lack: left out there, never "unavailable".
ADDED_SECTIONS = ("machine",)


def _leaves(part: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of a nested section, e.g. ``fresh_fill.stages.zero_fill.seconds``."""
    found: list[tuple[str, Any]] = []
    for key, value in part.items():
        if isinstance(value, dict) and value:
            found += _leaves(value, f"{prefix}{key}.")
        elif isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
            found.append((f"{prefix}{key}", "; ".join(map(str, value))))
        else:
            found.append((f"{prefix}{key}", value))
    return found


def flatten(snap: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(section, key, value) triples of a snapshot, for tables and the ``stagelab env`` printout;
    nested facts (the ``machine`` section's) under dotted keys."""
    rows = []
    for section in SECTIONS:
        part = snap.get(section)
        if part is None and section in ADDED_SECTIONS and section not in snap:
            continue
        if part is None:
            rows.append((section, "(unavailable)", "see below"))
            continue
        rows.extend((section, key, value) for key, value in _leaves(part))
    rows.extend(("unavailable", str(i + 1), reason)
                for i, reason in enumerate(snap.get("unavailable") or []))
    return rows


def size_words(nbytes: float) -> str:
    """A size in the unit that reads best: 23.5 GiB, 256.0 MiB, 4 KiB, 512 B."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 2**10:.0f} KiB" if abs(nbytes) >= 2**10 else f"{nbytes:.0f} B"


def _is_size(key: str) -> bool:
    last = key.rpartition(".")[2]
    return last == "bytes" or last.endswith("_bytes")


def value_words(key: str, value: Any) -> str:
    """One snapshot value as a reader sees it: a size in its unit (GiB, MiB, KiB), a time in
    ms, yes or no, "not reported" for what the snapshot holds no value for, anything else as it
    is."""
    if value is None:
        return "not reported"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _is_size(key) and isinstance(value, (int, float)):
        return size_words(value)
    if key.rpartition(".")[2] == "seconds" and isinstance(value, (int, float)):
        return f"{1e3 * value:.3g} ms"
    return str(value)


def key_words(key: str) -> str:
    """A snapshot's (dotted) key in words: ``fresh_fill.stages.zero_fill.seconds`` reads
    "fresh fill, zero fill, time", ``fresh_fill.refill_gbps`` "fresh fill, refill (GB/s)"."""
    parts = [part for part in key.split(".") if part != "stages"]
    last, unit = parts[-1], ""
    if last in ("bytes", "seconds"):
        last = {"bytes": "size", "seconds": "time"}[last]
    elif last.endswith("_bytes"):
        last = last.removesuffix("_bytes")
    elif last.endswith("_gbps"):
        last, unit = last.removesuffix("_gbps"), " (GB/s)"
    return ", ".join(part.replace("_", " ") for part in [*parts[:-1], last]) + unit


def readable_rows(snap: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """:func:`flatten`'s triples with each key in words (:func:`key_words`) and each value
    through :func:`value_words`, for the tables of notebook 00 and the report."""
    return [(section, key_words(key), value_words(key, value))
            for section, key, value in flatten(snap)]


def unavailable_text(snap: dict[str, Any]) -> str:
    """What the snapshot could not read, as a Markdown list, or a sentence saying all was read."""
    if not snap.get("unavailable"):
        return "Everything was read: GPU, NVML and host."
    return "\n".join(f"- {reason}" for reason in snap["unavailable"])
