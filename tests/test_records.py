"""Records that survive their users (issue 22): written whole with the umask's permissions, read
with their shapes checked, placed by names from the file system, never overwritten by an output
that did not make them, kept only as regular, valid files, and closed on every way out."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest

from conftest import fake_run, good_run, make_run, start_sleepy, tiny_cli, write_notebook
from stagelab import cli
from stagelab.analyse import verdict as verdict_module
from stagelab.analyse import verdict_decision
from stagelab.core import paths, records, rundir, schema
from stagelab.core.errors import BadRecord, UserError
from stagelab.core.records import RunFolder
from stagelab.present import evidence, report
from stagelab.run import execute, profiles

# keep re-derives a run's verdict from its tables; these runs' tables are stubs
pytestmark = pytest.mark.usefixtures("verdict_as_recorded")

KEPT_CPU_RUN = paths.REFERENCE_DIR / "cpu-Intel-Xeon-Processor" / "20261130T141659Z_vm_quick"


@pytest.fixture
def reference(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "reference"
    monkeypatch.setattr(paths, "REFERENCE_DIR", root)
    return root


# ------------------------------------------------------------------------- written whole

def test_record_files_get_the_umask_permissions_not_0600(tmp_path):
    # Before: every record was created 0600 (mkstemp), unreadable to the group that reviews it.
    previous = os.umask(0o027)
    try:
        written = [records.write_json_atomic(tmp_path / "manifest.json", {"status": "ok"}),
                   records.write_text_atomic(tmp_path / "index.html", "<html></html>"),
                   schema.write_table(schema.make_rows([{"experiment": "e", "arm": "a",
                                                         "seconds": 1.0, "round": 0}]),
                                      tmp_path, "t")]
    finally:
        os.umask(previous)
    assert [stat.S_IMODE(p.stat().st_mode) for p in written] == [0o640] * 3
    assert records.umask() == previous


def test_an_html_export_is_atomic(tmp_path, monkeypatch):
    # Before: a full disk left a 0-byte HTML file in place of the old one.
    target = records.write_text_atomic(tmp_path / "01.html", "old report")
    real = os.fdopen

    def full_disk(fd, *args, **kwargs):
        handle = real(fd, *args, **kwargs)
        handle.write = lambda data: (_ for _ in ()).throw(OSError(28, "No space left on device"))
        return handle
    monkeypatch.setattr(records.os, "fdopen", full_disk)
    notebook = write_notebook(tmp_path / "01.ipynb", 'run_dir = ""', "print(1)")
    with pytest.raises(OSError, match="No space left"):
        report.export_html(notebook, target)
    assert target.read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01.html", "01.ipynb"]


# ----------------------------------------------------------------------- shapes, documented

def test_the_record_schemas_are_json_schema_and_the_kept_records_follow_them():
    for kind in ("manifest", "verdict", "kept"):
        jsonschema.Draft202012Validator.check_schema(records.schema(kind))
    for folder in sorted(KEPT_CPU_RUN.parent.iterdir()):
        for kind in ("manifest", "verdict", "kept"):
            path = folder / f"{kind}.json"
            if path.exists():
                records.load_record(path, kind)
                jsonschema.validate(json.loads(path.read_text()), records.schema(kind))


def test_a_real_verdict_follows_its_documented_schema(tmp_path):
    # A verdict built now from the kept CPU run's measured tables, as notebook 04 builds it.
    run_dir = tmp_path / KEPT_CPU_RUN.name
    shutil.copytree(KEPT_CPU_RUN / "data", run_dir / "data")
    shutil.copy(KEPT_CPU_RUN / "manifest.json", run_dir / "manifest.json")
    built = verdict_module.build_verdict(
        run_dir, decisive_rows=[16, 64], decisive_vocabs=[152064], decisive_ks=[5],
        rule=verdict_decision.Rule(min_samples=10), reference_root=paths.REFERENCE_DIR,
        calibration_trials=20)
    written = RunFolder(run_dir).write_json("verdict.json", built)
    payload = json.loads(written.read_text())
    documented = records.schema("verdict")["properties"]
    assert set(payload) <= set(documented), f"undocumented: {set(payload) - set(documented)}"
    assert RunFolder(run_dir).read_verdict() == payload
    jsonschema.validate(payload, records.schema("verdict"))
    cell_fields = documented["decisive"]["items"]["properties"]
    assert payload["decisive"] and all(set(c) <= set(cell_fields) for c in payload["decisive"])
    payload["decisive"][0]["decision"] = "MAYBE"
    RunFolder(run_dir).write_json("verdict.json", payload)
    with pytest.raises(BadRecord, match=r"verdict.json: not a valid verdict record: "
                       r"decisive\[0\].decision is 'MAYBE'"):
        RunFolder(run_dir).read_verdict()


def test_a_wrong_shaped_manifest_is_one_unreadable_row_among_good_ones(tmp_path, capsys):
    # Before: one such manifest broke `stagelab runs` for every run, with a traceback.
    good = [fake_run(tmp_path) for _ in range(2)]
    bad = fake_run(tmp_path)
    (bad / "manifest.json").write_text(json.dumps({"run_id": 3, "status": "ok",
                                                   "notebooks": "all of them"}))
    assert cli.main(["runs", "--root", str(tmp_path)]) == cli.EXIT_OK
    header, *lines = capsys.readouterr().out.strip().splitlines()
    assert header.split() == ["run", "id", "profile", "started", "(UTC)", "device", "trust",
                              "status"]
    assert len(lines) == 3
    assert [line.split()[0] for line in lines if line.endswith("ok")] == [g.name for g in good]
    (row,) = [line for line in lines if line.startswith(bad.name)]
    assert "unreadable manifest" in row and "run_id is int, not string" in row
    for command in (["report", str(bad)], ["report", str(bad), "--single-file"],
                    ["keep", str(bad)]):
        assert cli.main(command) == cli.EXIT_USAGE
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(bad / "manifest.json") in err
        assert "Traceback" not in err
    assert cli.main(["compare", str(bad), str(make_run(tmp_path, "C_ok")),
                     "--out", str(tmp_path / "cmp.html")]) == cli.EXIT_OK
    assert f"{bad.name}: {bad / 'manifest.json'}: not a valid manifest" in capsys.readouterr().err


# ------------------------------------------------------------------ paths from the file system

@pytest.mark.parametrize("field, value", [("name", "../../outside"), ("html", "../outside.html"),
                                          ("output", "/tmp/elsewhere.ipynb"), ("name", "..")])
def test_a_traversal_manifest_writes_nothing_outside_its_folder(tmp_path, capsys, field, value):
    # Before: a notebook name or run id in the manifest made `report` write HTML anywhere.
    run_dir = fake_run(tmp_path / "runs")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["notebooks"][0][field] = value
    manifest["run_id"] = "../../../run"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    before = sorted(tmp_path.rglob("*"))
    assert cli.main(["report", str(run_dir), "--single-file"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "is not a plain" in err or "not a valid manifest" in err
    assert sorted(tmp_path.rglob("*")) == before
    assert rundir.summarize(run_dir).status == rundir.UNREADABLE


def test_a_linked_notebook_is_never_exported_or_embedded(tmp_path):
    outside = write_notebook(tmp_path / "outside.ipynb", 'run_dir = ""', "print('not this run')")
    run_dir = fake_run(tmp_path / "runs", notebooks=("10_ok", "20_link"))
    (run_dir / "20_link.ipynb").unlink()
    (run_dir / "20_link.ipynb").symlink_to(outside)
    entry = {"name": "20_link", "output": "20_link.ipynb", "html": None}
    execute.export_html(run_dir, entry)
    assert entry["html"] is None and not (run_dir / "20_link.html").exists()
    page = report.write_single_file(run_dir).read_text()
    assert "notebook-10_ok" in page and "not this run" not in page


def test_html_names_come_from_the_notebook_files_found(tmp_path):
    run_dir = fake_run(tmp_path)
    entry = {"name": "10_ok", "output": "10_ok.ipynb", "html": "somewhere-else.html"}
    execute.export_html(run_dir, entry)
    assert entry["html"] == "10_ok.html" and (run_dir / "10_ok.html").is_file()
    assert not (run_dir / "somewhere-else.html").exists()


def test_records_refuse_names_that_are_paths():
    for name in ("..", ".", "", "a/b", "..\\x", ".hidden", "x\x00y", 7):
        with pytest.raises(BadRecord, match="is not a plain file name"):
            records.plain_name(name, "notebook name", "manifest.json")
    assert records.plain_name("01_d2h_staging", "notebook name", "m") == "01_d2h_staging"


def test_keep_never_writes_outside_the_reference_folder(tmp_path, reference):
    # Before: a GPU name of `..` made keep write outside data/reference/.
    run_dir = good_run(tmp_path / "runs", hardware={"gpu": {"name": ".."}})
    dest = evidence.keep_evidence(run_dir)
    assert dest == reference / "gpu" / run_dir.name and dest.is_dir()
    assert evidence.machine_slug({"hardware": {"gpu": {"name": "../../etc"}}}) == "etc"


def test_keep_refuses_a_symlink_even_forced(tmp_path, reference, capsys):
    # Before: a link to /etc/shadow was copied into data/reference as a regular file.
    secret = tmp_path / "secret.txt"
    secret.write_text("not evidence")
    run_dir = good_run(tmp_path / "runs")
    (run_dir / "shadow.json").symlink_to(secret)
    for force in ([], ["--force"]):
        assert cli.main(["keep", str(run_dir), *force]) == cli.EXIT_USAGE
        err = capsys.readouterr().err.strip()
        assert "shadow.json is a symbolic link" in err and len(err.splitlines()) == 1
    assert not reference.exists() or not list(reference.rglob("*.json"))


def _ran_ok(run_dir: Path, *notebooks: str) -> None:
    """Record these notebooks as run ok (their files written), whatever tables exist."""
    for name in notebooks:
        write_notebook(run_dir / f"{name}.ipynb", 'run_dir = ""', "print(1)")
    rundir.write_manifest(run_dir, {**rundir.read_manifest(run_dir), "notebooks": [
        rundir.notebook_entry(name, status="ok") for name in notebooks]})


@pytest.mark.parametrize("damage, message", [
    (lambda run: (run / "data" / "staging.parquet").write_bytes(b"PAR1 garbage"),
     "staging.parquet: cannot be read as a parquet table"),
    (lambda run: (run / "verdict.json").write_text('{"overall": {"decision": 3}}'),
     "verdict.json: not a valid verdict record: overall.decision is 3"),
    (lambda run: (run / "verdict.json").write_text('["PORT"]'),
     "verdict.json: not a valid verdict record: the document is list, not object"),
    (lambda run: _ran_ok(run, "01_d2h_staging", "02_logprobs_step"),
     "data/step.parquet is missing, although 02_logprobs_step is recorded ok"),
])
def test_keep_refuses_damaged_evidence_even_forced(tmp_path, reference, capsys, damage, message):
    # Before: missing or garbage tables and wrong-typed verdicts were kept as ok evidence.
    run_dir = good_run(tmp_path / "runs")
    damage(run_dir)
    assert cli.main(["keep", str(run_dir), "--force"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not list(reference.glob("*/*"))


def test_concurrent_keeps_leave_one_whole_copy_and_never_touch_each_others_staging(
        tmp_path, reference, monkeypatch):
    # Before: two keeps of one run deleted each other's staging folder.
    run_dir = good_run(tmp_path / "runs")
    leftover = reference / "NVIDIA-H200" / f".incoming-{run_dir.name}"
    leftover.mkdir(parents=True)  # a keep killed mid-copy
    (leftover / "verdict.json").write_text('{"overall": {"decision": "PORT"}}')
    real_copy, inner = evidence._copy_evidence, []

    def copy_while_another_keep_runs(source, files, staging, verdict):
        real_copy(source, files, staging, verdict)
        if not inner:
            inner.append(None)
            inner[0] = evidence.keep_evidence(run_dir)  # the other keep, meanwhile
    monkeypatch.setattr(evidence, "_copy_evidence", copy_while_another_keep_runs)
    with pytest.raises(UserError, match="kept meanwhile by another process"):
        evidence.keep_evidence(run_dir)
    (dest,) = inner
    assert (dest / "kept.json").is_file() and (dest / "data" / "staging.parquet").is_file()
    assert sorted(p.name for p in dest.parent.iterdir()) == [leftover.name, run_dir.name]
    assert (leftover / "verdict.json").exists()  # another keep's leftovers are not its to delete
    index = (reference / "index.html").read_text()
    assert f".incoming-{run_dir.name}: a hidden folder" in index
    assert [r.path for r in evidence.kept_runs(reference)] == [f"NVIDIA-H200/{run_dir.name}"]


# ------------------------------------------------------------- outputs never overwrite records

def test_compare_out_never_replaces_what_it_did_not_make(tmp_path, capsys):
    # Before: `compare --out` overwrote any file, a run's own manifest.json included.
    run = make_run(tmp_path, "A_cpu")
    manifest = (run / "manifest.json").read_bytes()
    notes = tmp_path / "notes.html"
    notes.write_text("my notes")
    for out, force in ((run / "manifest.json", []), (run / "manifest.json", ["--force"]),
                       (notes, [])):
        assert cli.main(["compare", str(run), "--out", str(out), *force]) == cli.EXIT_USAGE
        err = capsys.readouterr().err.strip()
        assert f"--out {out}" in err and len(err.splitlines()) == 1
    assert (run / "manifest.json").read_bytes() == manifest and notes.read_text() == "my notes"
    page = tmp_path / "page.html"
    assert cli.main(["compare", str(run), "--out", str(page)]) == cli.EXIT_OK
    assert cli.main(["compare", str(run), "--out", str(page)]) == cli.EXIT_OK  # its own output
    assert cli.main(["compare", str(run), "--out", str(notes), "--force"]) == cli.EXIT_OK
    assert records.generator_tag("stagelab compare") in notes.read_text()


def test_single_file_out_never_replaces_what_it_did_not_make(tmp_path, capsys):
    # Before: `report --single-file --out` overwrote any file.
    run_dir = fake_run(tmp_path / "runs")
    verdict = run_dir / "verdict.json"
    verdict.write_text('{"overall": {"decision": "CLOSE"}}')
    other = tmp_path / "other.html"
    other.write_text("someone's page")
    for out, force in ((verdict, ["--force"]), (other, []), (run_dir / "10_ok.ipynb", [])):
        assert cli.main(["report", str(run_dir), "--single-file", "--out", str(out),
                         *force]) == cli.EXIT_USAGE
        assert f"--out {out}" in capsys.readouterr().err
    assert verdict.read_text() == '{"overall": {"decision": "CLOSE"}}'
    assert other.read_text() == "someone's page" and not (run_dir / "10_ok.html").exists()
    assert cli.main(["report", str(run_dir), "--single-file", "--out", str(other),
                     "--force"]) == cli.EXIT_OK
    assert cli.main(["report", str(run_dir), "--single-file", "--out", str(other)]) == cli.EXIT_OK


def test_report_refuses_a_folder_of_plain_notebooks_and_writes_nothing(tmp_path, capsys):
    # Before: `report notebooks` wrote a manifest and HTML into the notebooks folder.
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_notebook(folder / "01.ipynb", 'run_dir = ""', "print(1)")
    assert cli.main(["report", str(folder)]) == cli.EXIT_USAGE
    assert "no notebook executed by papermill" in capsys.readouterr().err
    assert [p.name for p in folder.iterdir()] == ["01.ipynb"]


# ------------------------------------------------------------------- one writer, every way out

def test_report_refuses_a_live_run_and_never_rolls_its_status_back(tmp_path, capsys):
    run_dir = fake_run(tmp_path, status="running")  # this process: alive
    before = (run_dir / "manifest.json").read_bytes()
    assert cli.main(["report", str(run_dir)]) == cli.EXIT_USAGE
    assert "the run is still running" in capsys.readouterr().err
    with RunFolder(run_dir).locked():  # a runner holds its folder's lock
        assert cli.main(["report", str(run_dir)]) == cli.EXIT_USAGE
        assert "another stagelab process" in capsys.readouterr().err
    assert (run_dir / "manifest.json").read_bytes() == before
    brought_back = fake_run(tmp_path, status="running")  # from a GPU node, where it died
    rundir.write_manifest(brought_back, {**rundir.read_manifest(brought_back), "host": "gpu-node"})
    assert cli.main(["report", str(brought_back)]) == cli.EXIT_OK


@pytest.mark.serial  # a race with a live run
@pytest.mark.slow
def test_report_during_a_real_run_leaves_the_runs_final_state(tiny_suite):
    # Before: `report` during a run overwrote the run's final save: `running` after exit 0.
    proc, run_dir = start_sleepy(tiny_suite)
    report_cmd = tiny_cli(tiny_suite, "report", str(run_dir), "--single-file")
    during = subprocess.run(report_cmd, capture_output=True, text=True, timeout=120)
    assert during.returncode == cli.EXIT_USAGE, during.stderr
    assert "another stagelab process" in during.stderr
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=90)
    assert proc.returncode == cli.EXIT_INTERRUPTED
    final = rundir.read_manifest(run_dir)
    assert final["status"] == "interrupted" and final["finished_utc"]
    after = subprocess.run(report_cmd, capture_output=True, text=True, timeout=120)
    assert after.returncode == cli.EXIT_OK, after.stderr
    manifest = rundir.read_manifest(run_dir)
    assert (manifest["status"], manifest["finished_utc"]) == ("interrupted", final["finished_utc"])
    assert [e["status"] for e in manifest["notebooks"]] == ["interrupted", "pending"]


@pytest.mark.serial  # a process stopped on purpose
@pytest.mark.slow
def test_sighup_ends_the_record_like_sigterm_and_removes_the_socket_folder(tiny_suite, tmp_path):
    # Before: a closed terminal left the run `running`, no HTML and its socket folder behind.
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    proc, run_dir = start_sleepy(tiny_suite, env={**os.environ, "TMPDIR": str(private_tmp)})
    assert list(private_tmp.glob("stagelab-kernel-*"))
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == cli.EXIT_INTERRUPTED, err
    manifest = rundir.read_manifest(run_dir)
    assert manifest["status"] == "interrupted" and "SIGHUP" in manifest["notebooks"][0]["error"]
    assert (run_dir / "30_sleeps.html").is_file()
    assert not list(private_tmp.glob("stagelab-kernel-*"))


@pytest.mark.serial  # a process stopped on purpose
@pytest.mark.slow
def test_a_second_ctrl_c_does_not_abandon_the_record(tiny_suite, tmp_path):
    # Before: a second Ctrl-C during the cleanup left the run `running`, without HTML.
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    proc, run_dir = start_sleepy(tiny_suite, env={**os.environ, "TMPDIR": str(private_tmp)})
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    # The second signal may land after the record is closed: once main has returned, the
    # command ends at once with its status (stops.end_quietly); in the interpreter's last
    # moments, its handlers gone, by SIGINT. The record is whole either way.
    closed_first = proc.returncode == -signal.SIGINT and err.rstrip().endswith(
        "run interrupted; what was produced is kept")
    assert proc.returncode == cli.EXIT_INTERRUPTED or closed_first, err
    assert "Traceback" not in err
    manifest = rundir.read_manifest(run_dir)
    assert manifest["status"] == "interrupted" and manifest["finished_utc"]
    assert [e["status"] for e in manifest["notebooks"]] == ["interrupted", "pending"]
    assert (run_dir / "30_sleeps.html").is_file() and (run_dir / "index.html").is_file()
    assert not list(private_tmp.glob("stagelab-kernel-*"))



@pytest.mark.serial  # a process stopped on purpose
@pytest.mark.slow
def test_a_ctrl_c_after_the_record_is_closed_ends_the_command_without_a_traceback(tiny_suite):
    # Before: one landing in torch's finalizer at exit printed a traceback (CI, stop 58).
    proc, run_dir = start_sleepy(tiny_suite)
    proc.send_signal(signal.SIGINT)
    said = ""
    for said in proc.stderr:  # the record is closed once the command says so
        if "run interrupted; what was produced is kept" in said:
            proc.send_signal(signal.SIGINT)
            break
    assert "run interrupted" in said
    rest = proc.stderr.read()
    # Landing before main returned, it is main's interrupt; in the interpreter's last moments,
    # its handlers gone, it ends by SIGINT: never a traceback.
    assert proc.wait(timeout=90) in (cli.EXIT_INTERRUPTED, -signal.SIGINT)
    assert rest in ("", "stagelab: interrupted\n")
    assert rundir.read_manifest(run_dir)["status"] == "interrupted"

def test_an_interrupt_in_the_first_milliseconds_leaves_a_listed_interrupted_run(
        tiny_suite, monkeypatch):
    # Before: Ctrl-C between the folder and its first manifest left an unlisted folder.
    plan = profiles.plan_run("okonly", profiles_path=tiny_suite["profiles"],
                             notebooks_dir=tiny_suite["notebooks"])
    real_new_run_dir = rundir.new_run_dir

    def interrupted_at_once(root, profile):
        folder = real_new_run_dir(root, profile)
        os.kill(os.getpid(), signal.SIGINT)  # arrives before the manifest exists
        return folder
    monkeypatch.setattr(rundir, "new_run_dir", interrupted_at_once)
    run_dir, manifest = execute.run(plan, tiny_suite["root"], command=["test"], progress=False)
    assert manifest["status"] == "interrupted"
    (summary,) = rundir.list_runs(tiny_suite["root"])
    assert (summary.run_id, summary.status) == (run_dir.name, "interrupted")
    assert [e["status"] for e in rundir.read_manifest(run_dir)["notebooks"]] == ["pending"]


def test_a_run_that_measured_nothing_says_so_and_exits_1(tiny_suite, monkeypatch, capsys):
    # Before: an all-skipped run reported ok, exit 0, with no hint.
    def all_skipped(notebook, output, run_dir, plan, warm=None):
        write_notebook(Path(output), 'run_dir = ""', "print(1)")
        schema.write_table(schema.make_rows([
            {"experiment": "e", "arm": "a", "round": r, "status": "skipped",
             "note": "does not fit"} for r in range(3)]), run_dir, "t")
        return rundir.OK, None
    monkeypatch.setattr(execute, "execute_notebook", all_skipped)
    monkeypatch.setattr(execute.report, "export_html", lambda nb, path: Path(path).write_text("x"))
    monkeypatch.setattr(paths, "PROFILES_FILE", tiny_suite["profiles"])
    monkeypatch.setattr(paths, "NOTEBOOKS_DIR", tiny_suite["notebooks"])
    assert cli.main(["run", "--profile", "okonly", "--out", str(tiny_suite["root"])]) == 1
    assert "run nothing measured (3 skipped)" in capsys.readouterr().err
    (run_dir,) = tiny_suite["root"].iterdir()
    manifest = rundir.read_manifest(run_dir)
    assert manifest["status"] == "unmeasured" and manifest["measured"] == {"skipped": 3}


def test_a_sub_second_timeout_rounds_up_and_never_means_no_limit(tiny_suite):
    # Before: 0.5 s became 0, which papermill reads as no timeout (a cell ran 10 minutes).
    quick = tiny_suite["profiles"].parent / "quick.json"
    quick.write_text('{"profiles": {"p": {"cell_timeout_s": 0.5, "notebooks": {"10_ok": {}}}}}')
    plan = profiles.plan_run("p", profiles_path=quick, notebooks_dir=tiny_suite["notebooks"])
    assert plan.cell_timeout_s == 1


@pytest.mark.parametrize("body, message", [
    ('{"p": ["10_ok"]}', "profile 'p' is a list; it must map 'notebooks'"),
    ('{"p": {"notebooks": ["10_ok"]}}', "profile 'p': 'notebooks' is a list"),
    ('{"p": {"notebooks": {"10_ok": 3}}}', "profile 'p': the parameters of 10_ok are an int"),
])
def test_a_badly_shaped_profile_is_one_line(tiny_suite, body, message):
    bad = tiny_suite["profiles"].parent / "bad.json"
    bad.write_text('{"profiles": ' + body + "}")
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        profiles.plan_run("p", profiles_path=bad, notebooks_dir=tiny_suite["notebooks"])


def test_the_readme_exit_codes_are_the_cli_s():
    text = " ".join((paths.REPO_ROOT / "README.md").read_text().split())
    for words in (f"exits **{cli.EXIT_OK}** when every notebook is ok",
                  f"**{cli.EXIT_FAILED}** when a notebook failed, when nothing was measured",
                  f"**{cli.EXIT_USAGE}** for a bad request",
                  f"**{cli.EXIT_INTERRUPTED}** when interrupted (Ctrl-C, SIGTERM or SIGHUP;"):
        assert words in text, words


def test_only_a_tracked_change_makes_a_run_uncommitted(tmp_path):
    """Before: any untracked file (a scratch notebook, a run folder) made every report say
    "(uncommitted changes)"; only a change to a tracked file does now."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "tracked.txt").write_text("one\n")
    git("add", "tracked.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "untracked.ipynb").write_text("{}")
    assert rundir.git_state(tmp_path)["dirty"] is False
    (tmp_path / "tracked.txt").write_text("two\n")
    assert rundir.git_state(tmp_path)["dirty"] is True
