"""``stagelab run --from DIR``: a run whose measuring notebooks read a measured folder.

The plan is checked as for a live run, then each measuring notebook of the profile gets the
parameters it was measured with and ``measured`` naming the folder; everything is refused, in one
line and before a run folder exists, when the folder is not a measurement or lacks an
experiment the profile needs. An experiment that measured nothing (stopped before its first
cell) is left out of the run, and the verdict names it with every other gap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stagelab.core import outcomes
from stagelab.core.errors import UserError
from stagelab.core.records import RunFolder
from stagelab.run import measure_command, profiles
from stagelab.run.profiles import RunPlan


def _measured_anything(entry: dict[str, Any]) -> bool:
    if entry["table"] is None:
        return entry["status"] == outcomes.OK
    return any(cell["status"] in (outcomes.OK, outcomes.FAILED) for cell in entry["cells"])


def check_overrides(params: Iterable[str]) -> None:
    """UserError for a ``--param`` of a measuring notebook: its rows were measured with their
    own parameters (checked before the profile's own checks, which would name another cause)."""
    for name in profiles.parse_overrides(params):
        if name in measure_command.MEASURING:
            raise UserError(f"--param for {name}: its rows were measured with their own "
                            "parameters (see measured.json); measure again to change them")


def replay_plan(plan: RunPlan, folder: Path, params: Iterable[str]) -> dict[str, Any]:
    """Point ``plan``'s measuring notebooks at ``folder`` (in place); return the measurement's
    origin for the run's manifest, its ``hardware`` included. UserError for a bad request."""
    folder = Path(folder).resolve()
    manifest = measure_command.read_measured(folder)
    if manifest.get("profile") != plan.profile:
        raise UserError(f"--from {folder}: measured with profile {manifest.get('profile')!r}, "
                        f"not {plan.profile!r}; replay it with --profile "
                        f"{manifest.get('profile')}")
    by_notebook = {entry["notebook"]: entry for entry in manifest["experiments"]}
    check_overrides(params)
    kept, replayed = [], []
    for notebook in plan.notebooks:
        if notebook.name not in measure_command.MEASURING:
            kept.append(notebook)
            continue
        entry = by_notebook.get(notebook.name)
        if entry is None and notebook.name == measure_command.SNAPSHOT_NOTEBOOK:
            entry = {"table": None, "status": outcomes.OK, "parameters": {}}  # hardware.json
        if entry is None:
            raise UserError(f"--from {folder}: lacks {notebook.name}, which profile "
                            f"{plan.profile!r} needs (it holds "
                            f"{', '.join(by_notebook) or 'nothing'}); measure it, or leave it "
                            "out with --only")
        replayed.append(entry)
        if _measured_anything(entry):
            notebook.parameters = {**entry["parameters"], "measured": str(folder)}
            kept.append(notebook)
    for entry in replayed:  # once every experiment the profile needs is known to be there
        measure_command.check_rows(folder, entry)
    plan.notebooks = kept
    try:
        hardware = json.loads((folder / RunFolder.HARDWARE).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--from {folder}: {RunFolder.HARDWARE} cannot be read ({exc})") from exc
    return {**measure_command.origin(folder, manifest), "hardware": hardware}
