"""What ``keep`` recomputes before it keeps a run, and keeps: the verdict from the run's own
tables, with the parameters the run recorded, through the very function notebook 04 calls
(:func:`stagelab.analyse.verdict.build_verdict`), so that a change of the decision rule changes
both at once; the run's tables against the records that back them (:mod:`stagelab.analyse.
claims`), a replay's tables against the verified node rows they come from; and the machine the
run names, against its snapshot. A run whose ``verdict.json`` differs in any decision, number or
sentence, whose pages state another verdict, or whose tables or hardware claims differ from what
its records give is refused in one line (:func:`kept_verdict`); what is kept is the re-derived
verdict.

What this proves, and what it does not: the kept verdict follows from the kept tables by this
checkout's rule, and the tables agree with their records (a replay's are its node's verified
rows); whether the numbers are what a GPU really measured rests on the machine that measured
them (docs/security.md).
"""

from __future__ import annotations

import html
import itertools
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stagelab.analyse import claims, summaries, verdict, verdict_words
from stagelab.core import (
    catalogue,
    forward,
    outcomes,
    parameter_history,
    paths,
    records,
    schema,
    untrusted,
)
from stagelab.core.cells import notebook_parameters
from stagelab.core.errors import BadRecord, UserError
from stagelab.core.measured import MANIFEST, RECORD_COPY, MeasuredFolder
from stagelab.core.records import RunFolder

VERDICT_NOTEBOOK = catalogue.VERDICT_NOTEBOOK
# The arguments of build_verdict that notebook 04's parameters of the same name give (its rule
# and conditions: verdict.arguments).
PASSED = ("decisive_rows", "decisive_ks")


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
    return _current(VERDICT_NOTEBOOK, given)


