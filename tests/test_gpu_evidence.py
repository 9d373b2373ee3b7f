"""`make gpu-evidence` (scripts/gpu_evidence.py): the wheelhouse check names a missing wheel before
anything is installed, and a CPU rehearsal of the whole sequence in a copy of the repository.

What the rehearsal proves: on a machine without CUDA, from a copy of the repository and with pip
kept off any index, the command checks the wheelhouse, builds a venv that reuses an existing
interpreter's packages (the .pth file), installs stagelab into it offline and editable, runs
preflight (no-go, exit 3), goes on only when told to, runs the real notebooks of a `gate`
profile, keeps the run with its preflight.json under data/reference/, and stamps every phase.
What it does not prove: that the real bundle (.whl/, cp312) completes the H200 node's own
packages (its interpreter here already has them all, so the rehearsal's wheelhouse is empty),
anything about CUDA, or the time the gate profile takes on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\] gpu-evidence (\d)/5 (\w+): ", re.M)
FAKE = "stagelab-fake-dep"
GATE = {  # the real notebooks at tiny sizes
    "00_environment": {},
    "01_d2h_staging": {"models": [1000, 4096], "rows": [2], "rounds": 4, "warmup": 1},
    "02_logprobs_step": {"models": [1000], "rows": [2], "ks": [0, 2], "rounds": 3},
    "03_prompt_logprobs": {"tokens": 97, "vocab": 1000, "hidden": 8, "chunks": [32],
                           "rounds": 2, "dtype": "float32", "measure_memory": False},
    "04_verdict": {"min_samples": 3},
}
PINNED_ARMS = {"pinned_grow_only", "pinned_fresh", "to_cpu_non_blocking"}


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}


def copy_repository(dest: Path) -> Path:
    """The repository without its build outputs, runs and bundles, as it would travel."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "papermill_runs", ".whl", "wheelhouse", "__pycache__", "*.egg-info",
        ".pytest_cache", ".ipynb_checkpoints"))
    return dest


def fake_wheel(folder: Path, name: str = FAKE, version: str = "1.0") -> Path:
    """A minimal pure-Python wheel: enough metadata for pip's resolver."""
    dist = name.replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{dist}/__init__.py", "")
        wheel.writestr(f"{dist}-{version}.dist-info/METADATA",
                       f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{dist}-{version}.dist-info/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                       "Tag: py3-none-any\n")
        wheel.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return path


@pytest.fixture
def scripts_with_extra_dependency(tmp_path: Path) -> Path:
    """scripts/ and a pyproject.toml that also needs a package this interpreter lacks."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "scripts", root / "scripts")
    text = (REPO / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(
        text.replace('dependencies = [\n', f'dependencies = [\n    "{FAKE}>=1.0",\n', 1))
    return root


def test_the_check_names_the_missing_wheel_and_installs_nothing(scripts_with_extra_dependency,
                                                                tmp_path):
    root, wheelhouse = scripts_with_extra_dependency, tmp_path / "wh"
    wheelhouse.mkdir()
    proc = subprocess.run([sys.executable, str(root / "scripts" / "gpu_evidence.py"),
                           "--python", sys.executable, "--wheelhouse", str(wheelhouse),
                           "--venv", str(root / ".venv")],
                          capture_output=True, text=True, env=clean_env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert f"lacks a wheel for {FAKE}>=1.0; nothing was installed" in last
    assert not (root / ".venv").exists()

    fake_wheel(wheelhouse)  # negative control: with that wheel there, nothing is missing
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import gpu_evidence; "
             "print(gpu_evidence.missing_wheel(sys.executable, gpu_evidence.Path(sys.argv[2])))")
    found = subprocess.run([sys.executable, "-c", probe, str(root / "scripts"), str(wheelhouse)],
                           capture_output=True, text=True, env=clean_env(), check=True)
    assert found.stdout.strip() == "None"


def test_no_wheelhouse_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_evidence.py"),
                           "--wheelhouse", str(tmp_path / "absent")],
                          capture_output=True, text=True, env=clean_env())
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines()[-1].endswith(
        "does not exist (build one with `make gpu-wheelhouse` on a machine with an index) "
        "(exit status 2)")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="rehearses the no-GPU outcome")
def test_cpu_rehearsal_of_make_gpu_evidence(tmp_path):
    repo = copy_repository(tmp_path / "repo")
    profiles = json.loads((repo / "profiles.json").read_text())
    profiles["profiles"]["gate"] = {"description": "rehearsal", "notebooks": GATE}
    (repo / "profiles.json").write_text(json.dumps(profiles))
    wheelhouse = tmp_path / "wh"
    wheelhouse.mkdir()
    make = ["make", "-C", str(repo), "gpu-evidence", f"PYTHON={sys.executable}",
            f"GPU_WHEELS={wheelhouse}"]

    forced = subprocess.run([*make, "FORCE=1"], capture_output=True, text=True, env=clean_env(),
                            timeout=600)
    assert forced.returncode == 0, forced.stdout[-3000:] + forced.stderr[-3000:]
    phases = [m.group(2) for m in STAMP.finditer(forced.stdout)]
    assert [p for i, p in enumerate(phases) if p not in phases[:i]] == [
        "check", "install", "preflight", "gate", "keep"]
    assert "NO-GO, going on as asked" in forced.stdout

    kept = sorted((repo / "data" / "reference" / "cpu").glob("*_gate"))
    assert len(kept) == 1 and f"evidence kept in {kept[0]}" in forced.stdout
    assert (repo / ".venv" / "bin" / "stagelab").exists()
    manifest = json.loads((kept[0] / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["profile"] == "gate"
    assert manifest["git"] and manifest["notebooks"][1]["parameters"]["rounds"] == 4
    saved = json.loads((kept[0] / "preflight.json").read_text())
    assert saved["decision"] == "no-go" and saved["profile"] == "gate"
    staging = pd.read_parquet(kept[0] / "data" / "staging.parquet")
    pinned = staging[staging["arm"].isin(PINNED_ARMS)]
    assert set(pinned["arm"]) == PINNED_ARMS and set(pinned["status"]) == {"unavailable"}
    assert (staging[staging["arm"] == "pageable_fresh"]["status"] == "ok").all()

    runs_before = sorted((repo / "papermill_runs").glob("*/manifest.json"))
    stopped = subprocess.run(make, capture_output=True, text=True, env=clean_env(), timeout=300)
    assert stopped.returncode != 0  # make reports the script's exit status 3 as its own failure
    assert "preflight says NO-GO" in stopped.stdout and "(exit status 3)" in stopped.stdout
    assert sorted((repo / "papermill_runs").glob("*/manifest.json")) == runs_before
