# stagelab: `make run` sets up .venv and runs the quick profile; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PROFILE ?= quick
# torch: on an NVIDIA machine PyPI's default (CUDA) build; elsewhere the CPU build 2.13.0.
TORCH_SPEC ?= $(shell if nvidia-smi -L >/dev/null 2>&1; then echo 'torch>=2.4'; else echo 'torch==2.13.0'; fi)
# Offline GPU nodes: `make run OFFLINE_WHEELS=wheelhouse PROFILE=full` installs from a bundle made
# by `make wheelhouse` and reuses the packages of $(PYTHON), above all its preinstalled torch.
OFFLINE_WHEELS ?=
PY := $(VENV)/bin/python

# `make gpu-evidence` on an offline GPU node: check the bundle, install, preflight, the gate
# profile, keep the run (scripts/gpu_evidence.py). FORCE=1 goes on past a no-go preflight.
GATE_PROFILE ?= gate
GPU_WHEELS ?=
FORCE ?=
# What the H200 node's image already has (see the README): left out of its bundle.
NODE_HAS ?= numpy pandas scipy pyarrow matplotlib seaborn tqdm nvidia-ml-py pyyaml

.PHONY: setup run test lab wheelhouse gpu-wheelhouse gpu-evidence browser clean

# Offline, scripts/gpu_evidence.py checks the wheelhouse, then installs from it alone into a venv
# that reuses $(PYTHON)'s packages and torch (through a .pth file, which also works where $(PYTHON)
# is itself a virtual environment).
$(VENV)/.installed: pyproject.toml
ifdef OFFLINE_WHEELS
	$(PYTHON) scripts/gpu_evidence.py --install-only --python '$(PYTHON)' --venv '$(VENV)' \
	  --wheelhouse '$(OFFLINE_WHEELS)'
else
	$(PYTHON) -m venv $(VENV)
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q '$(TORCH_SPEC)'
	$(PY) -m pip install -q -e '.[lab,test]'
	$(PY) -m ipykernel install --sys-prefix --name stagelab --display-name 'Python (stagelab)' >/dev/null
endif
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/stagelab run --profile $(PROFILE)

# The report test drives a real browser: Debian's chromium, installed here when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo 'warning: chromium could not be installed; the browser test will say so'

# The linter first (ruff, configured in pyproject.toml), then the tests.
test: setup browser
	$(PY) -m ruff check
	$(PY) -m pytest

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

# Wheels for an offline GPU node (Python 3.12, x86_64, torch preinstalled); see the README.
wheelhouse:
	$(PYTHON) scripts/build_wheelhouse.py --dest wheelhouse

# The smaller bundle for the H200 node (.whl/, git-ignored, carried with the repository).
gpu-wheelhouse:
	$(PYTHON) scripts/build_wheelhouse.py --dest .whl $(addprefix --skip ,$(NODE_HAS))

gpu-evidence:
	$(PYTHON) scripts/gpu_evidence.py --python '$(PYTHON)' --venv '$(VENV)' \
	  --profile '$(GATE_PROFILE)' $(if $(GPU_WHEELS),--wheelhouse '$(GPU_WHEELS)') \
	  $(if $(FORCE),--go-on-no-go)

clean:
	rm -rf $(VENV)
