"""Shared fixtures and helpers: tiny notebooks and profiles that exercise the runner in seconds,
hand-made run folders, a recording allocator, seeded logits; test modules import from here, never
from one another."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

from stagelab.core import paths, rundir, schema, stops
from stagelab.core.records import RunFolder
from stagelab.measure import busy
from stagelab.present import report

# ------------------------------------------------------------- both cores (pytest-xdist)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's torch (and every process it starts) uses its share of
    the cores, not all of them: two workers of two threads each on two cores wait on each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    triton_built_for_its_interpreter()


def triton_built_for_its_interpreter() -> None:
    """On a machine without CUDA, import Triton once with ``TRITON_INTERPRET=1`` before any test
    does: Triton builds its own library functions when first imported, and the one-pass
    kernel's interpreter tests skip where they were built compiled. The variable is restored at
    once, so no other test runs the interpreter (the step's one-pass arm still takes its torch
    reference here). Before: under pytest-xdist a worker's first test to import Triton did so
    without the variable, and every interpreter test after it on that worker skipped."""
    import importlib.util

    if torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401  (built for the interpreter, once per process)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


@pytest.fixture(autouse=True)
def no_load_sampler_outlives_its_test() -> Iterator[None]:
    """Error the test that leaves a :class:`~stagelab.measure.busy.LoadWatch` sampler running:
    it reads /proc every few seconds for the rest of the worker's life, inside other tests'
    timed stages and file audits (a test double that skipped ``LoadWatch.__exit__`` did so)."""
    before = set(threading.enumerate())
    yield
    for thread in set(threading.enumerate()) - before:
        if thread.name == busy.SAMPLER_THREAD:
            thread.join(10)
            assert not thread.is_alive(), "a LoadWatch sampler outlived this test"


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], object]) -> Path:
    """``<base>/<name>`` made by ``make(path)`` once per test session, however many pytest-xdist
    workers ask for it (the first makes it under a lock, the others wait and reuse it): a
    module fixture that measures or runs for seconds costs its seconds once, not once per
    worker. Those who use it only read it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if worker else base) / f"made-once-{name}"
    shared.mkdir(exist_ok=True)
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / ".done"
        if not done.exists():
            make(shared / name)
            done.touch()
    return shared / name


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
                   "from stagelab.run import context\n"
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
        "hangs": {"description": "test", "cell_timeout_s": 10,
                  "notebooks": {"30_sleeps": {}, "10_ok": {}}}}}))
    return {"notebooks": nb_dir, "profiles": profiles, "root": tmp_path / "runs"}


def tiny_cli(suite: dict[str, Path], *args: str) -> list[str]:
    """A command line running ``stagelab ARGS`` in a fresh interpreter on the tiny suite."""
    script = ("import sys\nfrom pathlib import Path\nfrom stagelab import cli\nfrom stagelab.core import paths\n"
              f"paths.PROFILES_FILE = Path({str(suite['profiles'])!r})\n"
              f"paths.NOTEBOOKS_DIR = Path({str(suite['notebooks'])!r})\n"
              f"sys.exit(cli.console({list(args)!r}))\n")
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
    "05_prediction": {"decisive_rows": [2], "decisive_models": [1000], "decisive_ks": [2]},
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


