"""Where a notebook's time goes: the kernel's marks, the phases the runner records from them and
papermill's cell times, the manifest's shape and the terminal's line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_notebook
from stagelab.core import paths, phases, records, rundir
from stagelab.run import execute, profiles


def cells_notebook(path: Path, spans: list[tuple[str, str]]) -> Path:
    """An executed notebook as papermill leaves it: each cell's start and end time."""
    cells = [{"cell_type": "code", "metadata": {"papermill": {"start_time": start,
                                                              "end_time": end}},
              "source": "", "outputs": []} for start, end in spans]
    cells.append({"cell_type": "markdown", "metadata": {}, "source": "prose"})
    path.write_text(json.dumps({"cells": cells, "metadata": {}}))
    return path


def test_the_cell_span_is_from_the_first_cell_s_start_to_the_last_one_s_end(tmp_path):
    notebook = cells_notebook(tmp_path / "nb.ipynb", [
        ("2026-12-01T10:00:02.500000Z", "2026-12-01T10:00:03.000000Z"),
        ("2026-12-01T10:00:03.000000Z", "2026-12-01T10:00:09.250000Z")])
    first, last = phases.cell_span(notebook)
    assert last - first == pytest.approx(6.75)
    assert phases.cell_span(tmp_path / "missing.ipynb") == (None, None)
    (tmp_path / "broken.ipynb").write_text("{")
    assert phases.cell_span(tmp_path / "broken.ipynb") == (None, None)


def test_the_phases_sum_to_the_notebook_s_time_and_measurement_is_the_kernel_s():
    # started at 100, cells 102-110, imports done at 104, 3 s measured, papermill back at 111,
    # HTML done at 112.5
    found = phases.notebook_phases(100.0, 111.0, 112.5, (102.0, 110.0),
                                   {"imported": 104.0, "measure_s": 3.0})
    assert found == {"kernel_start_s": 3.0, "import_s": 2.0, "measure_s": 3.0,
                     "analysis_s": 3.0, "export_s": 1.5}
    assert sum(found.values()) == pytest.approx(12.5)
    assert phases.non_measurement_share(found) == pytest.approx(9.5 / 12.5)


def test_a_notebook_that_marked_nothing_or_ran_no_cell_leaves_those_phases_unknown():
    unmarked = phases.notebook_phases(100.0, 111.0, 112.0, (102.0, 110.0), {})
    assert unmarked["import_s"] is None and unmarked["measure_s"] == 0.0
    assert unmarked["analysis_s"] == 8.0  # every cell's time is the notebook's own work
    no_cell = phases.notebook_phases(100.0, 104.0, 104.5, (None, None), {"imported": 1.0})
    assert no_cell == {"kernel_start_s": 4.0, "import_s": None, "measure_s": None,
                       "analysis_s": None, "export_s": 0.5}


