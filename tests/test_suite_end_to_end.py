"""The real notebooks, end to end, at tiny sizes: a complete run, its verdict, its report in a
real browser (Debian's chromium, installed by `make test` when missing)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import TINY
from stagelab.analyse import verdict
from stagelab.core import paths, records, rundir
from stagelab.core.records import RunFolder
from stagelab.run import execute, profiles

pytestmark = pytest.mark.slow

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
                                    decisive_ks=[2], min_samples=3,
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
