"""``stagelab fleet``: one profile measured on every GPU node of a Ray cluster, one comparison,
the verdict per platform.

The driver connects to an existing cluster, picks the nodes (every alive node with a GPU, or the
given accelerator types, or the nodes holding a custom resource), and runs ``stagelab measure``
once on each, all in parallel. Each task asks for all of its node's GPUs (or all of the custom
resource) and is pinned to that node, so two measurements never share a node's PCIe link and
host memory. The checkout travels as the task's working folder through Ray's runtime
environment; the node's own Python and torch measure (:mod:`stagelab.run.fleet_node`); the measured
folder comes back as tar bytes through Ray. The driver analyses each folder with
``stagelab run --from`` into its own run folder and writes a fleet folder: ``fleet.json``, the
fleet page (``index.html``) and ``compare.html``.

Faults are data: a lost node is ``failed`` with Ray's error, a node past ``--timeout-s`` is
``timed out`` (keeping what it measured), a node without torch or with a no-go preflight is
``unavailable``. Retry policy: a task that fails for a system reason (its worker crashed, its
object was lost, its runtime environment could not be set up) while its node is still alive is
run once more on the same node; a node that died is not retried (another node would be another
platform), and a measurement that failed, timed out or was unavailable is never rerun.

Ray is imported only here, lazily: the base install does not need it (``pip install -e
.[fleet]``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stagelab.core import measured, outcomes, paths, rundir
from stagelab.core.errors import UserError
from stagelab.core.outcomes import EXIT_FAILED, EXIT_NO_GO, EXIT_OK, FAILED, OK
from stagelab.core.records import RunFolder, write_json_atomic
from stagelab.present.fleet_page import PAGE, answer_sentence, write_pages
from stagelab.run import fleet_node, profiles

FLEET_FILE = "fleet.json"
NODES_DIR, MEASURED_DIR = "nodes", "measured"
MEASURED_MANIFEST = "measured.json"
TIMED_OUT, UNAVAILABLE = "timed out", "unavailable"
STATUSES = (OK, FAILED, TIMED_OUT, UNAVAILABLE)
EXIT_SOME_FAILED, EXIT_USAGE = EXIT_FAILED, outcomes.EXIT_USAGE
MEASURE_EXIT_NO_GO = EXIT_NO_GO
MAX_ATTEMPTS = 2
RETRY_POLICY = ("a system failure (worker crashed, object lost, runtime environment not set up) "
                "on a node still alive is retried once on that node; a dead node, a failed or "
                "timed-out measurement and an unavailable node are never retried")
# How long past --timeout-s the driver waits for a node's archive before it cancels the task.
RETURN_MARGIN_S = 60.0
POLL_S = 0.5
CONNECT_CHECK_S = 5.0
ACCELERATOR_PREFIX = "accelerator_type:"
# Ray's switch for a cluster on one machine (read when Ray is imported): addresses stay loopback.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
ANALYSIS_TIMEOUT_S = 3600
Progress = Callable[["NodeRecord", str], None]


# ------------------------------------------------------------------------------ which nodes

@dataclass
class Target:
    """One node to measure, as Ray's node table describes it."""

    node_id: str
    host: str
    address: str
    accelerator_type: str | None
    gpus: int
    resource: str | None = None
    resource_amount: float = 0.0

    @property
    def label(self) -> str:
        """A folder-safe name: host, accelerator type and the node id's first 8 hex digits."""
        text = f"{self.host}_{self.accelerator_type or 'no-accelerator'}_{self.node_id[:8]}"
        return re.sub(r"[^A-Za-z0-9._-]", "-", text)


def accelerator_of(resources: dict[str, float]) -> str | None:
    """Ray's ``accelerator_type`` of a node, from its ``accelerator_type:<T>`` resource."""
    found = [key.removeprefix(ACCELERATOR_PREFIX) for key in resources
             if key.startswith(ACCELERATOR_PREFIX)]
    return found[0] if found else None


