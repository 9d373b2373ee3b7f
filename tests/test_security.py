"""A measured folder is a stranger's: each attack on `stagelab run --from` reproduced, and refused.

Every test plants something in a copy of a real smoke measurement (made once, with torch,
forced past the CPU's no-go) and shows what the replay does with it: no code from the folder
runs, no file outside it is read, no claim in it is believed unchecked.
"""

from __future__ import annotations

import ast
import copy
import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import made_once
from stagelab import cli
from stagelab.analyse import predict_tables
from stagelab.core import measured as measured_folder
from stagelab.core import untrusted
from stagelab.core.errors import BadRecord, UserError
from stagelab.run import execute, measure_command, profiles, replay
from stagelab.run.profiles import NotebookPlan

CODE = "under_load = False\nimport os; open('PLANTED', 'w')\n_x"


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """The smoke profile measured here, as a node would (once)."""
    def measure(out: Path) -> None:
        assert measure_command.main(["--profile", "smoke", "--out", str(out), "--force"]) == 0
    return made_once(tmp_path_factory, "smoke-forced", measure)


@pytest.fixture
def node(tmp_path, measured) -> Path:
    """A copy of the measurement to tamper with, its rows as plain JSON lines (which run --from
    reads as it reads the compressed rows a measurement writes)."""
    copy = tmp_path / "node"
    shutil.copytree(measured, copy)
    for packed in (copy / "rows").glob("*.jsonl.gz"):
        packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
        packed.unlink()
    measured_folder.write_digests(copy)
    return copy


def edit_manifest(folder: Path, change) -> None:
    path = folder / measured_folder.MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    measured_folder.write_digests(folder)  # as anyone who edits a folder can: a digest is no seal


def experiment(manifest: dict, notebook: str) -> dict:
    return next(e for e in manifest["experiments"] if e["notebook"] == notebook)


def edit_rows(folder: Path, table: str, change) -> None:
    path = folder / "rows" / f"{table}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    change(rows)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    measured_folder.write_digests(folder)


def replay_of(folder: Path):
    return replay.replay_plan(profiles.plan_run("smoke"), folder, [])


# ------------------------------------------------------------ nothing from a folder is code

def test_a_parameter_name_from_the_folder_is_refused_and_never_runs(node, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    edit_manifest(node, lambda m: experiment(m, "00_environment")["parameters"].update(
        {CODE: 1}))
    with pytest.raises(UserError, match=r"unknown parameter 00_environment\.under_load = False"):
        replay_of(node)
    assert not (tmp_path / "PLANTED").exists()


def test_a_value_of_the_wrong_type_is_refused(node):
    edit_manifest(node, lambda m: experiment(m, "01_d2h_staging")["parameters"].update(
        rounds="__import__('os').system('true')"))
    with pytest.raises(UserError, match=r"01_d2h_staging\.rounds=.* is a str, expected int"):
        replay_of(node)


def test_a_text_value_with_code_in_it_reaches_the_notebook_as_data(node):
    edit_manifest(node, lambda m: experiment(m, "01_d2h_staging")["parameters"].update(
        aa_arm=f'pageable_fresh"\n{CODE}\n"'))
    plan = profiles.plan_run("smoke")
    replay.replay_plan(plan, node, [])
    (staging,) = [nb for nb in plan.notebooks if nb.name == "01_d2h_staging"]
    cell = __import__("papermill.translators").translators.translate_parameters(
        "python3", "python", execute.injected_parameters(staging, node), "Parameters")
    tree = ast.parse(cell)
    assert all(isinstance(node_, ast.Assign) for node_ in tree.body)  # no import, no call
    assigned = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body}
    assert assigned["aa_arm"] == f'pageable_fresh"\n{CODE}\n"'
    assert set(assigned) <= set(profiles.notebook_parameters(staging.path))


def test_the_runner_refuses_a_parameter_name_that_is_not_an_identifier(tmp_path):
    plan = NotebookPlan("01_d2h_staging", Path("nb.ipynb"), {CODE: 1})
    with pytest.raises(UserError, match="is not a Python identifier"):
        execute.injected_parameters(plan, tmp_path)


# ---------------------------------------------- only the folder's own regular files are read

@pytest.mark.parametrize("name", ["inventory.json", "preflight.json", "hardware.json",
                                  "rows/step.jsonl"])
def test_a_symlinked_record_file_is_refused_naming_it(node, tmp_path, name):
    secret = tmp_path / "host_secret.json"
    secret.write_text(json.dumps({"secret": "from the host"}))
    (node / name).unlink()
    (node / name).symlink_to(secret)
    with pytest.raises(UserError, match=rf"{name}: is a symbolic link"):
        replay_of(node)


