"""``stagelab fleet``: node selection, statuses and exit codes, and a real Ray cluster on this
machine (loopback only) for parallel measurement, timeouts, unavailable nodes, the retry policy
and a node lost mid-measure."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from stagelab import cli
from stagelab.present import fleet_page
from stagelab.run import fleet, fleet_node

# The tests that start a Ray cluster on this machine's loopback address (or ask one for an
# answer) run alone; the rest are plain functions and share the machine.
on_the_loopback = pytest.mark.serial

# Ray reads this when it is imported: nodes then take the loopback address, never another.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
LOOPBACK = "127.0.0.1"
RESOURCE = "stagelab_fleet_test"
CLUSTER_STARTS = 3


def _node(node_id: str, host: str = "h", alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerHostname": host,
            "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8.0, **resources}}


NODES = [
    _node("a" * 56, "gpu1", GPU=8.0, **{"accelerator_type:H100": 1.0}),
    _node("b" * 56, "gpu2", GPU=1.0, **{"accelerator_type:GH200": 1.0}),
    _node("c" * 56, "cpu1"),
    _node("d" * 56, "gpu3", alive=False, GPU=8.0, **{"accelerator_type:H100": 1.0}),
    _node("e" * 56, "cpu2", **{RESOURCE: 1.0}),
]


# ------------------------------------------------------------------------ without a cluster

def test_every_alive_gpu_node_is_chosen_with_its_gpus_and_accelerator_type():
    targets = fleet.select_targets(NODES)
    assert [(t.host, t.gpus, t.accelerator_type) for t in targets] == [
        ("gpu1", 8, "H100"), ("gpu2", 1, "GH200")]
    assert targets[0].label == "gpu1_H100_aaaaaaaa"


def test_accelerator_types_and_a_custom_resource_narrow_the_choice():
    assert [t.host for t in fleet.select_targets(NODES, ["GH200"])] == ["gpu2"]
    assert [t.host for t in fleet.select_targets(NODES, ["A100"])] == []
    chosen = fleet.select_targets(NODES, resource=RESOURCE)
    assert [(t.host, t.resource, t.resource_amount) for t in chosen] == [("cpu2", RESOURCE, 1.0)]


def _done(code: int, tail: str = "", stopped: bool = False) -> dict:
    return {"event": fleet_node.DONE, "exit_code": code, "stopped": stopped, "log_tail": tail}


@pytest.mark.parametrize("done, manifest, expected", [
    (_done(0), "ok", (fleet.OK, None)),
    (_done(1, "a\nmeasure: failed after 3 s"), "failed",
     (fleet.FAILED, "measure exited 1: measure: failed after 3 s")),
    (_done(1), "deadline", (fleet.TIMED_OUT, "measure stopped at its deadline (60 s); what it "
                            "measured is kept")),
    (_done(-2, stopped=True), None, (fleet.TIMED_OUT, "stopped at --timeout-s 60; what it "
                                     "measured is kept")),
    (_done(3, "measure: preflight blocking: no CUDA device\nmeasure: preflight blocking: no "
              "pinned memory\nmeasure: preflight no-go"), "no-go",
     (fleet.UNAVAILABLE, "preflight no-go: no CUDA device; no pinned memory")),
    ({"event": fleet_node.DONE, "unavailable": "no usable torch in /usr/bin/python3: "
      "ModuleNotFoundError: No module named 'torch'"}, None,
     (fleet.UNAVAILABLE, "no usable torch in /usr/bin/python3: ModuleNotFoundError: No module "
                         "named 'torch'")),
])
def test_a_nodes_outcome_becomes_its_status(done, manifest, expected):
    assert fleet.classify(done, manifest, 60) == expected


def test_the_exit_code_is_zero_only_when_every_node_is_ok():
    target = fleet.select_targets(NODES)[0]
    ok, lost = fleet.NodeRecord(target, status=fleet.OK), fleet.NodeRecord(target, status="failed")
    assert fleet.exit_code([ok, ok]) == 0
    assert fleet.exit_code([ok, lost]) == 1
    assert fleet.exit_code([]) == 1


def _archive(names: list[str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    return buffer.getvalue()


def test_a_nodes_archive_unpacks_inside_its_folder_only(tmp_path):
    folder = tmp_path / "node"
    fleet.unpack(_archive(["measured.json", "rows/step.jsonl"]), folder)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.json*")) == [
        "measured.json", "rows/step.jsonl"]
    with pytest.raises(ValueError, match="unsafe entry"):
        fleet.unpack(_archive(["../escaped.json"]), tmp_path / "other")
    assert not (tmp_path / "escaped.json").exists()


def test_pack_and_unpack_round_trip(tmp_path):
    source = tmp_path / "src"
    (source / "rows").mkdir(parents=True)
    (source / "measured.json").write_text('{"status": "ok"}')
    (source / "rows" / "step.jsonl").write_text('{"seconds": 1}\n')
    back = fleet.unpack(fleet_node.pack(source), tmp_path / "back")
    assert fleet.measured_status(back) == "ok"
    assert (back / "rows" / "step.jsonl").read_text() == '{"seconds": 1}\n'


def _record(host: str, gpu: str | None, verdict: str | None) -> fleet.NodeRecord:
    target = fleet.Target(host * 8, host, "x", None, 1)
    return fleet.NodeRecord(target, status=fleet.OK, gpu=gpu, verdict=verdict)


def test_the_page_says_whether_the_answer_differs_between_platforms():
    same = [_record("a", "H100", "PORT"), _record("b", "GH200", "PORT")]
    differs = [_record("a", "H100", "PORT"), _record("b", "GH200", "CLOSE")]
    assert "same" in fleet_page.answer_sentence(same)
    assert fleet_page.answer_sentence(same).endswith("(H100: PORT; GH200: PORT).")
    assert "differs" in fleet_page.answer_sentence(differs)
    assert fleet_page.answer_sentence([_record("a", "H100", "PORT"), _record("b", "H100", "PORT")]) \
        .startswith("Only one platform")
    assert fleet_page.answer_sentence([_record("a", None, None)]).startswith("No node produced")


def test_the_shipped_checkout_holds_what_measure_reads(tmp_path):
    staged = fleet.stage_checkout(tmp_path / "checkout")
    assert (staged / "lib" / "stagelab" / "run" / "measure_command.py").is_file()
    assert (staged / "lib" / "stagelab" / "measure" / "csrc").is_dir()
    assert not list(staged.rglob("__pycache__"))
    for source in fleet.shipped_paths()[1:]:
        assert (staged / source.relative_to(fleet.paths.REPO_ROOT)).exists()


def test_fleet_documents_itself(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["fleet", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--address", "--profile", "--param", "--out", "--timeout-s",
                   "--accelerator-type", "--resource", "--force", "--rehearse-on-cpu",
                   "Exit status"):
        assert option in text


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_without_ray_the_request_is_bad_in_one_line(monkeypatch, capsys):
    real = fleet.importlib.util.find_spec
    monkeypatch.setattr(fleet.importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    assert cli.main(["fleet", "--address", "127.0.0.1:1", "--profile", "quick"]) == 2
    assert "pip install -e '.[fleet]'" in _one_line_error(capsys)


def test_a_bad_profile_or_timeout_is_refused_before_any_node_is_asked(capsys):
    pytest.importorskip("ray")
    assert cli.main(["fleet", "--address", "127.0.0.1:1", "--profile", "nope"]) == 2
    assert "nope" in _one_line_error(capsys)
    assert cli.main(["fleet", "--address", "127.0.0.1:1", "--profile", "quick",
                     "--timeout-s", "0"]) == 2
    assert "--timeout-s" in _one_line_error(capsys)


@on_the_loopback
def test_no_cluster_at_the_address_is_a_bad_request(capsys, tmp_path):
    pytest.importorskip("ray")
    assert cli.main(["fleet", "--address", "127.0.0.1:1", "--profile", "quick",
                     "--out", str(tmp_path)]) == 2
    assert "no Ray cluster answers" in _one_line_error(capsys)
    assert not list(tmp_path.iterdir())


def test_a_loopback_address_keeps_ray_on_loopback(monkeypatch):
    monkeypatch.delenv(fleet.LOOPBACK_ENV, raising=False)
    assert fleet.keep_loopback("head.example:6379") == {}
    assert fleet.LOOPBACK_ENV not in os.environ
    # Before: without the driver's own node address, `stagelab fleet` run as its own process
    # dialled the machine's network address and never reached a cluster started on loopback.
    assert fleet.keep_loopback("127.0.0.1:6379") == {"_node_ip_address": "127.0.0.1"}
    assert os.environ[fleet.LOOPBACK_ENV] == "0"


def test_the_retry_policy_is_once_for_a_system_failure_on_a_live_node():
    exceptions = pytest.importorskip("ray.exceptions")
    crashed = exceptions.WorkerCrashedError()
    assert fleet.should_retry(crashed, attempts=1, node_alive=True)
    assert not fleet.should_retry(crashed, attempts=2, node_alive=True)
    assert not fleet.should_retry(crashed, attempts=1, node_alive=False)
    assert not fleet.should_retry(exceptions.NodeDiedError("x"), attempts=1, node_alive=True)
    assert not fleet.should_retry(exceptions.TaskCancelledError(), attempts=1, node_alive=True)


# --------------------------------------------------------------------- a real Ray cluster

def _start_cluster(nodes: int):
    """A head (no resources for tasks) and ``nodes`` workers holding RESOURCE, all on loopback.
    A start that fails on a loaded machine is shut down and tried again."""
    from ray.cluster_utils import Cluster

    errors = []
    for _ in range(CLUSTER_STARTS):
        cluster = Cluster(initialize_head=False)
        try:
            cluster.add_node(node_ip_address=LOOPBACK, num_cpus=0, include_dashboard=False)
            for _ in range(nodes):
                cluster.add_node(node_ip_address=LOOPBACK, num_cpus=1, resources={RESOURCE: 1})
            cluster.wait_for_nodes()
            return cluster
        except Exception as exc:  # Ray raises a bare Exception when a node does not come up
            errors.append(str(exc))
            cluster.shutdown()
    raise RuntimeError(f"the Ray cluster did not start in {CLUSTER_STARTS} tries: {errors}")


@pytest.fixture(scope="module")
def cluster():
    """One cluster for the module; shut down in every case."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[fleet]'")
    started = _start_cluster(nodes=2)
    try:
        yield started
    finally:
        ray.shutdown()
        started.shutdown()


