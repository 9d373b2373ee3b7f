"""The floors of lib/stagelab, declared once here and enforced by reading every module's imports.

A module imports only from its own floor or below (anywhere in its file, lazy imports included),
with no import cycle; the analyse and present floors never import the measuring floor, so the
verdict, the report and ``stagelab compare`` never load torch; torch is imported on the measuring
floor only; the ground and measuring floors, and ``stagelab measure``, load no pandas, YAML
or papermill, so that a node measures with torch and the standard library alone (the frame
functions of ``schema`` import pandas lazily, never called there). A module without a floor
fails: a new module is placed here.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from stagelab import paths

PACKAGE = paths.REPO_ROOT / "lib" / "stagelab"

FLOORS: dict[str, tuple[str, ...]] = {
    # names, files and the row schema: the standard library only
    "ground": ("errors", "paths", "catalogue", "records", "schema", "rundir", "design", "stops"),
    # torch: the measuring code, importable with torch and the standard library alone
    "measure": ("device", "shapes", "bench", "memory", "native", "logprobs", "hardware", "sweep",
                "staging", "step", "prompt_logprobs", "testing", "busy", "preflight", "estimate"),
    # torch-free analysis of tidy tables: comparisons, the decision, the verdict
    "analyse": ("stats", "calibration", "analysis", "trust", "verdict"),
    # torch-free presentation of a run: figures, pages, kept evidence
    "present": ("machine", "tables", "plots", "report", "compare", "evidence"),
    # the run: its plan and checks, notebooks' context, the runner and the command line
    "run": ("params", "profiles", "measure", "replay", "context", "execute", "fleet_node", "fleet",
            "cli", "__main__"),
}
ORDER = tuple(FLOORS)
TORCH_FREE = ("analyse", "present")
FLOOR_OF = {module: floor for floor, modules in FLOORS.items() for module in modules}


def _package_modules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}


def _imports(module: str) -> tuple[set[str], set[str]]:
    """The stagelab modules and the top-level outside packages one module imports, anywhere."""
    ours, theirs = set(), set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "stagelab":
                theirs.add(parts[0])
            elif len(parts) > 1:
                ours.add(parts[1])
            else:
                ours.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                (ours.add(parts[1]) if parts[0] == "stagelab" and len(parts) > 1
                 else theirs.add(parts[0]))
    return ours & _package_modules() - {module}, theirs


def test_every_module_has_one_floor():
    declared = [m for modules in FLOORS.values() for m in modules]
    assert len(declared) == len(set(declared)), "a module is declared on two floors"
    assert set(declared) == _package_modules(), (
        f"undeclared: {sorted(_package_modules() - set(declared))}; "
        f"declared but absent: {sorted(set(declared) - _package_modules())}")


@pytest.mark.parametrize("module", sorted(FLOOR_OF))
def test_a_module_imports_nothing_above_its_floor(module):
    floor = ORDER.index(FLOOR_OF[module])
    ours, _ = _imports(module)
    above = {m: FLOOR_OF[m] for m in ours if ORDER.index(FLOOR_OF[m]) > floor}
    assert not above, f"{module} ({FLOOR_OF[module]}) imports from above: {above}"
    if FLOOR_OF[module] in TORCH_FREE:
        measuring = sorted(m for m in ours if FLOOR_OF[m] == "measure")
        assert not measuring, f"{module} ({FLOOR_OF[module]}) imports the measuring floor: {measuring}"


@pytest.mark.parametrize("module", sorted(FLOOR_OF))
def test_torch_only_on_the_measuring_floor_which_never_imports_pandas(module):
    _, theirs = _imports(module)
    if FLOOR_OF[module] != "measure":
        assert "torch" not in theirs, f"{module} ({FLOOR_OF[module]}) imports torch"
    else:  # not even lazily (schema's frame functions, on the ground floor, may)
        assert "pandas" not in theirs, f"{module} (measure) imports pandas"


def test_the_package_has_no_import_cycle():
    graph = {m: _imports(m)[0] for m in _package_modules()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in sorted(graph[module]):
                visit(imported, (*path, module))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())


def _loaded_after_importing(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` a fresh interpreter has loaded after importing ``modules``."""
    code = (f"import sys\nfor m in {modules!r}: __import__('stagelab.' + m)\n"
            f"print(' '.join(w for w in {watched!r} if w in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_torch_free_floors_load_no_torch_in_a_fresh_interpreter():
    modules = [m for floor in TORCH_FREE for m in FLOORS[floor]] + ["catalogue", "params", "profiles"]
    # pandas is watched too: it is loaded, which shows the check sees what an import pulls in
    assert _loaded_after_importing(modules, ("torch", "pandas")) == ["pandas"]


def test_the_measuring_floor_loads_no_notebook_stack_in_a_fresh_interpreter():
    modules = [m for floor in ("ground", "measure") for m in FLOORS[floor]] + ["measure", "cli"]
    # not tqdm: torch itself loads it where it is installed (tests/test_measure.py refuses it)
    watched = ("pandas", "yaml", "papermill", "nbformat", "scipy", "matplotlib", "torch")
    assert _loaded_after_importing(modules, watched) == ["torch"]