def test_a_symlinked_rows_folder_is_refused(node, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(node / "rows", elsewhere)
    (node / "rows").symlink_to(elsewhere)
    with pytest.raises(UserError, match=r"rows: is a symbolic link, not a folder"):
        replay_of(node)


def test_run_from_refuses_a_symlink_with_exit_2_and_makes_no_run(node, tmp_path, capsys):
    (node / "inventory.json").unlink()
    (node / "inventory.json").symlink_to("/etc/passwd")
    out = tmp_path / "runs"
    code = cli.main(["run", "--profile", "smoke", "--from", str(node), "--out", str(out)])
    assert code == 2 and not list(out.glob("*"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "inventory.json: is a symbolic link" in err[0]


def test_a_fifo_is_refused_at_once(node):
    (node / "rows" / "staging.jsonl").unlink()
    os.mkfifo(node / "rows" / "staging.jsonl")
    with pytest.raises(UserError, match=r"staging.jsonl: is a FIFO"):
        replay_of(node)


def test_a_giant_sparse_file_is_refused_before_it_is_read(node):
    with open(node / "inventory.json", "wb") as handle:
        handle.truncate(untrusted.MAX_JSON_BYTES + 1)
    with pytest.raises(UserError, match=r"inventory.json: \d+ bytes, more than"):
        replay_of(node)


def test_a_compressed_rows_file_past_what_a_lease_returns_is_refused_unread(tmp_path):
    """measure never writes a rows file past 16 MiB: a larger one is not read at all (a small
    file could still decompress to a gigabyte, a larger one to far more)."""
    from stagelab.core import schema

    path = tmp_path / "rows" / "step.jsonl.gz"
    path.parent.mkdir()
    with open(path, "wb") as handle:
        handle.truncate(untrusted.MAX_COMPRESSED_ROWS_BYTES + 1)
    with pytest.raises(BadRecord, match=r"step.jsonl.gz: \d+ bytes, more than the 16777216"):
        schema.read_json_lines(path, root=tmp_path)


def test_deeply_nested_json_is_one_line(node):
    (node / measured_folder.MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="nests deeper than"):
        measured_folder.MeasuredFolder(node).manifest()


def test_json_nested_past_the_bound_is_refused_by_the_reader(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(json.loads("[" * 40 + "]" * 40)))
    with pytest.raises(BadRecord, match="nests deeper than 32 levels"):
        untrusted.load_json(path)


def test_a_lone_surrogate_is_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"host": "\\ud800"}')
    with pytest.raises(BadRecord, match="lone surrogate"):
        untrusted.load_json(path)


@pytest.mark.parametrize(("where", "value", "message"), [
    ("rows", "many", r"cells\[0\]\.rows 'many', not a count"),
    ("status", {"x": 1}, r"cells\[0\] that is not a cell with a known status"),
    ("cell", ["a"], r"cells\[0\]\.cell of type list"),
])
def test_a_malformed_cell_field_is_one_line(node, where, value, message):
    edit_manifest(node, lambda m: experiment(m, "01_d2h_staging")["cells"][0].update(
        {where: value}))
    with pytest.raises(UserError, match=message):
        measured_folder.MeasuredFolder(node).manifest()


def test_a_malformed_top_level_field_is_one_line(node):
    edit_manifest(node, lambda m: m.update(gpu={"name": "x"}))
    with pytest.raises(UserError, match="measured.json has gpu of type dict"):
        measured_folder.MeasuredFolder(node).manifest()


def test_a_rows_path_field_is_never_followed(node):
    """A manifest naming another rows file (one round of three) is not read by that name:
    the known file is, and its count must match the cells."""
    short = node / "rows" / "short.jsonl"
    lines = (node / "rows" / "staging.jsonl").read_text().splitlines(keepends=True)
    short.write_text("".join(lines[: len(lines) // 3]))
    edit_manifest(node, lambda m: experiment(m, "01_d2h_staging").update(rows="rows/short.jsonl"))
    assert len(measured_folder.MeasuredFolder(node).measured_rows("staging")) == len(lines)
    (node / "rows" / "staging.jsonl").write_text("".join(lines[: len(lines) // 3]))
    measured_folder.write_digests(node)
    with pytest.raises(UserError, match=r"rows/staging.jsonl(.gz)? holds \d+ rows, fewer than"):
        replay_of(node)


# ------------------------------------------------------ claims checked against the folder

def test_fabricated_pinned_rows_from_a_node_without_cuda_are_refused(node):
    def pin(rows):
        for row in rows:
            if row.get("arm") == "pageable_reused":
                row["arm"] = "pinned_grow_only"
    edit_rows(node, "staging", pin)
    with pytest.raises(UserError, match=r"an ok 'pinned_grow_only' row .* no CUDA device"):
        replay_of(node)


def test_fabricated_cuda_rows_of_the_step_are_refused(node):
    edit_rows(node, "step", lambda rows: [row.update(device="cuda:0 NVIDIA H200")
                                          for row in rows if row.get("status") == "ok"])
    with pytest.raises(UserError, match="no CUDA device"):
        replay_of(node)


def test_an_arm_no_catalogue_names_is_refused(node):
    edit_rows(node, "staging", lambda rows: rows[0].update(arm="made_up"))
    with pytest.raises(UserError, match="arm 'made_up' is not a staging arm of the catalogue"):
        replay_of(node)


def first_placed(rows):
    return [r for r in rows if r.get("metric") == "time" and r.get("stage") == "total"
            and r.get("position") == 0]


def test_positions_the_balanced_order_cannot_give_are_refused(node):
    """Every sample placed first in its round (a folder made up without the design)."""
    def all_first(rows):
        for row in rows:
            if row.get("metric") == "time" and row.get("position") is not None:
                row["position"] = 0
    edit_rows(node, "step", all_first)
    with pytest.raises(UserError, match=r"places its \d+ arms at \[0, 0"):
        replay_of(node)


def test_positions_that_favour_one_arm_are_refused(node):
    """Each round a valid permutation, but one arm always first: not the balanced order."""
    def one_arm_first(rows):
        first = first_placed(rows)[0]["arm"]
        by_round: dict = {}
        for row in rows:
            if row.get("metric") == "time" and row.get("position") is not None:
                by_round.setdefault(row["round"], []).append(row)
        for placed in by_round.values():
            mine = [r for r in placed if r["arm"] == first]
            theirs = [r for r in placed if r["arm"] != first]
            if not mine or not theirs:
                continue
            old = mine[0]["position"]
            for row in placed:  # swap places with whoever was first, every stage alike
                if row["arm"] == first:
                    row["position"] = 0
                elif row["position"] == 0:
                    row["position"] = old
    edit_rows(node, "staging", one_arm_first)
    with pytest.raises(UserError, match="takes one place 3 times and another 0 times"):
        replay_of(node)


def test_rows_no_cell_accounts_for_are_refused(node):
    edit_rows(node, "step", lambda rows: rows.extend(rows[:5]))
    with pytest.raises(UserError, match=r"rows/step.jsonl(.gz)? holds \d+ rows, more than"):
        replay_of(node)


@pytest.mark.parametrize("seconds", [0.0, -1e-3, "fast"])
def test_a_timing_that_is_not_a_positive_number_is_refused(node, seconds):
    def change(rows):
        next(r for r in rows if r.get("metric") == "time" and r.get("status") == "ok").update(
            seconds=seconds)
    edit_rows(node, "staging", change)
    with pytest.raises(UserError, match="not a positive finite number"):
        replay_of(node)


def test_a_copy_faster_than_the_recorded_link_is_refused(node):
    snap = json.loads((node / "hardware.json").read_text())
    snap.update(gpu={"name": "NVIDIA H200"}, nvml={"pcie_max_gbps_per_direction": 31.5})
    snap["torch"]["cuda_available"] = True  # every record says CUDA: only the link is wrong
    (node / "hardware.json").write_text(json.dumps(snap))
    preflight = json.loads((node / "preflight.json").read_text())
    for check in preflight["checks"]:
        if check["name"] == "cuda":
            check["status"] = "go"
    (node / "preflight.json").write_text(json.dumps(preflight))

    def impossible(rows):
        row = next(r for r in rows if r.get("metric") == "time" and r.get("status") == "ok")
        row.update(device="cuda:0 NVIDIA H200", bytes=10**9, seconds=1e-3)  # 1000 GB/s
    edit_rows(node, "staging", impossible)
    h200 = predict_tables.platform_of_gpu("NVIDIA H200").pinned_gbps[1]  # above the PCIe rate
    with pytest.raises(UserError, match=rf"1000.0 GB/s, faster than the {h200:.1f} GB/s link"):
        replay_of(node)


def test_a_gh200_copy_over_its_c2c_link_is_believed():
    """NVML reports a GH200's PCIe rate, but its copies go over NVLink-C2C: the bound is the
    platform's published pinned figure, so an honest 250 GB/s copy is not refused."""
    from stagelab.analyse import claims

    hardware = {"gpu": {"name": "NVIDIA GH200 480GB"},
                "nvml": {"pcie_max_gbps_per_direction": 63.0}}
    link = claims.link_gb_per_s(hardware)
    assert link == predict_tables.platform_of_gpu("NVIDIA GH200 480GB").pinned_gbps[1] > 250
    row = {"device": "cuda:0 NVIDIA GH200 480GB", "bytes": 250 * 10**6, "seconds": 1e-3}
    assert claims.timing_problem("staging", "pinned_grow_only", row, link, 60.0) is None
    pcie_only = {"nvml": {"pcie_max_gbps_per_direction": 31.5}}  # no GPU name: PCIe alone
    assert claims.link_gb_per_s(pcie_only) == 31.5


def test_the_untouched_measurement_still_replays(node):
    origin = replay_of(node)
    assert origin["gaps"] == [] and origin["hardware"]["gpu"] is None


# ------------------------------------------------------------- unknown load is not quiet

def test_a_replay_whose_node_recorded_no_load_is_not_trusted(tmp_path):
    from stagelab.analyse import trust
    from stagelab.measure import busy

    manifest = {"measured_on": {"loads": {}}, "notebooks": [
        {"name": "02_logprobs_step", "load": execute.measured_load({"loads": {}},
                                                                   "02_logprobs_step")},
        {"name": "01_d2h_staging", "load": {"busy": False, "why": []}}]}
    assert manifest["notebooks"][0]["load"] == busy.unknown(
        "the measurement did not record the node's load")
    found = trust.reasons(tmp_path, manifest, {})
    (reason,) = found
    assert reason.startswith("02_logprobs_step:") and "unknown" in reason
    assert trust.headline(found).startswith("TIMINGS NOT TRUSTWORTHY")


# ------------------------------------------------ --force never touches a run's records

def run_with_records(root: Path) -> Path:
    from conftest import make_run

    run = make_run(root, "20261201T000000Z_node_smoke", gpu="NVIDIA H200", link=31.5)
    (run / "figures").mkdir()
    (run / "figures" / "01_d2h_staging_copy.png").write_bytes(b"\x89PNG figure")
    (run / "measured" / "rows").mkdir(parents=True)
    (run / "measured" / "measured.json").write_text('{"format": "stagelab-measured"}')
    (run / "measured" / "rows" / "staging.jsonl").write_text('{"arm": "pageable_fresh"}\n')
    return run


def snapshot_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


RECORDS = ["manifest.json", "verdict.json", "data/staging.parquet",
           "figures/01_d2h_staging_copy.png", "measured/measured.json",
           "measured/rows/staging.jsonl"]


@pytest.mark.parametrize("record", RECORDS)
def test_compare_force_leaves_every_record_of_a_run_byte_identical(tmp_path, record, capsys):
    run = run_with_records(tmp_path / "runs")
    before = snapshot_of(run)
    code = cli.main(["compare", str(run), "--out", str(run / record), "--force"])
    assert code == 2 and snapshot_of(run) == before
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("record", RECORDS)
def test_single_file_report_force_leaves_every_record_byte_identical(tmp_path, record):
    from stagelab.present import report

    run = run_with_records(tmp_path / "runs")
    before = snapshot_of(run)
    with pytest.raises(UserError, match="--out"):
        report.single_file_out(run, run / record, force=True)
    assert snapshot_of(run) == before


def test_force_may_not_replace_an_unlisted_file_of_a_run_either(tmp_path):
    from stagelab.core import records

    run = run_with_records(tmp_path / "runs")
    (run / "kernel.log").write_text("kernel output")
    with pytest.raises(UserError, match="--force never replaces a file of a run"):
        records.claim_output(run / "kernel.log", "stagelab compare", force=True)
    outside = tmp_path / "mine.html"
    outside.write_text("not a compare page")
    assert records.claim_output(outside, "stagelab compare", force=True) == outside


def test_preflight_out_refuses_a_runs_manifest_and_a_foreign_json_file(tmp_path):
    from stagelab.measure import preflight

    run = run_with_records(tmp_path / "runs")
    before = snapshot_of(run)
    with pytest.raises(UserError, match="lies in a run folder"):
        preflight.resolve_out(run / "manifest.json")
    with pytest.raises(UserError, match="lies in a run folder"):
        preflight.resolve_out(run / "measured")
    foreign = tmp_path / "settings.json"
    foreign.write_text('{"mine": true}')
    with pytest.raises(UserError, match="exists and is not an earlier preflight.json"):
        preflight.resolve_out(foreign)
    assert snapshot_of(run) == before and foreign.read_text() == '{"mine": true}'
    earlier = tmp_path / "preflight.json"
    preflight.write_report(earlier, "smoke", [], 0.1)
    assert preflight.resolve_out(earlier.parent) == earlier


# ------------------------------------- code planted in every string field: nothing runs

HOSTILE = ("<script>alert('x')</script>[here](javascript:alert(1)) \"\n"
           "__import__('os').system('touch PLANTED')")


def plant(value, skip=()):
    """``value`` with every string leaf (outside the keys in ``skip``) made hostile."""
    if isinstance(value, dict):
        return {k: (v if k in skip else plant(v, skip)) for k, v in value.items()}
    if isinstance(value, list):
        return [plant(v, skip) for v in value]
    return f"{value} {HOSTILE}" if isinstance(value, str) else value


# Fields that name things this code looks up (a table, a notebook, a status, an arm...), which a
# replay refuses when they are wrong (tests above); every other string is planted.
NAMES = {"format", "notebook", "table", "status", "profile", "rows", "file", "parameters",
         "arm", "experiment", "stage", "metric", "dtype", "timer", "device", "run_id",
         "log_softmax", "overlap_order", "decision", "name", "model", "git", "versions", "torch", "cuda_build",
         "created_utc", "finished_utc", "started_utc"}


@pytest.mark.slow
def test_code_planted_in_every_string_field_never_runs_nor_reaches_a_page(node, tmp_path,
                                                                          monkeypatch):
    from stagelab.present import evidence

    monkeypatch.chdir(tmp_path)
    for name in ("measured.json", "hardware.json", "preflight.json", "inventory.json"):
        path = node / name
        path.write_text(json.dumps(plant(json.loads(path.read_text()), NAMES)))
    for table in ("staging", "step", "prompt_logprobs"):
        edit_rows(node, table, lambda rows: rows.__setitem__(
            slice(None), [plant(row, NAMES) for row in rows]))
    out = tmp_path / "runs"
    code = cli.main(["run", "--profile", "smoke", "--from", str(node), "--param",
                     "04_verdict.include_reference=false", "--out", str(out)])
    (run,) = out.iterdir()
    manifest = json.loads((run / "manifest.json").read_text())
    assert code == 0, [(nb["name"], nb["status"], nb.get("error")) for nb in manifest["notebooks"]]
    assert json.dumps(HOSTILE)[1:-1] in json.dumps(manifest)  # the text is there, as data
    assert not list(tmp_path.rglob("PLANTED")) and not (Path.cwd() / "PLANTED").exists()
    pages = sorted(run.glob("*.html"))
    assert len(pages) >= 6
    for page in pages:
        text = page.read_text()
        assert "<script>alert('x')" not in text, page.name
        assert 'href="javascript:' not in text and "href='javascript:" not in text, page.name
    root = tmp_path / "reference"
    kept = evidence.keep_evidence(run, root, force=True)
    results = evidence.results_markdown(root)
    assert kept.is_dir() and "alert" in results  # the planted text is shown, inert
    for line in results.splitlines():
        prose = re.sub(r"`[^`]*`", "", line)  # a code span shows its text as it is
        assert "<script" not in prose and not re.search(r"(?<!\\)\]\(javascript", prose), line
        assert not line.startswith("__import__"), line


# ------------------------------------------- the native library only from this user's places

def test_the_temp_fallback_cache_is_created_private(tmp_path, monkeypatch):
    import stat

    from stagelab.measure import native

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    fallback = tmp_path / "stagelab-fallback"
    monkeypatch.setattr(native, "cache_dirs", lambda: [blocker / "cache", fallback])
    library = native.build(native.find_compiler())
    assert library.parent == fallback and stat.S_IMODE(fallback.stat().st_mode) == 0o700
    assert native.verified(library) is None


def test_a_planted_library_with_a_forged_stamp_in_a_foreign_fallback_is_never_loaded(
        tmp_path, monkeypatch):
    from stagelab.core.errors import NativeUnavailable
    from stagelab.measure import native

    fallback = tmp_path / "stagelab-fallback"
    fallback.mkdir(mode=0o777)
    fallback.chmod(0o777)
    planted = fallback / "seed_host-planted.so"
    planted.write_bytes(b"\x7fELF planted")
    (fallback / "seed_host-planted.json").write_text(json.dumps(
        {"size": planted.stat().st_size, "sha256": native._digest(planted)}))  # forged stamp
    try:
        os.chown(fallback, 4242, 4242)
    except PermissionError:
        pytest.skip("making a folder another user's needs root")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(native, "cache_dirs", lambda: [blocker / "cache", fallback])
    with pytest.raises(NativeUnavailable, match="is owned by uid 4242, not this user"):
        native.build(native.find_compiler())


def test_a_library_others_can_write_is_not_trusted_even_with_its_stamp(tmp_path, monkeypatch):
    from stagelab.measure import native

    monkeypatch.setattr(native, "cache_dirs", lambda: [tmp_path / "cache"])
    library = native.build(native.find_compiler())
    assert native.verified(library) is None
    library.chmod(0o777)
    assert "open to other users" in native.verified(library)


# ------------------------------------------------------------------- one line, not a traceback

@pytest.mark.parametrize("command", [["report", "{long}"], ["runs", "--root", "{long}"],
                                     ["compare", "{long}"],
                                     ["preflight", "--profile", "smoke", "--out", "{long}.json"]])
def test_a_name_over_255_bytes_is_one_line_and_exit_2(tmp_path, command, capsys):
    long = str(tmp_path / ("n" * 300))
    assert cli.main([part.format(long=long) for part in command]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stagelab: error:") and "Traceback" not in err[0]


@pytest.mark.parametrize("pid", [10**30, -1, 0, "12", True])
def test_a_huge_or_odd_pid_in_a_manifest_is_not_a_live_process(pid):
    import socket

    from stagelab.core import rundir

    assert rundir.process_alive({"host": socket.gethostname(), "pid": pid}) is False


def test_runs_lists_a_run_whose_manifest_nests_too_deep_in_one_line(tmp_path, capsys):
    from conftest import fake_run

    good = fake_run(tmp_path)
    bad = tmp_path / "20261201T000000Z_x_smoke"
    bad.mkdir()
    (bad / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert cli.main(["runs", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert good.name in out and "Traceback" not in out


def test_a_lone_surrogate_in_a_run_manifest_is_one_line(tmp_path, capsys):
    from conftest import fake_run

    run = fake_run(tmp_path)
    text = (run / "manifest.json").read_text().replace('"profile": "', '"profile": "\\udc80', 1)
    (run / "manifest.json").write_text(text)
    code = cli.main(["report", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "lone surrogate" in err[0]


# ------------------------------------------------------------- one keep per measurement

def _keep_in_a_child(run: Path, root: Path, results) -> None:
    from stagelab.present import evidence

    try:
        results.put(("kept", str(evidence.keep_evidence(run, root, force=True))))
    except UserError as exc:
        results.put(("refused", str(exc)))


def test_two_concurrent_keeps_keep_one_measurement_once(tmp_path, monkeypatch):
    import multiprocessing
    import time

    from conftest import good_run
    from stagelab.core import rundir
    from stagelab.core.records import RunFolder
    from stagelab.present import evidence

    runs = []
    for created in ("2026-11-30T10:00:00+00:00", "2026-11-30T11:00:00+00:00"):
        run = good_run(tmp_path / f"runs{len(runs)}", created=created)
        manifest = rundir.read_manifest(run)
        manifest["measured_on"] = {"measured_id": "node-abc", "status": "ok", "gaps": []}
        rundir.write_manifest(run, manifest)
        runs.append(run.rename(run.with_name(f"20261130T1{len(runs)}0000Z_vm_smoke")))
    from stagelab.present import rederive

    monkeypatch.setattr(rederive, "kept_verdict",  # these runs' records are stubs
                        lambda run_dir, _: RunFolder(run_dir).read_verdict())
    copy = evidence._copy_evidence
    monkeypatch.setattr(evidence, "_copy_evidence",
                        lambda *args: (time.sleep(0.5), copy(*args)))  # widen the race
    root = tmp_path / "reference"
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [context.Process(target=_keep_in_a_child, args=(run, root, results))
                for run in runs]
    for child in children:
        child.start()
    outcomes = sorted(results.get(timeout=60)[0] for _ in children)
    for child in children:
        child.join(30)
    assert outcomes == ["kept", "refused"]
    assert len(list(root.glob("*/*/kept.json"))) == 1


@pytest.mark.parametrize("seconds", [1e-300, 1e300])
def test_an_extreme_but_finite_timing_is_refused_before_the_verdict_sees_it(node, seconds):
    def change(rows):
        next(r for r in rows if r.get("metric") == "time" and r.get("status") == "ok").update(
            seconds=seconds)
    edit_rows(node, "step", change)
    with pytest.raises(UserError, match="outside what a timer here can read"):
        replay_of(node)


# ------------------------------------------------------- fleet checks what nodes would refuse

@pytest.mark.parametrize(("option", "message"), [
    (["--timeout-s", "inf"], "--timeout-s inf: give a positive, finite number"),
    (["--timeout-s", "nan"], "--timeout-s nan: give a positive, finite number"),
    (["--param", "01_d2h_staging.seed=12345678901234567890"], "beyond 64 bits"),
])
def test_fleet_refuses_what_every_node_would_refuse_before_asking_one(option, message, capsys):
    assert cli.main(["fleet", "--address", "127.0.0.1:1", "--profile", "quick", *option]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_the_measure_refuses_a_20_digit_seed_as_the_fleet_does():
    with pytest.raises(UserError, match="beyond 64 bits"):
        profiles.resolve_measuring("smoke", [], ["01_d2h_staging.seed=12345678901234567890"])


def test_fleet_param_for_a_measured_notebook_is_left_to_the_node():
    from stagelab.run import fleet

    params = ["01_d2h_staging.rounds=5", "02_logprobs_step.seed=3",
              "04_verdict.include_reference=false"]
    assert fleet.analysis_params(params) == ["04_verdict.include_reference=false"]
    plan = profiles.plan_run("smoke")
    replay.check_overrides(fleet.analysis_params(params))  # what run --from accepts
    assert plan.profile == "smoke"


def _serve_once(answer: bytes | None, held=None):
    """A loopback TCP server that accepts one connection and sends ``answer`` (or nothing), then
    holds it open: 8 s, or until the event ``held`` is set (``held.let_go`` is set where it
    stopped waiting on its own, after 120 s)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve():
        connection, _ = server.accept()
        with connection:
            connection.recv(64)
            if answer is not None:
                connection.sendall(answer)
            if held is None:
                threading.Event().wait(8)
            elif not held.wait(120):
                held.let_go.set()
    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.mark.parametrize("answer", [None, b"HTTP/1.1 400 Bad Request\r\n\r\n"])
def test_a_port_that_is_not_ray_fails_on_its_own_timeout(answer, monkeypatch):
    """The check gives up after its own timeout (shortened here), while the server still holds
    the connection open (before: a wall-clock bound of the timeout + 2 s, run alone)."""
    import threading

    from stagelab.run import fleet

    monkeypatch.setattr(fleet, "CONNECT_CHECK_S", 0.2)
    held = threading.Event()
    held.let_go = threading.Event()
    server = _serve_once(answer, held)
    try:
        with pytest.raises(UserError, match="something listens there, but not a Ray cluster"):
            fleet.check_address(f"127.0.0.1:{server.getsockname()[1]}")
        assert not held.let_go.is_set()  # it did not wait for the server to let go
    finally:
        held.set()
        server.close()


def test_a_grpc_server_passes_the_address_check():
    from stagelab.run import fleet

    settings = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # an HTTP/2 server's first frame
    server = _serve_once(settings)
    fleet.check_address(f"127.0.0.1:{server.getsockname()[1]}")
    server.close()


# ------------------------------------------------------------------- measure: nothing measured

def test_measure_exits_1_when_every_cell_was_skipped(tmp_path, capsys):
    out = tmp_path / "m"
    code = measure_command.main(["--profile", "smoke", "--only", "01_d2h_staging", "--param",
                                 '01_d2h_staging.arms=["pinned_grow_only"]', "--param",
                                 "01_d2h_staging.aa_arm=pinned_grow_only", "--out", str(out),
                                 "--force"])
    manifest = json.loads((out / measured_folder.MANIFEST).read_text())
    assert code == 1 and manifest["status"] == "unmeasured"
    assert manifest["measured"] and "ok" not in manifest["measured"]
    assert "nothing measured" in capsys.readouterr().err


def test_a_full_disk_ends_the_measurement_failed_not_running(tmp_path, monkeypatch, capsys):
    import errno

    from stagelab.core import records

    real = records.write_json_atomic

    def full_once(path, payload, sort_keys=False):
        if Path(path).name == "inventory.json":  # the disk fills up after the snapshot
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, payload, sort_keys)
    monkeypatch.setattr(records, "write_json_atomic", full_once)
    out = tmp_path / "m"
    code = measure_command.main(["--profile", "smoke", "--only", "01_d2h_staging", "--param",
                                 '01_d2h_staging.arms=["pinned_grow_only"]', "--param",
                                 "01_d2h_staging.aa_arm=pinned_grow_only", "--out", str(out),
                                 "--force"])
    manifest = json.loads((out / measured_folder.MANIFEST).read_text())
    assert code == 1 and manifest["status"] == "failed"
    assert "No space left on device" in manifest["error"]
    assert experiment(manifest, "01_d2h_staging")["status"] == "failed"
    err = capsys.readouterr().err
    assert "Traceback" not in err and "inventory.json: No space left on device" in err


# -------------------------------------------- keep re-checks the node's record a replay carries

def replayed_run_carrying(tmp_path: Path, measured_copy: Path) -> Path:
    from conftest import good_run

    run = good_run(tmp_path / "runs")
    measured_folder.MeasuredFolder(measured_copy).copy_verified(run / "measured")  # as a replay copies it
    assert list((run / "measured" / "rows").glob("*.jsonl.gz"))  # compressed, as a replay's are
    return run


def test_keep_refuses_a_replay_whose_node_record_contradicts_itself_even_forced(node, tmp_path):
    from stagelab.present import evidence

    def pin(rows):
        for row in rows:
            if row.get("arm") == "pageable_reused":
                row["arm"] = "pinned_grow_only"
    edit_rows(node, "staging", pin)
    run = replayed_run_carrying(tmp_path, node)
    with pytest.raises(UserError, match=r"not kept: the node's record it replays contradicts "
                                        r"itself: measured/rows/staging.jsonl.gz: an ok "
                                        r"'pinned_grow_only' row"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)
    assert not (tmp_path / "reference").exists() or not list((tmp_path / "reference").rglob(
        "kept.json"))


def test_keep_accepts_a_replay_whose_node_record_holds_together(node, tmp_path,
                                                               verdict_as_recorded):
    from stagelab.present import evidence

    run = replayed_run_carrying(tmp_path, node)
    kept = evidence.keep_evidence(run, tmp_path / "reference", force=True)
    assert (kept / "measured" / "measured.json").is_file()


# ------------------------------------------------ verified bytes only: digests, one copy, read once

def test_the_measurement_writes_digests_of_every_file_last(measured):
    """Before: a measured folder said nothing of its own bytes; what was checked and what was
    analysed could differ."""
    digests = json.loads((measured / measured_folder.DIGESTS).read_text())
    on_disk = {p.relative_to(measured).as_posix() for p in measured.rglob("*") if p.is_file()}
    assert set(digests["files"]) == on_disk - {measured_folder.DIGESTS}
    for name, digest in digests["files"].items():
        assert digest == measured_folder.file_digest((measured / name).read_bytes()), name


@pytest.mark.parametrize("name", ["hardware.json", "measured.json", "rows/staging.jsonl"])
def test_a_file_that_differs_from_its_digest_is_refused(node, name):
    """Before: a file edited after the measurement was analysed as measured."""
    path = node / name
    path.write_bytes(path.read_bytes().replace(b"}", b" }", 1))
    with pytest.raises(UserError, match=rf"{name} differs from its digest in digests.json"):
        replay_of(node)


def test_a_folder_without_digests_or_with_an_unlisted_file_is_refused(node):
    (node / "inventory.json").unlink()
    measured_folder.write_digests(node)
    (node / "inventory.json").write_text("{}")
    with pytest.raises(UserError, match="inventory.json is not listed in digests.json"):
        replay_of(node)
    (node / measured_folder.DIGESTS).unlink()
    with pytest.raises(UserError, match="has no digests.json"):
        replay_of(node)


def test_rows_swapped_in_after_the_check_are_never_analysed(node, tmp_path):
    """Before: the notebooks read the --from folder again after it was checked: rows swapped in
    mid-run (cuda:0 rows, a -1.0 s timing) were analysed while the checked copy stayed clean."""
    from stagelab.run.context import NotebookContext

    plan = profiles.plan_run("smoke")
    origin = replay.replay_plan(plan, node, [])
    clean = measured_folder.MeasuredFolder(node).measured_rows("staging")

    def swap(rows):
        for row in rows:
            row.update(device="cuda:0", seconds=-1.0)
    edit_rows(node, "staging", swap)  # resealed too: the attacker rewrites the digests
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    execute.take_in_measured(plan, run_dir, origin)
    (staging,) = [nb for nb in plan.notebooks if nb.name == "01_d2h_staging"]
    assert staging.parameters["measured"] == str(run_dir / measured_folder.RECORD_COPY)
    frame = NotebookContext("01_d2h_staging", run_dir).sweep_frame(
        "staging", staging.parameters["measured"], None)
    assert len(frame) == len(clean) and set(frame["device"]) == {r["device"] for r in clean}
    assert (frame["seconds"].dropna() > 0).all() and frame["seconds"].notna().any()
    measured_folder.MeasuredFolder(run_dir / measured_folder.RECORD_COPY).check_digests()


def test_a_refused_replay_leaves_no_copy_behind(node, monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    edit_manifest(node, lambda m: m.update(profile="quick"))
    with pytest.raises(UserError, match="measured with profile 'quick'"):
        replay_of(node)
    assert list((tmp_path / "temp").iterdir()) == []


def test_keep_refuses_a_replay_whose_node_record_differs_from_its_digests(node, tmp_path):
    """Before: keep re-checked the claims of measured/ but not that it held the bytes the
    replay verified."""
    from stagelab.present import evidence

    run = replayed_run_carrying(tmp_path, node)
    hardware = run / "measured" / "hardware.json"
    hardware.write_text(json.dumps({**json.loads(hardware.read_text()),
                                    "gpu": {"name": "NVIDIA H200"}}))
    with pytest.raises(UserError, match=r"not kept: .*hardware.json differs from its digest"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)


# ------------------------------------------------------ keep re-derives what a run claims

@pytest.fixture(scope="module")
def replayed(measured, tmp_path_factory) -> Path:
    """The smoke measurement replayed here (`run --from`), as a node's folder is analysed."""
    runs = tmp_path_factory.mktemp("replayed")
    assert cli.main(["run", "--profile", "smoke", "--from", str(measured), "--param",
                     "04_verdict.include_reference=false", "--out", str(runs)]) == 0
    (run,) = runs.iterdir()
    return run


def _sent(replayed: Path, tmp_path: Path) -> Path:
    run = tmp_path / "sent" / replayed.name
    shutil.copytree(replayed, run)
    return run


@pytest.mark.slow  # one replay of the smoke measurement: about a minute
def test_keep_refuses_a_sent_run_whose_claims_its_tables_do_not_give(replayed, tmp_path):
    """Before: a kept CPU run, its verdict.json edited to PORT and its manifest's GPU to
    "NVIDIA H200", was kept with exit 0, and the Results showed "Verdict: PORT" under
    NVIDIA-H200/."""
    from stagelab.present import evidence

    def to_port(run):
        path = run / "verdict.json"
        path.write_text(json.dumps({**json.loads(path.read_text()),
                                    "overall": {"decision": "PORT", "summary": "", "where": ""}}))

    def to_h200(run):
        path = run / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["hardware"]["gpu"] = {"name": "NVIDIA H200"}
        path.write_text(json.dumps(manifest))

    def page_to_port(run):
        page = (run / "index.html").read_text()
        (run / "index.html").write_text(re.sub(r"Staging verdict: \w+<", "Staging verdict: PORT<",
                                               page))
    cases = [(to_port, r"its verdict.json says overall decision 'PORT', its own tables give "
                       r"'INCONCLUSIVE'"),
             (to_h200, r"its manifest names gpu 'NVIDIA H200', its measured/hardware.json None"),
             (page_to_port, r"its index.html does not state the verdict its tables give")]
    for index, (edit, message) in enumerate(cases):
        run = _sent(replayed, tmp_path / str(index))
        edit(run)
        with pytest.raises(UserError, match=message) as refused:
            evidence.keep_evidence(run, tmp_path / "reference", force=True)
        assert "\n" not in str(refused.value)
    assert not list((tmp_path / "reference").rglob("kept.json"))
    kept = evidence.keep_evidence(_sent(replayed, tmp_path / "whole"), tmp_path / "reference",
                                  force=True)  # forced: the smoke measurement is a rehearsal
    assert (kept / "measured" / measured_folder.DIGESTS).is_file()
    results = (tmp_path / "reference" / "README.md").read_text()
    assert "measured elsewhere" in results


# ------------------------------------------------------ nothing live from a run's notebooks

PLANTED_JS = "window.__planted = (window.__planted || 0) + 1; console.log('PLANTED');"
PLANTED_TAGS = (f"<script>{PLANTED_JS}</script>"
                f"<img src=x onerror=\"{PLANTED_JS}\"><svg onload=\"{PLANTED_JS}\"></svg>"
                "<a href=\"javascript:alert(1)\">click</a><iframe srcdoc='<script>"
                "parent.__planted=1</script>'></iframe>")


def planted_run(root: Path) -> Path:
    """A sent run whose notebook plants script in a Markdown cell, an HTML output and a
    JavaScript output, and whose own HTML export holds script too."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from conftest import good_run

    run = good_run(root)
    nb = new_notebook(cells=[
        new_markdown_cell(f"# 10 ok\n\nProse, then {PLANTED_TAGS}"),
        new_code_cell("x", execution_count=1, outputs=[
            new_output("display_data", data={"text/html": f"<table><tr><td>a</td></tr></table>"
                                                          f"{PLANTED_TAGS}",
                                             "text/plain": "a table"}),
            new_output("display_data", data={"application/javascript": PLANTED_JS}),
            new_output("execute_result", execution_count=1,
                       data={"text/markdown": f"**found** {PLANTED_TAGS}"})])])
    nbformat.write(nb, str(run / "10_ok.ipynb"))
    (run / "10_ok.html").write_text(f"<html><body>{PLANTED_TAGS}</body></html>")
    return run


def live_markup(page: str) -> list[str]:
    """The elements and attributes of an HTML page that could run script, as a parser sees
    them (escaped text is not markup)."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Finder(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag in ("script", "iframe", "object", "embed", "svg", "form"):
                found.append(tag)
            found.extend(f"{tag} {name}" for name, value in attrs if name.startswith("on") or (
                (value or "").strip().lower().startswith(("javascript:", "data:text"))))
    Finder().feed(page)
    return found


def scripts_run(page_url: str) -> list[str]:
    """What planted script did when ``page_url`` opened in Chromium: console lines, page
    errors, dialogs and the planted counter; empty where nothing ran."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make test` installs Debian's chromium package")
        pytest.skip("chromium is not installed (make test installs it)")
    seen: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        context = browser.new_context()
        context.set_offline(True)
        page = context.new_page()
        page.on("console", lambda message: seen.append(f"console: {message.text}"))
        page.on("pageerror", lambda error: seen.append(f"error: {error}"))
        page.on("dialog", lambda dialog: (seen.append("dialog"), dialog.dismiss()))
        page.goto(page_url)
        page.wait_for_load_state("load")
        page.wait_for_timeout(300)
        for link in page.query_selector_all("a"):
            href = link.get_attribute("href") or ""
            if href.lower().startswith("javascript:"):
                seen.append(f"live link: {href}")
        if page.evaluate("window.__planted"):
            seen.append("the planted counter ran")
        browser.close()
    return seen


@pytest.mark.slow  # Chromium opens each page
def test_script_planted_in_a_sent_runs_notebook_never_runs_on_any_page(tmp_path,
                                                                      verdict_as_recorded):
    """Before: a Markdown cell, a text/html output or an application/javascript output of a
    run's .ipynb came out as live <script> from `report` and `report --single-file`, and
    `keep` copied the run's *.html verbatim into data/reference/."""
    from stagelab.present import evidence, report

    run = planted_run(tmp_path / "runs")
    assert scripts_run((run / "10_ok.html").as_uri())  # the control: the sent page does run
    assert live_markup((run / "10_ok.html").read_text())
    assert cli.main(["report", str(run)]) == cli.EXIT_OK  # regenerates the notebook's HTML
    single = report.write_single_file(run)
    kept = evidence.keep_evidence(run, tmp_path / "reference")
    pages = [run / "10_ok.html", run / "index.html", single, *sorted(kept.glob("*.html"))]
    assert {p.name for p in kept.glob("*.html")} == {"10_ok.html", "index.html"}
    for page in pages:
        assert scripts_run(page.as_uri()) == [], page
        assert live_markup(page.read_text()) == [], page
    assert "a table" not in (kept / "10_ok.html").read_text()  # the HTML shown, not its text
    assert "<td>a</td>" in (kept / "10_ok.html").read_text()  # the allowed markup stays


# ------------------------------------------------------------------------ the medium cases

def test_many_empty_gzip_members_are_refused_by_count():
    """Before: 400k empty members (8 MB) were read in quadratic time, about 300 s, and
    accepted."""
    from stagelab.core import schema

    empty = gzip.compress(b"", mtime=0)
    with pytest.raises(BadRecord, match=r"more than 100000 gzip members"):
        schema.gzip_members_text(empty * (schema.MAX_GZIP_MEMBERS + 1), "rows/step.jsonl.gz")
    assert schema.gzip_members_text(empty * 1000, "rows/step.jsonl.gz") == ""


def test_members_larger_than_a_piece_read_whole_and_a_cut_one_is_left_out():
    from stagelab.core import schema

    big = "".join(json.dumps({"i": i, "pad": os.urandom(8).hex()}) + "\n" for i in range(9000))
    members = gzip.compress(big.encode(), mtime=0) + gzip.compress(b'{"i": -1}\n', mtime=0)
    assert len(members) > 8 * 4096
    assert schema.gzip_members_text(members, "x") == big + '{"i": -1}\n'
    assert schema.gzip_members_text(members[:-5], "x") == big  # the last member cut short
    with pytest.raises(BadRecord, match="decompress past 1000 bytes"):
        schema.gzip_members_text(members, "x", limit=1000)


def test_a_rows_file_of_empty_rows_is_refused_without_parsing_it_all(node):
    """Before: a rows file of `{}` lines under the 1 GiB budget was parsed in full before the
    row-count refusal (about an hour, more memory than the machine has)."""
    expected = measured_folder.recorded_rows(experiment(
        measured_folder.MeasuredFolder(node).manifest(), "01_d2h_staging"))
    (node / "rows" / "staging.jsonl").write_text("{}\n" * 3_000_000)
    measured_folder.write_digests(node)
    folder = measured_folder.MeasuredFolder(node)
    assert len(folder.table_rows("staging", most=expected)) == expected + 1  # no further
    with pytest.raises(UserError, match=rf"holds {expected + 1} rows, more than the {expected}"):
        replay_of(node)


def test_a_manifest_claiming_more_rows_than_a_table_holds_is_refused(node):
    edit_manifest(node, lambda m: experiment(m, "01_d2h_staging")["cells"][0].update(
        rows=measured_folder.MAX_TABLE_ROWS + 1))
    with pytest.raises(UserError, match=r"more than the 2000000 a measured table holds"):
        replay_of(node)


def test_roll_over_parts_are_read_only_by_the_names_measure_writes(node):
    """Before: parts up to rows/<table>.8.jsonl.gz were read and copied, more than any
    measurement can write beside its record."""
    names = measured_folder.rows_names("staging")
    assert names[:3] == ["rows/staging.jsonl.gz", "rows/staging.2.jsonl.gz",
                         "rows/staging.3.jsonl.gz"] and len(names) == 4
    hidden = node / "rows" / "staging.4.jsonl.gz"
    hidden.write_bytes(gzip.compress(b'{"arm": "x"}\n', mtime=0))
    assert hidden not in measured_folder.MeasuredFolder(node).rows_paths("staging")


ESCAPES = "\x1b[2J\x1b]8;;https://example.org\x07link\x1b]8;;\x07\u202e"


def test_control_characters_from_a_folder_are_escaped_in_a_refusal(node, tmp_path, capsys):
    """Before: ANSI and OSC-8 escapes from a folder were printed raw in refusals."""
    edit_manifest(node, lambda m: m.update(profile=f"quick{ESCAPES}"))
    code = cli.main(["run", "--profile", "smoke", "--from", str(node), "--out",
                     str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and "measured with profile" in err
    assert "\x1b" not in err and "\u202e" not in err and "\\x1b]8;;" in err
    assert len(err.strip().splitlines()) == 1


def test_control_characters_in_a_run_manifest_are_escaped_by_runs(tmp_path, capsys):
    """Before: `stagelab runs` printed a run's profile and status with their escapes."""
    from conftest import fake_run
    from stagelab.core import rundir

    run = fake_run(tmp_path)
    manifest = rundir.read_manifest(run)
    manifest["profile"] = f"quick{ESCAPES}\nforged line"
    rundir.write_manifest(run, manifest)
    assert cli.main(["runs", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\\nforged line" in out
    assert len(out.strip().splitlines()) == 2  # the header and the one run


def test_one_record_saying_cuda_does_not_outvote_two_saying_none(node):
    """Before: the CUDA check was an OR of three records: one saying CUDA sufficed while the
    snapshot and the preflight said none."""
    hardware = json.loads((node / "hardware.json").read_text())
    hardware["torch"]["cuda_available"] = True  # torch says CUDA; the GPU and preflight: none
    (node / "hardware.json").write_text(json.dumps(hardware))
    edit_rows(node, "step", lambda rows: [row.update(device="cuda:0 NVIDIA H200")
                                          for row in rows if row.get("status") == "ok"])
    with pytest.raises(UserError, match="do not all say it has a CUDA device"):
        replay_of(node)


@pytest.mark.parametrize("where, value", [
    (("machine", "fresh_fill", "stages"), {"zero_fill": "x"}),
    (("machine", "fresh_fill", "fill_gbps"), "fast"),
    (("torch", "cuda_available"), "yes"),
    (("gpu",), "NVIDIA H200")])
def test_a_wrongly_typed_field_of_the_snapshot_is_refused_before_use(node, where, value):
    """Before: one string in hardware.json's machine.fresh_fill.stages crashed 04_verdict."""
    hardware = json.loads((node / "hardware.json").read_text())
    *path, last = where
    inner = hardware
    for key in path:
        inner = inner[key]
    inner[last] = value
    (node / "hardware.json").write_text(json.dumps(hardware))
    measured_folder.write_digests(node)
    with pytest.raises(UserError, match=rf"hardware.json\.{'.'.join(where)}.* is str"):
        replay_of(node)


# ------------------------------------------------------- lines, not rows; parts the reader reads

def test_blank_lines_count_against_the_line_budget(node):
    """Before: blank lines were not rows, so the row budget never limited them: 256 MiB of
    newlines were walked line by line (236 s), at least twice per replay."""
    from stagelab.core import schema

    path = node / "rows" / "staging.jsonl"
    rows = path.read_text()
    path.write_text("\n" * 5_000_000 + rows)
    measured_folder.write_digests(node)
    assert schema.read_json_lines(path, root=node, most=10) == []  # 11 lines read, no further
    with pytest.raises(UserError, match=r"holds 0 rows, fewer than the"):
        replay_of(node)


def test_keep_rechecks_the_node_rows_with_a_budget(node, tmp_path, monkeypatch):
    """Before: `keep` re-checked `measured/` rows with no `most`: every row of a rows file was
    parsed before its count was compared (300,000 `{}` rows: 4.6 s; at 16 MiB, hours)."""
    from stagelab.present import evidence

    run = replayed_run_carrying(tmp_path, node)
    copy = run / "measured"
    expected = measured_folder.recorded_rows(experiment(
        measured_folder.MeasuredFolder(copy).manifest(), "01_d2h_staging"))
    path = copy / "rows" / "staging.jsonl.gz"
    path.write_bytes(gzip.compress(b"{}\n" * 300_000, mtime=0))
    measured_folder.write_digests(copy)
    parsed = []
    real = untrusted.parse_json
    monkeypatch.setattr(untrusted, "parse_json",
                        lambda *a, **k: parsed.append(1) or real(*a, **k))
    problem = evidence.measured_copy_problem(run)
    assert problem and "more than the" in problem
    assert len(parsed) < expected + 50  # its rows and the record's few JSON files, no more


def test_a_rows_part_the_reader_skips_is_refused_not_copied(node, tmp_path):
    """Before: a listed rows/step.3.jsonl.gz with no .2 was never read as rows, but was read,
    copied densely and kept (a 256 MiB sparse part became 200 MiB in data/reference/)."""
    orphan = node / "rows" / "step.3.jsonl.gz"
    orphan.write_bytes(gzip.compress(b'{"arm": "x"}\n', mtime=0))
    measured_folder.write_digests(node)
    with pytest.raises(UserError, match=r"rows/step.3.jsonl.gz is not read as rows"):
        replay_of(node)


def test_a_compressed_rows_part_is_bounded_as_compressed_rows_are(node):
    """Before: a roll-over part was bounded at 1 GiB like plain rows, not at the 16 MiB of
    compressed rows: a 256 MiB sparse part was read and copied."""
    part = node / "rows" / "step.jsonl.gz"
    with open(part, "wb") as handle:
        handle.truncate(untrusted.MAX_COMPRESSED_ROWS_BYTES + 1)
    with pytest.raises(UserError, match=r"more than the 16777216 such a file may hold"):
        replay_of(node)


# ------------------------------------------- K1, K2, R8: tables checked against their records

CPU_BUILD = {"host": {"cpu_model": "Xeon"}, "gpu": None,
             "torch": {"torch": "2.13.0+cpu", "cuda_build": None, "cuda_available": False}}


def _live_run_with_rows(root: Path, hardware: dict, rows: list[dict]) -> Path:
    from conftest import good_run
    from stagelab.core import schema

    run = good_run(root, hardware=hardware)
    schema.write_table(schema.make_rows(rows, run_id=run.name, notebook="01_d2h_staging"),
                       run, "staging")
    return run


def _pinned_rows(device: str, rounds: int = 240) -> list[dict]:
    return [{"experiment": "d2h_copy", "arm": arm, "device": device, "rows": 64,
             "vocab": 152064, "round": r, "seconds": 0.01, "bytes": 10**6, "status": "ok",
             "metric": "time", "stage": "total"}
            for r in range(rounds) for arm in ("pageable_fresh", "pinned_grow_only")]


def test_keep_refuses_a_live_run_whose_tables_its_machine_cannot_have_measured(
        tmp_path, verdict_as_recorded):
    """Before: claims ran only on a replay's measured/, never on a run's data/*.parquet: a run
    whose tables held 1,920 pinned ok rows on device cpu (its torch 2.13.0+cpu) was kept
    unforced with "Verdict: PORT"."""
    from stagelab.present import evidence

    run = _live_run_with_rows(tmp_path / "runs", CPU_BUILD, _pinned_rows("cpu"))
    with pytest.raises(UserError, match=r"data/staging.parquet disagrees with the records that "
                                        r"back it: an ok 'pinned_grow_only' row"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)
    assert not list((tmp_path / "reference").rglob("kept.json"))


def test_keep_refuses_a_gpu_run_whose_torch_says_no_cuda(tmp_path, verdict_as_recorded):
    """Before (R8, K1): a run filed under NVIDIA-H200/ with cuda:0 rows while its own snapshot's
    torch was a CPU build was kept."""
    from stagelab.present import evidence

    h200 = {**CPU_BUILD, "gpu": {"name": "NVIDIA H200"}}
    run = _live_run_with_rows(tmp_path / "runs", h200, _pinned_rows("cuda:0"))
    with pytest.raises(UserError, match=r"names GPU 'NVIDIA H200' while its torch "
                                        r"\(2.13.0\+cpu\) says CUDA was not available"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)
    assert not (tmp_path / "reference" / "NVIDIA-H200").exists()


def test_keep_refuses_more_rounds_than_the_run_recorded(tmp_path, verdict_as_recorded):
    from stagelab.present import evidence

    run = _live_run_with_rows(tmp_path / "runs", CPU_BUILD, [
        {**row, "arm": "pageable_fresh"} for row in _pinned_rows("cpu", rounds=400)[::2]])
    with pytest.raises(UserError, match=r"holds 400 rounds, more than the 12 its recorded"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)


def test_a_replay_of_a_snapshot_naming_a_gpu_its_torch_denies_is_refused(node):
    """Before (R8): a snapshot naming an H200 while its torch said no CUDA was accepted when no
    row needed CUDA."""
    hardware = json.loads((node / "hardware.json").read_text())
    hardware["gpu"] = {"name": "NVIDIA H200"}
    (node / "hardware.json").write_text(json.dumps(hardware))
    measured_folder.write_digests(node)
    with pytest.raises(UserError, match=r"names GPU 'NVIDIA H200' while its torch"):
        replay_of(node)


def _replay_like(tmp_path: Path, node: Path) -> Path:
    """A run that carries the node's verified rows as a replay does, its tables what the
    notebooks derive from them and its measured_on the verified copy's."""
    from stagelab.core import catalogue, rundir, schema

    run = replayed_run_carrying(tmp_path, node)
    copy = measured_folder.MeasuredFolder(run / "measured")
    for path in (run / "data").glob("*.parquet"):
        path.unlink()
    for table, notebook in catalogue.tables().items():
        frame = copy.replayed_frame(table, run.name, notebook)
        if len(frame):
            schema.write_table(frame, run, table)
    manifest = rundir.read_manifest(run)
    manifest["measured_on"] = copy.origin(copy.manifest())
    manifest["hardware"] = json.loads((copy.path / "hardware.json").read_text())
    rundir.write_manifest(run, manifest)
    return run


def test_keep_refuses_a_replay_whose_tables_are_not_its_verified_rows(node, tmp_path,
                                                                     verdict_as_recorded):
    """Before (K2): nothing checked that a replay's tables were what the notebooks derive from
    measured/: a kept "(measured elsewhere) Verdict: PORT" had 1,920 pinned ok rows in its
    tables and none in its verified measured/."""
    from stagelab.core import rundir, schema
    from stagelab.present import evidence, rederive

    run = _replay_like(tmp_path, node)
    manifest = rundir.effective_manifest(run)
    assert rederive.replay_tables_problem(run, manifest) is None  # the honest one holds
    frame = schema.read_table(run, "staging")
    frame.loc[frame["arm"] == "pageable_reused", "arm"] = "pinned_grow_only"
    schema.write_table(frame, run, "staging")
    assert "not the" in (rederive.replay_tables_problem(run, manifest) or "")
    with pytest.raises(UserError, match=r"data/staging.parquet holds \d+ rows that are not the "
                                        r"\d+ its notebook derives from the verified"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)


def test_keep_reads_measured_on_from_the_verified_copy(node, tmp_path, verdict_as_recorded):
    """Before (K2): `replay_past_no_go` read measured_on from the run's manifest: a rehearsal
    whose manifest said otherwise was kept unforced."""
    from stagelab.core import rundir
    from stagelab.present import evidence

    run = _replay_like(tmp_path, node)
    manifest = rundir.read_manifest(run)
    assert manifest["measured_on"]["forced"] is True  # the smoke measurement was forced
    manifest["measured_on"].update(forced=False, preflight=None)
    rundir.write_manifest(run, manifest)
    assert "forced past a preflight no-go" in evidence.refusal(run, rundir.effective_manifest(run))
    with pytest.raises(UserError, match=r"its manifest's measured_on says forced False, its "
                                        r"verified measured/measured.json True"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)


# ------------------------------------------------ K3: every word and number of a kept verdict

@pytest.fixture
def derived_once(monkeypatch):
    """keep's re-derivation of the verdict from a run's tables, made once per test (seconds
    each): the runs such a test keeps are copies of one run, its tables and manifest unchanged,
    whose sent verdict or page alone it edits, so every keep compares with the same fresh one."""
    from stagelab.present import rederive

    real, derived = rederive.rederived_verdict, []

    def once(run_dir: Path, manifest: dict) -> dict:
        if not derived:
            derived.append(real(run_dir, manifest))
        return copy.deepcopy(derived[0])
    monkeypatch.setattr(rederive, "rederived_verdict", once)


def _decided_replay(tmp_path: Path, node: Path) -> Path:
    """A replay-like run (its tables its node's verified rows) with the verdict notebook 04
    computes from them, with the smoke profile's parameters, and its index."""
    from stagelab.core import rundir
    from stagelab.present import rederive, report
    from stagelab.run import profiles as run_profiles

    run = _replay_like(tmp_path, node)
    manifest = rundir.read_manifest(run)
    parameters = run_profiles.profile_parameters("smoke")["04_verdict"]
    manifest["notebooks"].append(rundir.notebook_entry("04_verdict", status="ok"))
    manifest["notebooks"][-1]["parameters"] = dict(parameters)
    rundir.write_manifest(run, manifest)
    fresh = rederive.rederived_verdict(run, manifest)
    fresh["findings"] += ["Not read as reference evidence: runs/x: no kept.json.",
                          "Committed reference evidence (cpu; not this run): compared."]
    (run / "verdict.json").write_text(json.dumps(fresh, default=str))
    report.write_index(run)
    return run


def test_keep_refuses_a_verdict_whose_prose_or_numbers_were_edited(node, tmp_path, derived_once):
    """Before (K3): `rederive` compared decisions only: a verdict.json whose summary, findings
    and each cell's speedup had been edited was kept, and the Results printed them "as that run
    wrote them" ("Verdict: INCONCLUSIVE. Measured on an H200 ... saves 1.9 ms per step")."""
    from stagelab.present import evidence

    run = _decided_replay(tmp_path / "runs", node)
    sent = json.loads((run / "verdict.json").read_text())

    def edited(change):
        copy = tmp_path / "edited" / run.name
        shutil.rmtree(copy.parent, ignore_errors=True)
        shutil.copytree(run, copy)
        verdict = json.loads(json.dumps(sent))
        change(verdict)
        (copy / "verdict.json").write_text(json.dumps(verdict))
        return copy

    cases = [
        (lambda v: v["overall"].update(summary="Measured on an H200: saves 1.9 ms; port it."),
         r"says overall.summary 'Measured on an H200: saves 1.9 ms; port it.', its own tables"),
        (lambda v: v["decisive"][0].update(speedup=1.5), r"says decisive\[0\].speedup 1.5"),
        (lambda v: v["findings"].insert(0, "A finding no table gives."),
         r"says findings\[0\] 'A finding no table gives.'"),
        (lambda v: v["calibration"].clear(), r"says calibration")]
    for change, message in cases:
        with pytest.raises(UserError, match=message) as refused:
            evidence.keep_evidence(edited(change), tmp_path / "reference", force=True)
        assert "\n" not in str(refused.value)
    assert not list((tmp_path / "reference").rglob("kept.json"))
    kept = evidence.keep_evidence(run, tmp_path / "reference", force=True)
    written = json.loads((kept / "verdict.json").read_text())
    assert written["findings"] == [f for f in sent["findings"] if not f.startswith(
        ("Committed reference evidence", "Not read as reference evidence"))]
    assert len(written["findings"]) == len(sent["findings"]) - 2
    assert written["overall"] == sent["overall"] and written["calibration"]


def test_keep_refuses_a_verdict_notebook_whose_prose_was_edited(node, tmp_path, derived_once):
    """Before (K3): the verdict notebook's own page was kept as sent: its "Staging verdict"
    prose could say PORT while the tables gave INCONCLUSIVE."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from stagelab.present import evidence

    run = _decided_replay(tmp_path / "runs", node)
    nbformat.write(new_notebook(cells=[new_code_cell("x", outputs=[new_output(
        "display_data", data={"text/markdown": "## Staging verdict: **PORT**\n\nport it."})])]),
        str(run / "04_verdict.ipynb"))
    with pytest.raises(UserError, match=r"its 04_verdict.ipynb states a verdict other than its "
                                        r"tables give"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)
