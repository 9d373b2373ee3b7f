"""`stagelab keep` takes only good evidence, never half-writes it, and indexes what is kept."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from conftest import dead_pid, good_run
from stagelab import cli
from stagelab.analyse import trust
from stagelab.core import paths, rundir, schema
from stagelab.core.errors import UserError
from stagelab.measure import busy
from stagelab.present import evidence

# keep re-derives a run's verdict from its tables; these runs' tables are stubs
pytestmark = pytest.mark.usefixtures("verdict_as_recorded")


def busy_run(root: Path) -> Path:
    """An ok run whose timing notebook ran while others took 1.6 of 2 cores (as recorded by the
    runner's load watch)."""
    run_dir = good_run(root, notebooks=("02_logprobs_step",))
    schema.write_table(schema.make_rows([{"experiment": "logprobs_step", "arm": "seed_pageable",
                                          "seconds": 0.01, "round": 0}]), run_dir, "step")
    manifest = rundir.read_manifest(run_dir)
    manifest["notebooks"][0]["load"] = busy.assess(
        busy.Reading(0.0, 100.0, 0.0, 50.0, 0.5, 2), busy.Reading(10.0, 126.0, 0.0, 60.0, 3.1, 2))
    rundir.write_manifest(run_dir, manifest)
    return run_dir


def failed_aa_run(root: Path) -> Path:
    """An ok run whose verdict's A/A twin saw the baseline differ from itself by 20 %."""
    run_dir = good_run(root)
    cell = {"rows": 64, "vocab": 152064, "k": 5, "decision": "PORT", "twin_speedup": 1.2,
            "twin_ci_low": 1.15,
            "twin_ci_high": 1.25}
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "PORT"}, "parameters": {"delta": 0.02}, "decisive": [cell]}))
    return run_dir