def _current(notebook: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """A notebook's defaults under ``given`` (recorded in any format: read in today's,
    :mod:`stagelab.core.parameter_history`)."""
    path = paths.NOTEBOOKS_DIR / f"{notebook}.ipynb"
    defaults = notebook_parameters(path) if path.is_file() else {}
    return parameter_history.current(notebook, {**defaults,
                                                **parameter_history.current(notebook, given)})


# the parameters that change what the verdict decides: the cells, the rule, each condition's value
DECIDING = (*PASSED, "decisive_models", *verdict.RULE_PARAMETERS, parameter_history.CONDITIONS)


def profile_parameters(profile: Any, notebook: str) -> dict[str, Any] | None:
    """A notebook's parameters as ``profile`` of profiles.json sets them, over the notebook's
    defaults; None for a profile this checkout does not have."""
    try:
        profiles = json.loads(paths.PROFILES_FILE.read_text(encoding="utf-8"))["profiles"]
        given = profiles[profile]["notebooks"][notebook] or {}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return _current(notebook, given)


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
    computes (its calibration's seeded simulations included), less the comparison with other
    kept runs, which depends on what is kept at the time and decides nothing."""
    given = recorded_parameters(manifest)
    trials = given.get("calibration_trials") or 0
    try:
        return verdict.build_verdict(
            run_dir, **{name: given[name] for name in PASSED if name in given},
            **verdict.arguments(given),
            decisive_vocabs=_vocabs(given.get("decisive_models") or []),
            reference_root=None, calibration_trials=trials)
    except (ValueError, TypeError, KeyError) as exc:
        raise UserError(f"its verdict cannot be re-derived with its recorded parameters "
                        f"({exc})") from exc


# What a sent verdict.json may hold that keep does not recompute: the comparison with the
# runs kept where and when it was made (other evidence, deciding nothing). Left out of the
# comparison, and of the kept verdict.json.
NOT_RECOMPUTED = ("reference", "reference_skipped")
ABOUT_OTHER_RUNS = verdict_words.ABOUT_OTHER_RUNS  # the findings that compare with them


def compared(result: Mapping[str, Any]) -> dict[str, Any]:
    """A verdict less what keep does not recompute (:data:`NOT_RECOMPUTED`)."""
    kept = {key: value for key, value in result.items() if key not in NOT_RECOMPUTED}
    if isinstance(kept.get("findings"), list):
        kept["findings"] = [f for f in kept["findings"]
                            if not str(f).startswith(ABOUT_OTHER_RUNS)]
    return kept


ABSENT = "(absent)"  # what a shorter list holds where the longer has an item


def first_difference(said: Any, fresh: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """The first place (``overall.summary``, ``decisive[0].speedup``, ``findings[3]``) where
    two JSON values differ, with both values there (:data:`ABSENT` past a shorter list's end);
    None where they are equal. A number differs by any amount: a re-derivation by the same rule
    from the same tables gives the same bits."""
    if isinstance(said, dict) and isinstance(fresh, dict):
        for key in sorted(set(said) | set(fresh), key=str):
            found = first_difference(said.get(key), fresh.get(key),
                                     f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    if isinstance(said, list) and isinstance(fresh, list):
        for index, (one, other) in enumerate(itertools.zip_longest(said, fresh, fillvalue=ABSENT)):
            found = first_difference(one, other, f"{where}[{index}]")
            if found:
                return found
        return None
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (said, fresh))
    same = (said == fresh and (numbers or type(said) is type(fresh))) or (
        numbers and math.isnan(said) and math.isnan(fresh))
    return None if same else (where or "the whole", said, fresh)


def as_written(result: Mapping[str, Any]) -> dict[str, Any]:
    """A verdict as its file holds it (the serialiser of every record), read back: what a
    verdict.json is compared with, and what keep writes."""
    return json.loads(json.dumps(result, default=str))


def _shown(value: Any) -> str:
    return outcomes.clipped(repr(value), 120)


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
    """The first decision, number or sentence where the run's verdict.json and the
    re-derived verdict differ: its decisions named first (the overall decision, the
    recommended change, each answer and decisive cell), then any other field by its path."""
    ours, theirs = decisions(fresh), decisions(recorded)
    for name in sorted(set(ours) | set(theirs)):
        if ours.get(name) != theirs.get(name):
            return (f"its {RunFolder.VERDICT} says {name} {theirs.get(name)!r}, its own tables "
                    f"give {ours.get(name)!r}")
    found = first_difference(compared(recorded), compared(as_written(fresh)))
    if found:
        where, said, given = found
        return (f"its {RunFolder.VERDICT} says {where} {_shown(said)}, its own tables give "
                f"{_shown(given)}")
    return None


VERDICT_HEADING = "Staging verdict:"  # how notebook 04 opens its verdict's prose


def notebook_difference(run_dir: Path, fresh: Mapping[str, Any]) -> str | None:
    """Where the verdict notebook's own page would state another verdict than the re-derived
    one: each of its outputs that states a verdict (:data:`VERDICT_HEADING`) must hold the
    re-derived decision and summary, as notebook 04 prints them."""
    import nbformat

    path = Path(run_dir) / f"{VERDICT_NOTEBOOK}.ipynb"
    try:
        notebook = nbformat.reads(untrusted.read_text(path, root=run_dir, limit=32 << 20),
                                  as_version=4)
    except FileNotFoundError:
        return None
    except Exception as exc:  # nbformat on a stranger's file: any failure refuses
        return f"its {path.name} cannot be read ({type(exc).__name__})"
    overall = fresh.get("overall") or {}
    wanted = f"{VERDICT_HEADING} **{overall.get('decision')}**\n\n{overall.get('summary', '')}"
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            for text in (output.get("data") or {}).values():
                text = "".join(text) if isinstance(text, list) else str(text)
                if VERDICT_HEADING in text and wanted not in text:
                    return (f"its {path.name} states a verdict other than its tables give "
                            f"({overall.get('decision')}: {_shown(overall.get('summary'))})")
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


# -------------------------------------------------------------- the tables and their rows

def table_records(frame: Any) -> list[dict[str, Any]]:
    """A table's rows as plain dicts, a missing value as None (as the node's JSON rows have
    it): what the claims checks read."""
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def recorded_notebook_parameters(manifest: Mapping[str, Any], notebook: str) -> dict[str, Any]:
    """A notebook's parameters as the run ran it: its defaults under the run's recorded ones."""
    entry = next((e for e in manifest.get("notebooks") or []
                  if isinstance(e, dict) and e.get("name") == notebook), None) or {}
    recorded = entry.get("parameters")
    return _current(notebook, recorded if isinstance(recorded, dict) else {})


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


def records_problem(run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
    """Why the run's records contradict each other (None when they do not): its hardware, its
    snapshot's CUDA, a replay's origin and tables against its verified node rows, its tables
    against the records that back them."""
    return (hardware_difference(run_dir, manifest)
            or claims.snapshot_problem(manifest.get("hardware") or {})
            or origin_difference(run_dir, manifest)
            or replay_tables_problem(run_dir, manifest)
            or tables_problem(run_dir, manifest))


def kept_verdict(run_dir: Path, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The verdict keep writes for a run: the one re-derived from its tables, as its file holds
    it (None for a run without a verdict, refused as such); UserError naming the first claim of
    the run that its tables and records do not give (:func:`records_problem`, then any
    decision, number or sentence of its verdict.json, its index.html's verdict, its verdict
    notebook's prose)."""
    found = records_problem(run_dir, manifest)
    if found:
        raise UserError(found)
    recorded = RunFolder(run_dir).read_verdict()
    if recorded is None:
        return None
    fresh = as_written(rederived_verdict(run_dir, manifest))
    found = (verdict_difference(recorded, fresh) or index_difference(run_dir, fresh)
             or notebook_difference(run_dir, fresh))
    if found:
        raise UserError(found)
    return fresh


def problem(run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
    """Why the run's claims are not what its tables and records give (None when they are):
    :func:`kept_verdict`'s refusal."""
    try:
        kept_verdict(run_dir, manifest)
    except UserError as exc:
        return str(exc)
    return None
