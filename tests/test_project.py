"""Project rules: notebooks committed clean with parameters; environment.yml agrees with pyproject."""

from __future__ import annotations

import ast
import re
import tomllib

import nbformat
import pytest
import yaml

from stagelab.core import paths
from stagelab.run import execute, profiles

NOTEBOOKS = sorted(paths.NOTEBOOKS_DIR.glob("*.ipynb"))
CONDA_NAMES = {"torch": "pytorch", "ray[default]": "ray-default"}


def _split(requirement: str) -> tuple[str, str]:
    # a name with its extras, e.g. ray[default], then the version
    pattern = r"^\s*([A-Za-z0-9_.\-]+(?:\[[^\]]*\])?)\s*(.*)$"
    name, spec = re.match(pattern, requirement).groups()
    return name.lower(), spec.replace(" ", "")


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:1] == ["00_environment.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs_and_has_parameters(path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "strip the outputs"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    assert "run_dir" in profiles.notebook_parameters(path)
    assert nb.metadata.kernelspec.name == execute.KERNEL_NAME


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_papermill_reads_every_parameter_the_suite_reads(path, capsys):
    # Before: a help comment holding "name: text" made papermill skip `delta` with a warning in
    # every run; papermill and the suite's own reader must see the same parameters.
    from papermill.translators import PythonTranslator

    cell = next(c for c in nbformat.read(str(path), as_version=4).cells
                if "parameters" in c.metadata.get("tags", []))
    seen = [parameter.name for parameter in PythonTranslator.inspect(cell)]
    assert seen == list(profiles.notebook_parameters(path))
    assert "Unable to parse" not in capsys.readouterr().out


def test_every_profile_names_existing_notebooks_with_valid_parameters():
    for profile in profiles.load_profiles():
        plan = profiles.plan_run(profile)
        assert plan.notebooks and plan.notebooks[0].name == "00_environment"


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = [_split(r) for r in project["dependencies"]]
    wanted += [_split(r) for extra in project["optional-dependencies"].values() for r in extra]
    env = yaml.safe_load((paths.REPO_ROOT / "environment.yml").read_text())
    conda = dict(_split(d) for d in env["dependencies"] if isinstance(d, str))
    pip_part = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert conda.pop("python") == project["requires-python"]
    conda.pop("pip")
    expected = {CONDA_NAMES.get(name, name): spec for name, spec in wanted}
    assert conda == expected
    extras = ",".join(sorted(project["optional-dependencies"]))
    assert pip_part == [f"-e .[{extras}]"]


LOGIC = (ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
         ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.Try)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_holds_calls_not_logic(path):
    """Loops, functions and comprehensions belong in lib/stagelab, where tests reach them."""
    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            found = [type(node).__name__ for node in ast.walk(ast.parse(cell.source))
                     if isinstance(node, LOGIC)]
            assert not found, f"{path.name}: {found} in a code cell:\n{cell.source}"


def _shown_without_raw_output(node: ast.expr) -> bool:
    """Whether an expression a cell shows is one a reader can take in: a table through
    ``tables.show`` (or ``tables.sections``, several under titles), a styled table
    (``.style...``), Markdown, or a call that shows nothing."""
    if not isinstance(node, ast.Call):
        return False
    name = ast.unparse(node.func)
    if name == "display":
        return all(_shown_without_raw_output(arg) for arg in node.args)
    return (name in ("tables.show", "tables.show_folded", "tables.sections", "Markdown",
                     "ctx.save_figure")
            or ".style." in f"{name}." or name.startswith("plt."))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_show_tables_with_units_and_no_bare_reprs(path):
    """Before: raw pandas frames and bare PosixPath(...) lines in every exported notebook."""
    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code" or "parameters" in cell.metadata.get("tags", []):
            continue
        body = ast.parse(cell.source).body
        shown = [stmt.value for stmt in body if isinstance(stmt, ast.Expr)
                 and (stmt is body[-1] or ast.unparse(stmt.value).startswith("display("))]
        raw = [ast.unparse(node) for node in shown if not _shown_without_raw_output(node)]
        assert not raw, f"{path.name}: shown raw: {raw}"


def test_notebook_02_opens_with_the_decisive_comparison_in_at_most_150_words():
    nb = nbformat.read(str(paths.NOTEBOOKS_DIR / "02_logprobs_step.ipynb"), as_version=4)
    title, first, *_ = nb.cells[0].source.split("\n\n")
    assert len(nb.cells[0].source.replace("#", "").split()) <= 150
    assert first.startswith("**The decisive comparison:**") and "`seed_pinned`" in first


def test_test_modules_share_helpers_through_conftest_not_one_another():
    tests = sorted((paths.REPO_ROOT / "tests").glob("test_*.py"))
    for path in tests:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n.startswith("test_") for n in names), (
                f"{path.name} imports {names}: move what it shares into tests/conftest.py")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_heading_has_its_output_under_it(path):
    """Before: notebook 02's "same answer" heading was followed by another heading, its table
    shown two sections later."""
    cells = nbformat.read(str(path), as_version=4).cells
    for index, cell in enumerate(cells):
        headed = cell.cell_type == "markdown" and any(
            line.startswith("#") for line in cell.source.splitlines())
        if headed:
            following = cells[index + 1].cell_type if index + 1 < len(cells) else "nothing"
            assert following == "code", (
                f"{path.name} cell {index} ({cell.source.splitlines()[0]!r}) is followed by "
                f"{following}, not the code that shows it")


