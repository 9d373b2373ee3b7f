"""Inside a notebook: where its tables, figures and JSON go.

Run by the runner, a notebook gets its run folder as ``run_dir``. Run by hand in JupyterLab,
``run_dir`` is empty: a folder ``<time>_<host>_interactive`` is made under ``papermill_runs/``
with a manifest of status ``interactive``, so that ``stagelab runs`` lists it and its results are
kept apart from profile runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagelab import paths, rundir
from stagelab.records import RunFolder, atomic_target
from stagelab.schema import TableSink

INTERACTIVE_PROFILE = "interactive"


@dataclass
class NotebookContext:
    """What a notebook needs to write into its run folder: tables through the schema, figures."""

    notebook: str
    run_dir: Path

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def table_sink(self, name: str) -> TableSink:
        """A table of this run (``data/<name>.parquet``, see :mod:`stagelab.schema`) that a sweep
        rewrites after every cell, each row labelled with this run and notebook."""
        return TableSink(self.run_dir, name, run_id=self.run_id, notebook=self.notebook)

    def save_figure(self, figure: Any, name: str) -> Path:
        """Save a matplotlib figure as ``figures/<notebook>_<name>.png``, atomically."""
        path = RunFolder(self.run_dir).figure_path(self.notebook, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_target(path) as temporary:
            figure.savefig(temporary, dpi=110, bbox_inches="tight", format="png")
        return path

    def write_json(self, payload: Any, name: str) -> Path:
        """Write a JSON document at the run folder's top level (e.g. ``verdict.json``)."""
        return RunFolder(self.run_dir).write_json(name, payload)


def interactive_run_dir(notebook: str, root: Path | None = None) -> Path:
    """A fresh interactive run folder with its manifest (status ``interactive``)."""
    from stagelab import hardware

    run_dir = rundir.new_run_dir(Path(root or paths.RUNS_DIR), INTERACTIVE_PROFILE)
    entry = rundir.notebook_entry(notebook, status=rundir.INTERACTIVE)
    entry.update(output=None, html=None)  # the notebook itself stays where JupyterLab has it
    manifest = rundir.new_manifest(run_dir, INTERACTIVE_PROFILE, list(sys.argv), [entry],
                                   hardware.snapshot(), status=rundir.INTERACTIVE)
    rundir.write_manifest(run_dir, manifest)
    return run_dir


def notebook_context(notebook: str, run_dir: str | Path | None) -> NotebookContext:
    """The context of a notebook run by the runner, or, interactively, of a fresh folder."""
    if run_dir:
        path = Path(run_dir)
        if not path.is_dir():
            raise FileNotFoundError(f"run_dir {path} does not exist")
        return NotebookContext(notebook, path)
    return NotebookContext(notebook, interactive_run_dir(notebook))
