"""Every notebook's kernel started at once, its imports done, before the first notebook; each a
process of its own, without the debugger, stopped when its notebook is done (issue 40)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from conftest import write_notebook
from stagelab.core import rundir
from stagelab.run import execute, kernels, profiles


def _notebook(path: Path, *sources: str) -> Path:
    notebook = new_notebook(cells=[new_markdown_cell("import not_this"),
                                   *(new_code_cell(source) for source in sources)])
    nbformat.write(notebook, path)
    return path


def test_a_notebook_s_imports_are_read_from_its_code_cells_once_each(tmp_path):
    path = _notebook(tmp_path / "n.ipynb",
                     "import numpy as np\nimport os.path\nfrom stagelab.analyse import stats, verdict",
                     "%timeit 1  # a magic: not Python, passed over",
                     "from . import sibling  # relative: no package here\nfrom json import *",
                     "def f():\n    import colorsys\n    import numpy\n")
    assert kernels.notebook_imports(path) == [
        "numpy", "os.path", "stagelab.analyse", "stagelab.analyse.stats",
        "stagelab.analyse.verdict", "json", "colorsys"]


def test_the_preload_imports_its_modules_passes_over_a_missing_one_and_leaves_no_name():
    namespace: dict = {}
    sys.modules.pop("colorsys", None)
    exec(kernels.preload_source(["no_such_module_anywhere", "colorsys"]), namespace)
    assert "colorsys" in sys.modules
    assert set(namespace) == {"__builtins__"}  # the notebook's namespace stays its own


def test_a_headless_kernel_runs_the_launcher_without_the_debugger():
    spec = [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{c}"]
    assert kernels.headless_command(spec) == [sys.executable, "-Xfrozen_modules=off", "-m",
                                              "stagelab.run.headless_kernel", "-f", "{c}"]
    assert kernels.headless_command(["other", "-f", "{c}"]) == ["other", "-f", "{c}"]
    hidden = subprocess.run(
        [sys.executable, "-c", "import sys\n"
         "from stagelab.run.headless_kernel import HideDebugger\n"
         "sys.meta_path.insert(0, HideDebugger())\n"
         "from ipykernel import debugger\n"
         "print(debugger._is_debugpy_available, 'debugpy' in sys.modules)\n"
         "import debugpy\n"], capture_output=True, text=True, check=False)
    assert hidden.stdout.split() == ["False", "False"]
    assert "ModuleNotFoundError: No module named 'debugpy'" in hidden.stderr


def test_a_warm_kernel_that_is_not_ready_is_not_handed_out():
    warm = kernels.WarmKernels([("a", Path("a.ipynb"))], log=io.StringIO(), timeout_s=1)
    assert warm.get(0) is None and warm.get(5) is None
    assert warm.record() == {"started": 0, "ready": 0, "seconds": 0.0, "errors": {}}


WHO = """import json, os, sys, time
started = time.time()
first_cell_saw = {name: name in sys.modules for name in ("colorsys", "debugpy")}
print(json.dumps({"pid": os.getpid(), "started": started, "saw": first_cell_saw}))
"""


def _kernel_processes(cwd: Path) -> list[int]:
    """Live headless kernels working in ``cwd``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            where = os.readlink(entry / "cwd")
        except OSError:
            continue
        if b"stagelab.run.headless_kernel" in command and Path(where) == cwd:
            found.append(int(entry.name))
    return found


@pytest.mark.slow  # real kernels: several seconds
def test_each_kernel_starts_with_its_imports_done_alone_and_none_outlives_its_notebook(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name in ("50_first", "60_second"):
        write_notebook(notebooks / f"{name}.ipynb", 'run_dir = ""', WHO + "\nimport colorsys\n")
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": {"two": {
        "description": "test", "notebooks": {"50_first": {}, "60_second": {}}}}}))
    plan = profiles.plan_run("two", profiles_path=tmp_path / "profiles.json",
                             notebooks_dir=notebooks)
    run_dir = rundir.new_run_dir(tmp_path / "runs", "two")
    manifest = execute.execute(plan, run_dir, command=["test"], progress=False)
    assert [e["status"] for e in manifest["notebooks"]] == ["ok", "ok"]
    assert manifest["kernels"] == {"started": 2, "ready": 2,
                                   "seconds": manifest["kernels"]["seconds"], "errors": {}}
    said = [json.loads(nbformat.read(run_dir / e["output"], 4).cells[-1].outputs[0]["text"])
            for e in manifest["notebooks"]]
    assert said[0]["pid"] != said[1]["pid"]  # a process of its own each
    assert all(s["saw"] == {"colorsys": True, "debugpy": False} for s in said)
    assert not _kernel_processes(notebooks)  # each stopped with its notebook
    for entry in manifest["notebooks"]:  # exported once, after the run: its seconds recorded
        assert (run_dir / entry["html"]).is_file() and entry["phases"]["export_s"] > 0