def test_notebook_02_shows_the_decisive_ab_before_the_decomposition():
    nb = nbformat.read(str(paths.NOTEBOOKS_DIR / "02_logprobs_step.ipynb"), as_version=4)
    headings = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown"]
    decisive = next(i for i, h in enumerate(headings) if h.startswith("## The decisive A/B"))
    split = next(i for i, h in enumerate(headings) if h.startswith("## Where the step's time"))
    assert decisive < split


def test_notebook_01_says_the_speedup_is_a_ratio_of_means_as_computed():
    """Before: the prose said "median of per-round ratios"; timings.compare takes the ratio of
    mean times over paired rounds (paired.paired_speedup)."""
    text = " ".join(c.source for c in nbformat.read(
        str(paths.NOTEBOOKS_DIR / "01_d2h_staging.ipynb"), as_version=4).cells
        if c.cell_type == "markdown")
    assert "median of per-round ratios" not in text and "median difference" not in text
    assert "ratio of mean copy times over paired rounds" in " ".join(text.split())


def test_the_readme_stays_short_and_links_the_docs():
    """The README says the question, its words, the commands; the rest lives in docs/."""
    readme = (paths.REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 180
    for doc in ("method", "decision-rule", "gpu-nodes-and-fleet", "gpu-lease", "developing",
                "timings", "security", "reading-the-report", "prediction"):
        assert f"(docs/{doc}.md" in readme, doc
    image = re.search(r"!\[[^\]]+\]\((docs/img/[^)]+\.png)\)", readme)
    assert image and (paths.REPO_ROOT / image.group(1)).is_file()


def test_notebook_defaults_answer_in_seconds_and_the_profiles_keep_their_full_sizes():
    """Before: notebook 03's defaults were 8,193 tokens at a 152k vocabulary (minutes and 18 GiB
    when run by hand in the Lab). The defaults are now the quick profile's sizes, and every profile
    that relied on an old default lists it, so that gate and full still measure what they did."""
    quick = profiles.profile_parameters("quick")
    for name, given in profiles.load_profiles()["quick"]["notebooks"].items():
        defaults = profiles.notebook_parameters(paths.NOTEBOOKS_DIR / f"{name}.ipynb")
        assert {key: defaults[key] for key in given} == given, name
        assert quick[name] == defaults | given
    full, gate = profiles.profile_parameters("full"), profiles.profile_parameters("gate")
    assert (full["03_prompt_logprobs"]["tokens"], full["03_prompt_logprobs"]["hidden"],
            full["03_prompt_logprobs"]["dtype"]) == (8193, 0, "bfloat16")
    assert full["03_prompt_logprobs"]["chunks"] == [256, 512, 1024, 2048, 4096]
    assert full["02_logprobs_step"]["max_rounds"] == 400
    assert full["04_verdict"]["decisive_rows"] == [16, 64, 256]
    assert full["04_verdict"]["calibration_trials"] == 200
    for profile in (full, gate):
        assert profile["05_prediction"]["decisive_models"] == ["Qwen2.5-7B", "Gemma-3-4B"]
        assert profile["04_verdict"]["decisive_models"] == ["Qwen2.5-7B", "Gemma-3-4B"]
    assert gate["05_prediction"]["decisive_rows"] == gate["04_verdict"]["decisive_rows"]


MAX_PARAMETERS = 10
# The functions allowed more: the Triton kernels (a kernel's arguments are its pointers,
# strides and compile-time constants, which cannot travel as one object). A new one fails.
MANY_PARAMETERS = {
    ("measure/onepass_triton.py", "onepass_kernel"),
    ("measure/onepass_triton.py", "fold_kernel"),
    ("measure/onepass_triton.py", "finish_kernel"),
}


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's parameters, ``self``/``cls`` and ``*args``/``**kwargs`` counted, self not."""
    given = function.args
    names = [*given.posonlyargs, *given.args, *given.kwonlyargs]
    bound = bool(names) and names[0].arg in ("self", "cls")
    return len(names) - bound + bool(given.vararg) + bool(given.kwarg)


def test_no_public_function_of_the_library_takes_more_than_ten_parameters():
    """Settings travel as one frozen value (a sweep's spec, the rule) rather than one parameter
    each (issue 47): a public function (or method) over ten is a sweep's settings gone loose."""
    library = paths.REPO_ROOT / "lib" / "stagelab"
    found = set()
    for path in sorted(library.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not node.name.startswith("_") and _parameters(node) > MAX_PARAMETERS):
                found.add((path.relative_to(library).as_posix(), node.name))
    assert found <= MANY_PARAMETERS, sorted(found - MANY_PARAMETERS)
    assert ("measure/onepass_triton.py", "onepass_kernel") in found  # the count sees a kernel
    assert found == MANY_PARAMETERS, "remove the allowance of a function that now fits"


def test_the_parameter_count_counts_what_a_caller_passes():
    (plain, method, loose) = ast.parse(
        "def f(a, /, b, *c, d, **e): pass\n"
        "class K:\n def m(self, a, b): pass\n"
        "def g(*args, **kwargs): pass\n").body
    assert _parameters(plain) == 5 and _parameters(loose) == 2
    assert _parameters(method.body[0]) == 2
