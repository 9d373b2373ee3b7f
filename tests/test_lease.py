"""One short GPU lease that cannot be wasted (issue 28): the measured folder always comes back
(compressed rows, no file over 16 MiB, at most 8 files, not too deep), a GPU is required
whatever ``--force`` says, the source is named without git, and a rehearsal is never evidence."""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import torch_alone
from stagelab import cli
from stagelab.core import measured as measured_folder
from stagelab.core import paths, provenance, records, rundir, schema
from stagelab.core.errors import RowsFileFull, UserError
from stagelab.measure import forecast
from stagelab.present import evidence
from stagelab.run import measure_command, profiles, replay

REPO = paths.REPO_ROOT
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU outcome needs no CUDA")
has_git = pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                             reason="matching a tree id to a commit needs git and the history")


def cell_rows(cell: int, count: int) -> list[dict]:
    return [{"experiment": "step", "arm": "fused", "round": i, "seconds": 1e-3 * (i + 1),
             "rows": cell, "vocab": 8} for i in range(count)]


# ------------------------------------------------------------------------ compressed rows

def test_a_cut_gzip_member_leaves_every_whole_cell_readable(tmp_path):
    path = tmp_path / "step.jsonl.gz"
    sink = schema.GzipJsonLinesSink(path, run_id="r", notebook="02_logprobs_step")
    sink.append(cell_rows(1, 3))
    sink.append(cell_rows(2, 4))
    whole = path.stat().st_size
    sink.append(cell_rows(3, 5))
    data = path.read_bytes()
    path.write_bytes(data[:whole + (len(data) - whole) // 2])  # killed inside the third write
    rows = schema.read_json_lines(path)
    assert [row["rows"] for row in rows] == [1] * 3 + [2] * 4
    assert rows[0]["run_id"] == "r" and len(rows[0]) == len(schema.COLUMNS)


def test_plain_and_compressed_rows_read_the_same(tmp_path):
    plain = schema.JsonLinesSink(tmp_path / "a.jsonl", run_id="r")
    packed = schema.GzipJsonLinesSink(tmp_path / "a.jsonl.gz", run_id="r")
    for cell in (1, 2):
        plain.append(cell_rows(cell, 3))
        packed.append(cell_rows(cell, 3))
    assert schema.read_json_lines(plain.path) == schema.read_json_lines(packed.path)
    assert packed.path.stat().st_size < plain.path.stat().st_size


def test_a_full_rows_file_rolls_over_once_allowed_and_otherwise_stops_untouched(tmp_path):
    budget = measure_command.file_budget(1)
    sink = schema.GzipJsonLinesSink(tmp_path / "step.jsonl.gz", 800, budget)
    sink.append(cell_rows(1, 2))
    first = sink.path.read_bytes()
    sink.append(cell_rows(2, 40))  # too much for the first file: the spare file takes it
    assert sink.path.read_bytes() == first
    assert (tmp_path / "step.2.jsonl.gz").is_file() and sink.parts == 2
    before = (tmp_path / "step.2.jsonl.gz").read_bytes()
    with pytest.raises(RowsFileFull, match="would pass 800 B .* no other file may take it"):
        sink.append(cell_rows(3, 200))  # and no spare left: refused, nothing written
    assert (tmp_path / "step.2.jsonl.gz").read_bytes() == before
    folder = tmp_path / "measured"
    (folder / "rows").mkdir(parents=True)
    for name in ("step.jsonl.gz", "step.2.jsonl.gz"):
        shutil.copy(tmp_path / name, folder / "rows" / name)
    assert [r["rows"] for r in measured_folder.MeasuredFolder(folder).table_rows("step")] == [1] * 2 + [2] * 40


def full_profile_step_rows(cell, rounds: int, rng: random.Random) -> list[dict]:
    """As many rows as the estimate's upper bound for one step cell of ``full``, shaped as a GPU
    writes them: every stage timed by CUDA events, the total also by the host clock, the copy
    with its bytes (the entropy is in the 17-digit timings)."""
    stages = ("total", "device", "alloc", "copy", "host_gather", "free")
    count = measure_command.estimate.cell_rows("step", cell.arms, rounds)
    rows = []
    for i in range(count):
        seconds, stage = rng.lognormvariate(-6, 0.4), stages[i % len(stages)]
        row = {"experiment": "step", "arm": cell.arms[i % len(cell.arms)], "stage": stage,
               "device": "cuda:0 NVIDIA H200", "model": cell.sizes.get("model") or "",
               "rows": cell.sizes["rows"], "vocab": cell.sizes["vocab"],
               "k": cell.sizes.get("k"), "dtype": "float32",
               "log_softmax": cell.sizes.get("log_softmax"), "round": i // 42,
               "position": i % 7, "seconds": seconds, "timer": "cuda_event"}
        if stage == "total":
            row.update(host_seconds=seconds * (1 + rng.random() * 1e-3), clock_agrees=True)
        if stage == "copy":
            row["bytes"] = 4 * cell.sizes["rows"] * cell.sizes["vocab"]
        rows.append(row)
    return rows


@pytest.mark.slow  # a 16 MiB file of compressed rows: a minute or so
def test_a_step_table_of_the_full_profile_s_size_comes_back_whole(tmp_path):
    measuring, _ = profiles.resolve_measuring("full", [], [])
    manifest = {"experiments": [{"table": measured_folder.TABLES.get(name)}
                                for name in measuring]}
    another = measure_command.file_budget(measured_folder.spare_files(manifest))
    out = tmp_path / "evidence"
    (out / "rows").mkdir(parents=True)
    for name in measured_folder.RECORD_FILES:
        (out / name).write_text("{}\n")
    for table in ("staging", "prompt_logprobs"):
        schema.GzipJsonLinesSink(out / measured_folder.rows_file(table)).append(cell_rows(1, 9))
    parameters = measuring["02_logprobs_step"]
    sink = schema.GzipJsonLinesSink(out / measured_folder.rows_file("step"),
                                    measured_folder.LEASE_MAX_FILE_BYTES, another,
                                    run_id="evidence", notebook="02_logprobs_step")
    rng, written, stopped = random.Random(0), 0, None
    for cell in forecast.sweep_cells("02_logprobs_step", parameters, "cpu"):
        rows = full_profile_step_rows(cell, parameters["max_rounds"], rng)
        try:
            sink.append(rows)
        except RowsFileFull as exc:  # the full profile at its round cap passes 8 files
            stopped = str(exc)
            break
        written += len(rows)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert written > 500_000 and sink.parts == 1  # no spare file (digests.json takes it): a stop
    assert stopped and "would pass 16777216 B" in stopped
    assert len(files) == measured_folder.LEASE_MAX_FILES
    assert all(p.stat().st_size <= 16 << 20 for p in files)
    assert all(len(p.relative_to(out).parts) <= 2 for p in files)
    assert measured_folder.return_problems(out) == []
    assert len(measured_folder.MeasuredFolder(out).table_rows("step")) == written  # every cell before, whole


def test_return_problems_name_what_a_lease_would_not_return(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep.json").write_text("{}")
    with open(tmp_path / "big.bin", "wb") as handle:
        handle.truncate((16 << 20) + 1)
    for i in range(7):
        (tmp_path / f"f{i}.json").write_text("{}")
    problems = measured_folder.return_problems(tmp_path)
    too_many, too_deep, too_big = problems
    assert too_many.startswith("9 files") and "8" in too_many
    assert too_deep.startswith("a/b/deep.json: ") and too_big.startswith("big.bin: ")
    assert f"{(16 << 20) + 1} B" in too_big and f"{16 << 20} B" in too_big


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_a_table_at_the_size_limit_stops_with_a_status_and_keeps_its_cells(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(measure_command, "LEASE_MAX_FILE_BYTES", 1)  # any cell passes it
    out = tmp_path / "m"
    code = measure_command.main(["--profile", "smoke", "--only", "03_prompt_logprobs", "--out",
                                 str(out), "--rehearse-on-cpu"])
    manifest = measured_folder.MeasuredFolder(out).manifest()
    (prompt,) = manifest["experiments"]
    assert code == measure_command.EXIT_PARTIAL and manifest["status"] == "failed"
    assert prompt["status"] == "failed" and prompt["cells"] == []
    assert prompt["error"].startswith("stopped before a cell") and (
        "prompt_logprobs.jsonl.gz: " in prompt["error"])
    assert measured_folder.MeasuredFolder(out).measured_rows("prompt_logprobs") == []


def test_a_replay_keeps_rows_compressed_even_from_a_plain_folder(tmp_path):
    folder = tmp_path / "old"
    (folder / "rows").mkdir(parents=True)
    schema.JsonLinesSink(folder / "rows" / "step.jsonl", run_id="r").append(cell_rows(1, 5))
    (folder / measured_folder.MANIFEST).write_text("{}")
    measured_folder.write_digests(folder)
    dest = tmp_path / "run" / "measured"
    measured_folder.MeasuredFolder(folder).copy_verified(dest)
    assert [p.name for p in (dest / "rows").iterdir()] == ["step.jsonl.gz"]
    assert measured_folder.MeasuredFolder(dest).table_rows("step") == measured_folder.MeasuredFolder(
        folder).table_rows("step")


# ------------------------------------------------------------------------ a GPU is required

@no_cuda
def test_force_never_passes_no_cuda_exit_3_before_the_first_cell(tmp_path):
    """A forced CPU gate stops before its first cell (it used to measure for 350-395 s): what it
    left says so, whatever the machine's load (before: a 60 s wall-clock bound, run serially)."""
    out = tmp_path / "evidence"
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib")}
    done = subprocess.run([sys.executable, "-m", "stagelab", "measure", "--profile", "gate",
                           "--force", "--out", str(out)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=600)
    assert done.returncode == measure_command.EXIT_NO_GO, done.stderr[-2000:]
    manifest = measured_folder.MeasuredFolder(out).manifest()
    assert manifest["status"] == "no-go" and manifest["forced"] is True
    assert manifest["preflight"]["decisive"][0].startswith("cuda: ")
    assert all(e["status"] == "pending" and e["cells"] == [] and "started_utc" not in e
               for e in manifest["experiments"] if e["table"])
    assert list((out / "rows").iterdir()) == []
    assert "--force" in done.stderr and "--rehearse-on-cpu" in done.stderr  # what would pass


def replayed(measured_on: dict) -> dict:
    manifest = rundir.new_manifest(Path("run"), "gate", ["stagelab"], [], {}, "ok")
    return {**manifest, "measured_on": {"status": "ok", "gaps": [], **measured_on}}


def test_keep_refuses_a_replay_of_a_rehearsal_or_a_forced_no_go():
    no_go = {"decision": "no-go", "blocking": ["cuda: no CUDA device"]}
    rehearsal = evidence.replay_past_no_go(replayed({"rehearsal": True, "preflight": no_go}))
    assert "--rehearse-on-cpu" in rehearsal and rehearsal.endswith("(cuda: no CUDA device)")
    forced = evidence.replay_past_no_go(replayed({"forced": True, "preflight": no_go}))
    assert "forced" in forced and forced.endswith("(cuda: no CUDA device)")
    go = {"decision": "go", "blocking": []}
    assert evidence.replay_past_no_go(replayed({"forced": True, "preflight": go})) is None
    assert evidence.refusal(Path("nowhere"), replayed({"rehearsal": True,
                                                      "preflight": no_go})) == rehearsal


def test_deadline_admission_takes_the_worse_of_scaled_and_a_safety_multiple():
    assert forecast.admission_seconds(10.0, 1.0) == 10.0 * forecast.DEADLINE_SAFETY
    assert forecast.admission_seconds(10.0, 4.0) == 40.0
    recorder = measured_folder.Recorder(Path("unused"), {"experiments": []})
    recorder.save = lambda: None
    entry = {"cells": []}
    deadline = time.monotonic() + 20  # 10 s predicted fits once, not at 2.5x
    clock = measure_command.CellClock(recorder, entry, lambda *_: 10.0, deadline)
    cell = type("Cell", (), {"label": "n=1"})()
    assert clock.admit("step", cell, 1, 0) is False
    assert entry["cells"][0]["outcome"].startswith("not started: expected 25.0 s")


# ------------------------------------------------------------------------ provenance

@has_git
def test_the_source_tree_id_is_git_s_and_matches_its_commit(tmp_path):
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "lib/stagelab"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    (tmp_path / "lib/stagelab/__pycache__").mkdir(exist_ok=True)
    (tmp_path / "lib/stagelab/__pycache__/x.pyc").write_bytes(b"ignored, as git ignores it")
    (tmp_path / "lib/stagelab/cli.py").chmod(0o755)  # a copy that marks files executable
    modes = subprocess.run(["git", "-C", str(REPO), "ls-files", "-s", "lib/stagelab"],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    assert {line.split()[0] for line in modes if line} == {"100644"}  # what the tree id assumes
    expected = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD:lib/stagelab"],
                              capture_output=True, text=True, check=True).stdout.strip()
    tree = provenance.tree_id(tmp_path / "lib/stagelab")
    assert tree == expected
    assert provenance.matching_commit(tree) == head
    assert provenance.matching_commit("0" * 40) is None
    origin = {"source": {"tree": tree, "matched_commit": head}}
    line = replay.source_line(origin)
    assert f"tree {tree[:12]}" in line and line.endswith(f"is commit {head}")


def test_a_commit_named_in_the_environment_is_honoured_without_git(monkeypatch):
    monkeypatch.setattr(rundir, "git_state", lambda: {"commit": None, "dirty": None})
    monkeypatch.setenv(provenance.COMMIT_ENV, "abc123")
    assert measured_folder.commit_state() == {"commit": "abc123", "dirty": None,
                                              "from": provenance.COMMIT_ENV}
    assert provenance.source_record()["commit_env"] == "abc123"
    monkeypatch.delenv(provenance.COMMIT_ENV)
    assert measured_folder.commit_state() == {"commit": None, "dirty": None}
    origin = {"source": {"tree": "f" * 40, "matched_commit": None, "commit_env": "abc123"}}
    line = replay.source_line(origin)
    assert "matches no commit" in line and line.endswith("commit abc123")


def test_the_manifest_records_the_source_tree_of_this_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv(provenance.COMMIT_ENV, "given")
    request = measure_command.Request("smoke", {}, {}, tmp_path, rehearse=True)
    manifest = measured_folder.measurement_manifest(request, tmp_path)
    assert manifest["source"] == {"path": "lib/stagelab",
                                  "tree": provenance.tree_id(REPO / "lib/stagelab"),
                                  "commit_env": "given"}
    assert manifest["rehearsal"] is True and manifest["forced"] is False
    records.write_json_atomic(tmp_path / "m.json", manifest)
    assert json.loads((tmp_path / "m.json").read_text())["source"]["tree"]


# ------------------------------------------------------------------------ one rehearsal

def lease_command() -> list[str]:
    """The lease's ``stagelab measure`` arguments, as docs/gpu-lease.md gives the command (the
    README speaks to a user with a GPU machine of their own and links there)."""
    found = [line for line in (REPO / "docs" / "gpu-lease.md").read_text().splitlines()
             if line.startswith("PYTHONPATH=lib python3 -m stagelab measure")]
    words = shlex.split(found[0])
    return words[words.index("stagelab") + 1:]


# A CPU's gate takes about 600 s (`measure --profile gate --estimate cpu`), past the lease's
# 540 s deadline, so the rehearsal at that deadline ran 540 s whatever it measured. At this one
# the same command admits the small step cells, stops the rest at the deadline and comes back.
REHEARSAL_DEADLINE_S = "150"


def rehearsal_argv(out: Path) -> list[str]:
    """The lease command with its output under ``out`` and the rehearsal's own deadline."""
    argv = [str(out) if word == "$OUT/evidence" else word for word in lease_command()]
    assert argv[:3] == ["measure", "--profile", "gate"] and "--force" in argv
    argv[argv.index("--deadline-s") + 1] = REHEARSAL_DEADLINE_S
    return argv + ["--rehearse-on-cpu"]


@pytest.mark.slow  # the gate's small cells measured on a CPU, replayed and kept (~2 min)
@no_cuda
def test_the_lease_command_rehearsed_on_a_cpu_comes_back_whole(tmp_path):
    lease_out = tmp_path / "lease"
    done = torch_alone(*rehearsal_argv(lease_out / "evidence"))
    assert done.returncode in (measure_command.EXIT_OK, measure_command.EXIT_PARTIAL), (
        done.stderr[-3000:])
    out = lease_out / "evidence"
    manifest = measured_folder.MeasuredFolder(out).manifest()
    assert manifest["rehearsal"] is True and manifest["forced"] is True
    assert manifest["preflight"]["decisive"] and manifest["source"]["tree"]
    returned = [p for p in lease_out.rglob("*") if p.is_file()]
    assert len(returned) <= 8 and measured_folder.return_problems(out) == []
    assert all(p.stat().st_size <= 16 << 20 and len(p.relative_to(lease_out).parts) <= 3
               for p in returned)  # at most two folders below the lease's output folder
    assert "a lease would not return" not in done.stderr
    runs = tmp_path / "runs"  # the rule's calibration at 20 trials, not the gate's 100: 2 min less
    assert cli.main(["run", "--profile", "gate", "--from", str(out), "--out", str(runs),
                     "--param", "04_verdict.calibration_trials=20"]) in (0, 1)
    (run_dir,) = runs.iterdir()
    repo = tmp_path / "repo"  # keep writes the README's Results: a copy of the repository
    shutil.copytree(REPO / "data" / "reference", repo / "data" / "reference")
    root = repo / "data" / "reference"
    with pytest.raises(UserError, match=r"it replays a rehearsal \(--rehearse-on-cpu\)"):
        evidence.keep_evidence(run_dir, root)
    dest = evidence.keep_evidence(run_dir, root, force=True)
    kept = json.loads((dest / "kept.json").read_text())
    assert kept["forced"] is True and "rehearsal" in kept["refusal"]
    assert sorted(p.name for p in (dest / "measured" / "rows").iterdir()) == [
        "staging.jsonl.gz", "step.jsonl.gz"]
    results = evidence.results_file(root).read_text()
    assert run_dir.name in results and "kept with --force" in results  # listed, labelled


@pytest.mark.parametrize("decides, force, rehearse, refused", [
    (True, False, False, True), (True, True, False, True), (True, False, True, False),
    (False, False, False, True), (False, True, False, False), (False, False, True, False)])
def test_only_a_profile_that_decides_holds_a_cpu_to_its_decisive_no_go(
        tmp_path, decides, force, rehearse, refused):
    """No CUDA: a profile that decides measures only as a rehearsal, whatever --force says; one
    that does not (smoke, quick) measures what the CPU can with either flag."""
    request = measure_command.Request("p", {}, {}, tmp_path, force=force, rehearse=rehearse,
                                      decides=decides)
    no_cuda = ["cuda: no CUDA device"]
    assert (measure_command.refused_no_go(request, no_cuda, no_cuda) is not None) is refused


def test_another_no_go_passes_with_force_alone(tmp_path):
    request = measure_command.Request("p", {}, {}, tmp_path, rehearse=True, decides=True)
    assert measure_command.refused_no_go(request, ["memory: too little"], []) is not None
    forced = measure_command.Request("p", {}, {}, tmp_path, force=True, decides=True)
    assert measure_command.refused_no_go(forced, ["memory: too little"], []) is None


def test_the_profiles_that_decide_are_gate_and_full():
    assert [p for p in profiles.load_profiles() if profiles.profile_decides(p)] == ["gate", "full"]
