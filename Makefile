# stagelab: `make run` sets up .venv and runs the quick profile; `make test` runs the tests.
# scripts/setup_venv.py installs torch that fits the machine (the CPU build without an NVIDIA
# GPU), then stagelab with uv (pip where uv cannot be had). `make run` installs only what a
# headless run needs; `make lab` and `make test` add their extras, one stamp per extra.
PYTHON ?= python3
VENV ?= .venv
PROFILE ?= quick
# The wheel index torch comes from, for a driver older than PyPI's CUDA build needs, e.g.
# `make clean setup TORCH_INDEX=https://download.pytorch.org/whl/cu126` (README: own GPU).
TORCH_INDEX ?=
# Extra options for JupyterLab, e.g. LAB_ARGS='--no-browser --ServerApp.port=8899'.
LAB_ARGS ?=
SETUP := $(PYTHON) scripts/setup_venv.py --venv '$(VENV)' $(if $(TORCH_INDEX),--torch-index '$(TORCH_INDEX)')
PY := $(VENV)/bin/python
# JupyterLab refuses to start as root without this flag (containers, CI).
ALLOW_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: help setup run test check lab browser clean

# pytest-xdist: the tests on every core (`-n auto`; a worker that runs out takes another's
# queued tests); the tests marked `serial` (they cannot share the machine: docs/developing.md)
# run after, alone. PYTEST_ARGS passes options to both passes.
PYTEST_ARGS ?=
PYTEST_PARALLEL := -n auto --dist worksteal
# the serial pass collects only the modules that mark a test serial (collecting all costs seconds)
SERIAL_TESTS = $(shell grep -l 'pytest.mark.serial' tests/test_*.py)
TIMINGS := docs/timings.md

# `make help` lists every target with the words after its `##` (this list reads the Makefile
# itself) and, for the targets in TIMED, the time docs/timings.md gives (written by
# scripts/bench_fresh_clone.py, with its date and machine), or that none was measured.
TIMED := setup run check test
help: ## list the targets
	@awk -v timings='$(TIMINGS)' -v timed=' $(TIMED) ' \
	  'FILENAME == timings { if ($$0 ~ /^\| `make [a-z]+` \|/) { split($$0, f, "|"); t = f[2]; \
	      sub(/^ *`make /, "", t); sub(/` *$$/, "", t); w = f[3]; gsub(/^ +| +$$/, "", w); took[t] = w }; next } \
	   /^[a-z]+:.*## / { name = $$0; sub(/:.*/, "", name); words = $$0; sub(/^[^#]*## /, "", words); \
	     if ((name in took) && index(timed, " " name " ")) words = words " (" took[name] ": " timings ")"; \
	     else if (index(timed, " " name " ")) words = words " (no time measured yet: " timings ")"; \
	     printf "%-10s%s\n", name, words }' $(wildcard $(TIMINGS)) $(firstword $(MAKEFILE_LIST))

$(VENV)/.installed: pyproject.toml scripts/setup_venv.py
	$(SETUP)
	@touch $@

# An extra of pyproject.toml on top of the headless set-up: $(VENV)/.extra-NAME installs NAME.
$(VENV)/.extra-%: $(VENV)/.installed
	$(SETUP) --extra $*
	@touch $@

setup: $(VENV)/.installed ## make .venv with torch for this machine (TORCH_INDEX=URL: from that index) and stagelab, nothing run

run: setup ## set up, then run the quick profile (PROFILE=name for another) and print the report
	$(VENV)/bin/stagelab run --profile $(PROFILE)

# The report test drives a real browser: Debian's chromium, installed here when missing.
browser: ## install Debian's chromium where missing (the browser tests need it)
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo 'warning: chromium could not be installed; the browser test will say so'

# The Lab extra too: tests/test_lab_browser.py runs every notebook in JupyterLab; and the fleet
# extra (Ray): tests/test_fleet.py runs a Ray cluster on this machine's loopback address. The
# linter (ruff, configured in pyproject.toml) runs first.
test: $(VENV)/.extra-lab $(VENV)/.extra-test $(VENV)/.extra-fleet browser ## lint, types, then every test
	$(PY) -m ruff check
	$(PY) -m mypy
	$(PY) -m pytest -m "not serial" $(PYTEST_PARALLEL) $(PYTEST_ARGS)
	$(PY) -m pytest -m "serial" $(PYTEST_ARGS) $(SERIAL_TESTS) || test $$? -eq 5  # 5: none selected

# The fast lane, before every commit: lint, types, and the tests not marked slow (no notebook,
# browser or Ray cluster), on every core.
check: $(VENV)/.extra-test ## lint, types and the fast tests, on every core
	$(PY) -m ruff check
	$(PY) -m mypy
	$(PY) -m pytest -q -m "not slow and not serial" -p no:cacheprovider $(PYTEST_PARALLEL) $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "not slow and serial" -p no:cacheprovider $(PYTEST_ARGS) $(SERIAL_TESTS) || test $$? -eq 5

lab: $(VENV)/.extra-lab ## JupyterLab on notebooks/ with the project's kernel (LAB_ARGS passes options)
	JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	  $(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ALLOW_ROOT) \
	  --LabApp.app_settings_dir='$(CURDIR)/jupyter/lab' $(LAB_ARGS)

clean: ## remove .venv
	rm -rf $(VENV)
