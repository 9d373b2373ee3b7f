"""The busy-machine flag: the load sampler on injected readings and on a real CPU burner, and what
the run's record, the report and the terminal say about it."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stagelab.analyse import trust
from stagelab.core import rundir
from stagelab.measure import busy
from stagelab.present import report

# keep re-derives a run's verdict from its tables; these runs' tables are stubs
pytestmark = pytest.mark.usefixtures("verdict_as_recorded")


def reading(wall: float, busy_s: float, own: float, load: float = 0.5,
            steal: float | None = 0.0, cpus: int = 2) -> busy.Reading:
    return busy.Reading(wall_s=wall, busy_cpu_s=busy_s, steal_cpu_s=steal, own_cpu_s=own,
                        load1=load, cpus=cpus)


def test_a_quiet_machine_is_not_busy():
    summary = busy.assess(reading(0, 100, 50), reading(10, 112, 61), loads=[1.2, 0.9])
    assert summary == {"seconds": 10, "cpus": 2, "load_avg_max": 1.2, "others_cpu_s": 1.0,
                       "others_cores": 0.1, "steal_share": 0.0, "busy": False, "why": [],
                       "source": "the whole host (/proc/stat)"}


STAT = ("cpu  400 0 200 900 0 0 0 40 0 0\n"
        "cpu0 100 0 50 200 0 0 0 10 0 0\ncpu1 100 0 50 250 0 0 0 10 0 0\n"
        "cpu2 100 0 50 200 0 0 0 10 0 0\ncpu3 100 0 50 250 0 0 0 10 0 0\nintr 5\n")


def test_the_load_is_read_from_the_process_s_own_cores_where_it_has_fewer(tmp_path,
                                                                           monkeypatch):
    (tmp_path / "stat").write_text(STAT)
    (tmp_path / "loadavg").write_text("0.5 0.4 0.3 1/100 7\n")
    hz = busy._ticks_per_s()
    assert busy.cpu_seconds(tmp_path) == (600 / hz, 40 / hz)
    assert busy.cpu_seconds(tmp_path, frozenset({1, 3})) == (300 / hz, 20 / hz)
    monkeypatch.setattr(busy.os, "sched_getaffinity", lambda pid: {1, 3})
    assert busy.own_cpus(tmp_path) == frozenset({1, 3})
    reading = busy.read_machine(os.getpid(), tmp_path)
    assert (reading.cpus, reading.busy_cpu_s) == (2, 300 / hz)
    assert "2 cores" in reading.source and "affinity" in reading.source
    monkeypatch.setattr(busy.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert busy.own_cpus(tmp_path) is None
    assert busy.read_machine(os.getpid(), tmp_path).source == "the whole host (/proc/stat)"


def test_other_processes_taking_cores_make_it_busy():
    summary = busy.assess(reading(0, 100, 50), reading(10, 126, 60, load=3.1))
    assert summary["others_cpu_s"] == 16 and summary["others_cores"] == 1.6
    assert summary["busy"] is True and summary["load_avg_max"] == 3.1
    (why,) = summary["why"]
    assert "other processes" in why and "1.60 of 2 cores" in why and "(limit 0.5)" in why


def test_stolen_time_makes_it_busy_and_is_unknown_where_not_reported():
    stolen = busy.assess(reading(0, 100, 50, steal=5.0), reading(10, 110, 60, steal=7.0))
    assert stolen["steal_share"] == 0.1 and stolen["busy"] is True
    (why,) = stolen["why"]
    assert "stole" in why and "10%" in why and "(limit 5%)" in why
    unknown = busy.assess(reading(0, 100, 50, steal=None), reading(10, 110, 60, steal=None))
    assert unknown["steal_share"] is None and unknown["busy"] is False


def test_the_watch_samples_the_load_average_between_its_readings():
    script = iter([reading(0, 100, 50, load=0.4), *[reading(1, 100, 50, load=4.0)] * 50])
    readings = [reading(0, 100, 50, load=0.4)]

    def read() -> busy.Reading:
        readings.append(next(script))
        return readings[-1]

    with busy.LoadWatch(read=read, every_s=0.01) as watch:
        time.sleep(0.1)
    assert watch.summary["load_avg_max"] == 4.0 and watch.summary["busy"] is False


def test_the_watch_says_unknown_where_the_load_cannot_be_read():
    def unreadable() -> busy.Reading:
        raise FileNotFoundError(2, "No such file or directory", "/proc/stat")

    with busy.LoadWatch(read=unreadable) as watch:
        pass
    assert watch.summary["busy"] is None and "cannot be read" in watch.summary["unavailable"]


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.serial  # reads the whole machine's CPU time: another test's is "others"
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
def test_cpu_burnt_outside_the_watched_tree_counts_as_others():
    """Watched from a sleeping process's tree, a burner elsewhere is 'other processes'; watched
    from this process's own tree (it is our child), it is not."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        outside = busy.LoadWatch(read=lambda: busy.read_machine(sleeper.pid), every_s=0.2)
        inside = busy.LoadWatch(every_s=0.2)
        burner = multiprocessing.get_context("fork").Process(target=_burn, args=(1.5,))
        with outside, inside:
            burner.start()
            burner.join(30)
            burnt = busy.tree_cpu_seconds(os.getpid())  # includes the reaped burner
    finally:
        sleeper.kill()
        sleeper.wait()
    assert burner.exitcode == 0
    own_share = inside.summary["others_cpu_s"]
    assert outside.summary["others_cpu_s"] >= 0.5 * 1.0  # at least half a second of the burn
    assert outside.summary["others_cpu_s"] > own_share
    assert burnt > 0.5


