"""One binding from notebook to experiment (stagelab.measure.experiments): its cells are the
notebook's own, the estimate costs an arm by its catalogue entry, and no arm or notebook name,
nor the verdict's file name, is spelled outside the one module that owns it."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from stagelab.core import catalogue, outcomes, paths
from stagelab.core import measured as measured_folder
from stagelab.core.errors import UserError
from stagelab.measure import estimate, experiments, forecast, sweep
from stagelab.run import context, profiles

LIB = paths.REPO_ROOT / "lib" / "stagelab"
MEASURING = [catalogue.notebook_of(e).name for e in catalogue.EXPERIMENTS]


class _Stop(Exception):
    """Stops a notebook's code, or a sweep, once what the test needs is captured."""


class _FakeContext:
    """Stands in for the notebook's run context: captures the measuring call, measures nothing."""

    def __init__(self) -> None:
        self.call = None

    def snapshot(self, measured, under_load=False):
        return {}

    def sweep_frame(self, table, measured, measure, *args, **kwargs):
        self.call = (table, measure, args, kwargs)
        raise _Stop


def _code_cells(notebook: str) -> list[dict]:
    cells = json.loads((paths.NOTEBOOKS_DIR / f"{notebook}.ipynb").read_text())["cells"]
    return [c for c in cells if c["cell_type"] == "code"]


def notebook_call(notebook: str, parameters: dict, monkeypatch) -> tuple:
    """The measuring call the notebook's own code makes with ``parameters``."""
    fake = _FakeContext()
    monkeypatch.setattr(context, "notebook_context", lambda name, run_dir: fake)
    source = next("".join(c["source"]) for c in _code_cells(notebook)
                  if "sweep_frame" in "".join(c["source"]))
    with pytest.raises(_Stop):
        exec(compile(source, notebook, "exec"), {**parameters, "run_dir": "", "measured": ""})
    return fake.call


def cells_of_call(call: tuple, monkeypatch) -> list[sweep.Cell]:
    """The cells the measuring function hands to the sweep (nothing is measured)."""
    captured = []

    def capture(cells, prepare, **kwargs):
        captured.extend(cells)
        raise _Stop

    monkeypatch.setattr(sweep, "run", capture)
    _, measure, args, kwargs = call
    with pytest.raises(_Stop):
        measure(*args, device="cpu", **kwargs)
    return captured


@pytest.mark.parametrize("notebook", MEASURING)
def test_the_bindings_cells_are_the_notebooks_own_on_the_smoke_profile(notebook, monkeypatch):
    parameters = profiles.profile_parameters("smoke")[notebook]
    call = notebook_call(notebook, parameters, monkeypatch)
    bound = experiments.of_notebook(notebook)
    assert call[0] == bound.table
    assert call[1] is bound.call(parameters)[0]
    mine = experiments.notebook_cells(notebook, parameters, "cpu")
    theirs = cells_of_call(call, monkeypatch)
    assert [dataclasses.asdict(c) for c in mine] == [dataclasses.asdict(c) for c in theirs]
    assert mine


def test_the_step_binding_has_a_cell_per_place_of_the_log_softmax():
    smoke = profiles.profile_parameters("smoke")[catalogue.notebook_of(catalogue.STEP).name]
    parameters = {**smoke, "conditions": {**smoke["conditions"], "log_softmax": ["device", "host"]}}
    cells = experiments.EXPERIMENTS[catalogue.STEP].cells(parameters, "cpu")
    assert sorted({c.sizes["log_softmax"] for c in cells}) == ["device", "host"]
    assert sorted({c.sizes["overlap_order"] for c in cells}) == ["queued", "waited"]  # smoke's
    assert len(cells) == 2 * 2 * len(parameters["rows"]) * len(parameters["ks"])


def test_notebooks_that_measure_no_arm_have_no_binding_and_no_cells():
    for name in (catalogue.ENVIRONMENT_NOTEBOOK, catalogue.VERDICT_NOTEBOOK, "99_unknown"):
        assert experiments.of_notebook(name) is None
        assert experiments.notebook_cells(name, {}, "cpu") == []
    with pytest.raises(ValueError, match="not a measuring notebook"):
        forecast.cell_predictor(catalogue.ENVIRONMENT_NOTEBOOK, {}, "cpu")


