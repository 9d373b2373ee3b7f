"""Run folders and their record: creation, the manifest, statuses that tell the truth, listing.

A run folder ``<UTC time>_<host>_<profile>[-N]/`` is created exclusively (never shared, never
overwritten) and holds each executed notebook, its HTML, ``data/`` (tidy tables), ``figures/``,
``manifest.json`` and ``index.html``. Every write of the record is atomic: a kill or a full disk
never leaves half a file or a temporary one behind.

The manifest says what the runner last knew. :func:`effective_manifest` says what is true now:
a run whose process died is ``interrupted``, and so is its running notebook; a notebook whose
file is gone from the folder is ``missing``. Listing and the report both read it.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from stagelab.core import paths
from stagelab.core.errors import UserError
from stagelab.core.outcomes import FAILED, INTERRUPTED, OK, PENDING, RUNNING
from stagelab.core.records import RunFolder, UnreadableJSON, write_json_atomic, write_text_atomic

__all__ = ["FAILED", "INTERRUPTED", "OK", "PENDING", "RUNNING",  # kept here for callers
           "RunFolder", "write_json_atomic", "write_text_atomic"]

MANIFEST = RunFolder.MANIFEST
CORRUPT_SUFFIX = ".corrupt"

# Statuses of a run and of each of its notebooks besides those of stagelab.core.outcomes.
MISSING = "missing"
INTERACTIVE = "interactive"  # run by hand in JupyterLab: the runner cannot know how it ended
UNREADABLE = "unreadable manifest"  # listed by `stagelab runs`, with the reason
UNMEASURED = "unmeasured"  # every notebook ran, but no table holds an ok row (all skipped)
# Notebook statuses that mean "this notebook did not deliver", as listed by ``stagelab runs``.
NOT_DELIVERED = (FAILED, INTERRUPTED, MISSING)

PACKAGES = ("stagelab", "torch", "numpy", "pandas", "pyarrow", "scipy", "matplotlib", "seaborn",
            "papermill", "nbconvert", "nbformat", "ipykernel", "nvidia-ml-py", "tqdm")


class RecordError(RuntimeError):
    """The run's record (manifest, index) could not be written, e.g. the disk is full: the run
    stops and is reported failed (exit 1), not as a bad request."""


def now_utc() -> str:
    """The time now, UTC, to the second, ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# -------------------------------------------------------------------------------- run folders

def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text)


def new_stamped_dir(root: Path, name: str, what: str = "run folder") -> Path:
    """Create ``<root>/<UTC time>_<name>[-N]`` exclusively (never reuse a folder); a bad
    ``--out`` is a one-line UserError."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {root}: cannot create the folder ({exc.strerror})") from exc
    if not os.access(root, os.W_OK | os.X_OK):
        raise UserError(f"--out {root}: the folder is not writable")
    base = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}_{name}"
    for attempt in range(1, 1000):
        candidate = root / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise UserError(f"--out {root}: cannot create a {what} ({exc.strerror})") from exc
        return candidate
    raise UserError(f"--out {root}: too many {what}s named {base}")


def new_run_dir(root: Path, profile: str) -> Path:
    """Create ``<root>/<UTC time>_<host>_<profile>[-N]`` with its data and figures folders."""
    candidate = new_stamped_dir(root, f"{_slug(socket.gethostname())}_{profile}")
    for sub in ("data", "figures"):
        (candidate / sub).mkdir()
    return candidate


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a result depends on."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(repo: Path = paths.REPO_ROOT) -> dict[str, Any]:
    """The commit the code came from and whether a tracked file had uncommitted changes (an
    untracked file, a scratch notebook or a run's own folder, changes no result: before, any
    untracked file made every report say "uncommitted changes")."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def notebook_entry(name: str, parameters: Mapping[str, Any] | None = None,
                   status: str = PENDING) -> dict[str, Any]:
    """A notebook's entry in the manifest."""
    return {"name": name, "parameters": dict(parameters or {}), "status": status,
            "duration_s": None, "error": None, "output": f"{name}.ipynb", "html": f"{name}.html"}


