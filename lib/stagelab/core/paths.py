"""Where the repository's inputs live; the package is installed editable from ``lib/``."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
DATA_DIR = REPO_ROOT / "data"
REFERENCE_DIR = DATA_DIR / "reference"
RUNS_DIR = REPO_ROOT / "papermill_runs"
PROFILES_FILE = REPO_ROOT / "profiles.json"
MODEL_SHAPES_FILE = DATA_DIR / "model_shapes.csv"
PLATFORMS_FILE = DATA_DIR / "platforms.csv"  # GPU platforms: link and memory figures, sourced
HOSTS_FILE = DATA_DIR / "hosts.csv"  # host classes: the host-side rates of each GPU's usual host
# In a run folder: host rates measured before the run, in another process (the model's
# out-of-sample input; stagelab.measure.priorrates).
HOST_PRIOR_ROWS = Path("data") / "host_prior.jsonl"
# Set by the runner for the kernels it starts: progress as one line per finished cell, no bars.
HEADLESS_ENV = "STAGELAB_HEADLESS"


def given(text: str) -> Path:
    """A path from the command line, made absolute once, where it is given: every folder a
    command passes on (to a notebook that runs in ``notebooks/``, to a child process) then
    names the same place. Links are not followed (the readers refuse them)."""
    return Path(os.path.abspath(text))