def select_targets(nodes: Iterable[dict[str, Any]], accelerator_types: Sequence[str] = (),
                   resource: str | None = None) -> list[Target]:
    """The alive nodes to measure from Ray's node table (``ray.nodes()``): those holding
    ``resource`` when given, else those of the given accelerator types, else every node with a
    GPU."""
    wanted = set(accelerator_types)
    targets = []
    for node in nodes:
        resources = node.get("Resources") or {}
        if not node.get("Alive"):
            continue
        accelerator = accelerator_of(resources)
        gpus = int(resources.get("GPU", 0))
        if resource is not None:
            chosen = resources.get(resource, 0) > 0
        elif wanted:
            chosen = accelerator in wanted
        else:
            chosen = gpus > 0
        if chosen:
            targets.append(Target(node["NodeID"], node.get("NodeManagerHostname") or "?",
                                  node.get("NodeManagerAddress") or "?", accelerator, gpus,
                                  resource, float(resources.get(resource, 0)) if resource else 0))
    return sorted(targets, key=lambda t: (t.host, t.node_id))


def describe_selection(accelerator_types: Sequence[str], resource: str | None) -> str:
    """The selection in words, for messages."""
    if resource is not None:
        return f"holding the resource {resource!r}"
    if accelerator_types:
        return f"of accelerator type {', '.join(accelerator_types)}"
    return "with a GPU"


# ---------------------------------------------------------------------------- what each did