# ---------------------------------------------------------------------- what the run says

def busy_manifest(run_dir: Path, notebook: str = "02_logprobs_step") -> dict:
    manifest = rundir.new_manifest(run_dir, "quick", ["stagelab"], [
        rundir.notebook_entry(notebook, status=rundir.OK)], hardware=None, status=rundir.OK)
    manifest["notebooks"][0]["load"] = busy.assess(reading(0, 100, 50), reading(10, 126, 60))
    (run_dir / f"{notebook}.ipynb").write_text("{}")
    rundir.write_manifest(run_dir, manifest)
    return manifest


def test_trust_names_busy_timing_notebooks_and_failed_aa_checks(tmp_path):
    manifest = busy_manifest(tmp_path)
    verdict = {"parameters": {"delta": 0.02}, "decisive": [
        {"rows": 64, "vocab": 1000, "k": 5, "twin_speedup": 0.9, "twin_ci_low": 0.85,
         "twin_ci_high": 0.95},
        {"rows": 16, "vocab": 1000, "k": 5, "twin_speedup": 1.0, "twin_ci_low": 0.97,
         "twin_ci_high": 1.04}],
        "copy_cells": [{"rows": 1, "vocab": 1000, "twin_speedup": 0.95, "twin_ci_low": 0.75,
                        "twin_ci_high": 1.3}]}
    busy_reason, twin_reason = trust.reasons(tmp_path, manifest, verdict)
    assert busy_reason.startswith("02_logprobs_step ") and "1.60 of 2 cores" in busy_reason
    assert "A/A" in twin_reason and "n=64, V=1000, K=5" in twin_reason
    assert "0.900x [0.850, 0.950]" in twin_reason and twin_reason.endswith("1 +- 2%")
    manifest["notebooks"][0]["name"] = "00_environment"  # no timings there: not a reason
    assert trust.reasons(tmp_path, manifest, {}) == []


def test_the_harness_block_decides_over_each_cells_own_ci(tmp_path):
    """A run's twins are one family: the verdict's ``harness`` block (Bonferroni) says which
    differ; a cell's own 95 % CI beyond 1 +- delta alone is no longer a reason."""
    lone = {"rows": 16, "vocab": 32768, "twin_speedup": 1.219, "twin_ci_low": 1.022,
            "twin_ci_high": 1.45}
    verdict = {"parameters": {"delta": 0.02}, "copy_cells": [lone], "harness": {
        "delta": 0.02, "confidence": 1 - 0.05 / 2, "checks": [
            {**lone, "level": "copy", "twin_ci_low": 0.97, "twin_ci_high": 1.6,
             "differs": False},
            {"level": "step", "rows": 64, "vocab": 1000, "k": 5, "twin_speedup": 0.9,
             "twin_ci_low": 0.84, "twin_ci_high": 0.96, "differs": True},
            {"level": "step", "rows": 16, "vocab": 1000, "k": 5, "differs": None}]}}
    (differs,) = trust.harness_reasons(verdict)  # the one twin that differs, not the lone CI
    assert "step level" in differs and "n=64, V=1000, K=5" in differs
    assert "0.900x [0.840, 0.960] (97.5% CI" in differs and "Bonferroni over 2" in differs
    assert differs.endswith("1 +- 2%")
    assert trust.harness_checked(verdict)
    assert trust.harness_reasons({**verdict, "harness": {**verdict["harness"], "checks": []}}) == []
    del verdict["harness"]  # a verdict written before the block: each cell's own CI
    reason = trust.harness_reasons(verdict)[0]
    assert "copy level" in reason and "n=16" in reason  # the level and cell whose twin differs


