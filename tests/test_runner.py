"""The papermill runner: complete run folders, failures kept, interruptions recorded, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from stagelab import runs, schema

pytestmark = pytest.mark.slow


def run_tiny(suite: dict[str, Path], profile: str, **overrides):
    plans = runs.plan_run(profile, overrides=overrides, profiles_path=suite["profiles"],
                          notebooks_dir=suite["notebooks"])
    run_dir = runs.new_run_dir(suite["root"], profile)
    return run_dir, runs.execute(plans, run_dir, profile, command=["test"], progress=False)


def test_run_writes_a_complete_folder_and_keeps_a_failure(tiny_suite):
    run_dir, manifest = run_tiny(tiny_suite, "tiny")
    by_name = {nb["name"]: nb for nb in manifest["notebooks"]}
    assert manifest["status"] == "failed"
    assert by_name["10_ok"]["status"] == "ok"
    assert by_name["10_ok"]["parameters"] == {"repeats": 3}
    assert by_name["20_fails"]["status"] == "failed"
    assert "RuntimeError: deliberate failure for the test" in by_name["20_fails"]["error"]
    for name in ("10_ok", "20_fails"):
        assert (run_dir / f"{name}.ipynb").exists() and (run_dir / f"{name}.html").exists()
    partial = (run_dir / "20_fails.ipynb").read_text()
    assert "partial output before the failure" in partial
    table = schema.read_table(run_dir, "ok_table")
    assert list(table["repeat"]) == [0, 1, 2]
    assert set(table["run_id"]) == {run_dir.name} and set(table["gb_per_s"]) == {2.0}
    on_disk = json.loads((run_dir / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(manifest, default=str))
    for key in ("run_id", "command", "profile", "hardware", "packages", "git", "created_utc",
                "finished_utc"):
        assert on_disk[key] is not None, key
    index = (run_dir / "index.html").read_text()
    assert "10_ok.html" in index and "failed" in index
    html = (run_dir / "10_ok.html").read_text()
    assert "done 3" in html and "notebook_context" not in html  # outputs shown, code hidden


@pytest.fixture
def tiny_paths(tiny_suite, monkeypatch):
    """Point the CLI at the tiny profiles and notebooks."""
    from stagelab import paths

    monkeypatch.setattr(paths, "PROFILES_FILE", tiny_suite["profiles"])
    monkeypatch.setattr(paths, "NOTEBOOKS_DIR", tiny_suite["notebooks"])
    return tiny_suite


def test_cli_exit_code_is_nonzero_when_a_notebook_fails(tiny_paths):
    from stagelab import cli

    tiny_suite = tiny_paths
    code = cli.main(["run", "--profile", "tiny", "--out", str(tiny_suite["root"]),
                     "--param", "10_ok.label=y"])
    assert code == cli.EXIT_FAILED
    (run_dir,) = tiny_suite["root"].iterdir()
    assert set(schema.read_table(run_dir, "ok_table")["arm"]) == {"y"}


def test_two_runs_never_share_a_folder(tmp_path):
    first = runs.new_run_dir(tmp_path, "quick")
    second = runs.new_run_dir(tmp_path, "quick")
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name.startswith(first.name)


@pytest.mark.parametrize("args, message", [
    (["--profile", "nope"], "unknown profile 'nope'; valid: tiny, okonly, sleepy"),
    (["--profile", "tiny", "--only", "99_x"], "unknown notebook '99_x'"),
    (["--profile", "tiny", "--param", "10_ok.nope=1"], "unknown parameter 10_ok.nope; valid: repeats, label"),
    (["--profile", "tiny", "--param", "10_ok.repeats=many"], "10_ok.repeats='many' is a str, expected int"),
    (["--profile", "tiny", "--param", "repeats=3"], "expected NOTEBOOK.KEY=VALUE"),
])
def test_bad_requests_get_one_line_errors(tiny_paths, capsys, args, message):
    from stagelab import cli

    tiny_suite = tiny_paths
    code = cli.main(["run", *args, "--out", str(tiny_suite["root"])])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_USAGE
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not tiny_suite["root"].exists()  # nothing is created for a refused request


def test_an_unwritable_output_folder_is_refused_in_one_line(tmp_path, capsys):
    from stagelab import cli

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code = cli.main(["run", "--only", "00_environment", "--out", str(blocker / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_USAGE and f"--out {blocker / 'runs'}" in err
    assert len(err.splitlines()) == 1


def test_sigterm_marks_the_run_interrupted_and_keeps_what_was_written(tiny_suite):
    script = (
        "import sys; from pathlib import Path; from stagelab import runs\n"
        f"plans = runs.plan_run('sleepy', profiles_path=Path({str(tiny_suite['profiles'])!r}),"
        f" notebooks_dir=Path({str(tiny_suite['notebooks'])!r}))\n"
        f"d = runs.new_run_dir(Path({str(tiny_suite['root'])!r}), 'sleepy')\n"
        "print(d, flush=True)\n"
        "m = runs.execute(plans, d, 'sleepy', progress=False)\n"
        "sys.exit(130 if m['status'] == 'interrupted' else 0)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    run_dir = Path(proc.stdout.readline().strip())
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until the sleeping notebook has started its cell
        partial = run_dir / "30_sleeps.ipynb"
        if partial.exists() and "sleeping" in partial.read_text():
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert [nb["status"] for nb in manifest["notebooks"]] == ["interrupted", "pending"]
    assert (run_dir / "30_sleeps.ipynb").exists() and (run_dir / "index.html").exists()
    assert runs.list_runs(tiny_suite["root"])[0]["status"] == "interrupted"


def test_a_run_whose_process_died_lists_as_interrupted(tmp_path):
    run_dir = runs.new_run_dir(tmp_path, "quick")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    runs.write_manifest(run_dir, {"run_id": run_dir.name, "status": "running", "pid": dead.pid,
                                  "host": os.uname().nodename, "notebooks": []})
    assert runs.list_runs(tmp_path)[0]["status"] == "interrupted"


def test_report_command_rebuilds_html(tiny_suite, capsys):
    from stagelab import cli

    run_dir, _ = run_tiny(tiny_suite, "okonly")
    (run_dir / "10_ok.html").unlink()
    (run_dir / "index.html").unlink()
    assert cli.main(["report", str(run_dir)]) == 0
    assert (run_dir / "10_ok.html").exists() and (run_dir / "index.html").exists()
    assert cli.main(["report", str(tiny_suite["root"])]) == cli.EXIT_USAGE
    assert "no manifest" in capsys.readouterr().err


def test_runs_command_lists_folders(tiny_suite, capsys):
    from stagelab import cli

    run_dir, _ = run_tiny(tiny_suite, "okonly")
    assert cli.main(["runs", "--root", str(tiny_suite["root"])]) == 0
    line = capsys.readouterr().out.strip()
    assert run_dir.name in line and "okonly" in line and line.endswith("ok")


def test_keep_copies_evidence_once(tiny_suite, tmp_path):
    run_dir, _ = run_tiny(tiny_suite, "okonly")
    dest = runs.keep_evidence(run_dir, tmp_path / "reference")
    assert dest.parent.parent == tmp_path / "reference" and dest.name == run_dir.name
    for name in ("manifest.json", "index.html", "10_ok.html", "10_ok.ipynb",
                 "data/ok_table.parquet"):
        assert (dest / name).exists(), name
    with pytest.raises(runs.UserError, match="never overwritten"):
        runs.keep_evidence(run_dir, tmp_path / "reference")