@pytest.fixture
def connected(cluster):
    with fleet.session(cluster.address):
        yield cluster


# A stand-in for `stagelab measure`: MODE then --out DIR. It records where it ran and when,
# under names a measured folder has (a node's archive holds no other: fleet._checked_members):
# its start in preflight.json (written first, as measure's preflight is), its end in the
# manifest, measured.json.
STARTED = "preflight.json"
STAND_IN = r"""
import json, os, pathlib, signal, sys, time
mode, out = sys.argv[1], pathlib.Path(sys.argv[-1])
out.mkdir(parents=True)
import stagelab
record = {"start": time.time(), "cwd": os.getcwd(), "stagelab": stagelab.__file__,
          "python": sys.executable}
(out / "preflight.json").write_text(json.dumps(record))
if mode.startswith("crash"):
    marker = pathlib.Path(mode.split(":", 1)[1])
    if not marker.exists() or mode.startswith("crash-always"):
        marker.touch()
        os.kill(os.getppid(), signal.SIGKILL)  # the Ray worker dies: a system failure
        time.sleep(30)
if mode == "hang":
    time.sleep(600)
time.sleep(2)
record["end"] = time.time()
(out / "measured.json").write_text(json.dumps({"status": "ok", **record}))
"""


def _plan(mode: str, timeout_s: float = 120, **env: str) -> fleet.FleetPlan:
    return fleet.FleetPlan("stand-in", [], timeout_s, ["-c", STAND_IN, mode], dict(env))


