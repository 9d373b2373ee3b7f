"""Run folders: plan a profile, execute its notebooks with papermill, keep a manifest.

A run folder ``<UTC time>_<host>_<profile>/`` is created exclusively (never shared, never
overwritten) and holds each executed notebook, its HTML, ``data/`` (tidy tables), ``figures/``,
``manifest.json`` and ``index.html``. The manifest is rewritten after every notebook, so a failed
or interrupted run keeps what it produced and says how it ended.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from stagelab import hardware, paths, report
from stagelab.errors import UserError

KERNEL_NAME = "stagelab"
MANIFEST = "manifest.json"
PACKAGES = ("stagelab", "torch", "numpy", "pandas", "pyarrow", "scipy", "matplotlib", "seaborn",
            "papermill", "nbconvert", "nbformat", "ipykernel", "nvidia-ml-py", "tqdm")
# Parameters the runner injects into every notebook; a notebook must declare ``run_dir``.
INJECTED = ("run_dir",)


@dataclass
class NotebookPlan:
    """One notebook of a run and the parameters it will get."""

    name: str
    path: Path
    parameters: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------- planning

def load_profiles(path: Path | None = None) -> dict[str, Any]:
    """The profiles file: ``{profile: {"description": str, "notebooks": {name: {param: value}}}}``."""
    path = path or paths.PROFILES_FILE
    try:
        profiles = yaml.safe_load(Path(path).read_text())["profiles"]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise UserError(f"profiles file {path} cannot be read: {exc}") from exc
    return profiles


def notebook_parameters(path: Path) -> dict[str, Any]:
    """The defaults of a notebook's ``parameters`` cell, as Python values."""
    import papermill

    declared = papermill.inspect_notebook(str(path))
    if not declared:
        raise UserError(f"notebook {path.name} has no cell tagged 'parameters'")
    return {name: _literal(info["default"]) for name, info in declared.items()}


def _literal(source: str) -> Any:
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return None  # a computed default: any type is accepted


