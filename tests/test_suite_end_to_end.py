"""The real notebooks, end to end, at tiny sizes: a complete run, its verdict, its report in a
real browser (Debian's chromium, installed by `make test` when missing)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from conftest import TINY
from stagelab.analyse import timeline, verdict, verdict_decision
from stagelab.core import catalogue, paths, records, rundir
from stagelab.core.records import RunFolder
from stagelab.run import execute, profiles

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # the real notebooks, then a browser

# Valid requests that measure nothing, or only part: each notebook must end with a clear sentence.
NOTHING = {
    "01_d2h_staging": {"models": ["Gemma-3-4B"], "rows": [100000], "rounds": 2},
    "02_logprobs_step": {"models": ["Gemma-3-4B"], "rows": [100000], "ks": [5], "rounds": 2},
}
SUBSET = {"01_d2h_staging": {"models": [1000], "rows": [2], "rounds": 3,
                             "arms": ["pageable_fresh", "raw_ceiling"]}}
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    plan = profiles.plan_run("quick", overrides=TINY)
    run_dir = rundir.new_run_dir(tmp_path_factory.mktemp("runs"), "quick")
    return run_dir, execute.execute(plan, run_dir, progress=False)


def test_every_notebook_runs_and_writes_its_outputs(tiny_run):
    run_dir, manifest = tiny_run
    assert [(nb["name"], nb["status"]) for nb in manifest["notebooks"]] == [
        ("00_environment", "ok"), ("01_d2h_staging", "ok"), ("02_logprobs_step", "ok"),
        ("03_prompt_logprobs", "ok"), ("04_verdict", "ok"), ("05_prediction", "ok")], [
            nb["error"] for nb in manifest["notebooks"]]
    for name in ("staging", "step", "prompt_logprobs"):
        assert (run_dir / "data" / f"{name}.parquet").exists()
    assert (run_dir / "figures" / "04_verdict_key.png").exists()
    assert (run_dir / "figures" / "05_prediction_prediction.png").exists()
    assert manifest["notebooks"][1]["parameters"]["rounds"] == 4
    # issue 48: each step arm's short sequence, kept as a trace, read back and drawn
    trace = run_dir / "data" / f"{catalogue.TIMELINE_TABLE}.trace.json.gz"
    spans = timeline.read(trace)
    assert set(spans["arm"]) >= {catalogue.baseline(catalogue.STEP), catalogue.DEFERRED_WAIT}
    assert (run_dir / "figures" / "02_logprobs_step_timeline.png").exists()
    assert timeline.NO_OVERLAP_ON_CPU in (run_dir / "02_logprobs_step.html").read_text()


def test_cpu_verdict_is_inconclusive_and_says_why(tiny_run):
    run_dir, _ = tiny_run
    saved = json.loads((run_dir / "verdict.json").read_text())
    if saved["hardware"]["gpu"] is None:
        assert saved["overall"]["decision"] == "INCONCLUSIVE"
        assert "No decisive cell was measured" in saved["overall"]["summary"]
        assert all(c["decision"] == "INCONCLUSIVE" for c in saved["decisive"])
        assert "pinned host memory needs a CUDA device" in saved["decisive"][0]["reason"]
    assert saved["decisive"][0]["stages_ms"]["total"] > 0  # the seed's step was measured
    assert saved["findings"] and saved["calibration"] and saved["goals"]
    rebuilt = verdict.build_verdict(run_dir, decisive_rows=[2], decisive_vocabs=[1000],
                                    decisive_ks=[2], rule=verdict_decision.Rule(min_samples=3),
                                    reference_root=paths.REFERENCE_DIR,
                                    calibration_trials=20)
    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(saved, sort_keys=True)
    # notebook 04's verdict.json follows its documented schema, every field documented
    assert RunFolder(run_dir).read_verdict() == saved
    assert set(saved) <= set(records.schema("verdict")["properties"])


@pytest.mark.parametrize("overrides, sentence", [
    (NOTHING, "Nothing was measured in"), (SUBSET, "Measured in the staging sweep")],
    ids=["nothing-measured", "arm-subset"])
def test_a_valid_request_that_measures_little_ends_with_a_clear_sentence(tmp_path, overrides,
                                                                        sentence):
    plan = profiles.plan_run("quick", only=list(overrides), overrides=overrides)
    run_dir = rundir.new_run_dir(tmp_path, "quick")
    manifest = execute.execute(plan, run_dir, progress=False)
    assert {nb["status"] for nb in manifest["notebooks"]} == {"ok"}, manifest["notebooks"]
    assert manifest["status"] == ("unmeasured" if overrides is NOTHING else "ok")
    for name in overrides:
        text = (run_dir / f"{name}.ipynb").read_text()
        assert sentence in text and "Traceback" not in text


def test_report_reads_well_in_a_real_browser(tiny_run):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make test` installs Debian's chromium package")
        pytest.skip("chromium is not installed (make test installs it)")
    from playwright.sync_api import sync_playwright

    run_dir, _ = tiny_run
    execute.rebuild_report(run_dir)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto((run_dir / "index.html").as_uri())
        page.wait_for_load_state("load")
        assert "Staging verdict: " in page.inner_text("#verdict")
        images = page.evaluate(
            "Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])")
        assert len(images) >= 5 and all(ok and width > 0 for _, ok, width in images), images
        page.screenshot(path=str(run_dir / "report_screenshot.png"), full_page=True)
        page.goto((run_dir / "01_d2h_staging.html").as_uri())
        widths = page.evaluate("Array.from(document.images).map(i => i.naturalWidth)")
        assert widths and all(w > 0 for w in widths)
        assert page.locator(".jp-CodeMirrorEditor").count() == 0  # code hidden
        assert "notebook_context" not in page.content()
        browser.close()
    assert (run_dir / "report_screenshot.png").stat().st_size > 10_000


def test_progress_goes_to_the_terminal_per_cell_and_never_into_the_html(tmp_path, capsys):
    only = ["01_d2h_staging", "03_prompt_logprobs"]
    plan = profiles.plan_run("quick", only=only, overrides={k: TINY[k] for k in only})
    run_dir = rundir.new_run_dir(tmp_path, "quick")
    manifest = execute.execute(plan, run_dir, progress=True)
    assert {nb["status"] for nb in manifest["notebooks"]} == {"ok"}
    err = capsys.readouterr().err.splitlines()
    sweep = [line for line in err if line.startswith("[1/2] 01_d2h_staging: staging: cell ")]
    assert len(sweep) == 2 and sweep[0].endswith(" s)")  # one per measured cell, timed
    assert any(line.startswith("[2/2] 03_prompt_logprobs: prompt logprobs: cell 1/1")
               for line in err)
    assert any(line.startswith("[1/2] 01_d2h_staging: notebook cell ") for line in err)
    for name in only:
        page = (run_dir / f"{name}.html").read_text()
        notebook = (run_dir / f"{name}.ipynb").read_text()
        for text in (page, notebook):
            assert ": cell 1/" not in text and "it/s]" not in text


# The class nbconvert gives a stderr stream's output (a pink box on a page; the page's style
# names the class too, so an element carrying it is looked for).
STDERR_BOX = re.compile(r"""class=["'][^"']*\boutput_stderr\b""")


def test_no_exported_page_has_a_stderr_output(tiny_run, tmp_path):
    """Progress belongs to the terminal. Before: 6 pink stderr boxes in notebook 01's page, 2 in
    02's, 1 in 03's (ipykernel echoed the sweeps' lines, written to the process's own stderr,
    into the cell)."""
    import nbformat

    from stagelab.present import report

    run_dir, manifest = tiny_run
    for entry in manifest["notebooks"]:
        notebook = nbformat.read(str(run_dir / entry["output"]), as_version=4)
        streams = ["".join(o.get("text", "")) for cell in notebook.cells
                   for o in cell.get("outputs", []) if o.get("name") == "stderr"]
        assert streams == [], (entry["name"], streams)
        assert not STDERR_BOX.search((run_dir / entry["html"]).read_text()), entry["name"]
    assert not STDERR_BOX.search(report.write_single_file(run_dir).read_text())
    noisy = nbformat.v4.new_code_cell("x", outputs=[
        nbformat.v4.new_output("stream", name="stderr", text="cell 1/2\n")])
    nbformat.write(nbformat.v4.new_notebook(cells=[noisy]), str(tmp_path / "noisy.ipynb"))
    assert STDERR_BOX.search(report.notebook_body(tmp_path / "noisy.ipynb"))  # the control


@pytest.mark.parametrize("page_name", ["index.html", "00_environment.html", "01_d2h_staging.html",
                                       "02_logprobs_step.html", "03_prompt_logprobs.html",
                                       "04_verdict.html", "05_prediction.html", "single-file"])
def test_no_exported_page_makes_a_network_request(tiny_run, page_name):
    """Every page a run exports opens with the network cut off and asks for nothing outside the
    run folder (before: each notebook's HTML loaded require.js and MathJax from a CDN)."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make test` installs Debian's chromium package")
        pytest.skip("chromium is not installed (make test installs it)")
    from playwright.sync_api import sync_playwright

    from stagelab.present import report

    run_dir, _ = tiny_run
    path = (report.write_single_file(run_dir) if page_name == "single-file"
            else run_dir / page_name)
    text = path.read_text()
    assert "<script src" not in text
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", text)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        context.set_offline(True)
        requested: list[str] = []
        context.on("request", lambda request: requested.append(request.url))
        page = context.new_page()
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        outside = [url for url in requested
                   if not (url.startswith("data:") or url.startswith(run_dir.as_uri()))]
        assert outside == [], outside
        leaky = run_dir.parent / "leaky.html"  # the negative control: a CDN script is seen
        leaky.write_text("<html><head><script src='https://cdn.example/require.js'></script>"
                         "</head><body></body></html>")
        page.goto(leaky.as_uri())
        assert "https://cdn.example/require.js" in requested
        browser.close()


def test_screenshots_of_the_report_and_notebooks_02_and_03(tiny_run):
    """The report's first screen and notebooks 02 and 03 as a reviewer sees them, kept in the run
    folder's screenshots/ (never copied by `keep`: evidence stays small)."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make test` installs Debian's chromium package")
        pytest.skip("chromium is not installed (make test installs it)")
    from playwright.sync_api import sync_playwright

    from stagelab.present import evidence

    run_dir, _ = tiny_run
    shots = run_dir / "screenshots"
    shots.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        for name, full in (("index.html", False), ("02_logprobs_step.html", True),
                           ("03_prompt_logprobs.html", True)):
            page.goto((run_dir / name).as_uri())
            page.wait_for_load_state("load")
            page.screenshot(path=str(shots / f"{name.removesuffix('.html')}.png"),
                            full_page=full)
        page.goto((run_dir / "index.html").as_uri())
        first_screen = page.inner_text("body")[:2000]
        browser.close()
    assert "Staging verdict" in first_screen
    sizes = {p.name: p.stat().st_size for p in shots.iterdir()}
    assert set(sizes) == {"index.png", "02_logprobs_step.png", "03_prompt_logprobs.png"}
    assert all(size > 10_000 for size in sizes.values()), sizes
    copied = [p.relative_to(run_dir) for p in evidence.evidence_files(run_dir)]
    assert not any(part.parts[0] == "screenshots" for part in copied)


# A run folder to take the screenshots of instead of the tiny run (a run made beside CPU hogs, to
# see that every page says its timings are not trustworthy), and where to put them.
SCREENSHOT_RUN, SCREENSHOT_DIR = "STAGELAB_SCREENSHOT_RUN", "STAGELAB_SCREENSHOT_DIR"
SCREEN = {"width": 1366, "height": 768}  # the laptop screen a reviewer reads the report on
STAGE_PAGES = ("02_logprobs_step.html", "04_verdict.html", "05_prediction.html")
PAGE_HEIGHT_PX = 20_000  # the tallest page a reviewer scrolls through (nb 05 was 35,000 px)
READ_PAGES = ("index.html", "01_d2h_staging.html", "02_logprobs_step.html",
              "03_prompt_logprobs.html", "04_verdict.html", "05_prediction.html")
RAW_CELL = re.compile(r"^(True|False|None|nan|NaN)$")
SNAKE_CASE = re.compile(r"\b[a-z]+_[a-z_]+\b")
# The first screen of each page, its width, its table headers and cells, its stderr boxes.
PAGE_FACTS = """() => ({
  width: document.documentElement.scrollWidth,
  top: document.body.innerText.slice(0, 600),
  trustTop: Array.from(document.querySelectorAll('#untrusted, #trust, #page-of'))
                 .map(e => e.getBoundingClientRect().top),
  headers: Array.from(document.querySelectorAll('th')).map(e => e.innerText.trim()),
  cells: Array.from(document.querySelectorAll('td')).map(e => e.innerText.trim()),
  stderr: document.querySelectorAll('.output_stderr').length,
  height: document.documentElement.scrollHeight,
  noAlt: Array.from(document.querySelectorAll('img'))
              .filter(e => !(e.getAttribute('alt') || '').trim()).length,
  predicted: Array.from(document.querySelectorAll('#predicted tr'))
                  .map(e => Array.from(e.children).map(c => c.innerText.trim())),
  confirm: (document.querySelector('#confirm') || {innerText: ''}).innerText,
  firstScreen: Array.from(document.querySelectorAll('#predicted, #confirm'))
                    .map(e => e.getBoundingClientRect().top),
  scrolled: Array.from(document.querySelectorAll('table'))
                 .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText.slice(0, 80))})"""


def test_screenshots_at_1366_px_say_trust_first_with_no_raw_cell_nor_stderr_box(request):
    """The front page and notebooks 01-05 at a 1,366 x 768 screen, as a reviewer sent one page
    sees them, each saved as its first screen and in full: each fits the width, says at the top
    whether its run's timings can be trusted (and, for a busy run, "not trustworthy"), shows no
    stderr box, and the front page no raw cell (snake_case header, True/False/None/nan) nor a
    table too wide to read without scrolling it (its 12-column prediction table was 1,369 px)."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make test` installs Debian's chromium package")
        pytest.skip("chromium is not installed (make test installs it)")
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    from stagelab.analyse import trust

    given = os.environ.get(SCREENSHOT_RUN)
    run_dir = Path(given) if given else request.getfixturevalue("tiny_run")[0]
    shots = Path(os.environ.get(SCREENSHOT_DIR) or run_dir / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    state = trust.run_trust(run_dir, rundir.read_manifest(run_dir))
    facts = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport=SCREEN)
        for name in READ_PAGES:
            page.goto((run_dir / name).as_uri())
            page.wait_for_load_state("load")
            stem = name.removesuffix(".html")
            page.screenshot(path=str(shots / f"{stem}_first_screen.png"))
            page.screenshot(path=str(shots / f"{stem}_full.png"), full_page=True)
            facts[name] = page.evaluate(PAGE_FACTS)
        browser.close()
    for name, seen in facts.items():
        assert seen["width"] <= SCREEN["width"], (name, seen["width"])
        assert seen["stderr"] == 0, name
        assert seen["trustTop"] and min(seen["trustTop"]) < SCREEN["height"], name
        assert f"timings {state}" in seen["top"].replace("\n", " "), (name, seen["top"])
        if state == trust.NOT_TRUSTWORTHY:
            assert "TIMINGS NOT TRUSTWORTHY" in seen["top"] or name == "index.html", name
    for name, seen in facts.items():  # issue 45's page defects, each where a page shows it
        assert seen["noAlt"] == 0, (name, "an image without alt text")
        assert seen["height"] <= PAGE_HEIGHT_PX, (name, seen["height"])  # nb 05 was 35,000 px
        assert not [h for h in seen["headers"] if "gb per" in h or h == "index"], name
        raw = {"device", "alloc", "host_gather", "host gather"}
        if name in STAGE_PAGES:  # (the machine table's "device" is a torch device, no stage)
            assert not raw & set(seen["cells"]), (name, "a stage named outside STAGE_WORDS")
    front = facts["index.html"]
    # an undecided CPU run: each platform's predicted answer, and the command that confirms it
    header, *platforms = front["predicted"]
    assert header[0] == "platform" and {row[0] for row in platforms} >= {"H200", "H100 SXM"}
    assert all(re.match(r"(PORT|CLOSE|depends on)", cell) for row in platforms
               for cell in row[1:] if not cell.startswith("does not fit")), platforms
    assert "make run PROFILE=gate" in front["confirm"]
    assert front["firstScreen"] and max(front["firstScreen"]) < 2 * SCREEN["height"]
    assert not front["scrolled"], front["scrolled"]  # the front page's tables fit, unscrolled
    assert not [h for h in front["headers"] if SNAKE_CASE.search(h)], front["headers"]
    assert not [c for c in front["cells"] if RAW_CELL.match(c)]
    assert all((shots / f"{p.removesuffix('.html')}_first_screen.png").stat().st_size > 10_000
               for p in READ_PAGES)
