"""The floors of lib/stagelab are its folders, and this test enforces them by reading every
module's imports.

``core``, ``measure``, ``analyse``, ``present`` and ``run``, in that order; only ``__init__``,
``__main__`` and ``cli`` sit at the top, above every floor. A module imports only from its own
floor or below (anywhere in its file, lazy imports included), with no import cycle; the analyse and
present floors never import the measuring floor, so the verdict, the report and ``stagelab
compare`` never load torch; torch is imported on the measuring floor only; the core and measuring
floors, and ``stagelab measure``, load no pandas, YAML or papermill, so that a node measures with
torch and the standard library alone (the frame functions of ``schema`` import pandas lazily,
never called there). A floor's ``__init__`` imports nothing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from stagelab.core import paths

PACKAGE = paths.REPO_ROOT / "lib" / "stagelab"
ORDER = ("core", "measure", "analyse", "present", "run", "top")
TOP = ("__init__", "__main__", "cli")
TORCH_FREE = ("analyse", "present")


def _modules(package: Path = PACKAGE) -> dict[str, str]:
    """Every module of the package, dotted under ``stagelab``, with its floor (its folder)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        floor = "top" if len(parts) == 1 else parts[0]
        found[".".join(parts)] = floor
    return found


MODULES = _modules()


def _imports(module: str, package: Path = PACKAGE) -> tuple[set[str], set[str]]:
    """The stagelab modules (dotted under ``stagelab``) and the top-level outside packages one
    module imports, anywhere in its file."""
    known = _modules(package)
    source = (package / (module.replace(".", "/") + ".py")).read_text()
    ours, theirs = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "stagelab":
                theirs.add(parts[0])
                continue
            base = ".".join(parts[1:])
            for alias in node.names:
                dotted = f"{base}.{alias.name}" if base else alias.name
                ours.add(dotted if dotted in known else base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                (ours.add(".".join(parts[1:])) if parts[0] == "stagelab" and len(parts) > 1
                 else theirs.add(parts[0]))
    return {m for m in ours if m in known} - {module}, theirs


def loose_modules(package: Path = PACKAGE) -> list[str]:
    """Modules outside every floor folder, other than the few that belong at the top."""
    return sorted(m for m, floor in _modules(package).items() if floor == "top" and m not in TOP)


def upward_imports(module: str, package: Path = PACKAGE) -> dict[str, str]:
    """What ``module`` imports from a floor above its own (or, on a torch-free floor, from the
    measuring floor), with that floor."""
    floors = _modules(package)
    own = floors[module]
    ours, _ = _imports(module, package)
    return {m: floors[m] for m in ours
            if ORDER.index(floors[m]) > ORDER.index(own)
            or (own in TORCH_FREE and floors[m] == "measure")}


def test_every_module_lives_in_a_floor_folder():
    assert not loose_modules(), (
        f"modules outside a floor folder: {loose_modules()} (place each in one of {ORDER[:-1]})")
    strangers = sorted(set(MODULES.values()) - set(ORDER))
    assert not strangers, f"folders that are not floors: {strangers}"
    assert set(ORDER[:-1]) <= set(MODULES.values()), "a floor folder is missing"


@pytest.mark.parametrize("floor", ORDER[:-1])
def test_a_floor_init_imports_nothing(floor):
    tree = ast.parse((PACKAGE / floor / "__init__.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not imports, f"stagelab.{floor} imports at package level"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_nothing_above_its_floor(module):
    above = upward_imports(module)
    assert not above, f"{module} ({MODULES[module]}) imports from above or from measure: {above}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_torch_only_on_the_measuring_floor_which_never_imports_pandas(module):
    _, theirs = _imports(module)
    if MODULES[module] != "measure":
        assert "torch" not in theirs, f"{module} ({MODULES[module]}) imports torch"
    else:  # not even lazily (schema's frame functions, on the core floor, may)
        assert "pandas" not in theirs, f"{module} (measure) imports pandas"


def test_the_checks_see_a_module_dropped_at_the_top_and_an_upward_import(tmp_path):
    """On a small copy: a module at the top and an import from a floor above are both found."""
    copy = tmp_path / "stagelab"
    for floor in ORDER[:-1]:
        (copy / floor).mkdir(parents=True)
        (copy / floor / "__init__.py").write_text("")
    (copy / "cli.py").write_text("")
    (copy / "loose.py").write_text("")
    (copy / "run" / "fleet.py").write_text("")
    (copy / "measure" / "device.py").write_text("")
    (copy / "core" / "upward.py").write_text("def f():\n    from stagelab.run import fleet\n")
    (copy / "analyse" / "stats.py").write_text("from stagelab.measure.device import x\n")
    assert loose_modules(copy) == ["loose"]
    assert upward_imports("core.upward", copy) == {"run.fleet": "run"}
    assert upward_imports("analyse.stats", copy) == {"measure.device": "measure"}
    assert upward_imports("run.fleet", copy) == {}


def test_the_package_has_no_import_cycle():
    graph = {m: _imports(m)[0] for m in MODULES}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in sorted(graph[module]):
                visit(imported, (*path, module))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())


def _on(*floors: str) -> list[str]:
    return [m for m, f in MODULES.items() if f in floors and not m.endswith("__init__")]


def _loaded_after_importing(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` a fresh interpreter has loaded after importing ``modules``."""
    code = (f"import sys\nfor m in {modules!r}: __import__('stagelab.' + m)\n"
            f"print(' '.join(w for w in {watched!r} if w in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_torch_free_floors_load_no_torch_in_a_fresh_interpreter():
    modules = _on(*TORCH_FREE) + ["core.catalogue", "run.params", "run.profiles"]
    # pandas is watched too: it is loaded, which shows the check sees what an import pulls in
    assert _loaded_after_importing(modules, ("torch", "pandas")) == ["pandas"]


def test_the_measuring_floor_loads_no_notebook_stack_in_a_fresh_interpreter():
    modules = _on("core", "measure") + ["run.measure_command", "cli"]
    # not tqdm: torch itself loads it where it is installed (tests/test_measure.py refuses it)
    watched = ("pandas", "yaml", "papermill", "nbformat", "scipy", "matplotlib", "torch")
    assert _loaded_after_importing(modules, watched) == ["torch"]
