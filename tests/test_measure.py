"""`stagelab measure` on a node with torch alone, and `stagelab run --from` back here: the
measuring floor imports nothing else, a killed or deadline-stopped measurement keeps its
finished cells, and a replayed run equals a live one over the same rows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import BLOCKED, BLOCKING_RUNNER, StoppedInAFinalizer, made_once, torch_alone
from stagelab import cli
from stagelab.analyse import verdict
from stagelab.core import measured as measured_folder
from stagelab.core import paths, schema, stops
from stagelab.core.errors import UserError
from stagelab.measure import bench as bench_module
from stagelab.measure import estimate, forecast
from stagelab.run import measure_command, profiles

REPO = paths.REPO_ROOT
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU outcome needs no CUDA")


def rows_of(folder: Path, table: str) -> list[dict]:
    return measured_folder.MeasuredFolder(folder).measured_rows(table)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    """The smoke profile measured with torch alone (a rehearsal past the CPU's no-go), once."""
    def measure(out: Path) -> None:
        done = torch_alone("measure", "--profile", "smoke", "--out", str(out), "--rehearse-on-cpu")
        assert done.returncode == measure_command.EXIT_OK, done.stderr[-3000:]
    return made_once(tmp_path_factory, "smoke-evidence", measure)


def test_help_works_with_torch_alone():
    done = torch_alone("measure", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--deadline-s" in done.stdout and "Exit status" in done.stdout


def test_the_smoke_profile_is_measured_with_torch_alone(smoke):
    manifest = measured_folder.MeasuredFolder(smoke).manifest()
    assert (manifest["format"], manifest["version"], manifest["status"]) == (
        measured_folder.FORMAT, measured_folder.VERSION, "ok")
    assert manifest["forced"] is False and manifest["rehearsal"] is True
    assert manifest["versions"]["torch"] == torch.__version__
    # installed here, refused by the import hook: not importable, so no version is claimed
    assert manifest["versions"]["numpy"] is None and manifest["versions"]["nvidia-ml-py"] is None
    assert [e["notebook"] for e in manifest["experiments"]] == list(measured_folder.MEASURING)
    for name in ("hardware.json", "preflight.json", "inventory.json"):
        assert json.loads((smoke / name).read_text())
    inventory = json.loads((smoke / "inventory.json").read_text())
    assert any(d["name"] == "torch" for d in inventory["distributions"])
    for entry in manifest["experiments"][1:]:
        assert entry["status"] == "ok" and entry["cells"]
        assert len(entry["cells"]) == entry["cells_planned"]
        assert all(c["predicted_s"] > 0 and c["measured_s"] > 0 for c in entry["cells"])
    step = rows_of(smoke, "step")
    numpy_arm = {r["status"] for r in step if r["arm"] == "seed_pageable_numpy"}
    assert numpy_arm == {"unavailable"}
    assert "numpy is not installed" in next(r["note"] for r in step
                                            if r["arm"] == "seed_pageable_numpy")
    for table in ("staging", "step", "prompt_logprobs"):
        for row in rows_of(smoke, table):
            if row["status"] != "ok" and row["arm"] != "seed_pageable_numpy":
                # what a CPU cannot have: pinned memory, NVML, the sync debug mode
                assert row["status"] == "unavailable", row
                assert "CUDA" in row["note"] or "NVML" in row["note"], row
    timed = {r["arm"] for r in step if r["status"] == "ok" and r["stage"] == "total"}
    assert {"seed_pageable", "seed_pageable~aa", "seed_pageable_reused", "device_gather",
            "fused"} <= timed
    # both overlap orders, every cell in each, every timed row tagged with its order
    orders = {(r["rows"], r["overlap_order"]) for r in step if r["status"] == "ok"
              and r["stage"] == "total" and r["arm"] == "seed_pageable"}
    assert orders == {(n, order) for n in (2, 8) for order in ("queued", "waited")}
    assert all(r["overlap_order"] in ("queued", "waited") for r in step if r["metric"] == "time")


def test_the_stagelab_command_refuses_a_bad_measure_request_in_one_line(tmp_path, capsys):
    assert cli.main(["measure", "--profile", "nope", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stagelab: error: ") and "'nope'" in err
    assert err.endswith("smoke, quick, gate, full")  # the valid profiles, named
    assert not (tmp_path / "m").exists()


def test_bad_requests_are_one_line_and_create_nothing(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("")
    new = ["--out", str(tmp_path / "new")]
    cases = [
        (["--profile", "nope", *new], "unknown profile 'nope'"),
        (["--profile", "smoke", "--param", "02_logprobs_step.rows=[0]", *new],
         "02_logprobs_step.rows: 0 is not a positive integer"),
        (["--profile", "smoke", "--only", "04_verdict", *new], "has no measuring notebook"),
        (["--profile", "smoke", "--deadline-s", "0", *new], "--deadline-s 0.0: give a positive"),
        (["--profile", "smoke", "--deadline-s", "inf", *new], "--deadline-s inf: give a positive, "
                                                               "finite"),
        (["--profile", "smoke", "--out", str(taken)], "exists and is not an empty folder"),
        (["--profile", "smoke"], "--out is required"),
    ]
    for args, message in cases:
        assert measure_command.main(args) == measure_command.EXIT_USAGE, args
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (args, err)
    assert not (tmp_path / "new").exists() and [p.name for p in taken.iterdir()] == ["x"]


def test_the_gate_estimate_stays_within_the_lease_budget(capsys):
    assert cli.main(["measure", "--profile", "gate", "--estimate", "cuda"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    total = next(line for line in out if line.startswith("total on cuda"))
    # 149 rounds per decisive cell (a 1-in-50 stall seen with 95 % probability), inside one
    # lease command (600 s at most) with room for the start, the deadline's slack and a host
    # 25 % slower than the estimate's basis
    assert float(total.split()[-1]) <= 420
    sizes = {line.split()[0]: int(line.split()[1]) for line in out if line.startswith("rows/")}
    assert set(sizes) == {"rows/staging.jsonl.gz", "rows/step.jsonl.gz"}
    assert all(0 < size <= measured_folder.LEASE_MAX_FILE_BYTES for size in sizes.values())
    assert out[-1].startswith("files at most: 7 of the 8 ")  # digests.json is one
    assert "stop" not in out[-1]


def test_the_gate_estimate_states_the_round_cap_and_its_device_time(capsys):
    assert cli.main(["measure", "--profile", "gate", "--estimate", "cuda"]) == 0
    out = capsys.readouterr().out.splitlines()
    line = next(line for line in out if "rounds until resolved" in line)
    assert line.startswith("02_logprobs_step:") and "150 rounds per cell" in line
    assert all(figure in line for figure in ("149", "200 rounds", "60 s", "7 cells"))
    # the six decisive cells queued, and the forward-waited order at n=16 on Qwen2.5-7B alone
    waited = [row for row in out if row.startswith("02_logprobs_step ") and "waited" in row]
    assert [row.split()[1:3] for row in waited] == [["n=16", "V=152064"]]
    floor = float(line.split(" take ")[1].split()[0])
    cap = float(line.split("at most ")[1].split()[0])
    step_rows = [float(row.split()[-1]) for row in out if row.startswith("02_logprobs_step ")]
    # the table counts the cap (each row rounded to 0.1 s)
    assert 0 < floor < cap == pytest.approx(sum(step_rows), abs=0.05 * len(step_rows) + 0.05)


def lease_deadline_s() -> str:
    """The ``--deadline-s`` of the lease command docs/gpu-lease.md gives."""
    command = next(line for line in (REPO / "docs" / "gpu-lease.md").read_text().splitlines()
                   if line.startswith("PYTHONPATH=lib python3 -m stagelab measure --profile gate"))
    return command.split("--deadline-s ")[1].split()[0]


def test_the_lease_deadline_starts_every_gate_cell_on_the_estimate(capsys):
    """Admission needs 2.5x a cell's prediction left: the deadline the README gives must start
    every cell of the gate were each to take its estimate, or the family cannot decide."""
    deadline = lease_deadline_s()
    assert cli.main(["measure", "--profile", "gate", "--estimate", "cuda",
                     "--deadline-s", deadline]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith(f"--deadline-s {deadline}: "))
    assert "every cell" in line and "(10 cells" in line
    assert float(deadline) <= 600 - 60  # a lease command runs 600 s at most; 60 s to close


def test_admission_refuses_a_cell_without_its_safety_multiple_left():
    rows = [("nb", "a", 100.0), ("nb", "b", 100.0), ("nb", "c", 10.0)]
    fixed = forecast.FIXED_S["cuda"]
    # a at fixed (needs 250); b at fixed + 100 needs 250: refused at 300 + fixed; c then fits
    assert forecast.admitted_cells(rows, fixed + 300, "cuda") == [True, False, True]
    assert forecast.admitted_cells(rows, fixed + 350, "cuda") == [True, True, True]
    assert "1 of 3 cells" in forecast.format_admission(
        rows, fixed + 300, "cuda")


def test_the_margin_is_the_slowest_host_that_still_starts_every_decisive_cell(capsys):
    decisive = forecast.DECISIVE_NOTEBOOK
    fixed = forecast.FIXED_S["cuda"]
    rows = [(decisive, "big", 100.0), (decisive, "small", 10.0), ("01_d2h_staging", "c", 50.0)]
    # the big cell needs 2.5 x 100 s left after the fixed 20 s, scaled: 1.25 * 20 + 250 = 275
    assert forecast.decisive_cells_start(rows, 275, "cuda", 1.25)
    assert not forecast.decisive_cells_start(rows, 275, "cuda", 1.3)
    assert forecast.slower_host_margin(rows, 275, "cuda") == pytest.approx(1.25, abs=0.01)
    assert forecast.slower_host_margin(rows, fixed + 200, "cuda") == 0.0  # big needs 250
    assert "up to 1.25x slower" in forecast.format_margin(rows, 275, "cuda")
    assert "up to 1.25x slower" in forecast.format_margin(rows + [("01", "late", 500.0)], 275,
                                                          "cuda")  # a later cell never counts
    assert cli.main(["measure", "--profile", "gate", "--estimate", "cuda",
                     "--deadline-s", "540"]) == 0
    gate = capsys.readouterr().out
    assert "margin: every decisive cell (02_logprobs_step)" in gate
    # Before: the gate's decisive cells were ordered per model and capped at 300 rounds or
    # 85 s: a host 1.03x slower than the estimate already lost a decisive cell.
    assert float(gate.split("on a host up to ")[1].split("x")[0]) >= forecast.SLOWER_HOST
    assert "1.25x is asked: enough" in gate


def test_the_estimate_says_when_a_profile_at_its_round_cap_passes_what_a_lease_returns(capsys):
    assert cli.main(["measure", "--profile", "full", "--estimate", "cuda"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    step = next(line for line in out if line.startswith("rows/step.jsonl.gz"))
    files = int(step.split("(in ")[1].split()[0])
    assert files > 2 and step.endswith(f"(in {files} files: rolls over at 16777216 B)")
    assert out[-1].startswith(f"files at most: {7 + files} of the 8 ") and "stop" in out[-1]


def test_a_cell_prediction_follows_its_basis():
    sizes = dict(experiment="step", rows=256, vocab=262208)
    seed = estimate.cell_seconds(sizes, ["seed_pageable"], rounds=1, warmup=0, kind="cuda",
                                 sources=0)
    basis = estimate.BASIS["cuda"]
    elements = 256 * 262208
    expected = (elements * basis.device_pass_s_per_element + 4 * elements
                / basis.fresh_bytes_per_s + elements * basis.native_topk_s_per_element
                + basis.call_overhead_s)
    fused = 2 * elements * basis.device_pass_s_per_element + basis.call_overhead_s
    # one round, the after-phase (the fused reference, three calls of each arm: agreement and
    # sync debug), the cell's preparation, and the host-rate microbenchmark on the host (six
    # calls at the CPU basis)
    host = estimate.BASIS["cpu"]
    host_rates = 6 * (4 * elements * host.device_pass_s_per_element
                      + elements * host.native_topk_s_per_element
                      + 12 * elements / host.reused_bytes_per_s
                      + 4 * elements / host.fresh_bytes_per_s)
    assert estimate.host_rates_s(256, 262208) == pytest.approx(host_rates)
    assert seed == pytest.approx(expected + fused + 3 * expected + basis.cell_overhead_s
                                 + host_rates)
    assert 4 * elements / basis.fresh_bytes_per_s == pytest.approx(0.179, abs=1e-3)  # the issue's
    # a call of a sequence of eight steps costs eight steps; the checks after still run one
    eight = estimate.cell_seconds({**sizes, "steps": 8}, ["seed_pageable"], rounds=1, warmup=0,
                                  kind="cuda", sources=0)
    assert eight - seed == pytest.approx(7 * expected)
    with pytest.raises(ValueError, match="no prediction for experiment 'nope'"):
        estimate.cell_seconds(dict(experiment="nope", rows=1, vocab=1), [], rounds=1, warmup=0,
                              kind="cpu")


def test_deadline_stops_at_a_cell_boundary_and_keeps_what_was_measured(tmp_path, monkeypatch):
    def predictor(notebook, parameters, kind):  # the second cell would pass any deadline
        return lambda cell, rounds, warmup: 0.0 if cell.sizes["rows"] == 2 else 1e6

    monkeypatch.setattr(measure_command, "cell_predictor", predictor)
    out = tmp_path / "m"
    code = measure_command.main(["--profile", "smoke", "--only", "02_logprobs_step", "03_prompt_logprobs",
                         "--param", "02_logprobs_step.rows=[2, 3, 4]", "--param",
                         "02_logprobs_step.arms=[seed_pageable, fused]", "--param",
                         '02_logprobs_step.conditions={"overlap": ["queued"]}', "--out", str(out),
                         "--deadline-s", "3600", "--rehearse-on-cpu"])
    assert code == measure_command.EXIT_PARTIAL
    manifest = measured_folder.MeasuredFolder(out).manifest()
    step, prompt = manifest["experiments"]
    assert manifest["status"] == step["status"] == prompt["status"] == "deadline"
    assert [(c["cell"].split()[0], c["status"]) for c in step["cells"]] == [
        ("n=2", "ok"), ("n=3", "deadline"), ("n=4", "deadline")]
    assert step["cells"][1]["measured_s"] is None and step["cells"][1]["predicted_s"] == 1e6
    assert {r["rows"] for r in rows_of(out, "step")} == {2}
    assert prompt["cells"] == [] and rows_of(out, "prompt_logprobs") == []
    step_gap, prompt_gap = measured_folder.gaps(manifest)
    assert step_gap.startswith("02_logprobs_step: deadline") and "1 of 3 cells" in step_gap
    assert "n=3 V=4096 K=5" in step_gap  # the first cell not started
    assert prompt_gap.startswith("03_prompt_logprobs: deadline") and "not started" in prompt_gap


@no_cuda
def test_a_no_go_preflight_stops_before_measuring(tmp_path, capsys):
    out = tmp_path / "m"
    assert measure_command.main(["--profile", "smoke", "--only", "01_d2h_staging", "--out",
                         str(out)]) == measure_command.EXIT_NO_GO
    manifest = json.loads((out / measured_folder.MANIFEST).read_text())
    assert manifest["status"] == "no-go" and manifest["preflight"]["blocking"]
    assert json.loads((out / "preflight.json").read_text())["decision"] == "no-go"
    assert rows_of(out, "staging") == [] and not (out / "rows" / "staging.jsonl.gz").exists()
    assert "preflight no-go" in capsys.readouterr().err


def stop_in_the_second_step_cell(out: Path, signum: int) -> int:
    """Run a measurement whose step has a long second cell, send ``signum`` inside that cell,
    and return the exit status."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib")}
    process = subprocess.Popen(
        [sys.executable, "-m", "stagelab", "measure", "--profile", "smoke", "--rehearse-on-cpu",
         "--out",
         str(out), "--param", "02_logprobs_step.models=[Qwen2.5-7B]",
         "--param", "02_logprobs_step.rows=[2, 64]", "--param", "02_logprobs_step.rounds=50",
         "--param", "02_logprobs_step.max_rounds=50",
         "--param", '02_logprobs_step.conditions={"overlap": ["queued"]}'],  # two cells: n=2, then 64
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not ((out / measured_folder.MANIFEST).exists() and rows_of(out, "step")):
            assert process.poll() is None and time.monotonic() < deadline, "no first cell"
            time.sleep(0.1)
        time.sleep(1.0)  # inside the second cell (50 rounds of a 39 MB step: many seconds)
        assert process.poll() is None, "the second cell ended before the signal"
        os.kill(process.pid, signum)
    finally:
        process.wait(60)
    return process.returncode


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """A measurement killed (SIGKILL) in the middle of the step's second cell."""
    out = tmp_path_factory.mktemp("killed") / "evidence"
    assert stop_in_the_second_step_cell(out, signal.SIGKILL) == -signal.SIGKILL
    return out


@pytest.mark.serial  # a process stopped on purpose
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_is_an_interruption_recorded_with_exit_130(tmp_path, signum):
    out = tmp_path / "evidence"
    assert stop_in_the_second_step_cell(out, signum) == measure_command.EXIT_INTERRUPTED
    manifest = json.loads((out / measured_folder.MANIFEST).read_text())  # written by the process itself
    statuses = [e["status"] for e in manifest["experiments"]]
    assert manifest["status"] == "interrupted" and statuses == [
        "ok", "ok", "interrupted", "interrupted"]
    assert {r["rows"] for r in rows_of(out, "step")} == {2}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowing
def test_a_stop_swallowed_by_a_finalizer_is_raised_again_after_its_round(monkeypatch):
    monkeypatch.setattr(stops, "_received", [])
    calls = []

    def arm(round_index: int) -> None:
        calls.append(round_index)
        if round_index == 1:
            StoppedInAFinalizer()  # dropped at once: its __del__ raises, and is swallowed

    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        bench_module.interleaved({"a": arm}, rounds=5, warmup=0,
                                 after_round=stops.raise_if_received)
    assert calls == [0, 1]  # the round it landed in ends, then the stop
    clock = measure_command.CellClock(None, {}, lambda *_: 0.0, None)
    with pytest.raises(KeyboardInterrupt):  # and before any later cell
        clock.admit("step", None, 1, 0)


@pytest.mark.parametrize("signum", stops.SIGNALS)
def test_a_stop_in_the_shutdown_after_the_command_ends_it_quietly_with_its_status(signum):
    # Before: a second Ctrl-C landing in torch's finalizer at exit printed a traceback (CI).
    script = ("import os, sys, weakref\nfrom stagelab.core import stops\n"
              "class Held: pass\nheld = Held()\n"
              f"weakref.finalize(held, lambda: os.kill(os.getpid(), {int(signum)}))\n"
              "print('recorded')\nstops.end_quietly(7)\nsys.exit(0)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (7, "recorded\n", "")


@pytest.mark.serial  # a process killed on purpose
@pytest.mark.slow
def test_a_killed_measurement_keeps_its_finished_cells(killed):
    manifest = measured_folder.MeasuredFolder(killed).manifest()
    staging, step, prompt = (manifest["experiments"][i] for i in (1, 2, 3))
    assert manifest["status"] == "interrupted"
    assert staging["status"] == "ok" and len(staging["cells"]) == 2
    assert step["status"] == prompt["status"] == "interrupted"
    assert [c["status"] for c in step["cells"]] == ["ok"]
    rows = rows_of(killed, "step")
    assert {r["rows"] for r in rows} == {2} and len(schema.make_rows(rows)) == len(rows)
    assert prompt["cells"] == []


# --------------------------------------------------------------------------------- run --from

def test_run_from_refuses_what_is_not_a_measurement(tmp_path, smoke, capsys):
    lacking = tmp_path / "lacking"
    lacking.mkdir()
    manifest = json.loads((smoke / measured_folder.MANIFEST).read_text())
    manifest["experiments"] = [e for e in manifest["experiments"]
                               if e["notebook"] != "03_prompt_logprobs"]
    (lacking / measured_folder.MANIFEST).write_text(json.dumps(manifest))
    measured_folder.write_digests(lacking)
    cases = [(tmp_path, "not a measured folder (no measured.json"),
             (lacking, "lacks 03_prompt_logprobs, which profile 'smoke' needs")]
    for folder, message in cases:
        code = cli.main(["run", "--profile", "smoke", "--from", str(folder), "--out",
                         str(tmp_path / "runs")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err and len(err.splitlines()) == 1, err
    for rounds in (2, 5):  # 5 passes the smoke profile's max_rounds: still this refusal
        code = cli.main(["run", "--profile", "smoke", "--from", str(smoke), "--param",
                         f"02_logprobs_step.rounds={rounds}", "--out", str(tmp_path / "runs")])
        assert code == 2 and "measured with their own parameters" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(UserError, match="is set by the runner"):
        profiles.plan_run("smoke", overrides={"01_d2h_staging": {"measured": str(smoke)}})


def test_a_replay_is_kept_under_the_measuring_machine(tmp_path, smoke):
    from stagelab.present import evidence
    from stagelab.run import replay

    node = tmp_path / "from_a_node"
    shutil.copytree(smoke, node)
    snap = json.loads((node / "hardware.json").read_text())
    cuda = {"torch": "2.13.0+cu128", "cuda_build": "12.8", "cuda_available": True}
    (node / "hardware.json").write_text(json.dumps({**snap, "gpu": {"name": "NVIDIA H200"},
                                                    "torch": cuda}))  # a snapshot that agrees
    measured_folder.write_digests(node)
    plan = profiles.plan_run("smoke")
    origin = replay.replay_plan(plan, node, [])
    shutil.rmtree(Path(origin["staged"]).parent)
    assert evidence.machine_slug({"hardware": origin["hardware"]}) == "NVIDIA-H200"
    assert origin["host"] == measured_folder.MeasuredFolder(smoke).manifest()["host"] and origin["gaps"] == []
    measured = {nb.name: nb.parameters.get("measured") for nb in plan.notebooks}
    assert measured == {**dict.fromkeys(measured_folder.MEASURING, origin["staged"]),
                        "04_verdict": None}  # the verified copy, never the folder itself
    assert origin["folder"] == str(node.resolve())


DECISION_FIELDS = ("overall", "decisive", "step_levers", "copy_cells", "goals", "clock_check",
                   "missing", "calibration")


def live_verdict(run_dir: Path, parameters: dict) -> dict:
    """The verdict notebook 04 computes, over a run folder."""
    from stagelab.measure import shapes

    return verdict.build_verdict(
        run_dir, decisive_rows=parameters["decisive_rows"],
        decisive_vocabs=shapes.vocabs(parameters["decisive_models"], "decisive_models"),
        decisive_ks=parameters["decisive_ks"], **verdict.arguments(parameters),
        reference_root=None, calibration_trials=parameters["calibration_trials"])


@pytest.mark.slow
def test_measure_then_replay_equals_a_live_run_over_the_same_rows(tmp_path, smoke):
    assert cli.main(["run", "--profile", "smoke", "--from", str(smoke), "--param",
                     "04_verdict.include_reference=false", "--out", str(tmp_path)]) == 0
    (replayed,) = tmp_path.iterdir()
    manifest = json.loads((replayed / "manifest.json").read_text())
    assert manifest["measured_on"]["host"] == measured_folder.MeasuredFolder(smoke).manifest()["host"]
    assert manifest["hardware"] == json.loads((smoke / "hardware.json").read_text())
    assert manifest["analysed_on"]["host"]
    assert "Measured on " in (replayed / "index.html").read_text()
    record = replayed / manifest["measured_on"]["record"]
    assert (record / measured_folder.MANIFEST).read_bytes() == (smoke / measured_folder.MANIFEST).read_bytes()
    assert manifest["measured_on"]["preflight"]["decision"] in ("go", "no-go")

    live = tmp_path / "live"  # the run a live notebook would have written over these rows
    for notebook, table in measured_folder.TABLES.items():
        rows = [{k: v for k, v in r.items() if k not in ("run_id", "notebook")}
                for r in rows_of(smoke, table)]
        frame = schema.make_rows(rows, run_id=replayed.name, notebook=notebook)
        schema.write_table(frame, live, table)
        assert schema.read_table(replayed, table).equals(frame), table
    live_manifest = {key: value for key, value in manifest.items()
                     if key not in ("measured_on", "analysed_on")}
    (live / "manifest.json").write_text(json.dumps({**live_manifest, "run_id": live.name}))
    parameters = {**profiles.notebook_parameters(paths.NOTEBOOKS_DIR / "04_verdict.ipynb"),
                  **profiles.load_profiles()["smoke"]["notebooks"]["04_verdict"]}
    expected = live_verdict(live, parameters)
    got = json.loads((replayed / "verdict.json").read_text())
    for field in DECISION_FIELDS:
        assert json.loads(json.dumps(expected[field], default=str)) == got[field], field
    assert got["measured_on"]["gaps"] == [] and expected["measured_on"] is None
    # the smoke fixture rehearses on this CPU: the verdict says so, and names the source
    assert got["measured_on"]["rehearsal"] is True and got["measured_on"]["source"]["tree"]
    assert any("was a rehearsal" in finding for finding in got["findings"])


@pytest.mark.serial  # a process killed on purpose
@pytest.mark.slow
def test_a_killed_measurement_replays_and_the_verdict_names_the_gaps(tmp_path, killed):
    code = cli.main(["run", "--profile", "smoke", "--from", str(killed), "--out", str(tmp_path)])
    assert code == 0
    (replayed,) = tmp_path.iterdir()
    manifest = json.loads((replayed / "manifest.json").read_text())
    assert [nb["name"] for nb in manifest["notebooks"]] == [
        "00_environment", "01_d2h_staging", "02_logprobs_step", "04_verdict"]
    got = json.loads((replayed / "verdict.json").read_text())
    assert got["measured_on"]["status"] == "interrupted"
    assert any(g.startswith("02_logprobs_step: interrupted") and "1 of 2 cells" in g
               for g in got["measured_on"]["gaps"])
    assert any("03_prompt_logprobs: interrupted" in f for f in got["findings"])


# ------------------------------------------------------------------ what a replay may claim

def replay_manifest(run_dir: Path, measured_status: str, gaps: list[str],
                    status: str = "running") -> dict:
    """A finished replay's manifest with notebooks 00 and 04 only (what a no-go replays to)."""
    from stagelab.core import rundir

    notebooks = [rundir.notebook_entry(name, status="ok")
                 for name in ("00_environment", "04_verdict")]
    manifest = rundir.new_manifest(run_dir, "smoke", ["stagelab"], notebooks, {}, status)
    manifest["measured_on"] = {"status": measured_status, "gaps": gaps}
    return manifest


def test_a_replay_that_measured_nothing_is_unmeasured(tmp_path):
    from stagelab.core import rundir

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    recorder = rundir.ManifestRecorder(run_dir, replay_manifest(run_dir, "no-go", []))
    assert recorder.finish()["status"] == rundir.UNMEASURED
    live = rundir.new_manifest(run_dir, "smoke", ["stagelab"], [
        rundir.notebook_entry("00_environment", status="ok")], {})
    assert rundir.ManifestRecorder(run_dir, live).finish()["status"] == rundir.OK


def test_keep_refuses_a_replay_of_a_partial_measurement_unless_forced(tmp_path):
    from stagelab.present import evidence

    for status, gaps in (("deadline", ["02_logprobs_step: deadline, 1 of 3 cells measured"]),
                         ("interrupted", ["03_prompt_logprobs: interrupted"]),
                         ("ok", ["01_d2h_staging: failed"])):
        why = evidence.refusal(tmp_path, replay_manifest(tmp_path, status, gaps, "ok"))
        assert f"status is {status}" in why and gaps[0] in why
    assert evidence.replay_gaps(replay_manifest(tmp_path, "ok", [], "ok")) is None


def test_run_from_refuses_a_folder_whose_rows_are_lost_or_cut(tmp_path, smoke):
    from stagelab.run import replay

    lost = tmp_path / "norows"
    lost.mkdir()
    for path in smoke.glob("*.json"):
        shutil.copy(path, lost)
    measured_folder.write_digests(lost)
    with pytest.raises(UserError, match=r"rows/staging.jsonl.gz is missing, although "
                                        r"01_d2h_staging recorded \d+ measured cells"):
        replay.replay_plan(profiles.plan_run("smoke"), lost, [])
    cut = tmp_path / "cut"
    shutil.copytree(smoke, cut)
    step = cut / "rows" / "step.jsonl.gz"
    lines = rows_of(cut, "step")
    step.unlink()
    schema.GzipJsonLinesSink(step).append(lines[:-1])
    measured_folder.write_digests(cut)
    with pytest.raises(UserError, match=f"rows/step.jsonl.gz holds {len(lines) - 1} rows, fewer "
                                        f"than the {len(lines)} that 02_logprobs_step"):
        replay.replay_plan(profiles.plan_run("smoke"), cut, [])


def test_the_node_records_its_load_per_experiment(smoke):
    for entry in measured_folder.MeasuredFolder(smoke).manifest()["experiments"][1:]:
        assert set(entry["load"]) >= {"busy", "why"}, entry["notebook"]
    origin = measured_folder.MeasuredFolder(smoke).origin(measured_folder.MeasuredFolder(smoke).manifest())
    assert set(origin["loads"]) == set(measured_folder.TABLES)


def test_a_replay_judges_trust_by_the_node_s_load_not_the_analysing_host_s(tmp_path,
                                                                          monkeypatch):
    from stagelab.analyse import trust
    from stagelab.core import rundir
    from stagelab.measure import busy
    from stagelab.run import execute

    class BusyHere:  # the analysing host is loaded while it replays
        summary = {"busy": True, "why": ["the analysing host was busy"]}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(busy, "LoadWatch", BusyHere)
    monkeypatch.setattr(execute, "execute_notebook", lambda *args: ("ok", None))
    monkeypatch.setattr(execute, "export_html", lambda *args: None)
    monkeypatch.setattr(execute, "write_index", lambda *args: None)
    plan = profiles.plan_run("smoke", ["01_d2h_staging", "02_logprobs_step"])
    plan.notebooks[0].parameters["measured"] = plan.notebooks[1].parameters["measured"] = "m"
    node = {"01_d2h_staging": {"busy": True, "why": ["the node was busy"]}}
    manifest = rundir.new_manifest(tmp_path, "smoke", ["stagelab"], [
        rundir.notebook_entry(nb.name, nb.parameters) for nb in plan.notebooks], {})
    manifest["measured_on"] = {"status": "ok", "gaps": [], "loads": node}
    recorder = rundir.ManifestRecorder(tmp_path, manifest)
    for index in range(2):
        execute.run_notebook_step(recorder, index, plan, progress=False)
    staging, step = manifest["notebooks"]
    assert staging["load"] == node["01_d2h_staging"] and step["load"]["busy"] is None
    assert staging["analysis_load"]["why"] == ["the analysing host was busy"]
    busy_node, unknown = trust.load_reasons(manifest)  # an unknown load is not a quiet one
    assert busy_node.startswith("01_d2h_staging ") and busy_node.endswith("the node was busy")
    assert unknown.startswith("02_logprobs_step: ") and "unknown" in unknown


def test_no_torch_or_an_old_torch_is_one_line_before_anything_is_made(tmp_path, monkeypatch,
                                                                     capsys):
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib")}
    for extra in ([], ["--estimate", "cuda"]):
        out = tmp_path / f"m{len(extra)}"
        done = subprocess.run([sys.executable, "-c", BLOCKING_RUNNER, ",".join(BLOCKED + ("torch",)),
                               "measure", "--profile", "smoke", "--out", str(out), *extra],
                              capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
        err = done.stderr.strip()
        assert done.returncode == measure_command.EXIT_USAGE and len(err.splitlines()) == 1, err
        assert "torch cannot be imported" in err and ">= 2.4" in err and not out.exists()
    monkeypatch.setattr(torch, "__version__", "2.3.1+cu121")
    out = tmp_path / "old"
    assert measure_command.main(["--profile", "smoke", "--out", str(out)]) == measure_command.EXIT_USAGE
    err = capsys.readouterr().err
    assert "torch 2.3.1+cu121" in err and ">= 2.4" in err
    assert not out.exists()


def test_an_out_that_cannot_be_made_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setattr(measure_command.os, "access", lambda *args: True)  # as root, or a read-only mount
    out = blocker / "sub"
    assert measure_command.main(["--profile", "smoke", "--out", str(out),
                                 "--rehearse-on-cpu"]) == measure_command.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stagelab measure: error: --out {out}: ")
    assert err.endswith("(Not a directory)") and len(err.splitlines()) == 1


def test_run_from_refuses_a_folder_measured_with_another_profile(tmp_path, smoke, capsys):
    code = cli.main(["run", "--profile", "gate", "--from", str(smoke), "--out",
                     str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "'smoke'" in err and "'gate'" in err and err.rstrip().endswith("--profile smoke")
    assert not (tmp_path / "runs").exists()


def test_a_measurement_that_passes_its_deadline_exits_1_and_says_by_how_much(tmp_path,
                                                                            monkeypatch):
    def slow_tables(recorder, request, device, deadline):  # a cell far longer than predicted
        for entry in recorder.manifest["experiments"]:
            entry["status"] = "ok"
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.05)

    monkeypatch.setattr(measure_command, "measure_tables", slow_tables)
    out = tmp_path / "m"
    code = measure_command.main(["--profile", "smoke", "--only", "03_prompt_logprobs", "--out", str(out),
                         "--deadline-s", "0.5", "--rehearse-on-cpu"])
    manifest = measured_folder.MeasuredFolder(out).manifest()
    assert code == measure_command.EXIT_PARTIAL and manifest["status"] == "ok"
    assert manifest["deadline_passed_by_s"] > 0


def test_a_replay_carries_the_node_s_record_into_its_kept_evidence(tmp_path, smoke):
    from stagelab.present import evidence

    run_dir = tmp_path / "run"
    measured_folder.MeasuredFolder(smoke).copy_verified(run_dir / measured_folder.RECORD_COPY)
    kept = {str(p.relative_to(run_dir)) for p in evidence.evidence_files(run_dir)}
    assert kept == {f"measured/{name}" for name in measured_folder.RECORD_FILES} | {
        f"measured/rows/{table}.jsonl.gz" for table in measured_folder.TABLES.values()}
    assert (run_dir / "measured/rows/step.jsonl.gz").read_bytes() == (
        smoke / "rows/step.jsonl.gz").read_bytes()
    origin = measured_folder.MeasuredFolder(smoke).origin(measured_folder.MeasuredFolder(smoke).manifest())
    assert origin["record"] == "measured" and origin["preflight"]["decision"] in ("go", "no-go")


def test_one_measurement_is_kept_once_however_often_it_is_replayed(tmp_path, smoke):
    from stagelab.core import records, rundir
    from stagelab.present import evidence

    measured_id = measured_folder.MeasuredFolder(smoke).manifest()["measured_id"]
    assert measured_id.startswith(f"{smoke.name}-") and len(measured_id) > len(smoke.name) + 8

    def replayed_run(folder: Path) -> Path:
        folder.mkdir(parents=True)
        manifest = rundir.new_manifest(folder, "smoke", ["stagelab"], [], {}, "ok")
        manifest["measured_on"] = {"status": "ok", "gaps": [], "measured_id": measured_id}
        records.write_json_atomic(folder / "manifest.json", manifest)
        return folder

    root = tmp_path / "reference"
    kept = replayed_run(root / "cpu" / "first")
    records.write_json_atomic(kept / "kept.json", {"forced": False})
    assert evidence.kept_replay_of(root, measured_id) == kept
    assert evidence.kept_replay_of(root, "another") is None
    with pytest.raises(UserError, match="its measurement is kept already, as .*first"):
        evidence.keep_evidence(replayed_run(tmp_path / "second"), root, force=True)


def test_a_manifest_without_its_experiments_is_refused_in_one_line(tmp_path, smoke):
    broken = tmp_path / "broken"
    shutil.copytree(smoke, broken)
    manifest = json.loads((broken / measured_folder.MANIFEST).read_text())
    del manifest["experiments"]
    (broken / measured_folder.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="measured.json has no readable list of experiments"):
        measured_folder.MeasuredFolder(broken).manifest()


def test_a_cell_after_one_the_deadline_refused_still_runs_where_it_fits(tmp_path, monkeypatch):
    """A lease lists its largest cells first: one refused for the deadline does not cost the
    smaller ones after it."""
    def predictor(notebook, parameters, kind):  # only the middle cell would pass the deadline
        return lambda cell, rounds, warmup: 1e6 if cell.sizes["rows"] == 3 else 0.0

    monkeypatch.setattr(measure_command, "cell_predictor", predictor)
    out = tmp_path / "m"
    code = measure_command.main(["--profile", "smoke", "--only", "02_logprobs_step",
                                 "--param", "02_logprobs_step.rows=[2, 3, 4]", "--param",
                                 "02_logprobs_step.arms=[seed_pageable, fused]", "--param",
                                 '02_logprobs_step.conditions={"overlap": ["queued"]}', "--out", str(out),
                                 "--deadline-s", "3600", "--rehearse-on-cpu"])
    assert code == measure_command.EXIT_PARTIAL
    (step,) = measured_folder.MeasuredFolder(out).manifest()["experiments"]
    assert [(c["cell"].split()[0], c["status"]) for c in step["cells"]] == [
        ("n=2", "ok"), ("n=3", "deadline"), ("n=4", "ok")]
    assert step["status"] == "deadline" and {r["rows"] for r in rows_of(out, "step")} == {2, 4}


@no_cuda
def test_run_from_refuses_a_folder_that_measured_nothing(tmp_path, capsys):
    """A no-go leaves a folder with its records and no rows: replaying it would make a run that
    decides nothing, so it is refused in one line and no run folder is made."""
    out = tmp_path / "nogo"
    assert measure_command.main(["--profile", "smoke", "--out", str(out)]) == (
        measure_command.EXIT_NO_GO)
    capsys.readouterr()
    runs = tmp_path / "runs"
    assert cli.main(["run", "--profile", "smoke", "--from", str(out), "--out", str(runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "it measured nothing (status 'no-go'" in err[0]
    assert not runs.exists() or not any(runs.iterdir())
