"""Shared fixtures: tiny notebooks and profiles that exercise the runner in seconds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook


def write_notebook(path: Path, parameters: str, body: str) -> Path:
    """A notebook with a tagged parameters cell followed by one code cell."""
    nb = new_notebook(cells=[new_code_cell(parameters, metadata={"tags": ["parameters"]}),
                             new_code_cell(body)],
                      metadata={"kernelspec": {"name": "stagelab", "display_name": "stagelab",
                                               "language": "python"}})
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def tiny_suite(tmp_path: Path) -> dict[str, Path]:
    """Three notebooks (one writes a table, one fails, one sleeps) and a profile file naming them."""
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    write_notebook(nb_dir / "10_ok.ipynb", 'run_dir = ""\nrounds = 2\nlabel = "x"',
                   "from stagelab import context\n"
                   "ctx = context.notebook_context('10_ok', run_dir)\n"
                   "ctx.table_sink('ok_table').append(\n"
                   "    {'seconds': 0.5, 'bytes': 10**9, 'round': r, 'experiment': 'e', 'arm': label}\n"
                   "    for r in range(rounds))\nprint('done', rounds)")
    write_notebook(nb_dir / "20_fails.ipynb", 'run_dir = ""',
                   "print('partial output before the failure')\n"
                   "raise RuntimeError('deliberate failure for the test')")
    write_notebook(nb_dir / "30_sleeps.ipynb", 'run_dir = ""\nseconds = 60',
                   "import pathlib, time\nprint('sleeping', flush=True)\n"
                   "pathlib.Path(run_dir, 'sleeping').touch()  # tells a test the cell runs\n"
                   "time.sleep(seconds)")
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"profiles": {
        "tiny": {"description": "test", "notebooks": {"10_ok": {"rounds": 3}, "20_fails": {}}},
        "okonly": {"description": "test", "notebooks": {"10_ok": {}}},
        "sleepy": {"description": "test", "notebooks": {"30_sleeps": {}, "10_ok": {}}},
        "hangs": {"description": "test", "cell_timeout_s": 3,
                  "notebooks": {"30_sleeps": {}, "10_ok": {}}}}}))
    return {"notebooks": nb_dir, "profiles": profiles, "root": tmp_path / "runs"}


def tiny_cli(suite: dict[str, Path], *args: str) -> list[str]:
    """A command line running ``stagelab ARGS`` in a fresh interpreter on the tiny suite."""
    script = ("import sys\nfrom pathlib import Path\nfrom stagelab import cli, paths\n"
              f"paths.PROFILES_FILE = Path({str(suite['profiles'])!r})\n"
              f"paths.NOTEBOOKS_DIR = Path({str(suite['notebooks'])!r})\n"
              f"sys.exit(cli.main({list(args)!r}))\n")
    return [sys.executable, "-c", script]