def test_the_kernel_marks_only_where_the_runner_named_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv(phases.PHASES_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    phases.mark_imported()
    with phases.measuring():
        pass
    assert list(tmp_path.iterdir()) == []  # by hand in the Lab: nothing written anywhere
    marks = tmp_path / "marks.json"
    monkeypatch.setenv(phases.PHASES_ENV, str(marks))
    phases.mark_imported()
    first = phases.read_marks(marks)["imported"]
    phases.mark_imported()  # the first mark counts
    with phases.measuring():
        pass
    with pytest.raises(RuntimeError), phases.measuring():  # a failed measurement still counts
        raise RuntimeError("boom")
    found = phases.read_marks(marks)
    assert found["imported"] == first and found["measure_s"] >= 0.0
    assert set(found) == {"imported", "measure_s"}


def test_the_terminal_line_says_where_the_run_s_time_went():
    manifest = {"notebooks": [
        {"phases": {"kernel_start_s": 1.0, "import_s": 2.0, "measure_s": 6.0,
                    "analysis_s": 0.5, "export_s": 0.5}},
        {"phases": {"kernel_start_s": 1.0, "import_s": 1.0, "measure_s": None,
                    "analysis_s": 7.0, "export_s": 0.0}},
        {"phases": None}]}
    spent = {"kernel_start_s": 2.0, "import_s": 3.0, "measure_s": 6.0, "analysis_s": 7.5,
             "export_s": 0.5}
    assert phases.totals(manifest) == spent
    assert phases.non_measurement_share(spent) == pytest.approx(13 / 19)
    # the one test that holds the terminal's time line's wording
    assert phases.summary_line(manifest) == (
        "time: kernel start 2.0 s, import 3.0 s, measure 6.0 s, analysis 7.5 s, export 0.5 s; "
        "not measuring: 68% of 19.0 s")
    assert phases.summary_line({"notebooks": [{"name": "x"}]}) == ""
    manifest["kernels"] = {"started": 3, "ready": 3, "seconds": 1.0, "errors": {}}
    assert phases.totals(manifest) == {**spent, "kernel_start_s": 3.0}  # before the first one
    assert phases.summary_line(manifest).endswith("not measuring: 70% of 20.0 s")


def test_the_manifest_schema_takes_the_phases_and_refuses_a_misspelt_one(tmp_path):
    manifest = rundir.new_manifest(tmp_path, "quick", ["test"], [rundir.notebook_entry("x")],
                                   None)
    manifest["notebooks"][0]["phases"] = dict.fromkeys(phases.NAMES, 1.0)
    records.check_record(json.loads(json.dumps(manifest)), "manifest", "m.json")
    manifest["notebooks"][0]["phases"]["measuring_s"] = 1.0
    with pytest.raises(Exception, match="measuring_s"):
        records.check_record(manifest, "manifest", "m.json")


MEASURES = """from stagelab.run import context
ctx = context.notebook_context('40_measures', run_dir)

def measure(seconds, sink):
    import time
    time.sleep(seconds)
    sink.append([{'seconds': seconds, 'bytes': 1, 'round': 0, 'experiment': 'e', 'arm': 'a'}])

frame = ctx.sweep_frame('t', '', measure, seconds)
import time
time.sleep(0.2)  # analysis
"""


@pytest.mark.slow  # a real kernel: several seconds
def test_a_real_run_records_each_notebook_s_phases_within_its_duration(tmp_path):
    """A notebook that measures 0.6 s and analyses 0.2 s, through the runner and a real kernel.

    Before: it asserted the measurement under 1.6 s, and the phases within 0.1 s of the
    duration: wall-clock bounds that a loaded machine broke (1.84 s; 0.12 s), and make test
    from a fresh clone failed."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    write_notebook(notebooks / "40_measures.ipynb", 'run_dir = ""\nseconds = 0.6', MEASURES)
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": {"one": {
        "description": "test", "notebooks": {"40_measures": {}}}}}))
    plan = profiles.plan_run("one", profiles_path=tmp_path / "profiles.json",
                             notebooks_dir=notebooks)
    run_dir = rundir.new_run_dir(tmp_path / "runs", "one")
    manifest = execute.execute(plan, run_dir, command=["test"], progress=False)
    (entry,) = manifest["notebooks"]
    assert entry["status"] == "ok", entry["error"]
    found = entry["phases"]
    assert set(found) == set(phases.NAMES) and None not in found.values()
    # a recorded figure checked for sense, never for speed (before: an upper bound of 1.6 s
    # failed make test at 1.84 s under a load of 12): at least the sleep, within the notebook
    assert 0.6 <= found["measure_s"] < entry["duration_s"]
    assert found["analysis_s"] >= 0.2 and found["kernel_start_s"] > 0
    # the export comes once the run has ended, after the entry's duration was taken; the
    # duration also holds the runner's own reading after papermill returned, which a loaded
    # machine lengthens (0.12 s measured): the phases fit in it, up to their rounding
    assert sum(found.values()) - found["export_s"] <= entry["duration_s"] + 0.05
    assert rundir.read_manifest(run_dir)["notebooks"][0]["phases"] == found
    assert phases.PHASES_ENV not in os.environ  # the runner named its file to this kernel only


# What a notebook that does not need torch or seaborn loads, in a fresh interpreter: its first
# code cell's imports and its context.
LEAN = {"00_environment": ("torch", "seaborn", "matplotlib", "scipy"),
        "04_verdict": ("torch",), "05_prediction": ("torch",)}


def first_cell_imports(notebook: str) -> str:
    import ast

    import nbformat

    nb = nbformat.read(str(paths.NOTEBOOKS_DIR / f"{notebook}.ipynb"), as_version=4)
    code = next(cell.source for cell in nb.cells if cell.cell_type == "code"
                and "parameters" not in cell.metadata.get("tags", []))
    tree = ast.parse(code)
    return "\n".join(ast.unparse(node) for node in tree.body
                     if isinstance(node, ast.Import | ast.ImportFrom))


@pytest.mark.parametrize("notebook", sorted(LEAN))
def test_a_notebook_imports_only_what_it_uses(notebook, tmp_path):
    """Before: every notebook loaded torch and seaborn (about 2 s of its start) through the
    context and the model shapes, the verdict's and the environment's too."""
    script = (f"import sys\n{first_cell_imports(notebook)}\n"
              f"context.notebook_context({notebook!r}, {str(tmp_path)!r})\n"
              f"print(','.join(m for m in {LEAN[notebook]!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""