def test_the_report_first_screen_says_the_timings_are_not_trustworthy(tmp_path):
    busy_manifest(tmp_path)
    (tmp_path / "verdict.json").write_text(json.dumps({"overall": {
        "decision": "PORT", "summary": "pinned saves"}, "decisive": []}))
    page = report.write_index(tmp_path).read_text()
    verdict_box = page[page.index("<section class='verdict'"):page.index("</section>")]
    assert "TIMINGS NOT TRUSTWORTHY" in verdict_box
    assert "02_logprobs_step" in verdict_box and "busy" in verdict_box  # which notebook, why
    assert verdict_box.index("TIMINGS NOT TRUSTWORTHY") < verdict_box.index("PORT")
    (row,) = re.findall(r"<td class='failed'>busy: ([^<]*)</td>", page)  # the notebook's row
    assert "1.60 of 2 cores" in row and "0.5" in row


def _goals_notebook(path: Path) -> None:
    """An executed notebook that shows a goals table as the measuring notebooks do."""
    import nbformat

    from stagelab.analyse import goal_rows
    from stagelab.present import tables

    shown = tables.show(goal_rows.goals_frame([goal_rows.goal("reuse lever", "CI above 1", "2x",
                                                             True)])).to_html()
    cell = nbformat.v4.new_code_cell("show()", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/html": shown, "text/plain": "table"})])
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), str(path))


def test_every_page_of_a_busy_run_says_so_and_its_goals_are_met_on_untrustworthy_timings(
        tmp_path):
    """Before: only index.html and notebook 04 said "not trustworthy"; notebook 01 of a busy run
    marked its reuse goal "met" and the header said "status ok" in green."""
    from stagelab.run import execute

    manifest = busy_manifest(tmp_path, "01_d2h_staging")
    _goals_notebook(tmp_path / "01_d2h_staging.ipynb")
    entry = manifest["notebooks"][0]
    execute.export_html(tmp_path, entry, manifest)
    page = (tmp_path / entry["html"]).read_text()
    head = page[page.index("<body>"):page.index("<div class=\"cell")]
    assert "TIMINGS NOT TRUSTWORTHY" in head and "01_d2h_staging ran on a busy" in head
    assert "timings <span class='failed'>not trustworthy</span>" in head
    assert ">met on untrustworthy timings</td>" in page and ">met</td>" not in page
    index = report.write_index(tmp_path).read_text()
    assert "timings <span class='failed' id='trust'>not trustworthy</span>" in index
    manifest["notebooks"][0]["load"] = busy.assess(reading(0, 100, 50), reading(10, 101, 59))
    execute.export_html(tmp_path, entry, manifest)
    quiet = (tmp_path / entry["html"]).read_text()
    assert "NOT TRUSTWORTHY" not in quiet and ">met</td>" in quiet
    assert "timings <span class='ok'>trustworthy</span>" in quiet


