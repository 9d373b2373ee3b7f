"""``stagelab run --from DIR``: a run whose measuring notebooks read a measured folder.

The plan is checked as for a live run, then each measuring notebook of the profile gets the
parameters it was measured with and ``measured`` naming the folder's verified copy (read once,
checked against the digests ``measure`` wrote; the run takes it in as ``measured/`` and nothing
reads the folder again); everything is refused, in one line and before a run folder exists,
when the folder is not a measurement, lacks an experiment the profile needs, or makes a claim
the rest of it contradicts.

The folder is a stranger's: parameter names come from each notebook's own parameters cell
(the measured values are data checked against them), files are read only by known names
(:mod:`stagelab.core.untrusted`), and rows are checked against the folder's own hardware
snapshot and preflight (:mod:`stagelab.analyse.claims`). An experiment that measured nothing (stopped before its first
cell) is left out of the run, and the verdict names it with every other gap.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, overload

from stagelab.analyse import claims
from stagelab.core import measured as measured_folder
from stagelab.core import outcomes, parameter_history, records, untrusted
from stagelab.core.errors import UserError
from stagelab.core.measured import MeasuredFolder
from stagelab.core.records import RunFolder
from stagelab.run import profiles
from stagelab.run.profiles import NotebookPlan, RunPlan


def _measured_anything(entry: dict[str, Any]) -> bool:
    if entry["table"] is None:
        return entry["status"] == outcomes.OK
    return any(cell["status"] in (outcomes.OK, outcomes.FAILED) for cell in entry["cells"])


def check_overrides(params: Iterable[str]) -> None:
    """UserError for a ``--param`` of a measuring notebook: its rows were measured with their
    own parameters (checked before the profile's own checks, which would name another cause)."""
    for name in profiles.parse_overrides(params):
        if name in measured_folder.MEASURING:
            raise UserError(f"--param for {name}: its rows were measured with their own "
                            "parameters (see measured.json); measure again to change them")


def replay_plan(plan: RunPlan, folder: Path, params: Iterable[str]) -> dict[str, Any]:
    """Point ``plan``'s measuring notebooks at the verified copy of ``folder`` (in place);
    return the measurement's origin for the run's manifest, its ``hardware`` included, and
    ``staged``: the copy, read once from ``folder`` and checked against its digests, which
    the run takes in as its ``measured/`` and which every check here and every notebook reads
    (``folder`` is never read again). UserError for a bad request, with nothing left behind."""
    given = MeasuredFolder(Path(folder).resolve())
    given.manifest()  # what the folder is, in one line, before its bytes are copied
    given.check_files()
    copy = given.staged_copy()
    try:
        origin = _checked_origin(plan, copy, params)
    except BaseException:
        shutil.rmtree(copy.path.parent, ignore_errors=True)
        raise
    return {**origin, "staged": str(copy.path)}


def _checked_origin(plan: RunPlan, copy: MeasuredFolder, params: Iterable[str]) -> dict[str, Any]:
    manifest = copy.manifest()
    folder = copy.shown
    if manifest.get("profile") != plan.profile:
        raise copy.refusal(f"measured with profile {manifest.get('profile')!r}, not "
                           f"{plan.profile!r}; replay it with --profile "
                           f"{manifest.get('profile')}")
    by_notebook = {entry["notebook"]: entry for entry in manifest["experiments"]}
    check_overrides(params)
    kept, replayed = [], []
    for notebook in plan.notebooks:
        if notebook.name not in measured_folder.MEASURING:
            kept.append(notebook)
            continue
        entry = by_notebook.get(notebook.name)
        if entry is None and notebook.name == measured_folder.SNAPSHOT_NOTEBOOK:
            entry = {"table": None, "status": outcomes.OK, "parameters": {}}  # hardware.json
        if entry is None:
            raise copy.refusal(f"lacks {notebook.name}, which profile {plan.profile!r} needs "
                               f"(it holds {', '.join(by_notebook) or 'nothing'}); measure it, "
                               "or leave it out with --only")
        replayed.append(entry)
        if _measured_anything(entry):
            notebook.parameters = {**measured_parameters(notebook, entry, folder),
                                   "measured": str(copy.path)}
            kept.append(notebook)
    if manifest.get("status") == outcomes.NO_GO or not any(
            _measured_anything(e) for e in replayed if e["table"] is not None):
        raise copy.refusal(f"it measured nothing (status {manifest.get('status')!r}; "
                           "preflight.json says why): nothing to replay")
    for entry in replayed:  # once every experiment the profile needs is known to be there
        copy.check_rows(entry)
    hardware = read_folder_json(copy, RunFolder.HARDWARE)
    wrong = records.shape_errors(hardware, records.schema("hardware"), RunFolder.HARDWARE)
    if wrong:  # every typed field checked before a notebook reads it
        raise copy.refusal(f"{wrong[0]}{f' (and {len(wrong) - 1} more)' if wrong[1:] else ''}")
    preflight = read_folder_json(copy, "preflight.json", required=False)
    for entry in replayed:
        check_claims(copy, entry, hardware, preflight)
    contradiction = claims.snapshot_problem(hardware)  # whether or not a row needs CUDA
    if contradiction:
        raise copy.refusal(f"{contradiction}; refused")
    plan.notebooks = kept
    return {**copy.origin(manifest), "hardware": hardware}


def measured_parameters(notebook: NotebookPlan, entry: dict[str, Any],
                        folder: Path) -> dict[str, Any]:
    """The parameters an experiment was measured with, as data: every name must be one the
    notebook's own parameters cell declares, every value of its default's type (papermill writes
    them into code, so a name from a folder is never trusted). UserError otherwise."""
    given = parameter_history.current(notebook.name, entry.get("parameters") or {})
    declared = profiles.notebook_parameters(notebook.path)
    profiles.check_parameters(notebook.name, given, declared,
                              f"--from {folder}: {measured_folder.MANIFEST}")
    return dict(given)


@overload
def read_folder_json(folder: MeasuredFolder, name: str,
                     required: Literal[True] = True) -> dict[str, Any]: ...


@overload
def read_folder_json(folder: MeasuredFolder, name: str,
                     required: bool) -> dict[str, Any] | None: ...


def read_folder_json(folder: MeasuredFolder, name: str,
                     required: bool = True) -> dict[str, Any] | None:
    """One of the folder's own JSON objects, read as a stranger's file is
    (:func:`stagelab.core.untrusted.load_json`); a refusal naming it when it cannot be."""
    try:
        payload = untrusted.load_json(folder.path / name, root=folder.path)
    except FileNotFoundError:
        if not required:
            return None
        raise folder.refusal(f"{name} is missing") from None
    except UserError as exc:
        raise folder.refusal(f"{name} cannot be read ({exc})") from exc
    if not isinstance(payload, dict):
        raise folder.refusal(f"{name} is not a JSON object")
    return payload


def check_claims(folder: MeasuredFolder, entry: dict[str, Any], hardware: dict[str, Any],
                 preflight: dict[str, Any] | None) -> None:
    """A refusal when an experiment's rows disagree with the folder's hardware snapshot,
    preflight, the catalogue or physical bounds (:mod:`stagelab.analyse.claims`)."""
    if entry["table"] is None:
        return
    rows = folder.measured_rows(entry["table"])
    found = claims.rows_problems(entry["table"], rows, entry, hardware, preflight)
    if found:
        more = f" (and {len(found) - 1} more disagreements)" if len(found) > 1 else ""
        raise folder.refusal(f"{folder.rows_path(entry['table']).name} disagrees with the "
                             f"folder's own records: {found[0]}{more}; refused")


def source_line(origin: dict[str, Any]) -> str:
    """One line naming the commit the measured source matched here, or why none is named."""
    source = origin.get("source") or {}
    if source.get("matched_commit"):
        return (f"the measured source (lib/stagelab tree {source['tree'][:12]}) is commit "
                f"{source['matched_commit']}")
    if not source.get("tree"):
        return "the measurement recorded no source fingerprint (made before they were)"
    claimed = source.get("commit_env") or (origin.get("git") or {}).get("commit")
    return (f"the measured source (lib/stagelab tree {source['tree'][:12]}) matches no commit "
            f"here{'; it names commit ' + claimed if claimed else ''}")