@dataclass
class NodeRecord:
    """One node's row of fleet.json: where it is, what happened, and when."""

    target: Target
    status: str | None = None
    error: str | None = None
    attempts: int = 0
    gpu: str | None = None
    torch: str | None = None
    exit_code: int | None = None
    archive_bytes: int | None = None
    log_tail: str | None = None
    measured_dir: str | None = None
    run_dir: str | None = None
    verdict: str | None = None
    started_utc: str | None = None
    finished_utc: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    _dispatched: float = 0.0
    _started: float | None = None

    def row(self) -> dict[str, Any]:
        """The JSON row (private timing fields left out)."""
        row = {key: value for key, value in asdict(self).items() if not key.startswith("_")}
        target = row.pop("target")
        return {"node_id": target["node_id"], "label": self.target.label,
                "host": target["host"], "address": target["address"],
                "accelerator_type": target["accelerator_type"], "gpus": target["gpus"], **row}


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def measured_status(folder: Path) -> str | None:
    """The status a measured folder's manifest records (ok, deadline, failed, ...), if any."""
    try:
        return json.loads((folder / MEASURED_MANIFEST).read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def classify(done: dict[str, Any], manifest_status: str | None,
             timeout_s: float) -> tuple[str, str | None]:
    """A node's status and error from its ``done`` item (before analysis)."""
    if done.get("unavailable"):
        return UNAVAILABLE, done["unavailable"]
    code, tail = done["exit_code"], done.get("log_tail") or ""
    last = tail.splitlines()[-1] if tail else ""
    if code == MEASURE_EXIT_NO_GO:
        blocking = [line.split("preflight blocking:", 1)[1].strip()
                    for line in tail.splitlines() if "preflight blocking:" in line]
        return UNAVAILABLE, "preflight no-go: " + ("; ".join(blocking) or last)
    if done.get("stopped") or manifest_status == "deadline":
        return TIMED_OUT, (f"stopped at --timeout-s {timeout_s:g}; what it measured is kept"
                           if done.get("stopped") else
                           f"measure stopped at its deadline ({timeout_s:g} s); what it "
                           "measured is kept")
    if code == 0:
        return OK, None
    return FAILED, f"measure exited {code}: {last}" if last else f"measure exited {code}"


def is_system_failure(exc: BaseException) -> bool:
    """Whether a Ray error is the system's (a crashed worker, a lost node or object, a runtime
    environment that could not be set up) rather than the task's own exception."""
    from ray import exceptions

    return (isinstance(exc, exceptions.RayError)
            and not isinstance(exc, (exceptions.RayTaskError, exceptions.TaskCancelledError)))


def should_retry(exc: BaseException, attempts: int, node_alive: bool) -> bool:
    """The retry policy (:data:`RETRY_POLICY`): once, for a system failure on a live node."""
    from ray import exceptions

    return (attempts < MAX_ATTEMPTS and node_alive and is_system_failure(exc)
            and not isinstance(exc, exceptions.NodeDiedError))


def exit_code(records: Sequence[NodeRecord]) -> int:
    """0 when every node is ok, 1 otherwise."""
    return EXIT_OK if records and all(r.status == OK for r in records) else EXIT_SOME_FAILED


# ------------------------------------------------------------------------- the request

@dataclass
class FleetPlan:
    """What every node runs: ``argv`` after the node's Python (``--out`` is appended), its limit
    in seconds from its start, and extra environment for the measuring process."""

    profile: str
    params: list[str]
    timeout_s: float
    argv: list[str]
    extra_env: dict[str, str] = field(default_factory=dict)


def measure_argv(profile: str, params: Sequence[str], timeout_s: float,
                 force: bool = False, rehearse: bool = False) -> list[str]:
    """The node's ``stagelab measure`` command line (without ``--out``); its deadline is the
    fleet's timeout, so a node stops itself and sends what it measured. ``force`` measures past a
    no-go preflight, ``rehearse`` past no CUDA or no pinned copy (measure records both)."""
    argv = ["-m", "stagelab", "measure", "--profile", profile, "--deadline-s", f"{timeout_s:g}"]
    for param in params:
        argv += ["--param", param]
    return argv + (["--force"] if force else []) + (["--rehearse-on-cpu"] if rehearse else [])


def check_request(profile: str, params: Sequence[str], timeout_s: float,
                  force: bool = False, rehearse: bool = False) -> FleetPlan:
    """The plan, or UserError for a request every node would refuse (checked here, before any
    node is asked)."""
    if not 0 < timeout_s < math.inf:  # what every node's `measure --deadline-s` refuses
        raise UserError(f"--timeout-s {timeout_s}: give a positive, finite number of seconds")
    profiles.resolve_measuring(profile, [], list(params))
    return FleetPlan(profile, list(params), timeout_s,
                     measure_argv(profile, params, timeout_s, force, rehearse))


def require_ray() -> None:
    """UserError, naming the extra, when Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        raise UserError("the fleet needs Ray, which is not installed: pip install -e '.[fleet]'")


def host_and_port(address: str) -> tuple[str, int] | None:
    """The host and port of a ``HOST:PORT`` (or ``ray://HOST:PORT``) address; None for ``auto``."""
    match = re.fullmatch(r"(?:ray://)?\[?([^\]]+?)\]?:(\d+)", address)
    return (match.group(1), int(match.group(2))) if match else None


def keep_loopback(address: str) -> dict[str, Any]:
    """For a loopback ``address``, the ``ray.init`` options that keep the driver on loopback.

    Ray swaps a loopback address for the machine's network address, where a cluster bound to
    loopback is not found, unless told (before Ray is imported) that the cluster is this one
    machine's, and given the driver's own node address. Empty for any other address."""
    found = host_and_port(address)
    if found is None:
        return {}
    try:
        loopback = found[0] == "localhost" or ipaddress.ip_address(found[0]).is_loopback
    except ValueError:  # a host name
        return {}
    if not loopback:
        return {}
    os.environ.setdefault(LOOPBACK_ENV, "0")
    return {"_node_ip_address": "127.0.0.1" if found[0] == "localhost" else found[0]}


def check_address(address: str) -> None:
    """For a ``host:port`` address, UserError in seconds when nothing listens there (Ray itself
    would retry for much longer)."""
    found = host_and_port(address)
    if found is None:
        return
    host, port = found
    try:
        with socket.create_connection((host, port), timeout=CONNECT_CHECK_S) as connection:
            answer = _http2_answer(connection)
    except OSError as exc:
        raise UserError(f"--address {address}: no Ray cluster answers there "
                        f"({exc.strerror or exc})") from exc
    if not is_http2_settings(answer):
        said = f"it answered {answer[:16]!r}" if answer else "no answer"
        raise UserError(f"--address {address}: something listens there, but not a Ray cluster "
                        f"(it does not speak gRPC: {said} within {CONNECT_CHECK_S:g} s)")


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, a Ray client
# server) answers with a SETTINGS frame of its own; anything else is not Ray.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
SETTINGS_FRAME = 4


def _http2_answer(connection: socket.socket) -> bytes:
    """The first bytes a server sends after HTTP/2's preface (empty when it says nothing in
    :data:`CONNECT_CHECK_S`)."""
    connection.sendall(HTTP2_PREFACE)
    answer = b""
    with contextlib.suppress(TimeoutError, socket.timeout):
        while len(answer) < 9:
            chunk = connection.recv(9 - len(answer))
            if not chunk:
                break
            answer += chunk
    return answer


def is_http2_settings(answer: bytes) -> bool:
    """Whether ``answer`` starts with an HTTP/2 SETTINGS frame header (a gRPC server's first)."""
    return len(answer) >= 9 and answer[3] == SETTINGS_FRAME and answer[5:9] == b"\0\0\0\0"


# ---------------------------------------------------------------------- shipping the checkout

def shipped_paths() -> list[Path]:
    """What a node needs of the checkout to measure: the package, the profiles, the notebooks'
    parameter cells and the model shapes (paths inside the repository)."""
    package = Path(__file__).resolve().parents[1]
    return [package, paths.PROFILES_FILE, paths.NOTEBOOKS_DIR, paths.MODEL_SHAPES_FILE]


def stage_checkout(dest: Path) -> Path:
    """Copy :func:`shipped_paths` into ``dest`` at the same places (``lib/stagelab``, ...),
    without caches; ``dest`` becomes the task's working folder on every node."""
    root = paths.REPO_ROOT
    package = Path(__file__).resolve().parents[1]
    for source in shipped_paths():
        target = dest / ("lib/stagelab" if source == package else source.relative_to(root))
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", ".ipynb_checkpoints"))
        else:
            shutil.copy2(source, target)
    return dest


# A pax record or GNU long name of a measured folder's entry takes a few dozen bytes (its
# mtime, a name such as rows/step.2.jsonl.gz): one past this is refused before it is read.
MAX_EXTENDED_HEADER_BYTES = 4096
MAX_EXTENDED_CHAIN = 4  # a pax record, a global one, a long name and a long link, at most
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
             tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_PLAIN = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)


class _BoundedTarInfo(tarfile.TarInfo):
    """A tar header checked before tarfile processes it: an extended header (a GNU long name,
    a pax record) larger than :data:`MAX_EXTENDED_HEADER_BYTES` and any kind of entry other
    than a file or a folder are refused here, since tarfile reads an extended header whole
    into memory before any member check could see it."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > MAX_EXTENDED_HEADER_BYTES:
            raise ValueError(f"a node's archive has an extended header of {self.size} B, more "
                             f"than the {MAX_EXTENDED_HEADER_BYTES} B a measured folder's "
                             "names need; not read")
        if self.type not in _EXTENDED + _PLAIN:
            raise ValueError(f"unsafe entry in a node's archive: {_shown(self.name)} (type "
                             f"{self.type!r})")
        chain = getattr(tarfile_, "_extended_chain", 0) + 1 if self.type in _EXTENDED else 0
        if chain > MAX_EXTENDED_CHAIN:  # tarfile reads a chain of them by recursion
            raise ValueError(f"a node's archive chains more than {MAX_EXTENDED_CHAIN} extended "
                             "headers before an entry")
        tarfile_._extended_chain = chain  # type: ignore[attr-defined]
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _shown(name: str) -> str:
    """A member's name as a refusal quotes it: escaped and cut short."""
    return outcomes.clipped(repr(name), 80)


def _checked_members(tar: tarfile.TarFile, root: Path) -> list[tarfile.TarInfo]:
    """The archive's entries, read one header at a time and refused (ValueError) as soon as
    one is not a file of a measured folder by its known name (or its ``rows/`` folder), is
    there twice, is a link or a device, is larger than a file a lease returns, or is one file
    more than a lease returns: a node's folder is bounded as a measured folder is, before a
    byte of it is written."""
    members: list[tarfile.TarInfo] = []
    known, seen, files = set(measured.record_names()), set(), 0
    while (member := tar.next()) is not None:
        members.append(member)
        where = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not where.is_relative_to(root):
            raise ValueError(f"unsafe entry in a node's archive: {_shown(member.name)}")
        if len(Path(member.name).parts) > measured.LEASE_MAX_FOLDERS_BELOW_OUT + 1:
            raise ValueError(f"a node's archive entry lies deeper than a measured folder goes: "
                             f"{_shown(member.name)}")
        files += member.isfile()
        if files > measured.LEASE_MAX_FILES or len(members) > 2 * measured.LEASE_MAX_FILES:
            raise ValueError(f"a node's archive holds more than the {measured.LEASE_MAX_FILES} "
                             "files a measured folder has")
        name = Path(member.name).as_posix()
        if name not in (known if member.isfile() else {measured.ROWS_DIR}):
            raise ValueError(f"a node's archive entry {_shown(member.name)} is not a file of a "
                             "measured folder")
        if name in seen:
            raise ValueError(f"a node's archive holds {_shown(member.name)} twice")
        seen.add(name)
        if member.size > measured.LEASE_MAX_FILE_BYTES:
            raise ValueError(f"a node's archive entry {_shown(member.name)} holds {member.size} "
                             f"B, more than the {measured.LEASE_MAX_FILE_BYTES} B a lease returns")
    return members


def archive_error(exc: BaseException) -> str:
    """What a node's record says of an archive that cannot be read: one short, escaped line
    (an error may quote a name of megabytes)."""
    return outcomes.clipped(f"the node's archive cannot be read: {exc}")


def unpack(archive: bytes, dest: Path) -> Path:
    """Extract a node's tar bytes into ``dest``; entries that would land outside it, links,
    devices and more or larger files than a measured folder holds are refused (ValueError)
    before anything is written."""
    import io

    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz",
                      tarinfo=_BoundedTarInfo) as tar:
        members = _checked_members(tar, root)
        for member in members:
            if member.isdir():
                (root / member.name).mkdir(parents=True, exist_ok=True)
            else:
                (root / member.name).parent.mkdir(parents=True, exist_ok=True)
                _extract_file(tar, member, root / member.name)
    return dest


