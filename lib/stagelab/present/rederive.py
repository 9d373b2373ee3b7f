"""What ``keep`` recomputes before it keeps a run: the verdict from the run's own tables, with
the parameters the run recorded, through the very function notebook 04 calls
(:func:`stagelab.analyse.verdict.build_verdict`), so that a change of the decision rule changes
both at once; and the machine the run names, against the records that back it. A run whose
``verdict.json``, ``index.html`` or hardware claims differ from what its tables and records give
is refused in one line (:func:`problem`).

What this proves, and what it does not: the kept decision follows from the kept tables by this
checkout's rule; whether the tables hold what a GPU really measured rests on the node that
measured them (docs/security.md).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stagelab.analyse import summaries, verdict
from stagelab.core import catalogue, forward, paths, records, untrusted
from stagelab.core.cells import notebook_parameters
from stagelab.core.errors import BadRecord, UserError
from stagelab.core.measured import RECORD_COPY
from stagelab.core.records import RunFolder

VERDICT_NOTEBOOK = catalogue.VERDICT_NOTEBOOK
# The arguments of build_verdict that notebook 04's parameters of the same name give.
PASSED = ("delta", "min_samples", "confidence", "decisive_rows", "decisive_ks", "seed",
          "log_softmax", "overlap_order")


def recorded_parameters(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Notebook 04's parameters as the run ran it: the notebook's defaults under the values
    the run's manifest records for it. UserError where the run records no verdict notebook."""
    entry = next((e for e in manifest.get("notebooks") or []
                  if isinstance(e, dict) and e.get("name") == VERDICT_NOTEBOOK), None)
    if entry is None:
        raise UserError(f"its manifest records no {VERDICT_NOTEBOOK}: its {RunFolder.VERDICT} "
                        "cannot be re-derived")
    given = entry.get("parameters") or {}
    if not isinstance(given, dict):
        raise UserError(f"its manifest's {VERDICT_NOTEBOOK} parameters are not an object")
    return {**notebook_parameters(paths.NOTEBOOKS_DIR / f"{VERDICT_NOTEBOOK}.ipynb"), **given}


def _vocabs(models: Iterable[Any]) -> list[int]:
    """Model names or vocabulary sizes as sizes, read from data/model_shapes.csv (as
    :func:`stagelab.measure.shapes.vocabs` reads them, without torch)."""
    table = forward.model_table()
    found = []
    for model in models:
        if isinstance(model, int) and not isinstance(model, bool):
            found.append(model)
        elif isinstance(model, str) and model in table:
            found.append(int(table[model]["vocab"]))
        else:
            raise UserError(f"decisive_models: {model!r} is no model of data/model_shapes.csv")
    return found


def rederived_verdict(run_dir: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict the run's own tables give, with its recorded parameters: what notebook 04
    computes, less the calibration's simulations and the comparison with other kept runs,
    which decide nothing."""
    given = recorded_parameters(manifest)
    try:
        return verdict.build_verdict(
            run_dir, **{name: given[name] for name in PASSED if name in given},
            decisive_vocabs=_vocabs(given.get("decisive_models") or []),
            reference_root=None, calibration_trials=0)
    except (ValueError, TypeError, KeyError) as exc:
        raise UserError(f"its verdict cannot be re-derived with its recorded parameters "
                        f"({exc})") from exc


def decisions(result: Mapping[str, Any]) -> dict[str, Any]:
    """What a verdict decides, by name: the overall decision, the recommended change, each
    question's answer and each decisive cell's decision and answers, the machine it names."""
    found: dict[str, Any] = {
        "overall decision": (result.get("overall") or {}).get("decision"),
        "recommended change": (result.get("recommendation") or {}).get("change"),
        "hardware": result.get("hardware")}
    for name, answer in sorted((result.get("questions") or {}).items()):
        found[f"answer to {name}"] = (answer or {}).get("decision")
    for cell in result.get("decisive") or []:
        where = f"cell n={cell.get('rows')} V={cell.get('vocab')} K={cell.get('k')}"
        found[f"{where} decision"] = cell.get("decision")
        for name, answer in sorted((cell.get("answers") or {}).items()):
            found[f"{where} {name}"] = (answer or {}).get("decision")
    return found


def verdict_difference(recorded: Mapping[str, Any], fresh: Mapping[str, Any]) -> str | None:
    """The first decision where the run's verdict.json and the re-derived verdict differ."""
    ours, theirs = decisions(fresh), decisions(recorded)
    for name in sorted(set(ours) | set(theirs)):
        if ours.get(name) != theirs.get(name):
            return (f"its {RunFolder.VERDICT} says {name} {theirs.get(name)!r}, its own tables "
                    f"give {ours.get(name)!r}")
    return None


def index_difference(run_dir: Path, fresh: Mapping[str, Any]) -> str | None:
    """Where the run's index.html does not state the re-derived verdict."""
    decision = (fresh.get("overall") or {}).get("decision")
    try:
        page = untrusted.read_text(Path(run_dir) / RunFolder.INDEX, root=run_dir)
    except (FileNotFoundError, BadRecord):
        return f"its {RunFolder.INDEX} cannot be read"
    if f"Staging verdict: {html.escape(str(decision))}<" not in page:
        return f"its {RunFolder.INDEX} does not state the verdict its tables give ({decision})"
    return None


def _facts(snapshot: Any) -> dict[str, Any]:
    return summaries.hardware_summary(snapshot if isinstance(snapshot, dict) else {})


def hardware_difference(run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
    """Where the machine the run's manifest names differs from the snapshot that backs it: a
    replay's node record (``measured/hardware.json``, verified against its digests) or a live
    run's own ``hardware.json``."""
    wrong = records.shape_errors(manifest.get("hardware") or {}, records.schema("hardware"),
                                 "its manifest's hardware")
    if wrong:
        return wrong[0]
    named = _facts(manifest.get("hardware"))
    replay = manifest.get("measured_on")
    backing = (Path(run_dir) / RECORD_COPY if replay else Path(run_dir)) / RunFolder.HARDWARE
    try:
        snapshot = untrusted.load_json(backing, root=run_dir)
    except FileNotFoundError:
        if replay:
            return f"it replays a measurement but has no {RECORD_COPY}/{RunFolder.HARDWARE}"
        return None  # a live run without notebook 00: its manifest's snapshot is its only one
    except BadRecord as exc:
        return str(exc)
    for fact, value in _facts(snapshot).items():
        if named.get(fact) != value:
            where = Path(backing).relative_to(run_dir).as_posix()
            return f"its manifest names {fact} {named.get(fact)!r}, its {where} {value!r}"
    if replay and isinstance(replay, dict) and replay.get("gpu") != named.get("gpu"):
        return f"its measured_on names gpu {replay.get('gpu')!r}, its snapshot {named.get('gpu')!r}"
    return None


def problem(run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
    """Why the run's claims are not what its tables and records give (None when they are):
    its hardware, its verdict.json's decisions, its index.html's verdict."""
    found = hardware_difference(run_dir, manifest)
    if found:
        return found
    recorded = RunFolder(run_dir).read_verdict()
    if recorded is None:
        return None  # no verdict: refused as such
    fresh = rederived_verdict(run_dir, manifest)
    return verdict_difference(recorded, fresh) or index_difference(run_dir, fresh)
