"""Shared fixtures and helpers: tiny notebooks and profiles that exercise the runner in seconds,
hand-made run folders, a recording allocator, seeded logits; test modules import from here, never
from one another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

from stagelab import rundir


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
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(
        "profiles:\n"
        "  tiny:\n    description: test\n    notebooks:\n"
        "      10_ok: {rounds: 3}\n      20_fails: {}\n"
        "  okonly:\n    description: test\n    notebooks:\n      10_ok: {}\n"
        "  sleepy:\n    description: test\n    notebooks:\n      30_sleeps: {}\n      10_ok: {}\n"
        "  hangs:\n    description: test\n    cell_timeout_s: 3\n    notebooks:\n"
        "      30_sleeps: {}\n      10_ok: {}\n")
    return {"notebooks": nb_dir, "profiles": profiles, "root": tmp_path / "runs"}


def tiny_cli(suite: dict[str, Path], *args: str) -> list[str]:
    """A command line running ``stagelab ARGS`` in a fresh interpreter on the tiny suite."""
    script = ("import sys\nfrom pathlib import Path\nfrom stagelab import cli, paths\n"
              f"paths.PROFILES_FILE = Path({str(suite['profiles'])!r})\n"
              f"paths.NOTEBOOKS_DIR = Path({str(suite['notebooks'])!r})\n"
              f"sys.exit(cli.main({list(args)!r}))\n")
    return [sys.executable, "-c", script]


# ------------------------------------------------------- shared by several test modules

# The real notebooks at tiny sizes: a whole quick run in a minute on a CPU.
TINY = {
    "01_d2h_staging": {"models": [1000, 4096], "rows": [2], "rounds": 4, "warmup": 1},
    "02_logprobs_step": {"models": [1000], "rows": [2], "ks": [0, 2], "rounds": 3},
    "03_prompt_logprobs": {"tokens": 97, "vocab": 1000, "hidden": 8, "chunks": [16, 64],
                           "rounds": 2, "dtype": "float32"},
    "04_verdict": {"min_samples": 3, "decisive_rows": [2], "decisive_models": [1000],
                   "decisive_ks": [2], "calibration_trials": 20},
}


def fake_run(root: Path, status: str = "ok", notebooks=("10_ok",), pid: int | None = None,
             write_outputs: bool = True) -> Path:
    """A run folder made by hand: a manifest, and the notebooks it names."""
    run_dir = rundir.new_run_dir(root, "quick")
    entries = [rundir.notebook_entry(name, status=status) for name in notebooks]
    manifest = rundir.new_manifest(run_dir, "quick", ["test"], entries, None, status=status)
    manifest["pid"] = pid if pid is not None else os.getpid()
    rundir.write_manifest(run_dir, manifest)
    if write_outputs:
        for name in notebooks:
            write_notebook(run_dir / f"{name}.ipynb", 'run_dir = ""', "print(1)")
    return run_dir


def dead_pid() -> int:
    """The id of a process that has already ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class RecordingAllocator:
    """Hands out host uint8 buffers and remembers each, as torch's pinned allocator would."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []

    def __call__(self, nbytes: int) -> torch.Tensor:
        self.buffers.append(torch.empty(nbytes, dtype=torch.uint8))
        return self.buffers[-1]

    def owns(self, tensor: torch.Tensor) -> bool:
        last = self.buffers[-1]
        start, end = last.data_ptr(), last.data_ptr() + last.numel()
        size = tensor.numel() * tensor.element_size()
        return start <= tensor.data_ptr() and tensor.data_ptr() + size <= end


def make_logits(n: int, vocab: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    return (3 * torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed))).to(dtype)


def make_tokens(n: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))