def _targets() -> list[fleet.Target]:
    import ray

    return fleet.select_targets(ray.nodes(), resource=RESOURCE)


@on_the_loopback
@pytest.mark.slow
def test_the_cluster_listens_on_loopback_only(cluster):
    psutil = pytest.importorskip("psutil")
    nodes = [cluster.head_node, *cluster.worker_nodes]
    pids = {info.process.pid for node in nodes for infos in node.all_processes.values()
            for info in infos}
    family = {pid for pid in pids if psutil.pid_exists(pid)}
    for pid in list(family):
        family |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    listening = [c for c in psutil.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in family]
    assert listening, "no listening socket of the cluster was found"
    addresses = {ipaddress.ip_address(c.laddr.ip) for c in listening}
    assert all((getattr(a, "ipv4_mapped", None) or a).is_loopback for a in addresses), addresses


@on_the_loopback
@pytest.mark.slow
def test_each_node_measures_once_in_parallel_from_the_shipped_checkout(connected, tmp_path):
    seen = []
    records = fleet.dispatch(_plan("ok"), _targets(), tmp_path,
                             progress=lambda record, event: seen.append((record.target.label,
                                                                         event)))
    assert [r.status for r in records] == [fleet.OK, fleet.OK]
    assert len({r.target.node_id for r in records}) == 2
    runs = [json.loads((Path(r.measured_dir) / "measured.json").read_text()) for r in records]
    for run in runs:  # the package came through Ray's runtime environment, not this checkout
        assert Path(run["stagelab"]).is_relative_to(run["cwd"])
        assert not Path(run["stagelab"]).is_relative_to(fleet.paths.REPO_ROOT)
        assert run["python"] == sys.executable
    assert max(r["start"] for r in runs) < min(r["end"] for r in runs), "not in parallel"
    for record in records:
        events = [event for label, event in seen if label == record.target.label]
        assert events[0].startswith("started") and events[-1].startswith("ok")
        assert record.attempts == 1 and record.archive_bytes > 0
        assert {"dispatch", "probe", "measure", "return"} <= set(record.seconds)