def new_manifest(run_dir: Path, profile: str, command: list[str],
                 notebooks: list[dict[str, Any]], hardware: Mapping[str, Any] | None,
                 status: str = RUNNING) -> dict[str, Any]:
    """The manifest of a run that starts now, in this process."""
    return {
        "run_id": Path(run_dir).name, "command": command, "profile": profile, "status": status,
        "created_utc": now_utc(), "finished_utc": None, "host": socket.gethostname(),
        "pid": os.getpid(), "kernel": "stagelab", "notebooks": notebooks,
        "hardware": dict(hardware) if hardware is not None else None,
        "packages": package_versions(), "git": git_state(),
    }


# ----------------------------------------------------------------------------------- the record

class ManifestRecorder:
    """The one writer of a run's manifest while it runs: named steps, state in one place.

    Every step updates the in-memory manifest and persists it atomically. A write that fails
    (full disk, lost permission) is retried once as a ``failed`` manifest naming the cause; if
    even that cannot be written, :class:`RecordError` says so in one line.
    """

    def __init__(self, run_dir: Path, manifest: dict[str, Any]) -> None:
        self.run_dir = Path(run_dir)
        self.manifest = manifest

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST

    def entry(self, index: int) -> dict[str, Any]:
        return self.manifest["notebooks"][index]

    def save(self) -> None:
        """Persist the manifest; on failure record ``failed`` with the cause, then raise."""
        try:
            write_json_atomic(self.path, self.manifest)
        except OSError as exc:
            self.record_failure(f"the run's record could not be written: {_os_reason(exc)}")
            raise RecordError(f"{self.path}: cannot be written ({_os_reason(exc)}); "
                              "the run stopped") from exc

    def record_failure(self, reason: str) -> bool:
        """Mark the run and its unfinished notebooks ``failed`` with ``reason``; True if saved."""
        self.manifest.update(status=FAILED, error=reason, finished_utc=now_utc())
        for entry in self.manifest["notebooks"]:
            if entry["status"] in (RUNNING, PENDING):
                entry.update(status=FAILED, error=reason)
        try:
            write_json_atomic(self.path, self.manifest)
            return True
        except OSError:
            return False

    def start_notebook(self, index: int) -> dict[str, Any]:
        entry = self.entry(index)
        entry.update(status=RUNNING, started_utc=now_utc())
        self.save()
        return entry

    def finish_notebook(self, index: int, status: str, duration_s: float,
                        error: str | None = None) -> None:
        self.entry(index).update(status=status, duration_s=round(duration_s, 2), error=error)
        self.save()

    def interrupt(self, reason: str) -> None:
        """The run was stopped: the running notebook and the run become ``interrupted``, the
        run's ``error`` saying why (also when it stopped between notebooks)."""
        for entry in self.manifest["notebooks"]:
            if entry["status"] == RUNNING:
                entry.update(status=INTERRUPTED, error=f"interrupted ({reason})")
        self.manifest["status"] = INTERRUPTED
        self.manifest.setdefault("error", f"interrupted ({reason})")

    def finish(self) -> dict[str, Any]:
        """Close the record: ``failed`` if any notebook did not deliver, ``unmeasured`` if
        the tables hold rows but none ok (or a replay, ``measured_on``, holds no ok row at
        all), else ``ok``. Rows per status go in ``measured``."""
        self.manifest["measured"] = measured_counts(self.run_dir)
        if self.manifest["status"] == RUNNING:
            statuses = {e["status"] for e in self.manifest["notebooks"]}
            measured = self.manifest["measured"]
            replayed = bool(self.manifest.get("measured_on"))
            self.manifest["status"] = (
                FAILED if statuses & set(NOT_DELIVERED) else
                UNMEASURED if (measured or replayed) and not measured.get(OK) else OK)
        self.manifest["finished_utc"] = now_utc()
        self.save()
        return self.manifest