def start_sleepy(suite: dict[str, Path],
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """The sleepy profile started in a fresh interpreter, once its sleeping cell runs."""
    command = tiny_cli(suite, "run", "--profile", "sleepy", "--out", str(suite["root"]))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 90
    while time.time() < deadline:  # wait until the sleeping cell runs
        marker = next(suite["root"].glob("*/sleeping"), None) if suite["root"].exists() else None
        if marker:
            return proc, marker.parent
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the sleeping notebook never started: {proc.communicate()}")


GPU = {"gpu": {"name": "NVIDIA H200"}, "host": {"cpu_model": "Xeon"}}


def good_run(root: Path, decision: str = "PORT", hardware: dict | None = None,
             status: str = "ok", verdict: bool = True, pid: int | None = None,
             created: str = "2026-11-30T10:00:00+00:00", notebooks=("10_ok",)) -> Path:
    """A run folder with a manifest (given status and hardware), a verdict and a table."""
    run_dir = fake_run(root, status=status, pid=pid, notebooks=notebooks)
    manifest = rundir.read_manifest(run_dir)
    manifest.update(hardware=hardware or GPU, git={"commit": "abcdef1234567890", "dirty": False},
                    created_utc=created)
    rundir.write_manifest(run_dir, manifest)
    schema.write_table(schema.make_rows([{"experiment": "d2h_copy", "arm": "pageable_fresh",
                                          "seconds": 0.5, "bytes": 10**9, "round": 0}],
                                        run_id=run_dir.name, notebook="01_d2h_staging"),
                       run_dir, "staging")
    if verdict:
        (run_dir / "verdict.json").write_text(json.dumps({"overall": {"decision": decision}}))
    report.write_index(run_dir)
    return run_dir


@pytest.fixture
def verdict_as_recorded(monkeypatch):
    """keep's re-derivation of the verdict (:mod:`stagelab.present.rederive`) answering with
    the run's own verdict.json: for tests of what keep does with runs whose tables are stubs
    (the index, the Results, the locks); the re-derivation itself is tested on real runs."""
    from stagelab.present import rederive

    monkeypatch.setattr(rederive, "rederived_verdict",
                        lambda run_dir, manifest: RunFolder(run_dir).read_verdict())


# Text a page must escape, in the synthetic runs of `stagelab compare`'s tests.
HOSTILE = "<script>alert('x')</script> & co"


def copy_records(copy_seconds: float) -> list[dict]:
    """Three rounds at the largest cell (1 GB per copy), a smaller cell that must not be used, an
    A/A twin that must be left out and a failed row that must be ignored."""
    recs = []
    for r in range(3):
        recs.append(dict(experiment="d2h_copy", arm="pinned_grow_only", rows=64, vocab=152064,
                         round=r, seconds=copy_seconds * (1 + 0.1 * (r - 1)), bytes=10**9))
        recs.append(dict(experiment="d2h_copy", arm="pinned_grow_only~aa", rows=64,
                         vocab=152064, round=r, seconds=copy_seconds / 10, bytes=10**9))
        recs.append(dict(experiment="d2h_copy", arm="pinned_grow_only", rows=16, vocab=152064,
                         round=r, seconds=copy_seconds / 100, bytes=10**9))
    recs.append(dict(experiment="d2h_copy", arm="pinned_grow_only", rows=64, vocab=152064,
                     round=9, seconds=1e-6, bytes=10**9, status="failed", note="boom"))
    return recs


def _decisive_cell(total_ms: float) -> dict:
    return {"rows": 64, "vocab": 152064, "k": 5, "decision": "PORT", "speedup": 1.5,
            "ci_low": 1.4, "ci_high": 1.6, "min_speedup": 1.02, "twin_speedup": 1.0,
            "twin_ci_low": 0.99, "twin_ci_high": 1.01, "saved_ms": 1.0,
            "step_ms": total_ms, "reason": HOSTILE,
            "stages_ms": {"device": total_ms - 4.0, "alloc": 1.0, "copy": 2.0,
                          "host_gather": 0.75, "free": 0.25, "total": total_ms}}


def make_run(root: Path, name: str, *, gpu: str | None = None, link: float | None = None,
             total_ms: float = 10.0, copy_seconds: float = 0.5, verdict: str = "current",
             staging: bool = True) -> Path:
    """A synthetic run folder: manifest (hardware), verdict.json (current, older or none) and
    data/staging.parquet."""
    run = root / name
    run.mkdir(parents=True)
    hardware = {"host": {"cpu_model": f"CPU {HOSTILE}"}, "torch": {"torch": "2.5.1"},
                "gpu": {"name": gpu} if gpu else None,
                "nvml": {"pcie_max_gbps_per_direction": link} if link else None}
    (run / "manifest.json").write_text(json.dumps({"run_id": name, "status": "ok", "notebooks": [],
                                                   "hardware": hardware}))
    prompt = {"recommendation": {"chunk": 512, "arm": "fused+overlap", "reason": "smallest"},
              "peaks": [{"arm": "fused", "chunk": 512, "metric": "peak_device_bytes",
                         "bytes": int(copy_seconds * 8) * 2**20}]}
    if verdict == "current":
        (run / "verdict.json").write_text(json.dumps({
            "overall": {"decision": "PORT"}, "decisive": [_decisive_cell(total_ms)],
            "prompt_logprobs": prompt}))
    elif verdict == "older":
        (run / "verdict.json").write_text(json.dumps({"overall": {"decision": "CLOSE"},
                                                      "cells": [], "prompt_logprobs": None}))
    if staging:
        schema.write_table(schema.make_rows(copy_records(copy_seconds), run_id=name,
                                            notebook="01_d2h_staging"), run, "staging")
    return run


class StoppedInAFinalizer:
    """A stop signal landing inside a finalizer, as it can at the end of a step when the native
    vector's ``__del__`` runs: dropped at once, it raises KeyboardInterrupt in ``__del__``, which
    Python prints and swallows (tests that use it filter pytest's unraisable-exception warning)."""

    def __del__(self) -> None:
        stops._raise(signal.SIGTERM, None)


# ---------------------------------------------------------------- the measuring floor alone

BLOCKED = ("numpy", "pandas", "scipy", "pyarrow", "matplotlib", "seaborn", "yaml", "tqdm",
           "papermill", "nbformat", "nbconvert", "jupyter_client", "ipykernel", "pynvml")
# Runs `python -m stagelab ARGS` with an import system that refuses the notebook stack, and
# says which refused modules were asked for.
BLOCKING_RUNNER = """
import runpy, sys
BLOCKED = set(sys.argv[1].split(","))
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (refused: torch alone)")
        return None
sys.meta_path.insert(0, Refuse())
sys.argv = ["stagelab", *sys.argv[2:]]
runpy.run_module("stagelab", run_name="__main__", alter_sys=True)
"""


def torch_alone(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """``python -m stagelab ARGS`` from the checkout, the notebook stack refused."""
    env = {**os.environ, "PYTHONPATH": str(paths.REPO_ROOT / "lib")}
    return subprocess.run([sys.executable, "-c", BLOCKING_RUNNER, ",".join(BLOCKED), *args],
                          capture_output=True, text=True, cwd=paths.REPO_ROOT, env=env,
                          timeout=600, **kwargs)
