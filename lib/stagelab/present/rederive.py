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
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stagelab.analyse import analysis, claims, verdict
from stagelab.core import catalogue, forward, paths, records, schema, untrusted
from stagelab.core.cells import notebook_parameters
from stagelab.core.errors import BadRecord, UserError
from stagelab.core.measured import MANIFEST, RECORD_COPY, MeasuredFolder
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


DECIDING = (*PASSED, "decisive_models")  # the parameters that change what the verdict decides


def profile_parameters(profile: Any, notebook: str) -> dict[str, Any] | None:
    """A notebook's parameters as ``profile`` of profiles.json sets them, over the notebook's
    defaults; None for a profile this checkout does not have."""
    try:
        profiles = json.loads(paths.PROFILES_FILE.read_text(encoding="utf-8"))["profiles"]
        given = profiles[profile]["notebooks"][notebook] or {}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {**notebook_parameters(paths.NOTEBOOKS_DIR / f"{notebook}.ipynb"), **given}


def decision_changes(manifest: Mapping[str, Any]) -> list[str]:
    """Each parameter of the decision (notebook 04's) that the run recorded other than its
    profile sets it, in words (``delta 0.005 (profile smoke: 0.02)``); empty where they agree,
    or where the run records no verdict notebook or names no profile this checkout has."""
    try:
        recorded = recorded_parameters(manifest)
    except UserError:
        return []
    profile = manifest.get("profile")
    wanted = profile_parameters(profile, VERDICT_NOTEBOOK)
    if wanted is None:
        return []
    return [f"{name} {recorded.get(name)!r} (profile {profile}: {wanted.get(name)!r})"
            for name in DECIDING if recorded.get(name) != wanted.get(name)]


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
    return analysis.hardware_summary(snapshot if isinstance(snapshot, dict) else {})


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


# -------------------------------------------------------------- the tables and their rows

def table_records(frame: Any) -> list[dict[str, Any]]:
    """A table's rows as plain dicts, a missing value as None (as the node's JSON rows have
    it): what the claims checks read."""
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def recorded_notebook_parameters(manifest: Mapping[str, Any], notebook: str) -> dict[str, Any]:
    """A notebook's parameters as the run ran it: its defaults under the run's recorded ones."""
    entry = next((e for e in manifest.get("notebooks") or []
                  if isinstance(e, dict) and e.get("name") == notebook), None) or {}
    given = entry.get("parameters") if isinstance(entry.get("parameters"), dict) else {}
    path = paths.NOTEBOOKS_DIR / f"{notebook}.ipynb"
    return {**(notebook_parameters(path) if path.is_file() else {}), **given}


def rounds_problem(table: str, rows: list[dict[str, Any]], parameters: Mapping[str, Any]
                   ) -> str | None:
    """Why a table holds more rounds than its notebook's recorded parameters allow (``rounds``,
    or ``max_rounds`` where rounds run until resolved), or None."""
    caps = [v for v in (parameters.get("rounds"), parameters.get("max_rounds"))
            if isinstance(v, int) and not isinstance(v, bool)]
    if not caps:
        return None
    timed = {row.get("round") for row in rows
             if row.get("status") == "ok" and row.get("metric") == "time"}
    if len(timed) > max(caps):
        return (f"data/{table}.parquet holds {len(timed)} rounds, more than the {max(caps)} its "
                "recorded parameters allow")
    return None