def test_runs_lists_trust_and_marks_a_run_that_differs_from_its_profile(tmp_path, capsys):
    """Before: `stagelab runs` listed a busy run as ok, and a one-notebook --only run with
    changed parameters as "quick, ok"."""
    from stagelab import cli

    run_dir = tmp_path / "20261201T100000Z_vm_quick"
    run_dir.mkdir()
    manifest = busy_manifest(run_dir, "01_d2h_staging")
    manifest["notebooks"][0]["parameters"] = {"models": ["Mistral-7B-v0.3", "Qwen2.5-7B"],
                                              "rows": [1, 16, 64], "rounds": 3, "warmup": 3}
    rundir.write_manifest(run_dir, manifest)
    assert cli.main(["runs", "--root", str(tmp_path)]) == 0
    header, line = capsys.readouterr().out.strip().splitlines()
    assert header.split()[-2:] == ["trust", "status"]
    assert line.split()[:2] == [run_dir.name, "quick*"] and " not trustworthy " in line
    assert line.endswith("* only 01_d2h_staging; 01_d2h_staging: rounds=3")
    assert cli.main(["runs", "--root", str(tmp_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["trust"] == trust.NOT_TRUSTWORTHY and listed["status"] == rundir.OK
    assert listed["changed"] == ["only 01_d2h_staging", "01_d2h_staging: rounds=3"]


def test_the_report_says_when_the_load_was_not_recorded(tmp_path):
    manifest = busy_manifest(tmp_path)
    manifest["notebooks"][0].pop("load")
    rundir.write_manifest(tmp_path, manifest)
    page = report.write_index(tmp_path).read_text()
    assert "TIMINGS NOT TRUSTWORTHY" not in page
    assert "id='load-unknown'" in page
    manifest["notebooks"][0]["load"] = busy.assess(reading(0, 100, 50), reading(10, 101, 59))
    rundir.write_manifest(tmp_path, manifest)
    page = report.write_index(tmp_path).read_text()
    assert "load was not recorded" not in page and "TIMINGS NOT TRUSTWORTHY" not in page


# --------------------------------------------------- a few-round run judges neither question

def _few_round_verdict(rounds: int) -> dict:
    """A verdict whose one A/A check, at ``rounds`` rounds, saw the twins 'differ' (as a 3-round
    smoke run does on a quiet machine: its bootstrap over 3 rounds is far too narrow)."""
    return {"overall": {"decision": "INCONCLUSIVE", "summary": "too few rounds"},
            "decisive": [], "harness": {
                "method": "bonferroni", "delta": 0.02, "confidence": 0.99,
                "family_confidence": 0.95, "checks": [
                    {"level": "copy", "rows": 8, "vocab": 4096, "n_rounds": rounds,
                     "twin_speedup": 1.3, "twin_ci_low": 1.2, "twin_ci_high": 1.4,
                     "differs": True}]}}


def test_a_few_round_run_is_labelled_not_judged_rather_than_untrustworthy(tmp_path):
    smoke = _few_round_verdict(3)
    assert trust.harness_reasons(smoke) == []  # 3 rounds judge no twin
    assert trust.too_few_rounds(smoke) == 3
    label = trust.scope_label(smoke)
    not_judged = trust.NOT_JUDGED.upper()
    assert label.startswith(f"{not_judged}: 3 rounds")
    markdown = trust.warning_markdown(tmp_path, smoke)
    assert markdown.startswith(f"**{not_judged}**:")
    assert "NOT TRUSTWORTHY" not in markdown
    # with rounds enough, the same twins are a trust check, and they failed it
    judged = _few_round_verdict(trust.MIN_TRUST_ROUNDS)
    assert trust.scope_label(judged) == "" and trust.too_few_rounds(judged) is None
    reason = trust.harness_reasons(judged)[0]
    assert "copy level" in reason and "n=8" in reason


def test_the_report_and_the_terminal_label_a_smoke_run_and_keep_refuses_it(tmp_path, monkeypatch):
    from conftest import good_run
    from stagelab import cli
    from stagelab.core import paths
    from stagelab.core.errors import UserError
    from stagelab.present import evidence

    monkeypatch.setattr(paths, "REFERENCE_DIR", tmp_path / "reference")
    run_dir = good_run(tmp_path / "runs")
    (run_dir / "verdict.json").write_text(json.dumps(_few_round_verdict(3)))
    page = report.write_index(run_dir).read_text()
    verdict_box = page[page.index("<section class='verdict'"):page.index("</section>")]
    assert "id='not-judged'" in verdict_box and trust.NOT_JUDGED.upper() in verdict_box
    assert "NOT TRUSTWORTHY" not in page
    manifest = rundir.read_manifest(run_dir)
    line = cli.verdict_line(run_dir, manifest)
    assert line.splitlines()[1].startswith(f"{trust.NOT_JUDGED.upper()}: 3 rounds")
    assert "NOT TRUSTWORTHY" not in line
    with pytest.raises(UserError, match=r"not kept: not a decision, not a trust check: 3 rounds"):
        evidence.keep_evidence(run_dir)