def measured_counts(run_dir: Path) -> dict[str, int]:
    """Rows of the run's tables per status (``{}`` when it has no table); a table that cannot
    be read counts as ``unreadable``."""
    import pyarrow.parquet as pq

    counts: dict[str, int] = {}
    for table in RunFolder(run_dir).tables():
        try:
            statuses = pq.read_table(table, columns=["status"]).column("status").to_pylist()
        except Exception:  # pyarrow raises several types for a damaged file
            statuses = ["unreadable"]
        for status in statuses:
            counts[str(status)] = counts.get(str(status), 0) + 1
    return counts


def nothing_measured(manifest: Mapping[str, Any]) -> str:
    """The status line of a run that measured nothing, e.g. ``nothing measured (12 skipped)``."""
    counts = manifest.get("measured") or {}
    detail = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"nothing measured ({detail or 'no rows'})"


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


# ----------------------------------------------------------------------------------- reading

def read_manifest(run_dir: Path) -> dict[str, Any]:
    """A run folder's manifest, shape-checked; UserError naming the file when it is missing,
    corrupt or of the wrong shape."""
    folder = RunFolder(run_dir)
    try:
        return folder.read_manifest()
    except FileNotFoundError as exc:
        raise UserError(f"{folder.manifest_path}: no manifest; is {run_dir} a run folder?") \
            from exc
    except UnreadableJSON as exc:
        raise UserError(f"{exc}; `stagelab report {run_dir}` rebuilds it from the folder's "
                        "notebooks") from exc


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> Path:
    """Write a manifest atomically."""
    return RunFolder(run_dir).write_manifest(dict(manifest))


MAX_PID = 2**22  # Linux's largest pid_max


def process_alive(manifest: Mapping[str, Any]) -> bool:
    """Whether the process that wrote a ``running`` manifest still runs (unknown: assume so)."""
    if manifest.get("host") != socket.gethostname():
        return True
    pid = manifest.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= MAX_PID:
        return False  # no process has that id (0 and -1 would name a group, or every process)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass
    return True


def effective_status(manifest: Mapping[str, Any]) -> str:
    """The manifest's status, or ``interrupted`` for a run whose process died while running."""
    status = manifest.get("status", "unknown")
    if status == RUNNING and not process_alive(manifest):
        return INTERRUPTED
    return status


