"""What one node of a fleet runs: check its Python has torch, run ``stagelab measure`` in that
Python, and send the measured folder back as a tar archive (bytes through Ray, never a shared
filesystem).

Standard library only, and pickled by value (``stagelab.run.fleet`` registers it with Ray's
cloudpickle), so the Ray worker needs neither stagelab nor torch itself: the checkout arrives as
the task's working folder (Ray's runtime environment) and the node's own Python measures from it
with ``PYTHONPATH=lib``. The task is a generator: its first item says it started, its last what
happened.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STARTED, DONE = "started", "done"
LOG_TAIL_LINES = 12
PROBE_TIMEOUT_S = 300
# Past the node's limit: SIGTERM (measure keeps what it measured), SIGKILL this much later.
KILL_AFTER_S = 15.0
# What the node's Python must import, and what it tells about the node's GPUs.
PROBE = ("import json, torch; cuda = torch.cuda.is_available(); "
         "print(json.dumps({'torch': torch.__version__, 'cuda': cuda, 'gpus': "
         "[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] "
         "if cuda else []}))")
PR_SET_PDEATHSIG = 1


def _in_child() -> None:
    """In the measuring process: the default SIGINT and SIGTERM (a Ray worker ignores SIGINT,
    and an ignored signal stays ignored across exec), and be killed when the Ray worker dies (a
    lost node, a cancelled task), so that no measurement goes on unowned."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: Ray's own process-group cleanup remains
        pass


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def node_environment(checkout: Path, extra: dict[str, str]) -> dict[str, str]:
    """The measuring process's environment: the worker's, ``extra``, and the shipped checkout's
    ``lib`` first on ``PYTHONPATH``."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(checkout / "lib"), env.get("PYTHONPATH"))
                                        if p)
    return env


def probe_torch(env: dict[str, str], cwd: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The node's torch version and GPUs, or None and the reason it cannot measure."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=cwd, text=True,
                              capture_output=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"importing torch took over {PROBE_TIMEOUT_S} s in {sys.executable}"
    if done.returncode != 0:
        last = tail(done.stderr, 1) or f"exit {done.returncode}"
        return None, f"no usable torch in {sys.executable}: {last}"
    return json.loads(done.stdout.strip().splitlines()[-1]), None


def run_limited(argv: list[str], env: dict[str, str], cwd: Path, log: Path,
                limit_s: float) -> tuple[int, bool]:
    """Run ``argv`` with its output in ``log``; past ``limit_s`` stop it (SIGTERM, which
    ``stagelab measure`` takes as an interruption that keeps what it measured; SIGKILL
    :data:`KILL_AFTER_S` later). Returns the exit status and whether it was stopped."""
    with open(log, "wb") as sink:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=_in_child)
        try:
            return proc.wait(timeout=limit_s), False
        except subprocess.TimeoutExpired:
            proc.terminate()
        try:
            return proc.wait(timeout=KILL_AFTER_S), True
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(), True


def pack(folder: Path) -> bytes:
    """A folder as gzipped tar bytes, its entries relative to the folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(folder.rglob("*")):
            archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


def measure_on_node(argv: list[str], limit_s: float,
                    extra_env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Yield ``started``, then ``done`` with the exit status, timings, the log's tail and the
    measured folder as tar bytes (None when nothing was written). ``argv`` follows the node's
    Python; ``--out FOLDER`` is appended."""
    yield {"event": STARTED, "host": socket.gethostname(), "python": sys.executable}
    checkout = Path.cwd()
    env = node_environment(checkout, extra_env)
    began = time.monotonic()
    probe, reason = probe_torch(env, checkout)
    probe_s = time.monotonic() - began
    if probe is None:
        yield {"event": DONE, "unavailable": reason, "probe": None, "probe_s": probe_s}
        return
    with tempfile.TemporaryDirectory(prefix="stagelab-fleet-") as scratch:
        out, log = Path(scratch) / "measured", Path(scratch) / "measure.log"
        began = time.monotonic()
        code, stopped = run_limited([sys.executable, *argv, "--out", str(out)], env, checkout,
                                    log, limit_s)
        measure_s = time.monotonic() - began
        archive = pack(out) if out.is_dir() else None
        yield {"event": DONE, "exit_code": code, "stopped": stopped, "probe": probe,
               "probe_s": probe_s, "measure_s": measure_s,
               "pack_s": time.monotonic() - began - measure_s,
               "log_tail": tail(log.read_text(errors="replace")), "archive": archive}
