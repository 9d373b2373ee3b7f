"""The papermill runner: complete run folders, failures kept, timeouts, interruptions recorded,
statuses that tell the truth (dead runs, missing notebooks, corrupt manifests, a full disk)."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
from pathlib import Path

import nbformat
import pytest

from conftest import StoppedInAFinalizer, dead_pid, fake_run, start_sleepy, write_notebook
from stagelab import cli
from stagelab.core import paths, rundir, schema
from stagelab.core.errors import UserError
from stagelab.present import report
from stagelab.run import context, execute, profiles


def run_tiny(suite: dict[str, Path], profile: str, **overrides):
    plan = profiles.plan_run(profile, overrides=overrides, profiles_path=suite["profiles"],
                             notebooks_dir=suite["notebooks"])
    run_dir = rundir.new_run_dir(suite["root"], profile)
    return run_dir, execute.execute(plan, run_dir, command=["test"], progress=False)


@pytest.fixture
def tiny_paths(tiny_suite, monkeypatch):
    """Point the CLI at the tiny profiles and notebooks."""
    monkeypatch.setattr(paths, "PROFILES_FILE", tiny_suite["profiles"])
    monkeypatch.setattr(paths, "NOTEBOOKS_DIR", tiny_suite["notebooks"])
    return tiny_suite


# ------------------------------------------------------------------------- whole runs (slow)

@pytest.mark.slow
def test_run_writes_a_complete_folder_and_keeps_a_failure(tiny_suite):
    run_dir, manifest = run_tiny(tiny_suite, "tiny")
    by_name = {nb["name"]: nb for nb in manifest["notebooks"]}
    assert manifest["status"] == "failed"
    assert by_name["10_ok"]["status"] == "ok"
    assert by_name["10_ok"]["parameters"] == {"rounds": 3}
    assert by_name["20_fails"]["status"] == "failed"
    assert "RuntimeError" in by_name["20_fails"]["error"]  # the notebook's own exception
    for name in ("10_ok", "20_fails"):
        assert (run_dir / f"{name}.ipynb").exists() and (run_dir / f"{name}.html").exists()
    partial = (run_dir / "20_fails.ipynb").read_text()
    assert "partial output before the failure" in partial
    table = schema.read_table(run_dir, "ok_table")
    assert list(table["round"]) == [0, 1, 2]
    assert set(table["run_id"]) == {run_dir.name} and set(table["gb_per_s"]) == {2.0}
    on_disk = json.loads((run_dir / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(manifest, default=str))
    for key in ("run_id", "command", "profile", "hardware", "packages", "git", "created_utc",
                "finished_utc"):
        assert on_disk[key] is not None, key
    assert on_disk["cell_timeout_s"] == profiles.DEFAULT_CELL_TIMEOUT_S
    index = (run_dir / "index.html").read_text()
    assert "10_ok.html" in index and "failed" in index
    html = (run_dir / "10_ok.html").read_text()
    assert "done 3" in html and "notebook_context" not in html  # outputs shown, code hidden
    assert not list(tiny_suite["notebooks"].glob("kernel-ipc*"))  # sockets never beside notebooks
    assert not list(run_dir.glob(".*.tmp"))


@pytest.mark.slow
def test_cli_exit_code_is_nonzero_when_a_notebook_fails(tiny_paths):
    code = cli.main(["run", "--profile", "tiny", "--out", str(tiny_paths["root"]),
                     "--param", "10_ok.label=y"])
    assert code == cli.EXIT_FAILED
    (run_dir,) = tiny_paths["root"].iterdir()
    assert set(schema.read_table(run_dir, "ok_table")["arm"]) == {"y"}


@pytest.mark.serial  # a wall-time limit
@pytest.mark.slow
def test_a_cell_that_runs_too_long_times_out_and_the_next_notebook_runs(tiny_suite):
    # Before: papermill had no execution timeout, and a hung cell held the run for ever.
    run_dir, manifest = run_tiny(tiny_suite, "hangs")
    sleeps, ok = manifest["notebooks"]
    # 10 s: long enough for the ok notebook's imports (seaborn) on a loaded 2-core machine
    assert manifest["cell_timeout_s"] == 10
    assert sleeps["status"] == "failed"
    # cells of the executed notebook: parameters (0), injected parameters (1), the sleep (2)
    assert "timed out" in sleeps["error"] and "10 s" in sleeps["error"]
    assert sleeps["error"].endswith("cell 2")
    # its duration is a recorded figure, checked for sense (at least the timeout), not speed
    assert sleeps["duration_s"] >= manifest["cell_timeout_s"] and ok["status"] == "ok"
    assert manifest["status"] == "failed"


def test_the_kernel_gets_a_private_socket_folder(tmp_path):
    # Before: the IPC transport kept jupyter_client's relative default `kernel-ipc`, so every
    # kernel used the same notebooks/kernel-ipc-N files.
    manager = execute.private_kernel_manager(tmp_path)(kernel_name=execute.KERNEL_NAME)
    assert manager.transport == "ipc"
    assert Path(manager.ip).parent == tmp_path and Path(manager.connection_file).parent == tmp_path
    with execute.kernel_sockets() as folder:
        assert folder.is_dir() and folder.name.startswith("stagelab-kernel-")
        (folder / "kernel-ipc-1").write_text("")
    assert not folder.exists()  # removed afterwards, whatever it held


@pytest.mark.serial  # a process stopped on purpose
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_marks_the_run_interrupted_quietly_and_keeps_what_was_written(tiny_suite, signum):
    proc, run_dir = start_sleepy(tiny_suite)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == cli.EXIT_INTERRUPTED, err
    assert "Traceback" not in err and "zmq" not in err.lower()  # the kernel's noise stays out
    # Before: "Kernel died while waiting for execute reply." and asyncio's "Task was destroyed
    # but it is pending!" followed the interrupt; one line says it now.
    assert "Kernel died" not in err and "Task was destroyed" not in err, err
    assert err.count("interrupted") == 1, err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert [nb["status"] for nb in manifest["notebooks"]] == ["interrupted", "pending"]
    assert (run_dir / "30_sleeps.ipynb").exists() and (run_dir / "index.html").exists()
    (summary,) = rundir.list_runs(tiny_suite["root"])
    assert summary.status == "interrupted" and summary.not_delivered("interrupted") == ["30_sleeps"]
    assert summary.not_delivered("failed") == []


def _kill_orphaned_kernels(marker: Path) -> None:
    """SIGKILL leaves the run's kernel behind: end it (found by its private folder's path)."""
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(marker) in cmdline and "ipykernel" in cmdline:
            os.kill(int(proc_dir.name), signal.SIGTERM)


@pytest.mark.serial  # a process killed on purpose
@pytest.mark.slow
def test_a_killed_run_leaves_no_socket_where_another_run_looks(tiny_suite, tmp_path):
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    proc, run_dir = start_sleepy(tiny_suite, env={**os.environ, "TMPDIR": str(private_tmp)})
    # While the kernel runs, its sockets are in a private temporary folder (which also shows the
    # searches below would find socket files if there were any).
    assert list(private_tmp.glob("stagelab-kernel-*/kernel-ipc-*"))
    assert not list(tiny_suite["notebooks"].glob("kernel-ipc*"))
    proc.kill()
    proc.communicate(timeout=30)
    _kill_orphaned_kernels(private_tmp)
    assert not list(tiny_suite["notebooks"].glob("kernel-ipc*"))
    assert not list(paths.NOTEBOOKS_DIR.glob("kernel-ipc*"))
    (summary,) = rundir.list_runs(tiny_suite["root"])
    assert summary.status == "interrupted" and summary.not_delivered("interrupted") == ["30_sleeps"]


# ------------------------------------------------------------------- statuses that tell the truth

def test_a_run_whose_process_died_is_interrupted_in_runs_and_in_report(tmp_path):
    # Before: `runs` said interrupted but `report` still said running.
    run_dir = fake_run(tmp_path, status="running", pid=dead_pid())
    manifest = rundir.read_manifest(run_dir)
    manifest["notebooks"][0]["status"] = "running"
    rundir.write_manifest(run_dir, manifest)
    (summary,) = rundir.list_runs(tmp_path)
    assert summary.status == "interrupted" and summary.notebooks == (("10_ok", "interrupted"),)
    index = report.write_index(run_dir).read_text()
    assert "<span class='interrupted'>interrupted</span>" in index
    assert ">running<" not in index


def test_a_live_running_run_stays_running(tmp_path):
    run_dir = fake_run(tmp_path, status="running")  # this process: alive
    assert rundir.effective_manifest(run_dir)["status"] == "running"


def test_a_notebook_missing_from_the_folder_is_shown_missing(tmp_path, capsys):
    # Before: `report` showed a deleted notebook as ok.
    run_dir = fake_run(tmp_path, notebooks=("10_ok", "20_more"))
    (run_dir / "20_more.ipynb").unlink()
    effective = rundir.effective_manifest(run_dir)
    assert [e["status"] for e in effective["notebooks"]] == ["ok", "missing"]
    assert effective["status"] == "missing"
    assert "<td class='missing'>missing</td>" in report.write_index(run_dir).read_text()
    assert cli.main(["runs", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("missing  missing: 20_more")


def test_a_corrupt_manifest_is_rebuilt_from_the_notebooks_with_a_note(tmp_path, capsys):
    # Before: a corrupt manifest could not be rebuilt and the error gave no hint.
    run_dir = fake_run(tmp_path, notebooks=("10_ok", "20_fails", "30_cut"))
    for name, meta in (("10_ok", {"end_time": "t", "exception": None, "duration": 1.5,
                                   "parameters": {"run_dir": "x", "rounds": 3}}),
                       ("20_fails", {"end_time": "t", "exception": True}),
                       ("30_cut", {"end_time": None, "exception": None})):
        nb = nbformat.read(str(run_dir / f"{name}.ipynb"), as_version=4)
        nb.metadata["papermill"] = meta
        if name == "20_fails":
            nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="RuntimeError",
                                                          evalue="boom", traceback=[])]
        nbformat.write(nb, str(run_dir / f"{name}.ipynb"))
    (run_dir / "manifest.json").write_text('{"run_id": "trunc')
    with pytest.raises(UserError, match="rebuilds it from the folder's notebooks"):
        rundir.read_manifest(run_dir)
    assert cli.main(["report", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert any(line.startswith("note: ") and "rebuilt" in line for line in err.splitlines())
    manifest = rundir.read_manifest(run_dir)
    assert "rebuilt from the folder's notebooks" in manifest["note"]
    assert [(e["name"], e["status"]) for e in manifest["notebooks"]] == [
        ("10_ok", "ok"), ("20_fails", "failed"), ("30_cut", "interrupted")]
    assert manifest["notebooks"][0]["parameters"] == {"rounds": 3}
    assert manifest["notebooks"][1]["error"] == "RuntimeError: boom"
    assert manifest["status"] == "failed" and manifest["profile"] == "quick"
    assert (run_dir / "manifest.json.corrupt").read_text() == '{"run_id": "trunc'
    assert "rebuilt from the folder" in (run_dir / "index.html").read_text()


def test_report_refuses_a_folder_that_is_no_run(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "no readable manifest" in err and len(err.splitlines()) == 1


def test_an_interactive_folder_gets_a_manifest_and_is_listed(tmp_path, monkeypatch, capsys):
    # Before: folders made in JupyterLab (run_dir = "") had no manifest and were invisible.
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    ctx = context.notebook_context("01_d2h_staging", "")
    manifest = rundir.read_manifest(ctx.run_dir)
    assert manifest["status"] == "interactive" and manifest["profile"] == "interactive"
    assert manifest["notebooks"][0]["name"] == "01_d2h_staging"
    assert manifest["hardware"]["host"]["logical_cores"] > 0
    assert cli.main(["runs", "--root", str(tmp_path)]) == 0
    header, line = capsys.readouterr().out.strip().splitlines()
    assert header.startswith("run id") and header.endswith("status")
    assert line.startswith(ctx.run_dir.name) and line.endswith("interactive")
    assert "interactive" in report.write_index(ctx.run_dir).read_text()


def test_a_notebook_names_the_gpu_its_run_s_numbers_come_from(tmp_path):
    """The GPU of the run's manifest (a measured folder's, where the run reads one), without
    taking a snapshot; None without a GPU or a manifest."""
    ctx = context.NotebookContext("02_logprobs_step", tmp_path)
    assert ctx.gpu_name() is None  # no manifest yet
    for hardware, name in (({"gpu": {"name": "NVIDIA H200"}}, "NVIDIA H200"),
                           ({"gpu": None}, None), (None, None)):
        rundir.write_manifest(tmp_path, rundir.new_manifest(tmp_path, "quick", [], [], hardware))
        assert ctx.gpu_name() == name


def test_every_notebook_context_sets_the_suites_plot_theme(tmp_path):
    import matplotlib
    import seaborn as sns

    from stagelab.present import plots  # noqa: F401  (a notebook that plots imports it first)

    sns.set_theme(style="dark")  # what a previous notebook or a user might have left
    assert matplotlib.rcParams["axes.grid"] is False
    context.notebook_context("10_ok", tmp_path)
    assert matplotlib.rcParams["axes.grid"] is True
    assert matplotlib.rcParams["axes.facecolor"] == "white"


def test_a_given_run_dir_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        context.notebook_context("10_ok", tmp_path / "nope")


# ---------------------------------------------------------------------------- a full disk

class FullDisk:
    """``os.fdopen`` whose files refuse writes (ENOSPC) when ``full(text)`` says so."""

    def __init__(self, full) -> None:
        self.full, self.refused = full, 0
        self.real = os.fdopen

    def __call__(self, fd, *args, **kwargs):
        handle = self.real(fd, *args, **kwargs)
        disk = self

        class Handle:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                handle.close()

            def write(self, text):
                if disk.full(text):
                    disk.refused += 1
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return handle.write(text)
        return Handle()


def _fake_notebook(notebook, output, run_dir, plan, warm=None):
    write_notebook(Path(output), 'run_dir = ""', "print(1)")
    return rundir.OK, None


@pytest.fixture
def quick_tiny(tiny_paths, monkeypatch):
    """The tiny suite with notebooks 'executed' instantly (no kernel)."""
    monkeypatch.setattr(execute, "execute_notebook", _fake_notebook)
    monkeypatch.setattr(execute.WarmKernels, "start", lambda self: None)
    monkeypatch.setattr(execute.report, "export_html",
                        lambda nb, path, *_: Path(path).write_text("x"))
    return tiny_paths


def test_each_page_is_exported_once_when_the_run_ends(quick_tiny, monkeypatch):
    """Before: every page was exported after its notebook and again when the run ended."""
    exported = []
    monkeypatch.setattr(execute.report, "export_html",
                        lambda nb, path, *_: exported.append(Path(path).name)
                        or Path(path).write_text("x"))
    assert cli.main(["run", "--profile", "okonly", "--out", str(quick_tiny["root"])]) == 0
    (run_dir,) = quick_tiny["root"].iterdir()
    (entry,) = rundir.read_manifest(run_dir)["notebooks"]
    assert exported == ["10_ok.html"] and entry["phases"]["export_s"] is not None


def test_a_record_write_that_fails_once_leaves_a_failed_manifest_naming_the_cause(
        quick_tiny, monkeypatch, capsys):
    # Before: three tracebacks, a manifest stuck at running and an empty .tmp file.
    disk = FullDisk(lambda text: '"status": "ok"' in text and disk.refused == 0)
    monkeypatch.setattr(rundir.os, "fdopen", disk)
    code = cli.main(["run", "--profile", "okonly", "--out", str(quick_tiny["root"])])
    err = capsys.readouterr().err
    assert code == cli.EXIT_FAILED and disk.refused == 1
    assert "Traceback" not in err
    (error_line,) = [line for line in err.splitlines() if "error" in line]
    assert "No space left on device" in error_line
    (run_dir,) = quick_tiny["root"].iterdir()
    manifest = rundir.read_manifest(run_dir)
    assert manifest["status"] == "failed"
    assert "record" in manifest["error"] and manifest["error"].endswith(": No space left on device")
    assert manifest["notebooks"][0]["status"] == "ok"  # it did finish; the record did not
    assert "failed" in (run_dir / "index.html").read_text()
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_disk_that_stays_full_gives_one_line_and_no_temp_litter(quick_tiny, monkeypatch, capsys):
    disk = FullDisk(lambda text: '"started_utc"' in text or disk.refused > 0)
    monkeypatch.setattr(rundir.os, "fdopen", disk)
    code = cli.main(["run", "--profile", "okonly", "--out", str(quick_tiny["root"])])
    err = capsys.readouterr().err
    assert code == cli.EXIT_FAILED and disk.refused >= 2  # the record, then its failed version
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("stagelab: error:")] == [
        next(line for line in err.splitlines() if "No space left on device" in line)]
    (run_dir,) = quick_tiny["root"].iterdir()
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_run_ends_with_the_verdict_line_and_says_when_timings_are_not_trustworthy(
        quick_tiny, monkeypatch, capsys):
    # Before: the terminal never printed the verdict, nor that the machine was busy.
    def verdict_notebook(notebook, output, run_dir, plan, warm=None):
        (Path(run_dir) / "verdict.json").write_text(json.dumps({
            "overall": {"decision": "CLOSE", "summary": "any benefit is smaller than delta."},
            "parameters": {"delta": 0.02}, "decisive": [
                {"rows": 64, "vocab": 1000, "k": 5, "decision": "CLOSE", "twin_speedup": 1.3,
                 "twin_ci_low": 1.2,
                 "twin_ci_high": 1.4}]}))
        return _fake_notebook(notebook, output, run_dir, plan)

    monkeypatch.setattr(execute, "execute_notebook", verdict_notebook)
    assert cli.main(["run", "--profile", "okonly", "--out", str(quick_tiny["root"])]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2].startswith("verdict: CLOSE")
    assert out[-1].startswith("TIMINGS NOT TRUSTWORTHY") and "A/A" in out[-1] and "n=64" in out[-1]
    (run_dir,) = quick_tiny["root"].iterdir()
    load = rundir.read_manifest(run_dir)["notebooks"][0]["load"]
    assert load["busy"] in (True, False) and load["seconds"] >= 0  # the load was recorded


def test_atomic_write_keeps_the_old_file_whole_when_a_write_fails(tmp_path, monkeypatch):
    target = rundir.write_json_atomic(tmp_path / "manifest.json", {"status": "ok"})
    monkeypatch.setattr(rundir.os, "fdopen", FullDisk(lambda text: True))
    with pytest.raises(OSError, match="No space left"):
        rundir.write_json_atomic(target, {"status": "running"})
    assert json.loads(target.read_text()) == {"status": "ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


# ------------------------------------------------------------------------ folders and commands

def test_two_runs_never_share_a_folder(tmp_path):
    first = rundir.new_run_dir(tmp_path, "quick")
    second = rundir.new_run_dir(tmp_path, "quick")
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name.startswith(first.name)


@pytest.mark.parametrize("args, message", [
    (["--profile", "nope"], "unknown profile 'nope'; valid: tiny, okonly, sleepy, hangs"),
    (["--profile", "tiny", "--only", "99_x"], "unknown notebook '99_x'"),
    (["--profile", "tiny", "--param", "10_ok.nope=1"], "unknown parameter 10_ok.nope; valid: rounds, label"),
    (["--profile", "tiny", "--param", "10_ok.rounds=many"],
     "10_ok.rounds='many' is a str, expected int"),
    (["--profile", "tiny", "--param", "rounds=3"], "expected NOTEBOOK.KEY=VALUE"),
    # Before: accepted, then silently ignored.
    (["--profile", "tiny", "--param", "10_ok.run_dir=/tmp/x"], "10_ok.run_dir is set by the runner"),
    (["--profile", "tiny", "--only", "20_fails", "--param", "10_ok.rounds=3"],
     "--param for 10_ok, which --only leaves out"),
    # Before: "is a str".
    (["--profile", "tiny", "--param", "10_ok.rounds=1e9"],
     "10_ok.rounds=1000000000.0 is a float, expected int (default 2); write 1000000000"),
    (["--profile", "tiny", "--param", "10_ok.rounds=null"], "10_ok.rounds is null (None)"),
    # Before: exit 1 and a failed folder.
    (["--profile", "tiny", "--param", "10_ok.rounds=0"], "10_ok.rounds: 0 is not a positive integer"),
])
def test_bad_requests_get_one_line_errors(tiny_paths, capsys, args, message):
    code = cli.main(["run", *args, "--out", str(tiny_paths["root"])])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_USAGE
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not tiny_paths["root"].exists()  # nothing is created for a refused request


def test_a_profile_sets_its_timeouts_and_bad_ones_are_refused(tiny_suite):
    plan = profiles.plan_run("hangs", profiles_path=tiny_suite["profiles"],
                             notebooks_dir=tiny_suite["notebooks"])
    assert (plan.cell_timeout_s, plan.start_timeout_s) == (10, profiles.DEFAULT_START_TIMEOUT_S)
    bad = tiny_suite["profiles"].parent / "bad.json"
    bad.write_text('{"profiles": {"p": {"cell_timeout_s": 0, "notebooks": {"10_ok": {}}}}}')
    with pytest.raises(UserError, match="cell_timeout_s=0 must be a positive number"):
        profiles.plan_run("p", profiles_path=bad, notebooks_dir=tiny_suite["notebooks"])


def test_an_unwritable_output_folder_is_refused_in_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code = cli.main(["run", "--only", "00_environment", "--out", str(blocker / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_USAGE and f"--out {blocker / 'runs'}" in err
    assert len(err.splitlines()) == 1


@pytest.mark.slow
def test_report_command_rebuilds_html(tiny_suite, capsys):
    run_dir, _ = run_tiny(tiny_suite, "okonly")
    (run_dir / "10_ok.html").unlink()
    (run_dir / "index.html").unlink()
    assert cli.main(["report", str(run_dir)]) == 0
    assert (run_dir / "10_ok.html").exists() and (run_dir / "index.html").exists()
    assert cli.main(["runs", "--root", str(tiny_suite["root"])]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert run_dir.name in line and "okonly" in line and line.endswith("ok")


def test_the_verdict_by_hand_reads_the_newest_run_with_data_and_names_it(tmp_path):
    # Before: run by hand, notebook 04 decided on a fresh, empty folder.
    runs = tmp_path / "runs"
    with pytest.raises(FileNotFoundError, match="no run folder under .* holds data"):
        context.reading_context("04_verdict", "", root=runs)
    for name, data in (("20261130T100000Z_vm_quick", True), ("20261130T110000Z_vm_quick", True),
                       ("20261130T120000Z_vm_interactive", False)):
        (runs / name / "data").mkdir(parents=True)
        if data:
            (runs / name / "data" / "step.parquet").write_bytes(b"PAR1")
    ctx = context.reading_context("04_verdict", "", root=runs)
    assert ctx.data_dir == runs / "20261130T110000Z_vm_quick"
    (runs / "20261130T090000Z_vm_interactive" / "data").mkdir(parents=True)  # by hand, notebook 02
    (runs / "20261130T090000Z_vm_interactive" / "data" / "decisive.parquet").write_bytes(b"")
    preferred = context.reading_context("04_verdict", "", root=runs, prefer="decisive")
    assert preferred.data_dir == runs / "20261130T090000Z_vm_interactive"
    assert ctx.run_dir != ctx.data_dir and ctx.run_dir.parent == runs
    assert rundir.read_manifest(ctx.run_dir)["status"] == rundir.INTERACTIVE
    reading = ctx.reading()
    assert "`20261130T110000Z_vm_quick`" in reading and "newest" in reading and "`runs/`" in reading
    given = context.reading_context("04_verdict", str(runs / "20261130T100000Z_vm_quick"))
    assert given.data_dir == given.run_dir == runs / "20261130T100000Z_vm_quick"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowing
def test_a_stop_a_finalizer_swallowed_ends_the_run_before_the_next_notebook(quick_tiny,
                                                                             monkeypatch):
    ran = []

    def swallowing(notebook, output, run_dir, plan, warm=None):
        ran.append(notebook.name)
        StoppedInAFinalizer()  # dropped at once: its __del__ raises, and is swallowed
        return _fake_notebook(notebook, output, run_dir, plan)

    monkeypatch.setattr(execute, "execute_notebook", swallowing)
    code = cli.main(["run", "--profile", "sleepy", "--out", str(quick_tiny["root"])])
    assert code == cli.EXIT_INTERRUPTED and ran == ["30_sleeps"]
    (run_dir,) = quick_tiny["root"].iterdir()
    manifest = rundir.read_manifest(run_dir)
    assert manifest["status"] == "interrupted" and "SIGTERM" in manifest["error"]
    assert [nb["status"] for nb in manifest["notebooks"]] == ["ok", "pending"]


# ------------------------------------------------ a profile meant to decide, where it cannot

def test_a_deciding_profile_is_refused_in_one_line_where_its_decisive_arms_cannot_run(
        tmp_path, monkeypatch, capsys):
    # Before: `run --profile gate` on a CPU ran 365 s after its own preflight said no-go.
    from stagelab.measure import preflight

    monkeypatch.setattr(preflight, "check_cuda", lambda: preflight.Check(
        "cuda", preflight.NO_GO, "no CUDA device (a test)"))
    started = []
    monkeypatch.setattr(execute, "run", lambda plan, *a, **k: started.append(plan) or (
        tmp_path, {"status": "ok", "notebooks": []}))
    assert profiles.plan_run("gate").decides and not profiles.plan_run("quick").decides
    code = cli.main(["run", "--profile", "gate", "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_USAGE and not started and not (tmp_path / "runs").exists()
    assert len(err.splitlines()) == 1
    assert err.startswith("stagelab: error: profile 'gate' ") and "decisive" in err
    assert "(cuda: no CUDA device (a test))" in err  # the preflight's own reason
    assert "--rehearse-on-cpu" in err
    # asked to rehearse, it runs; a profile that does not decide never asks the preflight
    assert cli.main(["run", "--profile", "gate", "--rehearse-on-cpu", "--out",
                     str(tmp_path / "runs")]) == 0
    monkeypatch.setattr(preflight, "decisive_blockers", lambda *_: pytest.fail("asked"))
    assert cli.main(["run", "--profile", "quick", "--out", str(tmp_path / "runs")]) == 0
    assert [plan.profile for plan in started] == ["gate", "quick"]


# --------------------------------------------------------- progress in the terminal, not the HTML

def test_progress_lines_name_each_notebook_cell_and_sweep_cell_with_the_time(tmp_path, capsys):
    output = write_notebook(tmp_path / "01.ipynb", 'run_dir = ""', "x = 1")
    nb = nbformat.read(str(output), as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("end"))
    nbformat.write(nb, str(output))
    log = tmp_path / execute.KERNEL_LOG
    log.write_text("staging: cell 9/9 from an earlier notebook: 1 ok\n")
    with execute.ProgressLines("[2/5] 01_d2h_staging:", output, log, True,
                               interval_s=60) as lines:
        nb.cells[1].metadata["papermill"] = {"start_time": "2026-12-01T00:00:00"}
        nbformat.write(nb, str(output))
        with log.open("a") as kernel:
            kernel.write("staging: cell 1/2 n=1 V=4096: 6 ok, 4 unavailable\n"
                         "zmq noise: a teardown traceback\nstaging: cell 2/2 n=8 V=40")
        lines.poll()
        with log.open("a") as kernel:
            kernel.write("96: 6 ok\n")
    err = capsys.readouterr().err.splitlines()
    assert [re.sub(r" \(\d+ s\)$", "", line) for line in err] == [
        "[2/5] 01_d2h_staging: notebook cell 2/3",  # before "cell 2/3" beside sweep cells
        "[2/5] 01_d2h_staging: staging: cell 1/2 n=1 V=4096: 6 ok, 4 unavailable",
        "[2/5] 01_d2h_staging: staging: cell 2/2 n=8 V=4096: 6 ok"]
    assert all(re.search(r" \(\d+ s\)$", line) for line in err)
    with execute.ProgressLines("[1/1] x:", output, log, False):
        log.write_text("staging: cell 1/1 n=1 V=4096: 6 ok\n")  # disabled: nothing said
    assert capsys.readouterr().err == ""


def test_a_long_cell_says_it_is_still_running_at_least_every_10_s(tmp_path, capsys, monkeypatch):
    """Before: notebook 03 was silent in the terminal for 104 s while one cell ran."""
    output = write_notebook(tmp_path / "03.ipynb", 'run_dir = ""', "x = 1")
    nb = nbformat.read(str(output), as_version=4)
    nb.cells[1].metadata["papermill"] = {"start_time": "2026-12-01T00:00:00"}
    nbformat.write(nb, str(output))
    clock = [100.0]
    monkeypatch.setattr(execute.time, "perf_counter", lambda: clock[0])
    assert execute.HEARTBEAT_S < 10
    with execute.ProgressLines("[4/6] 03_prompt_logprobs:", output, tmp_path / "kernel.log", True,
                               interval_s=60) as lines:
        for _ in range(25):  # 25 s of one cell, polled each second
            clock[0] += 1
            lines.poll()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[4/6] 03_prompt_logprobs: notebook cell 2/2 (1 s)"
    assert err[1:] == ["[4/6] 03_prompt_logprobs: notebook cell 2/2 still running (10 s)",
                       "[4/6] 03_prompt_logprobs: notebook cell 2/2 still running (19 s)"]
