"""`stagelab report RUN_DIR --single-file`: one HTML file that holds the whole report and loads
nothing from elsewhere, proven by a parser and by Chromium with the network cut off."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from conftest import write_notebook
from stagelab import cli
from stagelab.core import rundir
from stagelab.core.errors import UserError
from stagelab.present import report
from stagelab.run import execute, profiles

CHROMIUM = shutil.which("chromium")
# A 1x1 PNG: the smallest figure a run folder can hold.
PIXEL = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9Q"
                         "DwADhQGAWjR9awAAAABJRU5ErkJggg==")
PLOT_BODY = ("import matplotlib.pyplot as plt\nimport pandas as pd\nfrom stagelab.run import context\n"
             "ctx = context.notebook_context('10_plot', run_dir)\n"
             "fig, ax = plt.subplots(figsize=(4, 3))\nax.plot([1, 3, 2])\n"
             "ctx.save_figure(fig, 'line')\nplt.show()\n"
             "pd.DataFrame({'arm': ['a', 'b'], 'ms': [1.5, 2.5]})")


def _synthetic_run(run_dir: Path) -> Path:
    """A run folder as the runner leaves it, with one executed notebook, made without a kernel."""
    (run_dir / "figures").mkdir(parents=True)
    (run_dir / "data").mkdir()
    (run_dir / "figures" / "10_plot_line.png").write_bytes(PIXEL)
    (run_dir / "data" / "staging.parquet").write_bytes(b"not read here")
    nb = new_notebook(cells=[
        new_markdown_cell("# 10 plot\n\nSee [the docs](https://example.org/docs)."),
        new_code_cell("x", execution_count=1, outputs=[
            new_output("stream", name="stdout", text="printed line\n"),
            new_output("display_data", data={"image/png": base64.b64encode(PIXEL).decode()})])])
    nbformat.write(nb, str(run_dir / "10_plot.ipynb"))
    manifest = {"run_id": run_dir.name, "profile": "tiny", "status": "ok", "hardware": None,
                "notebooks": [{"name": "10_plot", "status": "ok", "output": "10_plot.ipynb",
                               "html": "10_plot.html", "duration_s": 1.0, "error": None},
                              {"name": "20_missing", "status": "pending",
                               "output": "20_missing.ipynb", "html": "20_missing.html"}]}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "10_plot.html").write_text("<html></html>")
    return run_dir


def test_external_references_names_everything_that_would_leave_the_file():
    page = """<html><head><link rel="stylesheet" href="https://cdn.example/x.css">
      <script src="http://cdn.example/require.js"></script>
      <style>@font-face{src:url('https://fonts.example/a.woff2')} @import "theme.css";
      .ok{background:url(data:image/png;base64,AAAA)}</style></head>
      <body><img src="http://example.org/plot.png"><img src="data:image/png;base64,AAAA">
      <img srcset="figures/a.png 1x, data:image/png;base64,AAAA 2x">
      <a href="#verdict">ok</a><a href="manifest.json">file</a>
      <div style="background-image:url(figures/b.png)"></div></body></html>"""
    assert report.external_references(page) == [
        "https://cdn.example/x.css", "http://cdn.example/require.js",
        "https://fonts.example/a.woff2", "theme.css", "http://example.org/plot.png",
        "figures/a.png", "manifest.json", "figures/b.png"]
    assert report.external_references("<img src='data:image/png;base64,AAAA'><a href='#x'>") == []


def test_single_file_inlines_figures_and_links_notebooks_to_their_sections(tmp_path):
    run_dir = _synthetic_run(tmp_path / "20260101T000000Z_host_tiny")
    out = report.write_single_file(run_dir)
    assert out == run_dir / "20260101T000000Z_host_tiny_report.html"
    page = out.read_text()
    assert report.external_references(page) == []
    assert f"data:image/png;base64,{base64.b64encode(PIXEL).decode()}" in page
    assert page.count("<section class='notebook'") == 1  # the pending notebook has no file
    assert "id='notebook-10_plot'" in page and 'href="#notebook-10_plot"' in page
    assert "printed line" in page and "the docs" in page  # the link's text stays, not its target
    assert "cdnjs" not in page and "<script" not in page


def test_report_cli_writes_the_single_file_where_out_says(tmp_path):
    run_dir = _synthetic_run(tmp_path / "run")
    out = tmp_path / "elsewhere" / "review.html"
    out.parent.mkdir()
    assert cli.main(["report", str(run_dir), "--single-file", "--out", str(out)]) == cli.EXIT_OK
    assert out.exists() and report.external_references(out.read_text()) == []
    assert not (run_dir / f"run{report.SINGLE_FILE_SUFFIX}").exists()


@pytest.mark.parametrize("argv, message", [
    (["--out", "x.html"], "--out names the single file: add --single-file"),
    (["--single-file", "--out", "missing/x.html"], "/missing/x.html: the folder /"),  # resolved
])
def test_report_cli_names_bad_options(tmp_path, capsys, monkeypatch, argv, message):
    run_dir = _synthetic_run(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(run_dir), *argv]) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_single_file_refuses_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(UserError, match="no manifest.json"):
        report.write_single_file(tmp_path)


@pytest.fixture(scope="module")
def executed_run(tmp_path_factory):
    """A real run: a notebook that plots and shows a table, and one that fails halfway."""
    base = tmp_path_factory.mktemp("suite")
    (base / "notebooks").mkdir()
    write_notebook(base / "notebooks" / "10_plot.ipynb", 'run_dir = ""', PLOT_BODY)
    write_notebook(base / "notebooks" / "20_fails.ipynb", 'run_dir = ""',
                   "print('partial output')\nraise RuntimeError('deliberate failure')")
    (base / "profiles.json").write_text('{"profiles": {"tiny": {"description": "test", '
                                        '"notebooks": {"10_plot": {}, "20_fails": {}}}}}')
    plan = profiles.plan_run("tiny", profiles_path=base / "profiles.json",
                             notebooks_dir=base / "notebooks")
    run_dir = rundir.new_run_dir(base / "runs", "tiny")
    execute.execute(plan, run_dir, command=["test"], progress=False)
    return run_dir


@pytest.mark.serial  # a browser
@pytest.mark.slow
def test_single_file_opens_offline_with_every_image_rendered(executed_run):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make test` installs Debian's chromium package")
        pytest.skip("chromium is not installed (make test installs it)")
    from playwright.sync_api import sync_playwright

    assert cli.main(["report", str(executed_run), "--single-file"]) == cli.EXIT_OK
    out = executed_run / f"{executed_run.name}{report.SINGLE_FILE_SUFFIX}"
    leaky = executed_run.parent / "leaky.html"  # the negative control
    leaky.write_text("<html><body><img src='http://example.org/plot.png'></body></html>")
    assert report.external_references(leaky.read_text()) == ["http://example.org/plot.png"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        context.set_offline(True)
        left: list[str] = []

        def only_files(route):
            if route.request.url.startswith("file:"):
                return route.continue_()
            left.append(route.request.url)
            return route.abort()

        context.route("**/*", only_files)
        page = context.new_page()
        page.goto(out.as_uri())
        page.wait_for_load_state("load")
        images = page.evaluate("Array.from(document.images).map(i => [i.src.slice(0, 22), "
                               "i.complete, i.naturalWidth])")
        # the figure twice (landing page, notebook output), none other expected
        assert len(images) == 2 and all(src.startswith("data:image/png") and ok and width > 0
                                        for src, ok, width in images), images
        assert left == []
        text = page.inner_text("body")
        assert executed_run.name in text and "partial output" in text
        assert "RuntimeError: deliberate failure" in text  # the failed notebook's traceback
        page.screenshot(path=str(out.with_suffix(".png")), full_page=True)
        page.goto(leaky.as_uri())
        page.wait_for_load_state("load")
        assert left == ["http://example.org/plot.png"]
        assert page.evaluate("document.images[0].naturalWidth") == 0
        browser.close()
    assert out.with_suffix(".png").stat().st_size > 10_000