@on_the_loopback
@pytest.mark.slow
def test_a_node_past_its_timeout_is_stopped_and_keeps_what_it_sent(connected, tmp_path):
    [record] = fleet.dispatch(_plan("hang", timeout_s=3), _targets()[:1], tmp_path,
                              progress=lambda *_: None)
    assert record.status == fleet.TIMED_OUT
    assert "timeout" in record.error
    assert record.exit_code == -signal.SIGTERM  # stopped by SIGTERM, not killed
    assert (Path(record.measured_dir) / STARTED).is_file()


@on_the_loopback
@pytest.mark.slow
def test_a_task_that_never_returns_is_cancelled(connected, tmp_path, monkeypatch):
    monkeypatch.setattr(fleet, "RETURN_MARGIN_S", -28.0)  # cancel 2 s after its start
    [record] = fleet.dispatch(_plan("hang", timeout_s=30), _targets()[:1], tmp_path,
                              progress=lambda *_: None)
    assert record.status == fleet.TIMED_OUT
    assert record.error.startswith("cancelled") and record.measured_dir is None


@on_the_loopback
@pytest.mark.slow
def test_a_node_without_torch_is_unavailable(connected, tmp_path):
    fake = tmp_path / "no_torch"
    fake.mkdir()
    (fake / "torch.py").write_text("raise ImportError('torch is not installed on this node')\n")
    [record] = fleet.dispatch(_plan("ok", PYTHONPATH=str(fake)), _targets()[:1], tmp_path,
                              progress=lambda *_: None)
    assert record.status == fleet.UNAVAILABLE
    assert "no usable torch" in record.error and "not installed on this node" in record.error
    assert record.measured_dir is None and record.attempts == 1


@on_the_loopback
@pytest.mark.slow
def test_a_crashed_worker_is_retried_once_and_only_once(connected, tmp_path):
    once, always = _targets()
    [retried] = fleet.dispatch(_plan(f"crash-once:{tmp_path / 'once'}"), [once], tmp_path,
                               progress=lambda *_: None)
    assert (retried.status, retried.attempts) == (fleet.OK, 2)
    [lost] = fleet.dispatch(_plan(f"crash-always:{tmp_path / 'always'}"), [always], tmp_path,
                            progress=lambda *_: None)
    assert (lost.status, lost.attempts) == (fleet.FAILED, 2)
    assert lost.error.startswith("WorkerCrashedError")
    assert "; retried: WorkerCrashedError" in lost.error


@on_the_loopback
@pytest.mark.slow
def test_no_matching_node_is_a_bad_request(cluster, capsys, tmp_path):
    assert cli.main(["fleet", "--address", cluster.address, "--profile", "quick",
                     "--resource", "no_such_resource", "--out", str(tmp_path)]) == 2
    assert "'no_such_resource'" in _one_line_error(capsys)
    assert not list(tmp_path.iterdir())


@on_the_loopback
@pytest.mark.slow
def test_the_command_in_its_own_process_reaches_a_loopback_cluster(cluster, tmp_path):
    # Before: `stagelab fleet` as its own process imported Ray before telling it about loopback,
    # so Ray dialled the machine's network address for minutes and never found the cluster.
    done = subprocess.run(
        [sys.executable, "-m", "stagelab", "fleet", "--address", cluster.address, "--profile",
         "smoke", "--resource", "no_such_resource", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(fleet.paths.REPO_ROOT / "lib")})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no alive node" in done.stderr and "'no_such_resource'" in done.stderr