@pytest.fixture
def reference(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "reference"
    monkeypatch.setattr(paths, "REFERENCE_DIR", root)
    return root


def test_keep_copies_an_ok_run_once_and_indexes_it(tmp_path, reference):
    run_dir = good_run(tmp_path / "runs")
    steps: list[str] = []  # before: keep (15 s) said nothing while it worked
    dest = evidence.keep_evidence(run_dir, say=steps.append)
    assert [line.split(":")[0] for line in steps] == ["keep"] * 4, steps
    assert dest == reference / "NVIDIA-H200" / run_dir.name
    for name in ("manifest.json", "verdict.json", "index.html", "10_ok.ipynb",
                 "data/staging.parquet", "kept.json"):
        assert (dest / name).exists(), name
    assert json.loads((dest / "kept.json").read_text())["forced"] is False
    assert not list(reference.glob("*/.incoming-*"))
    (row,) = evidence.kept_runs(reference)
    assert row == evidence.KeptRun(path=f"NVIDIA-H200/{run_dir.name}", machine="NVIDIA H200",
                                   date="2026-11-30T10:00:00+00:00",
                                   commit="abcdef123456", profile="quick", verdict="PORT",
                                   forced=False)
    index = (reference / "index.html").read_text()
    assert f"href='NVIDIA-H200/{run_dir.name}/index.html'" in index
    assert "NVIDIA H200" in index and ">PORT<" in index and "abcdef123456" in index
    with pytest.raises(UserError, match="never overwritten"):
        evidence.keep_evidence(run_dir)


@pytest.mark.parametrize("make, why", [
    # Before: a failed run and a killed "running" run were kept without a word.
    (lambda root: good_run(root, status="failed"), "its status is failed (10_ok failed), not ok"),
    (lambda root: good_run(root, status="running", pid=dead_pid()),
     "its status is interrupted (10_ok interrupted), not ok"),
    (lambda root: good_run(root, verdict=False), "it has no verdict.json"),
    # Before: a run measured on a loaded machine, 5-45x off a quiet one, was kept as evidence.
    (lambda root: busy_run(root), "its timings are not trustworthy: 02_logprobs_step ran "
                                  "on a busy machine: other processes took 1.60 of 2 cores on average"),
    (lambda root: failed_aa_run(root), "its timings are not trustworthy: the A/A check at "
                                       "step level, n=64, V=152064, K=5, saw identical arms differ"),
])
def test_keep_refuses_bad_evidence_and_force_keeps_it_labelled(tmp_path, reference, capsys,
                                                                 make, why):
    run_dir = make(tmp_path / "runs")
    assert cli.main(["keep", str(run_dir)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert why in err and "--force" in err and len(err.splitlines()) == 1
    assert not reference.exists()  # nothing written
    assert cli.main(["keep", "--force", str(run_dir)]) == cli.EXIT_OK
    (row,) = evidence.kept_runs(reference)
    assert row.forced
    kept = json.loads((reference / row.path / "kept.json").read_text())
    assert kept["forced"] is True and why in kept["refusal"]
    assert row.untrusted is ("trustworthy" in why)
    assert kept["untrusted"] == trust.reasons(run_dir)
    index = (reference / "index.html").read_text()
    assert "<b>forced</b>" in index
    assert ("<b>not trustworthy</b>" in index) is row.untrusted


def test_a_missing_notebook_makes_a_run_unfit_to_keep(tmp_path, reference):
    run_dir = good_run(tmp_path / "runs")
    (run_dir / "10_ok.ipynb").unlink()
    with pytest.raises(UserError, match="status is missing"):
        evidence.keep_evidence(run_dir)


def test_no_write_access_is_one_line_and_nothing_half_written(tmp_path, reference, monkeypatch,
                                                                capsys):
    run_dir = good_run(tmp_path / "runs")
    copies = []

    write = evidence.records.write_bytes_atomic

    def refuse_second_copy(dst, data):
        copies.append(dst)
        if len(copies) == 2:
            raise PermissionError(errno.EACCES, "Permission denied", str(dst))
        return write(dst, data)

    monkeypatch.setattr(evidence.records, "write_bytes_atomic", refuse_second_copy)
    assert cli.main(["keep", str(run_dir)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "Permission denied" in err and len(err.splitlines()) == 1
    assert not [p for p in reference.rglob("*") if p.is_file()]  # no copy, no index
    assert not list(reference.glob("*/*"))


def test_a_reference_root_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(paths, "REFERENCE_DIR", blocker / "reference")
    assert cli.main(["keep", str(good_run(tmp_path / "runs"))]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert f"under {blocker / 'reference'}" in err and len(err.splitlines()) == 1


def test_the_index_lists_every_kept_run_oldest_first(tmp_path, reference):
    cpu = good_run(tmp_path / "runs", decision="INCONCLUSIVE",
                   hardware={"gpu": None, "host": {"cpu_model": "AMD EPYC"}})
    gpu = good_run(tmp_path / "runs", decision="CLOSE", created="2026-11-30T11:00:00+00:00")
    evidence.keep_evidence(cpu)
    evidence.keep_evidence(gpu)
    rows = evidence.kept_runs(reference)
    assert [(r.machine, r.verdict, r.path.split("/")[0]) for r in rows] == [
        ("AMD EPYC", "INCONCLUSIVE", "cpu-AMD-EPYC"), ("NVIDIA H200", "CLOSE", "NVIDIA-H200")]
    index = (reference / "index.html").read_text()
    assert index.count("<tr>") == 3  # the header and one row per run
    assert evidence.write_evidence_index(reference).read_text() == index


def test_the_committed_reference_folder_is_indexed():
    rows = evidence.kept_runs(paths.REFERENCE_DIR)
    assert rows and all(r.verdict != "no verdict" for r in rows)


def test_the_kept_results_are_the_ones_generated_from_the_kept_runs():
    # Before: hand-written, quoting a run six commits old, going stale silently.
    kept = evidence.results_file(paths.REFERENCE_DIR).read_text()
    start = kept.index(evidence.RESULTS_START)
    end = kept.index(evidence.RESULTS_END) + len(evidence.RESULTS_END)
    assert kept[start:end] == evidence.results_markdown(paths.REFERENCE_DIR), (
        "data/reference/README.md's Results differ from the kept runs: `stagelab keep` writes "
        "them (or call stagelab.present.evidence.write_results())")


def test_the_readme_links_the_kept_results():
    readme = (paths.REPO_ROOT / "README.md").read_text()
    assert "(data/reference/README.md)" in readme
    assert evidence.RESULTS_START not in readme  # generated text lives beside the runs


def test_keep_rewrites_the_results_between_their_markers_and_nothing_else(tmp_path):
    root = tmp_path / "repo" / "data" / "reference"
    root.mkdir(parents=True)
    results = evidence.results_file(root)
    results.write_text(f"# intro\n\n## Results\n\n{evidence.RESULTS_START}\nstale, by hand\n"
                       f"{evidence.RESULTS_END}\n\n## After\nkept\n")
    run_dir = good_run(tmp_path / "runs", decision="CLOSE")
    (run_dir / "verdict.json").write_text(json.dumps({
        "overall": {"decision": "CLOSE", "summary": "Any benefit is smaller than delta."},
        "hardware": {"gpu": "NVIDIA H200", "torch": "2.5.1"},
        "findings": ["Seed's step at n=64: 1.00 ms.", "Committed reference evidence (x): y."]}))
    dest = evidence.keep_evidence(run_dir, root=root)
    text = results.read_text()
    assert text.startswith("# intro\n\n## Results\n\n") and text.endswith("\n\n## After\nkept\n")
    assert "stale, by hand" not in text
    assert f"### NVIDIA H200: run `{run_dir.name}`" in text
    assert "**Verdict: CLOSE.**" in text
    assert "n=64: 1.00 ms" in text and "Committed reference" not in text
    assert "No kept run was made on a GPU" not in text
    link = f"({dest.relative_to(root).as_posix()}/index.html)"
    assert link in text and (root / link[1:-1]).parent == dest
    section = text[text.index(evidence.RESULTS_START):text.index(evidence.RESULTS_END)
                   + len(evidence.RESULTS_END)]
    assert section == evidence.results_markdown(root)


def test_keep_adds_the_results_where_the_file_has_none(tmp_path):
    root = tmp_path / "reference"
    root.mkdir()
    evidence.keep_evidence(good_run(tmp_path / "runs", decision="CLOSE"), root=root)
    text = evidence.results_file(root).read_text()
    assert text.startswith("# Reference evidence\n\n## Results\n\n" + evidence.RESULTS_START)
    assert text.endswith(evidence.RESULTS_END + "\n")


# ------------------------------------------------------------------- machines named as they are

@pytest.mark.parametrize("hardware, key", [
    ({"gpu": {"name": "NVIDIA H200"}, "host": {"cpu_model": "AMD EPYC"}}, "NVIDIA-H200"),
    ({"gpu": None, "host": {"cpu_model": "Intel(R) Xeon(R) Processor"}},
     "cpu-Intel-Xeon-Processor"),
    ({"gpu": None, "host": {"cpu_model": "Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz"}},
     "cpu-Intel-Core-i7-8700"),
    ({"gpu": None, "host": {"cpu_model": "AMD EPYC 7B13 64-Core Processor"}},
     "cpu-AMD-EPYC-7B13-64-Core-Processor"),
    ({"gpu": None, "host": {}}, "cpu-unknown"),
    ({"gpu": {"name": "../.."}}, "gpu"),
])
def test_a_machine_is_keyed_by_its_gpu_or_else_its_cpu_model(hardware, key):
    assert evidence.machine_slug({"hardware": hardware}) == key


def test_runs_of_two_cpu_models_are_kept_apart_and_headed_by_their_own_model(tmp_path,
                                                                               reference):
    # Before: every CPU run filed under one `cpu` folder, and Intel runs under an AMD heading
    intel = good_run(tmp_path / "runs", decision="INCONCLUSIVE",
                     hardware={"gpu": None, "host": {"cpu_model": "Intel(R) Xeon(R) Processor"}})
    amd = good_run(tmp_path / "runs", decision="INCONCLUSIVE", created="2026-11-30T11:00:00+00:00",
                   hardware={"gpu": None, "host": {"cpu_model": "AMD EPYC 7B13"}})
    assert evidence.keep_evidence(intel).parent.name == "cpu-Intel-Xeon-Processor"
    assert evidence.keep_evidence(amd).parent.name == "cpu-AMD-EPYC-7B13"
    rows = evidence.kept_runs(reference)
    assert {r.path.split("/")[0]: r.machine for r in rows} == {
        "cpu-Intel-Xeon-Processor": "Intel(R) Xeon(R) Processor",
        "cpu-AMD-EPYC-7B13": "AMD EPYC 7B13"}


def test_the_results_headline_is_the_newest_unforced_trusted_run_per_machine(tmp_path,
                                                                            reference):
    trusted = good_run(tmp_path / "runs", decision="CLOSE", created="2026-11-30T10:00:00+00:00")
    forced = good_run(tmp_path / "runs", decision="PORT", status="failed",
                      created="2026-11-30T12:00:00+00:00")
    evidence.keep_evidence(trusted)
    evidence.keep_evidence(forced, force=True)
    text = evidence.results_markdown(reference)
    assert f"run `{trusted.name}`" in text.split("###")[1]  # the headline, though older
    assert f"`{forced.name}` (PORT (kept with --force; {evidence.LIVE_LABEL}))" in text
    rows = evidence.kept_runs(reference)
    assert evidence.headline_run(rows).path.endswith(trusted.name)
    assert evidence.headline_run([r for r in rows if r.forced]) is None


def test_the_committed_kept_runs_sit_under_the_machine_their_manifest_names():
    for row in evidence.kept_runs(paths.REFERENCE_DIR):
        folder = paths.REFERENCE_DIR / row.path
        manifest = json.loads((folder / "manifest.json").read_text())
        assert folder.parent.name == evidence.machine_slug(manifest), row.path


def test_decision_parameters_unlike_the_profile_are_named_on_the_first_screen_and_results(
        tmp_path, verdict_as_recorded):
    """Before (R9): the 04_verdict parameters a run recorded (delta 0.02 -> 0.005 turned a
    CLOSE into INCONCLUSIVE) were used unchecked against the profile and shown nowhere."""
    from conftest import good_run
    from stagelab.core import rundir
    from stagelab.present import evidence, rederive, report

    run = good_run(tmp_path / "runs", notebooks=("04_verdict",))
    manifest = rundir.read_manifest(run)
    manifest["profile"] = "smoke"
    manifest["notebooks"][0]["parameters"] = {"delta": 0.005, "min_samples": 3,
                                              "decisive_rows": [2, 8],
                                              "decisive_models": [4096]}
    rundir.write_manifest(run, manifest)
    assert rederive.decision_changes(manifest) == ["delta 0.005 (profile smoke: 0.02)"]
    page = report.write_index(run).read_text()
    assert "changed from its profile" in page and "delta 0.005 (profile smoke: 0.02)" in page
    evidence.keep_evidence(run, tmp_path / "reference", force=True)
    results = evidence.results_markdown(tmp_path / "reference")
    assert "changed from its profile" in results and "delta 0.005" in results
    manifest["notebooks"][0]["parameters"]["delta"] = 0.02
    assert rederive.decision_changes(manifest) == []