def parse_overrides(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``NOTEBOOK.KEY=VALUE`` strings to ``{notebook: {key: value}}``; values are read as YAML."""
    overrides: dict[str, dict[str, Any]] = {}
    for item in items:
        target, sep, text = item.partition("=")
        notebook, dot, key = target.partition(".")
        if not sep or not dot or not notebook or not key:
            raise UserError(f"--param {item!r}: expected NOTEBOOK.KEY=VALUE, "
                            "e.g. 01_d2h_staging.repeats=20")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as exc:
            raise UserError(f"--param {item!r}: value is not valid YAML ({exc})") from exc
        overrides.setdefault(notebook, {})[key] = value
    return overrides


def _type_ok(value: Any, default: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def check_parameters(notebook: str, given: Mapping[str, Any], declared: Mapping[str, Any],
                     source: str) -> None:
    """Raise UserError for an unknown parameter or one whose type differs from the default's."""
    for key, value in given.items():
        if key not in declared:
            raise UserError(f"{source}: unknown parameter {notebook}.{key}; valid: "
                            f"{', '.join(k for k in declared if k not in INJECTED)}")
        if not _type_ok(value, declared[key]):
            raise UserError(f"{source}: {notebook}.{key}={value!r} is a "
                            f"{type(value).__name__}, expected {type(declared[key]).__name__} "
                            f"(default {declared[key]!r})")


def plan_run(profile: str, only: Iterable[str] = (),
             overrides: Mapping[str, Mapping] | None = None, profiles_path: Path | None = None,
             notebooks_dir: Path | None = None) -> list[NotebookPlan]:
    """Validate a request and return the notebooks to run, in the profile's order."""
    overrides = overrides or {}
    notebooks_dir = notebooks_dir or paths.NOTEBOOKS_DIR
    profiles = load_profiles(profiles_path)
    if profile not in profiles:
        raise UserError(f"unknown profile {profile!r}; valid: {', '.join(profiles)}")
    entries: dict[str, dict] = profiles[profile]["notebooks"]
    only = list(only)
    for name in [*only, *overrides]:
        if name not in entries:
            raise UserError(f"unknown notebook {name!r} in profile {profile!r}; valid: "
                            f"{', '.join(entries)}")
    plans = []
    for name, params in entries.items():
        if only and name not in only:
            continue
        path = Path(notebooks_dir) / f"{name}.ipynb"
        if not path.exists():
            raise UserError(f"profile {profile!r} names {name}, but {path} does not exist")
        declared = notebook_parameters(path)
        if "run_dir" not in declared:
            raise UserError(f"notebook {name} does not declare the parameter run_dir")
        check_parameters(name, params or {}, declared, f"profile {profile!r}")
        check_parameters(name, overrides.get(name, {}), declared, "--param")
        plans.append(NotebookPlan(name, path, {**(params or {}), **overrides.get(name, {})}))
    return plans


# -------------------------------------------------------------------------------- run folders

def new_run_dir(root: Path, profile: str) -> Path:
    """Create ``<root>/<UTC time>_<host>_<profile>[-N]`` exclusively; never reuse a folder."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {root}: cannot create the folder ({exc.strerror})") from exc
    if not os.access(root, os.W_OK | os.X_OK):
        raise UserError(f"--out {root}: the folder is not writable")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())
    base = f"{stamp}_{host}_{profile}"
    for attempt in range(1, 1000):
        candidate = root / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise UserError(f"--out {root}: cannot create a run folder ({exc.strerror})") from exc
        for sub in ("data", "figures"):
            (candidate / sub).mkdir()
        return candidate
    raise UserError(f"--out {root}: too many run folders named {base}")


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """A run folder's manifest; UserError naming the file when it is missing or corrupt."""
    path = Path(run_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise UserError(f"{path}: no manifest; is {run_dir} a run folder?") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot be read ({exc})") from exc


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Write the manifest atomically (a kill never leaves half a file)."""
    tmp = Path(run_dir) / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    tmp.replace(Path(run_dir) / MANIFEST)


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a result depends on."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(repo: Path = paths.REPO_ROOT) -> dict[str, Any]:
    """The commit the code came from and whether the tree had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------- execution

def ensure_kernel() -> None:
    """Make the ``stagelab`` kernel run this very interpreter, ahead of any other of that name."""
    from ipykernel.kernelspec import install
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    prefix_path = str(Path(sys.prefix) / "share" / "jupyter")
    if os.environ.get("JUPYTER_PATH", "").split(os.pathsep)[0] != prefix_path:
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            p for p in (prefix_path, os.environ.get("JUPYTER_PATH")) if p)
    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
        if spec.argv and spec.argv[0] == sys.executable:
            return
    except NoSuchKernel:
        pass
    install(kernel_name=KERNEL_NAME, display_name="Python (stagelab)", prefix=sys.prefix)


def _ipc_kernel_manager() -> type:
    """A kernel manager whose kernel talks over local IPC sockets rather than loopback TCP
    (private to this user, and the kernel no longer warns about unencrypted TCP)."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IpcKernelManager(AsyncKernelManager):
        @default("transport")
        def _default_transport(self) -> str:
            return "ipc"

    return IpcKernelManager


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _error_summary(exc: BaseException) -> str:
    name = getattr(exc, "ename", None) or type(exc).__name__
    value = getattr(exc, "evalue", None) or str(exc)
    lines = str(value).strip().splitlines()
    return f"{name}: {lines[0] if lines else ''}".strip()


def execute(plans: list[NotebookPlan], run_dir: Path, profile: str,
            command: list[str] | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the notebooks in order into ``run_dir``; return the final manifest.

    A failing notebook is recorded as ``failed`` (its partial output kept) and the next one still
    runs; Ctrl-C or SIGTERM marks the run ``interrupted`` and stops.
    """
    import papermill

    ensure_kernel()
    kernel_manager = _ipc_kernel_manager()
    run_dir = Path(run_dir)
    manifest: dict[str, Any] = {
        "run_id": run_dir.name,
        "command": command if command is not None else sys.argv,
        "profile": profile,
        "status": "running",
        "created_utc": _now(),
        "finished_utc": None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "kernel": KERNEL_NAME,
        "notebooks": [{"name": p.name, "parameters": p.parameters, "status": "pending",
                       "duration_s": None, "error": None, "output": f"{p.name}.ipynb",
                       "html": f"{p.name}.html"} for p in plans],
        "hardware": hardware.snapshot(),
        "packages": package_versions(),
        "git": git_state(),
    }
    write_manifest(run_dir, manifest)
    report.write_index(run_dir)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    current = None
    try:
        for i, (plan, entry) in enumerate(zip(plans, manifest["notebooks"])):
            current = entry
            entry.update(status="running", started_utc=_now())
            write_manifest(run_dir, manifest)
            _say(progress, f"[{i + 1}/{len(plans)}] {plan.name} ...")
            started = time.perf_counter()
            try:
                papermill.execute_notebook(
                    str(plan.path), str(run_dir / entry["output"]),
                    parameters={**plan.parameters, "run_dir": str(run_dir.resolve())},
                    kernel_name=KERNEL_NAME, cwd=str(plan.path.parent), progress_bar=False,
                    request_save_on_cell_execute=True, kernel_manager_class=kernel_manager)
                entry["status"] = "ok"
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # papermill or the kernel failed: keep going
                entry.update(status="failed", error=_error_summary(exc))
            entry["duration_s"] = round(time.perf_counter() - started, 2)
            _export_quietly(run_dir, entry)
            _say(progress, f"[{i + 1}/{len(plans)}] {plan.name}: {entry['status']} "
                           f"({entry['duration_s']} s){' - ' + entry['error'] if entry['error'] else ''}")
            write_manifest(run_dir, manifest)
            report.write_index(run_dir)
        failed = [e["name"] for e in manifest["notebooks"] if e["status"] == "failed"]
        manifest["status"] = "failed" if failed else "ok"
    except KeyboardInterrupt as exc:
        manifest["status"] = "interrupted"
        if current is not None and current["status"] == "running":
            current.update(status="interrupted", error=f"interrupted ({exc or 'Ctrl-C'})")
            _export_quietly(run_dir, current)
    finally:
        signal.signal(signal.SIGTERM, previous)
        manifest["finished_utc"] = _now()
        write_manifest(run_dir, manifest)
        report.write_index(run_dir)
    return manifest


def rebuild_report(run_dir: Path) -> Path:
    """Re-export every executed notebook of a run folder, record the HTML, rewrite the index."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    for entry in manifest.get("notebooks", []):
        entry["html"] = f"{entry['name']}.html"
        _export_quietly(run_dir, entry)
    write_manifest(run_dir, manifest)
    return report.write_index(run_dir)


def _export_quietly(run_dir: Path, entry: dict[str, Any]) -> None:
    """Export one executed notebook's HTML; an export failure is recorded, never fatal."""
    notebook = run_dir / entry["output"]
    if not notebook.exists():
        entry["html"] = None
        return
    try:
        report.export_html(notebook, run_dir / entry["html"])
    except Exception as exc:
        entry["html"] = None
        entry["html_error"] = _error_summary(exc)


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- listing

def list_runs(root: Path = paths.RUNS_DIR) -> list[dict[str, Any]]:
    """One summary per run folder under ``root``, oldest first."""
    runs = []
    for manifest_path in sorted(Path(root).glob(f"*/{MANIFEST}")):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            runs.append({"run_id": manifest_path.parent.name, "status": "unreadable manifest"})
            continue
        gpu = (manifest.get("hardware") or {}).get("gpu")
        runs.append({
            "run_id": manifest.get("run_id", manifest_path.parent.name),
            "profile": manifest.get("profile"),
            "created_utc": manifest.get("created_utc"),
            "device": gpu["name"] if gpu else "cpu",
            "status": effective_status(manifest),
            "failed": [n["name"] for n in manifest.get("notebooks", [])
                       if n.get("status") in ("failed", "interrupted")],
        })
    return runs


def effective_status(manifest: Mapping[str, Any]) -> str:
    """The manifest's status, or ``interrupted`` for a run whose process died while running."""
    status = manifest.get("status", "unknown")
    if status != "running" or manifest.get("host") != socket.gethostname():
        return status
    try:
        os.kill(int(manifest["pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError, TypeError):
        return "interrupted"
    except PermissionError:
        pass
    return status


# ---------------------------------------------------------------------- inside a notebook

@dataclass
class NotebookContext:
    """What a notebook needs to write into its run folder: tables through the schema, figures."""

    notebook: str
    run_dir: Path

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def write_table(self, frame: Any, name: str) -> Path:
        """Write a tidy table (see :mod:`stagelab.schema`) into ``data/``."""
        from stagelab import schema

        frame = frame.assign(run_id=self.run_id, notebook=self.notebook)
        return schema.write_table(frame, self.run_dir, name)

    def save_figure(self, figure: Any, name: str) -> Path:
        """Save a matplotlib figure as ``figures/<notebook>_<name>.png``."""
        path = self.run_dir / "figures" / f"{self.notebook}_{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=110, bbox_inches="tight")
        return path

    def write_json(self, payload: Any, name: str) -> Path:
        """Write a JSON document at the run folder's top level (e.g. ``verdict.json``)."""
        path = self.run_dir / name
        path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
        return path


def notebook_context(notebook: str, run_dir: str | Path | None) -> NotebookContext:
    """The context of a notebook run by the runner, or, interactively, of a fresh folder.

    In JupyterLab ``run_dir`` is empty: a folder ``<time>_<host>_interactive`` is made under
    ``papermill_runs/`` so interactive results are kept apart from profile runs.
    """
    if run_dir:
        path = Path(run_dir)
        if not path.is_dir():
            raise FileNotFoundError(f"run_dir {path} does not exist")
        return NotebookContext(notebook, path)
    return NotebookContext(notebook, new_run_dir(paths.RUNS_DIR, "interactive"))


# -------------------------------------------------------------------------------- evidence

EVIDENCE_PATTERNS = ("manifest.json", "verdict.json", "hardware.json", "*.json", "*.html",
                     "*.ipynb", "data/*.parquet", "figures/*.png")


def keep_evidence(run_dir: Path, root: Path = paths.REFERENCE_DIR) -> Path:
    """Copy a run's evidence to ``<root>/<gpu or cpu>/<run id>/`` for committing; never overwrite."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if effective_status(manifest) == "running":
        raise UserError(f"{run_dir}: the run is still running")
    gpu = ((manifest.get("hardware") or {}).get("gpu") or {}).get("name") or "cpu"
    slug = "".join(c if c.isalnum() or c in ".-" else "-" for c in gpu).strip("-")
    dest = Path(root) / slug / run_dir.name
    if dest.exists():
        raise UserError(f"{dest} exists already: reference evidence is never overwritten")
    for pattern in EVIDENCE_PATTERNS:
        for path in run_dir.glob(pattern):
            target = dest / path.relative_to(run_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copy2(path, target)
    return dest