def test_the_measure_command_times_the_tables_the_catalogue_names():
    assert measured_folder.TABLES == {nb: table for table, nb in catalogue.tables().items()}
    assert measured_folder.MEASURING[0] == catalogue.ENVIRONMENT_NOTEBOOK


# ------------------------------------------------------------ the estimate reads the catalogue

def _cell_seconds(experiment: str, arm: str, kind: str) -> float:
    sizes = {"experiment": experiment, "rows": 64, "vocab": 152064, "bytes": 64 * 152064 * 4}
    return estimate.cell_seconds(sizes, [arm], rounds=10, warmup=1, kind=kind)


@pytest.mark.parametrize(("experiment", "like", "changes"), [
    (catalogue.STAGING, "pageable_reused", {}),
    (catalogue.STAGING, "pinned_grow_only", {}),
    (catalogue.STEP, "seed_pageable_numpy", {}),
    (catalogue.STEP, "seed_pinned", {"needs_cuda": False}),
    (catalogue.STEP, "fused", {}),
])
def test_a_new_arm_is_costed_by_its_catalogue_entry_not_its_name(experiment, like, changes,
                                                                 monkeypatch):
    entry = catalogue.arm(experiment, like)
    twin = dataclasses.replace(entry, name="brand_new_arm", role=catalogue.LEVER, **changes)
    monkeypatch.setattr(catalogue, "ARMS", (*catalogue.ARMS, twin))
    for kind in estimate.BASIS:
        assert _cell_seconds(experiment, "brand_new_arm", kind) == _cell_seconds(
            experiment, like, kind)


def test_the_buffer_and_top_k_of_an_entry_change_its_cost(monkeypatch):
    base = catalogue.arm(catalogue.STEP, catalogue.baseline(catalogue.STEP))
    reused = dataclasses.replace(base, name="reused_one", role=catalogue.LEVER,
                                 buffer=catalogue.REUSED)
    numpy = dataclasses.replace(base, name="numpy_one", role=catalogue.LEVER,
                                host_top_k=catalogue.NUMPY_TOP_K_BACKEND)
    monkeypatch.setattr(catalogue, "ARMS", (*catalogue.ARMS, reused, numpy))
    fresh = _cell_seconds(catalogue.STEP, base.name, "cpu")
    assert _cell_seconds(catalogue.STEP, "reused_one", "cpu") < fresh
    assert _cell_seconds(catalogue.STEP, "numpy_one", "cpu") > fresh


def test_every_arm_entry_names_a_known_buffer_and_top_k():
    for entry in catalogue.ARMS:
        assert entry.buffer in (catalogue.FRESH, catalogue.REUSED, catalogue.PINNED)
        assert entry.host_top_k in ("", catalogue.NATIVE_TOP_K, catalogue.NUMPY_TOP_K_BACKEND)
        assert bool(entry.host_top_k) == entry.stages_whole_logprobs


# ----------------------------------------------------------------------- names spelled once

def _code_strings(source: str) -> list[tuple[int, str]]:
    """Every string literal of Python source, docstrings left out (they are prose)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def _arm_owners() -> dict[str, set[str]]:
    """Where an arm's name may be spelled: the catalogue, and the module of its own class."""
    own = {catalogue.STAGING: "measure/staging.py", catalogue.STEP: "measure/step_pipelines.py",
           catalogue.PROMPT: "measure/prompt_logprobs.py"}
    owners: dict[str, set[str]] = {}
    for entry in catalogue.ARMS:
        owners.setdefault(entry.name, {"core/catalogue.py"}).add(own[entry.experiment])
    return owners


def _spelled(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text) is not None


def _python_sources() -> dict[str, str]:
    return {str(p.relative_to(LIB)): p.read_text() for p in sorted(LIB.rglob("*.py"))}


def test_no_arm_name_is_spelled_outside_the_catalogue_and_its_own_class():
    found = []
    for relative, source in _python_sources().items():
        for line, text in _code_strings(source):
            for name, owners in _arm_owners().items():
                # a short word (fused) also reads as prose: only the literal itself counts
                hit = text == name if "_" not in name else _spelled(text, name)
                if hit and relative not in owners:
                    found.append(f"{relative}:{line} spells {name!r}")
    assert not found, "\n".join(found)


