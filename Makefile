# stagelab: `make run` sets up .venv and runs the quick profile; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PROFILE ?= quick
# torch: on an NVIDIA machine PyPI's default (CUDA) build; elsewhere the CPU build 2.13.0.
TORCH_SPEC ?= $(shell if nvidia-smi -L >/dev/null 2>&1; then echo 'torch>=2.4'; else echo 'torch==2.13.0'; fi)
# Offline GPU nodes: `make run OFFLINE_WHEELS=wheelhouse PROFILE=full` installs from a bundle made
# by `make wheelhouse` and reuses the packages of $(PYTHON), above all its preinstalled torch
# (through a .pth file, which also works where $(PYTHON) is itself a virtual environment).
OFFLINE_WHEELS ?=
EXTRAS ?= $(if $(OFFLINE_WHEELS),,lab,test)
PACKAGE := .$(if $(EXTRAS),[$(EXTRAS)],)
PIP_FLAGS := $(if $(OFFLINE_WHEELS),--no-index --find-links $(OFFLINE_WHEELS),)
PY := $(VENV)/bin/python

.PHONY: setup run test lab wheelhouse browser clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(if $(OFFLINE_WHEELS),$(PYTHON) -c 'import site; print(*site.getsitepackages(), sep="\n")' \
	  > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/inherited-site.pth")
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q $(PIP_FLAGS) '$(TORCH_SPEC)'
	$(PY) -m pip install -q $(PIP_FLAGS) -e '$(PACKAGE)'
	$(PY) -m ipykernel install --sys-prefix --name stagelab --display-name 'Python (stagelab)' >/dev/null
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/stagelab run --profile $(PROFILE)

# The report test drives a real browser: Debian's chromium, installed here when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo 'warning: chromium could not be installed; the browser test will say so'

test: setup browser
	$(PY) -m pytest

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

# Wheels for an offline GPU node (Python 3.12, x86_64, torch preinstalled); see the README.
wheelhouse:
	$(PYTHON) scripts/build_wheelhouse.py --dest wheelhouse

clean:
	rm -rf $(VENV)