def backing_records(run_dir: Path, manifest: Mapping[str, Any]
                    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The snapshot and preflight a run's tables are checked against: a replay's node record
    (``measured/``, verified against its digests), or a live run's own manifest snapshot (the
    same as its hardware.json: :func:`hardware_difference`) and no preflight."""
    if not manifest.get("measured_on"):
        hardware = manifest.get("hardware")
        return (hardware if isinstance(hardware, dict) else {}), None
    found = []
    for name in (RunFolder.HARDWARE, RunFolder.PREFLIGHT):
        try:
            value = untrusted.load_json(Path(run_dir) / RECORD_COPY / name, root=run_dir)
        except FileNotFoundError:
            value = None
        found.append(value if isinstance(value, dict) else None)
    return found[0] or {}, found[1]


def tables_problem(run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
    """Why a run's own tables (``data/*.parquet``) contradict the records that back them
    (:func:`backing_records`): an ok row of an arm that needs CUDA, or on a CUDA device, from a
    machine whose records do not all say CUDA, an arm the catalogue or the recorded parameters
    do not have, a timing no timer reads, positions the balanced order cannot give
    (:mod:`stagelab.analyse.claims`), more rounds than recorded; None where none does."""
    hardware, preflight = backing_records(run_dir, manifest)
    folder = RunFolder(run_dir)
    for table, notebook in sorted(catalogue.tables().items()):
        if not folder.table_path(table).is_file():
            continue
        rows = table_records(schema.read_table(run_dir, table))
        parameters = recorded_notebook_parameters(manifest, notebook)
        found = claims.rows_problems(table, rows, {"parameters": parameters}, hardware,
                                     preflight)
        found += [p for p in [rounds_problem(table, rows, parameters)] if p]
        if found:
            return f"data/{table}.parquet disagrees with the records that back it: {found[0]}"
    return None


def replay_tables_problem(run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
    """Where a replay's tables are not what its notebooks derive from the verified node rows
    it carries (``measured/``, rebuilt here by the very function the notebooks call:
    :meth:`stagelab.core.measured.MeasuredFolder.replayed_frame`); None for a live run and
    for a replay whose every table is its rows."""
    if not manifest.get("measured_on"):
        return None
    copy = MeasuredFolder(Path(run_dir) / RECORD_COPY)
    folder = RunFolder(run_dir)
    run_id = str(manifest.get("run_id") or Path(run_dir).name)
    for table, notebook in sorted(catalogue.tables().items()):
        rebuilt = table_records(copy.replayed_frame(table, run_id, notebook))
        held = (table_records(schema.read_table(run_dir, table))
                if folder.table_path(table).is_file() else [])
        if rebuilt != held:
            return (f"data/{table}.parquet holds {len(held)} rows that are not the "
                    f"{len(rebuilt)} its notebook derives from the verified "
                    f"{RECORD_COPY}/ rows; a replay's tables are its node's rows, or nothing")
    return None


ORIGIN_FIELDS = ("measured_id", "profile", "status", "created_utc", "host", "gpu", "device",
                 "forced", "rehearsal", "preflight", "gaps")


def verified_origin(run_dir: Path) -> dict[str, Any]:
    """Where a replay's measurement was made, read from the verified copy it carries
    (``measured/measured.json``), never from the run's own manifest."""
    copy = MeasuredFolder(Path(run_dir) / RECORD_COPY)
    return copy.origin(copy.manifest())


def origin_difference(run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
    """Where a replay's manifest says of its measurement (``measured_on``) other than its
    verified copy does; None for a live run and where they agree."""
    said = manifest.get("measured_on")
    if not said:
        return None
    if not isinstance(said, dict):
        return "its manifest's measured_on is not an object"
    verified = verified_origin(run_dir)
    for name in ORIGIN_FIELDS:
        if said.get(name) != verified.get(name):
            return (f"its manifest's measured_on says {name} {said.get(name)!r}, its verified "
                    f"{RECORD_COPY}/{MANIFEST} {verified.get(name)!r}")
    return None


def problem(run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
    """Why the run's claims are not what its tables and records give (None when they are):
    its hardware, its snapshot's CUDA, a replay's origin and tables against its verified node
    rows, its tables against the records that back them, its verdict.json, its index.html."""
    found = (hardware_difference(run_dir, manifest)
             or claims.snapshot_problem(manifest.get("hardware") or {})
             or origin_difference(run_dir, manifest)
             or replay_tables_problem(run_dir, manifest)
             or tables_problem(run_dir, manifest))
    if found:
        return found
    recorded = RunFolder(run_dir).read_verdict()
    if recorded is None:
        return None  # no verdict: refused as such
    fresh = rederived_verdict(run_dir, manifest)
    return verdict_difference(recorded, fresh) or index_difference(run_dir, fresh)
