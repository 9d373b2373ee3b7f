"""A measured folder's claims, checked against the rest of the folder before a replay believes
them (``stagelab run --from``): its rows against its own hardware snapshot and preflight, the
catalogue's arms and the profile's, and physical bounds.

A folder from another machine is evidence from a stranger: a pinned or CUDA row from a node
whose snapshot, torch and preflight do not all say it has a CUDA device, an arm no catalogue
names, a timing that is not a positive finite number, one shorter than a nanosecond or longer than its
whole experiment took, or a device-to-host copy faster than the link the node recorded cannot
have been measured, so the whole folder is refused (one line naming the
file and the first disagreement). Standard library only, as ``stagelab measure`` is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from stagelab.analyse import predict_tables
from stagelab.core import catalogue

# A measured copy may beat the link's nominal rate by this much (rounding of the nominal rate,
# timer granularity) and no more.
LINK_MARGIN = 1.25
MIN_SECONDS = 1e-9  # no timer here reads less than a nanosecond
MAX_SECONDS = 86400.0  # no one timed step or copy takes a day (a lease is minutes)
# Rows a sweep writes about itself rather than about an arm (the order's seed, the rounds a
# cell ran, the forward pass, the sync debugger, NVML's link counter, the host rates):
# never timings.
BOOKKEEPING_ARMS = ("order", "rounds", "forward", "sync_debug", "nvml_pcie", "host_rates")


def node_has_cuda(hardware: Mapping[str, Any], preflight: Mapping[str, Any] | None) -> bool:
    """Whether every record of the node that speaks of CUDA says it was there: its snapshot saw
    a GPU, torch said CUDA was available, and its preflight's CUDA check (where it has one)
    passed. One record saying CUDA while another says none is no CUDA: a claim the node's own
    records do not all back is not believed."""
    torch_info = _part(hardware, "torch")
    says = [bool(hardware.get("gpu")), torch_info.get("cuda_available") is True]
    checks = [c for c in (preflight or {}).get("checks") or []
              if isinstance(c, dict) and c.get("name") == "cuda"]
    if checks:
        says.append(all(c.get("status") == "go" for c in checks))
    return all(says)


def snapshot_problem(hardware: Mapping[str, Any]) -> str | None:
    """Why a hardware snapshot contradicts itself about CUDA, or None: a GPU named while its
    torch says CUDA was not available, CUDA available with no GPU seen, or CUDA available from
    a torch built without it (``+cpu``, no CUDA build). Such a snapshot backs no machine, so a
    run or folder resting on it is refused whether or not a row needs CUDA."""
    torch_info = _part(hardware, "torch")
    gpu = _part(hardware, "gpu").get("name") or hardware.get("gpu")
    if not isinstance(torch_info.get("cuda_available"), bool):
        return None  # its torch said nothing of CUDA: no row needing CUDA is believed anyway
    available = torch_info["cuda_available"]
    version = str(torch_info.get("torch") or "")
    if gpu and not available:
        return (f"hardware.json names GPU {gpu!r} while its torch ({version or 'unknown'}) says "
                "CUDA was not available")
    if available and not gpu:
        return "hardware.json says torch had CUDA while it saw no GPU"
    if available and (version.endswith("+cpu") or ("cuda_build" in torch_info
                                                   and not torch_info["cuda_build"])):
        return (f"hardware.json says CUDA was available from torch {version!r}, a build "
                "without CUDA")
    return None


def link_gb_per_s(hardware: Mapping[str, Any]) -> float | None:
    """The fastest device-to-host rate the node's link allows (GB/s), None when unknown: the
    per-direction PCIe rate it recorded, or, where its GPU is a platform of
    ``data/platforms.csv``, that platform's highest published pinned D2H figure if higher (a
    GH200 copies over NVLink-C2C, far past the PCIe rate NVML reports)."""
    nvml = _part(hardware, "nvml")
    rates = [float(nvml[key]) for key in ("pcie_max_gbps_per_direction",
                                          "pcie_current_gbps_per_direction")
             if _number(nvml.get(key)) and nvml[key] > 0]
    if not rates:
        return None
    name = _part(hardware, "gpu").get("name")
    platform = predict_tables.platform_of_gpu(name) if isinstance(name, str) else None
    return max(rates + ([platform.pinned_gbps[1]] if platform else []))


def _part(snapshot: Mapping[str, Any], name: str) -> dict[str, Any]:
    part = snapshot.get(name)
    return part if isinstance(part, dict) else {}


def _catalogue_arm(table: str, name: str) -> catalogue.Arm | None:
    base = name.removesuffix(catalogue.OVERLAP_SUFFIX) if table == catalogue.PROMPT else name
    try:
        return catalogue.arm(table, base)
    except ValueError:
        return None


def allowed_arms(table: str, parameters: Mapping[str, Any]) -> set[str] | None:
    """The arm names the measured parameters asked for (their A/A twin included), or None
    where the parameters leave it to the catalogue (every arm)."""
    arms = parameters.get("arms")
    if table == catalogue.PROMPT or not isinstance(arms, list):
        return None
    twin = parameters.get("aa_arm")
    return {str(a) for a in arms} | ({catalogue.aa_name(twin)} if isinstance(twin, str) else set())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def row_problem(table: str, row: Mapping[str, Any], allowed: set[str] | None, cuda: bool,
                link: float | None, longest: float = math.inf) -> str | None:
    """Why one row cannot be believed, or None; ``longest`` is the seconds its whole
    experiment took, which no one timing can pass."""
    name = row.get("arm")
    if not isinstance(name, str):
        return f"a row has no arm ({name!r})"
    if name in BOOKKEEPING_ARMS:
        return f"a {name!r} row claims to be a timing" if row.get("metric") == "time" else None
    entry = _catalogue_arm(table, name)
    if entry is None:
        return f"arm {name!r} is not a {table} arm of the catalogue"
    if allowed is not None and name not in allowed:
        return f"arm {name!r} was not among the arms measured.json says were asked for"
    if row.get("status") != "ok":
        return None
    device = row.get("device")
    if not cuda and (entry.needs_cuda or (isinstance(device, str) and device.startswith("cuda"))):
        return (f"an ok {name!r} row (device {device!r}) from a node whose records do not all "
                "say it has a CUDA device (hardware.json's GPU, torch's CUDA, preflight.json's "
                "check): for them it has no CUDA device")
    if row.get("metric") != "time":
        return None
    return timing_problem(table, name, row, link, longest)


def timing_problem(table: str, name: str, row: Mapping[str, Any], link: float | None,
                   longest: float) -> str | None:
    """Why one ok timing row cannot have been measured, or None."""
    device = row.get("device")
    for key in ("seconds", "host_seconds"):
        value = row.get(key)
        if value is not None and not (_number(value) and 0 < value < math.inf):
            return f"a {name!r} timing has {key} {value!r}, not a positive finite number"
        if value is not None and not MIN_SECONDS <= value <= longest:
            return (f"a {name!r} timing has {key} {value!r}, outside what a timer here can read "
                    f"({MIN_SECONDS:g} s) and the {longest:g} s its experiment took")
    if not _number(row.get("seconds")):
        return f"a {name!r} timing has no seconds"
    moved = row.get("bytes")
    copies = table == catalogue.STAGING or row.get("stage") == "copy"  # device to host
    if (link is not None and copies and isinstance(device, str) and device.startswith("cuda")
            and _number(moved)):
        rate = moved / row["seconds"] / 1e9
        if rate > link * LINK_MARGIN:
            return (f"a {name!r} copy moved {rate:.1f} GB/s, faster than the {link:.1f} GB/s "
                    "link the node recorded")
    return None


def rows_problems(table: str, rows: Sequence[Mapping[str, Any]], entry: Mapping[str, Any],
                  hardware: Mapping[str, Any], preflight: Mapping[str, Any] | None) -> list[str]:
    """Every distinct reason the rows of ``table`` disagree with the folder's other records
    (``entry`` is the experiment's record in measured.json: its parameters and seconds)."""
    cuda, link = node_has_cuda(hardware, preflight), link_gb_per_s(hardware)
    allowed = allowed_arms(table, entry.get("parameters") or {})
    took: Any = entry.get("measured_s")
    longest = min(float(took), MAX_SECONDS) if _number(took) and took > 0 else MAX_SECONDS
    found: list[str] = []
    for row in rows:
        problem = row_problem(table, row, allowed, cuda, link, longest)
        if problem and problem not in found:
            found.append(problem)
    placed = positions_problem(rows)
    return found + ([placed] if placed else [])


# What makes one timed configuration: the cell's sizes (its columns) and, within it, the arm
# with its chunk (prompt logprobs interleave every chunk of a prompt in one round).
CELL_COLUMNS = ("model", "device", "rows", "vocab", "hidden", "k", "dtype",
                *(condition.column for condition in catalogue.CONDITIONS))


def positions_problem(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the samples' places in their rounds cannot come from the balanced order
    (:mod:`stagelab.core.design`), or None. In a cell where every arm ran every round, each
    round places each arm once, at 0 .. arms - 1, and over the rounds every arm takes every
    place equally often, within one. A cell where an arm failed (its rounds are shorter) is not
    checked; neither are rows without a position (folders measured before it was recorded)."""
    cells: dict[tuple, dict[Any, list[tuple[Any, Any]]]] = {}
    for row in rows:
        if (row.get("metric") == "time" and row.get("stage") == catalogue.TOTAL
                and row.get("status") == "ok" and row.get("position") is not None):
            key = tuple(row.get(column) for column in CELL_COLUMNS)
            cells.setdefault(key, {}).setdefault(row.get("round"), []).append(
                ((row.get("arm"), row.get("chunk")), row.get("position")))
    for rounds in cells.values():
        arms = {arm for placed in rounds.values() for arm, _ in placed}
        if any(len(placed) != len(arms) or {a for a, _ in placed} != arms
               for placed in rounds.values()):
            continue  # an arm failed in this cell: its rounds hold fewer arms
        for index, placed in rounds.items():
            if sorted(position for _, position in placed) != list(range(len(arms))):
                return (f"round {index} of a cell places its {len(arms)} arms at "
                        f"{sorted(position for _, position in placed)}, not once each at "
                        f"0..{len(arms) - 1} as the balanced order does")
        counts: dict[tuple[Any, Any], int] = {}
        for placed in rounds.values():
            for arm, position in placed:
                counts[arm, position] = counts.get((arm, position), 0) + 1
        every = [counts.get((arm, place), 0) for arm in arms for place in range(len(arms))]
        if max(every) - min(every) > 1:
            return (f"over {len(rounds)} rounds an arm takes one place {max(every)} times and "
                    f"another {min(every)} times; the balanced order gives every arm every "
                    "place equally often, within one")
    return None