def _extract_file(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    """One regular file of the archive written to ``dest`` (ValueError for anything else:
    :func:`_checked_members` lets no other kind through)."""
    source = tar.extractfile(member)
    if source is None:
        raise ValueError(f"a node's archive entry is not a file: {member.name!r}")
    with source, open(dest, "wb") as out:
        shutil.copyfileobj(source, out)


# ---------------------------------------------------------------------------- on the cluster

def print_progress(record: NodeRecord, event: str) -> None:
    """One line per node as it starts, finishes or fails (stderr)."""
    print(outcomes.printable(f"fleet: {record.target.label}: {event}"), file=sys.stderr, flush=True)


def node_alive(node_id: str) -> bool:
    """Whether Ray's node table still lists the node as alive."""
    import ray

    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


def _task_options(target: Target) -> dict[str, Any]:
    """Pinned to its node, holding all its GPUs (or all of the custom resource), no Ray retry
    (the driver applies its own policy)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict[str, Any] = {
        "num_returns": "streaming", "num_cpus": 1, "num_gpus": target.gpus, "max_retries": 0,
        "name": f"stagelab-measure-{target.label}",
        "scheduling_strategy": NodeAffinitySchedulingStrategy(target.node_id, soft=False)}
    if target.resource is not None:
        options["resources"] = {target.resource: target.resource_amount}
    return options


def _receive(record: NodeRecord, item: dict[str, Any], get_s: float, node_dir: Path,
             plan: FleetPlan, progress: Progress) -> None:
    """Record a node's ``done`` item (fetched in ``get_s``): its status, its folder unpacked
    under ``node_dir``, the seconds its return took (packing on the node, fetching, unpacking)."""
    received = time.monotonic()
    record.finished_utc = rundir.now_utc()
    record.log_tail = item.get("log_tail") or item.get("unavailable")
    probe = item.get("probe") or {}
    record.torch = probe.get("torch")
    record.gpu = ", ".join(probe.get("gpus") or []) or None
    record.exit_code = item.get("exit_code")
    measure_s = float(item.get("measure_s") or 0.0)
    record.seconds["probe"] = round(float(item.get("probe_s") or 0.0), 3)
    record.seconds["measure"] = round(measure_s, 3)
    manifest_status = None
    archive = item.get("archive")
    if archive is not None:
        record.archive_bytes = len(archive)
        try:
            folder = unpack(archive, node_dir / MEASURED_DIR)
            record.measured_dir = str(folder)
            manifest_status = measured_status(folder)
        except (ValueError, tarfile.TarError, OSError) as exc:
            record.status, record.error = FAILED, archive_error(exc)
    if record.status is None:
        record.status, record.error = classify(item, manifest_status, plan.timeout_s)
    record.seconds["return"] = round(float(item.get("pack_s") or 0.0) + get_s
                                     + time.monotonic() - received, 3)
    progress(record, f"{record.status}" + (f": {record.error}" if record.error else
                                           f" (measured in {measure_s:.1f} s, "
                                           f"{record.archive_bytes or 0} bytes back)"))


def dispatch(plan: FleetPlan, targets: Sequence[Target], fleet_dir: Path,
             progress: Progress = print_progress) -> list[NodeRecord]:
    """Measure on every target at once; every record ends with a status. Runs inside
    :func:`session`."""
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(fleet_node)
    task = ray.remote(fleet_node.measure_on_node)
    records = [NodeRecord(t) for t in targets]
    running: dict[Any, NodeRecord] = {}

    def submit(record: NodeRecord) -> None:
        record.attempts += 1
        record._dispatched, record._started = time.monotonic(), None
        gen = task.options(**_task_options(record.target)).remote(plan.argv, plan.timeout_s,
                                                                 plan.extra_env)
        running[gen] = record

    for record in records:
        submit(record)
    while running:
        ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
        for gen in ready:
            _advance(gen, running, fleet_dir, plan, progress, submit)
        _cancel_overdue(running, plan, progress)
    return records


def _advance(gen: Any, running: dict[Any, NodeRecord], fleet_dir: Path, plan: FleetPlan,
             progress: Progress, submit: Callable[[NodeRecord], None]) -> None:
    """Take the next item of a ready node task: its start, its result, or its failure."""
    import ray

    record = running[gen]
    began = time.monotonic()
    try:
        item = ray.get(next(gen))
    except StopIteration:
        del running[gen]
        if record.status is None:
            record.status, record.error = FAILED, "the node's task ended without a result"
            progress(record, f"{FAILED}: {record.error}")
        return
    except ray.exceptions.RayError as exc:
        del running[gen]
        if should_retry(exc, record.attempts, node_alive(record.target.node_id)):
            record.error = one_line(exc)
            progress(record, f"retrying once after a system failure: {record.error}")
            submit(record)
            return
        # after a retry, both failures are told: the first is usually the cause
        record.status = FAILED
        record.error = one_line(exc) if record.error is None else (
            f"{record.error}; retried: {one_line(exc)}")
        record.finished_utc = rundir.now_utc()
        progress(record, f"{FAILED}: {record.error}")
        return
    if item["event"] == fleet_node.STARTED:
        record._started = time.monotonic()
        record.started_utc = rundir.now_utc()
        record.seconds["dispatch"] = round(record._started - record._dispatched, 3)
        progress(record, f"started on {item['host']} (attempt {record.attempts})")
        return
    del running[gen]
    _receive(record, item, time.monotonic() - began, fleet_dir / NODES_DIR / record.target.label,
             plan, progress)


def _cancel_overdue(running: dict[Any, NodeRecord], plan: FleetPlan, progress: Progress) -> None:
    """Cancel the tasks past ``--timeout-s`` plus the return margin (from their start, or from
    their dispatch when they never started); they are ``timed out``."""
    import ray

    now = time.monotonic()
    for gen, record in list(running.items()):
        since = record._started if record._started is not None else record._dispatched
        if now - since <= plan.timeout_s + RETURN_MARGIN_S:
            continue
        ray.cancel(gen, force=True)
        del running[gen]
        started = "" if record._started is not None else " (it never started)"
        record.status = TIMED_OUT
        record.error = (f"cancelled {plan.timeout_s + RETURN_MARGIN_S:g} s after its "
                        f"{'start' if record._started is not None else 'dispatch'}{started}; "
                        "it sent nothing back")
        record.finished_utc = rundir.now_utc()
        progress(record, f"{TIMED_OUT}: {record.error}")


# ------------------------------------------------------------------------------- analysis

def analyse(record: NodeRecord, plan: FleetPlan, node_dir: Path, progress: Progress) -> None:
    """``stagelab run --from`` on a node's measured folder, into ``node_dir``; a failed analysis
    turns an ok node into ``failed``. The run's overall verdict is read back. An unavailable
    node measured nothing: it is not analysed."""
    if record.measured_dir is None or record.status == UNAVAILABLE:
        return
    argv = [sys.executable, "-m", "stagelab", "run", "--profile", plan.profile,
            "--from", record.measured_dir, "--out", str(node_dir)]
    for param in analysis_params(plan.params):
        argv += ["--param", param]
    package_parent = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
    began = time.monotonic()
    log = node_dir / "analysis.log"
    with open(log, "wb") as sink:
        code = subprocess.run(argv, env=env, stdout=sink, stderr=subprocess.STDOUT,
                              timeout=ANALYSIS_TIMEOUT_S).returncode
    record.seconds["analysis"] = round(time.monotonic() - began, 3)
    runs = sorted(p for p in node_dir.iterdir() if p.is_dir() and p.name != MEASURED_DIR)
    record.run_dir = str(runs[-1]) if runs else None
    record.verdict = _overall_verdict(runs[-1]) if runs else None
    if code != 0 and record.status == OK:
        last = fleet_node.tail(log.read_text(errors="replace"), 1)
        record.status, record.error = FAILED, f"analysis (run --from) exited {code}: {last}"
    progress(record, f"analysed in {record.seconds['analysis']:.1f} s"
                     f"{': verdict ' + record.verdict if record.verdict else ''}"
                     f"{'' if code == 0 else f' (exit {code})'}")


def analysis_params(params: Sequence[str]) -> list[str]:
    """The ``--param`` items the analysis takes: a measuring notebook's were applied on the
    node (its measured.json records them) and ``run --from`` refuses them."""
    from stagelab.core import measured as measured_folder

    return [p for p in params
            if p.partition("=")[0].partition(".")[0] not in measured_folder.MEASURING]


def _overall_verdict(run_dir: Path) -> str | None:
    try:
        verdict = json.loads(RunFolder(run_dir).verdict_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (verdict.get("overall") or {}).get("decision") if isinstance(verdict, dict) else None


def new_fleet_dir(root: Path, profile: str) -> Path:
    """Create ``<root>/<UTC time>_fleet_<profile>[-N]`` exclusively."""
    return rundir.new_stamped_dir(root, f"fleet_{profile}", "fleet folder")


# ------------------------------------------------------------------------------ the command

@contextmanager
def session(address: str) -> Iterator[float]:
    """Connected to an existing cluster (never starting one) with the staged checkout as the
    job's working folder (Ray uploads it once; every task runs in it); yields the seconds that
    took and disconnects in every case. UserError when nothing answers at ``address``."""
    import logging

    loopback = keep_loopback(address)
    import ray

    check_address(address)
    with tempfile.TemporaryDirectory(prefix="stagelab-fleet-checkout-") as scratch:
        checkout = stage_checkout(Path(scratch) / "checkout")
        began = time.monotonic()
        try:
            ray.init(address=address, runtime_env={"working_dir": str(checkout)},
                     logging_level=logging.ERROR, log_to_driver=False, **loopback)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"--address {address}: cannot connect to a Ray cluster "
                            f"({one_line(exc)})") from exc
        try:
            yield time.monotonic() - began
        finally:
            ray.shutdown()


def run_fleet(address: str, plan: FleetPlan, out: Path, accelerator_types: Sequence[str] = (),
              resource: str | None = None, progress: Progress = print_progress) -> tuple[int, Path]:
    """Measure ``plan`` on the cluster's chosen nodes and write the fleet folder; returns the exit
    status (0 every node ok, 1 some not) and the folder. UserError (exit 2) for no Ray, no
    cluster at ``address`` or no matching node, before any node is asked."""
    require_ray()
    with session(address) as connect_s:  # imports Ray, after telling it about loopback
        import ray

        targets = select_targets(ray.nodes(), accelerator_types, resource)
        if not targets:
            raise UserError(f"no alive node {describe_selection(accelerator_types, resource)} "
                            f"in the cluster at {address}")
        fleet_dir = new_fleet_dir(out, plan.profile)
        print(f"fleet folder: {fleet_dir} ({len(targets)} nodes)", file=sys.stderr)
        began = time.monotonic()
        records = dispatch(plan, targets, fleet_dir, progress)
    for record in records:
        analyse(record, plan, fleet_dir / NODES_DIR / record.target.label, progress)
    header = {"folder": str(fleet_dir), "profile": plan.profile, "address": address,
              "nodes": len(records), "made": rundir.now_utc(),
              "connect s": round(connect_s, 3), "retry policy": RETRY_POLICY}
    write_json_atomic(fleet_dir / FLEET_FILE, {
        "format": "stagelab-fleet", "version": 1, "created_utc": header["made"],
        "address": address, "profile": plan.profile, "params": plan.params,
        "timeout_s": plan.timeout_s, "selection": describe_selection(accelerator_types, resource),
        "retry_policy": RETRY_POLICY, "connect_s": round(connect_s, 3),
        "wall_s": round(time.monotonic() - began, 3),
        "answer": answer_sentence(records), "nodes": [r.row() for r in records]})
    write_pages(fleet_dir, records, header)
    return exit_code(records), fleet_dir


def summary_line(code: int, records_path: Path) -> str:
    """The command's one line: the count per status and the page."""
    nodes = json.loads((records_path / FLEET_FILE).read_text(encoding="utf-8"))["nodes"]
    counts = ", ".join(f"{sum(n['status'] == s for n in nodes)} {s}" for s in STATUSES
                       if any(n["status"] == s for n in nodes))
    return f"fleet: {len(nodes)} nodes: {counts} (exit {code}); page: {records_path / PAGE}"