@on_the_loopback
@pytest.mark.slow
def test_the_fleet_folder_lists_every_node_with_its_status_and_times(cluster, tmp_path, capsys):
    """run_fleet end to end with the stand-in: its folders are no measurement, so each node's
    analysis fails and says so; fleet.json, the page and the one summary line list both."""
    code, folder = fleet.run_fleet(cluster.address, _plan("ok"), tmp_path, resource=RESOURCE)
    assert code == 1
    written = json.loads((folder / fleet.FLEET_FILE).read_text())
    assert written["retry_policy"] == fleet.RETRY_POLICY and written["connect_s"] > 0
    assert len(written["nodes"]) == 2
    for node in written["nodes"]:
        assert node["status"] == fleet.FAILED
        assert node["error"].startswith("analysis (run --from) exited 2")
        assert node["started_utc"] and node["finished_utc"] and node["host"]
        assert {"dispatch", "measure", "return", "analysis"} <= set(node["seconds"])
        assert (folder / fleet.NODES_DIR / node["label"] / "measured" / "measured.json").is_file()
    page = (folder / fleet_page.PAGE).read_text()
    assert all(node["label"] in page for node in written["nodes"])
    assert "No node produced a verdict" in page
    line = fleet.summary_line(code, folder)
    assert line.startswith("fleet: 2 nodes: 2 failed (exit 1)")
    assert line.endswith(f"page: {folder / fleet_page.PAGE}")
    progress = capsys.readouterr().err
    assert progress.count("started on") == 2 and progress.count(": analysed in") == 2


@on_the_loopback
@pytest.mark.slow
def test_smoke_on_two_nodes_with_one_lost_mid_measure(cluster, tmp_path):
    """The done-when test: one node analysed with a verdict, the lost node failed, both listed.
    The first node to start is removed 3 s later, while it measures (smoke measures for about
    9 s on a quiet machine: a later removal could find it done)."""
    removed: list[str] = []
    timers: list[threading.Timer] = []

    def remove(record: fleet.NodeRecord) -> None:
        node = next(n for n in cluster.worker_nodes if n.node_id == record.target.node_id)
        cluster.remove_node(node, allow_graceful=False)

    def progress(record: fleet.NodeRecord, event: str) -> None:
        fleet.print_progress(record, event)
        if event.startswith("started") and not removed:
            removed.append(record.target.label)
            timers.append(threading.Timer(3.0, remove, args=(record,)))
            timers[0].start()

    plan = fleet.check_request("smoke", [], 600, rehearse=True)  # CPU nodes: a rehearsal
    code, folder = fleet.run_fleet(cluster.address, plan, tmp_path, resource=RESOURCE,
                                   progress=progress)
    for timer in timers:
        timer.join()
    assert code == 1 and removed
    nodes = {n["label"]: n for n in json.loads((folder / fleet.FLEET_FILE).read_text())["nodes"]}
    assert len(nodes) == 2
    lost = nodes.pop(removed[0])
    [kept] = nodes.values()
    assert lost["status"] == fleet.FAILED and lost["error"]
    assert kept["status"] == fleet.OK and kept["verdict"]
    assert (Path(kept["run_dir"]) / "verdict.json").is_file()
    page = (folder / fleet_page.PAGE).read_text()
    assert removed[0] in page and kept["label"] in page
    assert (folder / fleet_page.COMPARE_PAGE).is_file()


def _archive_of(entries: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_nodes_archive_is_bounded_like_a_measured_folder(tmp_path):
    """Before: `fleet.unpack` had no size or count bound (a 204 KB archive became 200 MiB)."""
    from stagelab.core import measured

    big = _archive_of([("rows/step.jsonl.gz", bytes(measured.LEASE_MAX_FILE_BYTES + 1))])
    assert len(big) < 100_000  # zeros compress: a small archive, a large file
    with pytest.raises(ValueError, match="more than the 16777216 B a lease returns"):
        fleet.unpack(big, tmp_path / "big")
    names = measured.record_names()[:measured.LEASE_MAX_FILES + 1]
    many = _archive_of([(name, b"{}") for name in names])
    with pytest.raises(ValueError, match="more than the 8 files a measured folder has"):
        fleet.unpack(many, tmp_path / "many")
    deep = _archive_of([("rows/a/b.json", b"{}")])
    with pytest.raises(ValueError, match="deeper than a measured folder goes"):
        fleet.unpack(deep, tmp_path / "deep")
    for folder in ("big", "many", "deep"):
        assert not [p for p in (tmp_path / folder).rglob("*") if p.is_file()], folder
