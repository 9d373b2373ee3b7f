"""Inside a notebook: where its tables, figures and JSON go, and whether it measures or reads.

Run by the runner, a notebook gets its run folder as ``run_dir``; run by ``stagelab run --from``
a measuring notebook also gets ``measured``, a folder made by ``stagelab measure``, and reads its
rows and hardware snapshot instead of measuring (:meth:`NotebookContext.sweep_frame`,
:meth:`NotebookContext.snapshot`); every other cell runs unchanged. Run by hand in JupyterLab,
``run_dir`` is empty: a folder ``<time>_<host>_interactive`` is made under ``papermill_runs/``
with a manifest of status ``interactive``, so that ``stagelab runs`` lists it and its results are
kept apart from profile runs. A notebook that reads a run's data (the verdict) reads, by hand,
the newest run folder that holds data, names it, and writes its own results into the fresh
folder: it never decides on an empty one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagelab.core import paths, phases, rundir, untrusted
from stagelab.core.errors import InsufficientMemory, UserError
from stagelab.core.records import RunFolder, atomic_target
from stagelab.core.schema import TableSink, write_table

INTERACTIVE_PROFILE = "interactive"


@dataclass
class NotebookContext:
    """What a notebook needs to write into its run folder: tables through the schema, figures."""

    notebook: str
    run_dir: Path
    source_dir: Path | None = None  # the run whose data it reads, where that is another folder
    untraced: str | None = None  # why :meth:`trace` recorded nothing here (None: not refused)

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def data_dir(self) -> Path:
        """The run folder whose tables this notebook reads."""
        return self.source_dir or self.run_dir

    def reading(self) -> str:
        """Which run's data this notebook reads, in one Markdown sentence."""
        if self.source_dir is None:
            return f"Reading the data of run `{self.run_id}`."
        return (f"Run by hand: reading the data of run `{self.source_dir.name}`, the newest run "
                f"folder under `{self.source_dir.parent.name}/` with the data this notebook needs "
                f"(set `run_dir` to read another); results go to `{self.run_id}`.")

    def table_sink(self, name: str) -> TableSink:
        """A table of this run (``data/<name>.parquet``, see :mod:`stagelab.core.schema`) that a sweep
        rewrites after every cell, each row labelled with this run and notebook."""
        return TableSink(self.run_dir, name, run_id=self.run_id, notebook=self.notebook)

    def sweep_frame(self, table: str, measured: str | Path, measure: Callable[..., object],
                    *args: Any, **kwargs: Any) -> Any:
        """This notebook's sweep as a schema frame, written to ``data/<table>.parquet``:
        measured here by ``measure(*args, sink=..., **kwargs)`` (rewritten after every cell),
        or, where ``measured`` names a measured folder, its rows of ``table`` read back."""
        with phases.measuring():
            return self._sweep_frame(table, measured, measure, *args, **kwargs)

    def _sweep_frame(self, table: str, measured: str | Path, measure: Callable[..., object],
                     *args: Any, **kwargs: Any) -> Any:
        if not measured:
            sink = self.table_sink(table)
            measure(*args, sink=sink, **kwargs)
            return sink.frame()
        from stagelab.core.measured import MeasuredFolder

        frame = MeasuredFolder(measured).replayed_frame(table, self.run_id, self.notebook)
        write_table(frame, self.run_dir, table)
        return frame

    def snapshot(self, measured: str | Path, under_load: bool = False) -> dict[str, Any]:
        """The machine the numbers come from: this one, or the measured folder's."""
        with phases.measuring():
            return self._snapshot(measured, under_load)

    def _snapshot(self, measured: str | Path, under_load: bool) -> dict[str, Any]:
        if measured:  # a stranger's folder: its own regular file only (no link, bounded)
            return untrusted.load_json(Path(measured) / RunFolder.HARDWARE, root=measured)
        from stagelab.measure import hardware

        return hardware.snapshot(under_load=under_load)

    def save_figure(self, figure: Any, name: str) -> None:
        """Save a matplotlib figure as ``figures/<notebook>_<name>.png``, atomically, and show
        that very PNG in the notebook: the figure is drawn once (the inline backend would draw
        it again at the cell's end; it is closed instead). Returns nothing, so that a cell
        ending with it shows no path. A figure with nothing drawn
        (:func:`stagelab.present.plots.empty_reason`) is not saved nor shown: the notebook says
        in one sentence why instead of an empty frame. The image carries its caption as alt
        text, which the exported page keeps (before: every figure in a notebook's page had
        none)."""
        import matplotlib.pyplot as plt
        from IPython.display import Image, Markdown, display

        from stagelab.present import plots, report  # a notebook that saves a figure has them

        reason = plots.empty_reason(figure)
        if reason is not None:
            plt.close(figure)
            display(Markdown(f"*No figure: {reason.rstrip('.')}.*"))
            return
        path = RunFolder(self.run_dir).figure_path(self.notebook, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_target(path) as temporary:
            figure.savefig(temporary, dpi=110, bbox_inches="tight", format="png")
        plt.close(figure)
        caption = report.figure_caption(path.name, gpu=self._has_gpu())
        display(Image(data=path.read_bytes(), format="png", metadata={"alt": caption}))

    def gpu_name(self) -> str | None:
        """The name of the GPU this run's numbers come from (its manifest's hardware: the
        measured folder's where it reads one; no new snapshot), None without a GPU or a
        manifest."""
        return ((self._hardware() or {}).get("gpu") or {}).get("name")

    def _has_gpu(self) -> bool:
        """Whether this run's machine has a GPU (some captions name the link it draws); before
        its manifest is written, True: the captions say what a GPU run's figure draws."""
        hardware = self._hardware()
        return True if hardware is None else bool(hardware.get("gpu"))

    def _hardware(self) -> dict[str, Any] | None:
        """The hardware snapshot of this run's manifest ({} where it holds none), None before
        the manifest is written."""
        try:
            return rundir.read_manifest(self.run_dir).get("hardware") or {}
        except (OSError, UserError):
            return None

    def save_trace(self, packed: bytes, name: str) -> Path:
        """Write a compressed Chrome trace (:meth:`RunFolder.trace_path`) atomically; its path."""
        path = RunFolder(self.run_dir).trace_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_target(path) as temporary:
            Path(temporary).write_bytes(packed)
        return path

    def trace(self, name: str, measured: str | Path, record: Callable[..., bytes],
              *args: Any, **kwargs: Any) -> Path | None:
        """A trace recorded here by ``record(*args, **kwargs)`` and kept in the run folder
        (:meth:`save_trace`); None where ``measured`` names a measured folder (``stagelab
        measure`` records no timeline: the node's is not there to read), or where ``record``
        refused a size that would not fit (the reason in :attr:`untraced`: a run that asks for
        more than the machine holds still ends, saying so)."""
        if measured:
            return None
        try:
            with phases.measuring():
                return self.save_trace(record(*args, **kwargs), name)
        except InsufficientMemory as exc:
            self.untraced = f"refused before it started ({exc}); nothing large was allocated"
            return None

    def write_verdict(self, payload: Any) -> None:
        """Write the run's verdict (checked against its schema by the run folder); returns
        nothing, so that a notebook cell ending with it shows no path."""
        RunFolder(self.run_dir).write_json(RunFolder.VERDICT, payload)

    def write_json(self, payload: Any, name: str) -> None:
        """Write a JSON document at the run folder's top level (e.g. ``verdict.json``); returns
        nothing, so that a notebook cell ending with it shows no path."""
        RunFolder(self.run_dir).write_json(name, payload)


def interactive_run_dir(notebook: str, root: Path | None = None) -> Path:
    """A fresh interactive run folder with its manifest (status ``interactive``)."""
    from stagelab.measure import hardware

    run_dir = rundir.new_run_dir(Path(root or paths.RUNS_DIR), INTERACTIVE_PROFILE)
    entry = rundir.notebook_entry(notebook, status=rundir.INTERACTIVE)
    entry.update(output=None, html=None)  # the notebook itself stays where JupyterLab has it
    manifest = rundir.new_manifest(run_dir, INTERACTIVE_PROFILE, list(sys.argv), [entry],
                                   hardware.snapshot(), status=rundir.INTERACTIVE)
    rundir.write_manifest(run_dir, manifest)
    return run_dir


def use_plot_theme() -> None:
    """The suite's plot theme, for a notebook that plots (it imported
    :mod:`stagelab.present.plots` first); one that only shows tables never loads seaborn."""
    plots = sys.modules.get("stagelab.present.plots")
    if plots is not None:
        plots.use_theme()


def notebook_context(notebook: str, run_dir: str | Path | None) -> NotebookContext:
    """The context of a notebook run by the runner, or, interactively, of a fresh folder; the
    suite's plot theme is set here, once for every notebook that plots."""
    phases.mark_imported()
    use_plot_theme()
    if run_dir:
        path = Path(run_dir)
        if not path.is_dir():
            raise FileNotFoundError(f"run_dir {path} does not exist")
        return NotebookContext(notebook, path)
    return NotebookContext(notebook, interactive_run_dir(notebook))


def newest_run_with_data(root: Path | None = None, prefer: str | None = None) -> Path:
    """The newest run folder under ``root`` (default ``papermill_runs/``) holding a table
    (``data/*.parquet``), the newest holding table ``prefer`` where one does (by hand, each
    notebook writes a folder of its own); folder names start with their UTC time.
    FileNotFoundError, saying what to do, where there is none."""
    root = Path(root or paths.RUNS_DIR)
    with_data = {table.parent.parent for table in root.glob("*/data/*.parquet")}
    if not with_data:
        raise FileNotFoundError(f"no run folder under {root} holds data (data/*.parquet): run "
                                "`stagelab run` or notebooks 01-03 first, or set run_dir")
    preferred = {folder for folder in with_data if (folder / "data" / f"{prefer}.parquet").exists()}
    return max(preferred or with_data, key=lambda folder: folder.name)


def reading_context(notebook: str, run_dir: str | Path | None, root: Path | None = None,
                    prefer: str | None = None) -> NotebookContext:
    """The context of a notebook that reads a run's data: the given run folder (the runner's);
    by hand, the newest run folder with data under ``root`` (with table ``prefer`` where one has
    it), and a fresh interactive folder for what the notebook writes."""
    phases.mark_imported()
    if run_dir:
        return notebook_context(notebook, run_dir)
    source = newest_run_with_data(root, prefer)
    return NotebookContext(notebook, interactive_run_dir(notebook, root), source)