def test_no_notebook_name_is_spelled_outside_the_catalogue():
    found = [f"{relative}:{line} spells {name!r}"
             for relative, source in _python_sources().items() if relative != "core/catalogue.py"
             for line, text in _code_strings(source) for name in catalogue.NOTEBOOKS
             if _spelled(text, name)]
    assert not found, "\n".join(found)


def test_notebook_code_spells_no_arm_and_no_other_notebook():
    """Outside its parameters cell (the user's values) a notebook names only itself."""
    found = []
    for notebook in catalogue.NOTEBOOKS:
        for cell in _code_cells(notebook):
            if "parameters" in cell["metadata"].get("tags", []):
                continue
            for line, text in _code_strings("".join(cell["source"])):
                names = [n for n in catalogue.NOTEBOOKS if n != notebook and _spelled(text, n)]
                names += [a.name for a in catalogue.ARMS if text == a.name]
                found += [f"{notebook} line {line} spells {n!r}" for n in names]
    assert not found, "\n".join(found)


def test_the_verdict_file_is_named_in_one_module():
    pattern = re.compile(r"verdict\.json")
    found = [f"{relative}:{line}" for relative, source in _python_sources().items()
             if relative != "core/records.py"
             for line, text in _code_strings(source) if pattern.search(text)]
    for notebook in catalogue.NOTEBOOKS:
        found += [notebook for cell in _code_cells(notebook)
                  for _, text in _code_strings("".join(cell["source"])) if pattern.search(text)]
    assert not found, found


def test_the_name_checks_would_find_a_spelled_name():
    source = 'x = "seed_pinned"\ny = f"see {z}: 02_logprobs_step"\n"""not a docstring here"""\n'
    texts = [text for _, text in _code_strings(source)]
    assert "seed_pinned" in texts and any(_spelled(t, "02_logprobs_step") for t in texts)
    assert _code_strings('def f():\n    """seed_pinned"""\n') == []


# ------------------------------------------------------------------------ one-line errors

def test_a_bad_request_is_one_line_and_exit_2(capsys):
    def bad() -> int:
        raise UserError("--rows: must be positive")

    assert outcomes.one_line_errors("stagelab thing", bad) == outcomes.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == "stagelab thing: error: --rows: must be positive\n"


def test_an_interrupt_is_130_and_a_listed_failure_1(capsys):
    def interrupted() -> int:
        raise KeyboardInterrupt

    def full_disk() -> int:
        raise OSError("No space left on device")

    assert outcomes.one_line_errors("p", interrupted) == outcomes.EXIT_INTERRUPTED
    assert outcomes.one_line_errors("p", full_disk, also=(OSError,)) == outcomes.EXIT_FAILED
    assert capsys.readouterr().err == "p: interrupted\np: error: No space left on device\n"
    with pytest.raises(OSError):
        outcomes.one_line_errors("p", full_disk)


def test_paths_exist_for_the_greps():
    assert (LIB / "core" / "catalogue.py").is_file() and Path(paths.NOTEBOOKS_DIR).is_dir()


def test_the_prompt_estimate_counts_one_memory_probe_per_method_chunk_and_tile():
    """Before the tile sweep a prompt arm was probed once per overlap; a further head_fused tile
    runs with the first overlap alone, and each of its configurations is probed."""
    p = dict(tokens=17, chunks=[4], methods=[catalogue.FUSED, catalogue.HEAD_FUSED],
             overlaps=[True, False], tiles=[16, 32], measure_memory=True)
    prompt = experiments.EXPERIMENTS[catalogue.PROMPT]
    # fused and head_fused's tile 16: 4 configurations each, 2 probed; tile 32: 1, probed
    assert prompt.memory_probes_per_arm(p) == pytest.approx(5 / 9)
    assert prompt.memory_probes_per_arm({**p, "tiles": None}) == pytest.approx(1 / 2)
    assert prompt.memory_probes_per_arm({**p, "measure_memory": False}) == 0.0