def effective_manifest(run_dir: Path, manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A copy of the manifest with the statuses that are true now.

    A dead run's running notebook is ``interrupted``; a notebook recorded as executed whose
    file is gone is ``missing`` (and so is the run, if it was ``ok``).
    """
    run_dir = Path(run_dir)
    result = copy.deepcopy(dict(manifest if manifest is not None else read_manifest(run_dir)))
    result["status"] = effective_status(result)
    for entry in result.get("notebooks", []):
        if result["status"] == INTERRUPTED and entry.get("status") == RUNNING:
            entry.update(status=INTERRUPTED, error=entry.get("error") or "the run's process died")
        executed = entry.get("status") in (OK, FAILED, INTERRUPTED)
        if executed and entry.get("output") and not (run_dir / entry["output"]).exists():
            entry.update(status=MISSING, error=f"{entry['output']} is not in the folder")
    if result["status"] == OK and any(e.get("status") == MISSING for e in result.get("notebooks", [])):
        result["status"] = MISSING
    return result


# ----------------------------------------------------------------------- rebuilding a manifest

def _notebook_outcome(path: Path) -> tuple[str, dict[str, Any], float | None, str | None] | None:
    """Status, parameters, duration and error of a notebook papermill executed, from its
    metadata; None for a notebook papermill never ran (or one that cannot be read)."""
    import nbformat

    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception:  # nbformat raises several types for a damaged file
        return None
    meta = nb.metadata.get("papermill")
    if not isinstance(meta, dict):
        return None
    params = {k: v for k, v in (meta.get("parameters") or {}).items() if k != "run_dir"}
    if meta.get("exception"):
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
        error = f"{errors[-1]['ename']}: {errors[-1]['evalue']}" if errors else "a cell failed"
        return FAILED, params, meta.get("duration"), error
    if meta.get("end_time"):
        return OK, params, meta.get("duration"), None
    return INTERRUPTED, params, meta.get("duration"), "the notebook did not finish"


def rebuild_manifest(run_dir: Path, reason: str) -> dict[str, Any]:
    """Rebuild a lost or corrupt manifest from the folder's executed notebooks, with a note.

    The unreadable file is kept beside it as ``manifest.json.corrupt``.
    """
    run_dir = Path(run_dir)
    outcomes = {path: _notebook_outcome(path) for path in RunFolder(run_dir).notebooks()}
    executed = {path: outcome for path, outcome in outcomes.items() if outcome is not None}
    if not executed:
        raise UserError(f"{run_dir}: no readable manifest (it {reason}) and no notebook executed "
                        "by papermill to rebuild it from; is it a run folder?")
    entries = []
    for path, (status, params, duration, error) in executed.items():
        entry = notebook_entry(path.stem, params, status)
        entry.update(duration_s=duration, error=error)
        entries.append(entry)
    if (run_dir / MANIFEST).exists():
        os.replace(run_dir / MANIFEST, run_dir / (MANIFEST + CORRUPT_SUFFIX))
    profile = run_dir.name.rsplit("_", 1)[-1].split("-")[0] if "_" in run_dir.name else None
    try:
        hardware = RunFolder(run_dir).read_hardware()
    except UserError:
        hardware = None
    statuses = {e["status"] for e in entries}
    manifest = {
        "run_id": run_dir.name, "command": None, "profile": profile,
        "status": FAILED if statuses & set(NOT_DELIVERED) else OK,
        "created_utc": None, "finished_utc": None, "host": None, "pid": None,
        "kernel": "stagelab", "notebooks": entries, "hardware": hardware,
        "packages": None, "git": None,
        "note": f"rebuilt from the folder's notebooks on {now_utc()} because the manifest "
                f"{reason}; versions, commit and timings of the original run are not known",
    }
    write_manifest(run_dir, manifest)
    return manifest


def load_or_rebuild_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest, rebuilt from the notebooks (with a note) when it is missing or not JSON;
    a manifest of the wrong shape is refused in one line (BadRecord), never rewritten."""
    try:
        return RunFolder(run_dir).read_manifest()
    except FileNotFoundError:
        return rebuild_manifest(run_dir, "was missing")
    except UnreadableJSON as exc:
        return rebuild_manifest(run_dir, f"could not be read ({exc.__cause__})")


# ----------------------------------------------------------------------------------- listing

@dataclass(frozen=True)
class RunSummary:
    """One line of ``stagelab runs``."""

    run_id: str
    status: str
    profile: str | None = None
    created_utc: str | None = None
    device: str | None = None
    notebooks: tuple[tuple[str, str], ...] = ()
    problem: str | None = None  # why the manifest is unreadable, in one line

    def not_delivered(self, status: str) -> list[str]:
        """The notebooks with this status."""
        return [name for name, s in self.notebooks if s == status]


def summarize(run_dir: Path) -> RunSummary:
    """The listing line of one run folder, with effective statuses."""
    run_dir = Path(run_dir)
    try:
        manifest = effective_manifest(run_dir)
    except UserError as exc:
        return RunSummary(run_dir.name, UNREADABLE, problem=str(exc))
    gpu = (manifest.get("hardware") or {}).get("gpu")
    return RunSummary(
        run_id=run_dir.name, status=manifest["status"],
        profile=manifest.get("profile"), created_utc=manifest.get("created_utc"),
        device=(gpu.get("name") or "unnamed GPU") if gpu else "cpu",
        notebooks=tuple((e["name"], e["status"]) for e in manifest.get("notebooks", [])))


def list_runs(root: Path = paths.RUNS_DIR) -> list[RunSummary]:
    """One summary per run folder under ``root`` (dot-folders left out), oldest first."""
    return [summarize(path.parent) for path in sorted(Path(root).glob(f"*/{MANIFEST}"))
            if not path.parent.name.startswith(".")]
