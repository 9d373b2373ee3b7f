"""``make gpu-evidence``: the GPU evidence in one command on an offline node, every phase stamped.

Phases: (1) check that the wheelhouse holds every wheel the node lacks, and that
``data/reference/`` is writable, before anything is installed; (2) install offline into a
virtual environment that reuses the node's packages and torch (also what
``make setup OFFLINE_WHEELS=...`` runs, with ``--install-only``); needs no ``make``;
(3) ``stagelab preflight``, stopping on no-go unless ``--go-on-no-go``; (4) ``stagelab run`` of the
gate profile; (5) ``stagelab keep`` of that run, its preflight.json included. Standard library
only: it runs before anything is installed.

Exit status: 0 all phases done; 1 the run failed (what it measured is kept all the same);
2 a bad request (no wheelhouse, a missing wheel, an unwritable data/reference/);
3 preflight said no-go; 4 a phase broke (install, or no run folder).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_wheelhouse import requirements  # noqa: E402  (a sibling script)

REPO = Path(__file__).resolve().parents[1]
RUNS_DIR = REPO / "papermill_runs"
REFERENCE_DIR = REPO / "data" / "reference"
EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_REQUEST, EXIT_NO_GO, EXIT_BROKEN = 0, 1, 2, 3, 4
PHASES = ("check", "install", "preflight", "gate", "keep")


class Stop(Exception):
    """Ends the command with a one-line reason and an exit status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def stamp(phase: str, text: str) -> None:
    """One progress line with a UTC timestamp and the phase's number."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    number = f"{PHASES.index(phase) + 1}/{len(PHASES)}" if phase in PHASES else "-"
    print(f"[{now}] gpu-evidence {number} {phase}: {text}", flush=True)


def offline_env() -> dict[str, str]:
    """This environment without pip settings (an index or extra find-links would hide a
    missing wheel) and without PYTHONPATH (the venv's own stagelab must be the one run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def find_wheelhouse(given: str) -> Path:
    """The wheelhouse folder: ``given``, else the first of ``.whl/`` and ``wheelhouse/`` here."""
    candidates = [Path(given)] if given else [REPO / ".whl", REPO / "wheelhouse"]
    for folder in candidates:
        if folder.is_dir():
            return folder.resolve()
    raise Stop(EXIT_BAD_REQUEST, f"no wheelhouse: {' or '.join(map(str, candidates))} does not "
               "exist (build one with `make gpu-wheelhouse` on a machine with an index)")


def missing_wheel(python: str, wheelhouse: Path) -> str | None:
    """The first requirement that neither ``python``'s packages nor the wheelhouse satisfy
    (pip's own resolver, offline, installing nothing); None when all are there."""
    command = [python, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index",
               "--find-links", str(wheelhouse), *requirements([], set(), frozenset())]
    proc = subprocess.run(command, capture_output=True, text=True, env=offline_env())
    if proc.returncode == 0:
        return None
    found = re.findall(r"No matching distribution found for (\S+)", proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    return found[0] if found else (errors or [proc.stderr.strip() or "pip failed"])[-1]


def check_reference_writable(root: Path = REFERENCE_DIR) -> None:
    """``data/reference/`` (or its nearest existing parent) must be writable, before any lease
    time is spent on a run that could not be kept."""
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise Stop(EXIT_BAD_REQUEST, f"{existing} is not writable: the evidence could not be "
                   "kept under data/reference/")


def phase_check(python: str, wheelhouse: str) -> Path:
    folder = find_wheelhouse(wheelhouse)
    wheels = list(folder.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    stamp("check", f"{len(wheels)} wheels ({size:.1f} MiB) in {folder}; resolving offline "
                   f"against {python}")
    missing = missing_wheel(python, folder)
    if missing:
        raise Stop(EXIT_BAD_REQUEST, f"wheelhouse {folder} lacks a wheel for {missing}; "
                   "nothing was installed")
    check_reference_writable()
    stamp("check", "every needed wheel is there; data/reference/ is writable")
    return folder


def _pip_install(venv: Path, wheelhouse: Path, *what: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", str(wheelhouse), "--no-build-isolation", *what],
                   env=offline_env(), check=True)


def install_offline(python: str, wheelhouse: Path, venv: Path) -> None:
    """A venv that reuses ``python``'s packages (torch above all) through a .pth file, and has
    no pip or setuptools of its own, so it sees exactly what the wheelhouse check saw; then
    stagelab (editable) and its kernel, installed from the wheelhouse alone."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    inherited = subprocess.run(
        [python, "-c", "import site; print(*site.getsitepackages(), sep='\\n')"],
        capture_output=True, text=True, check=True).stdout
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "inherited-site.pth").write_text(inherited)
    _pip_install(venv, wheelhouse, "setuptools>=68")  # the build backend, before the build
    _pip_install(venv, wheelhouse, "-e", str(REPO))
    subprocess.run([str(venv / "bin" / "python"), "-m", "ipykernel", "install", "--sys-prefix",
                    "--name", "stagelab", "--display-name", "Python (stagelab)"],
                   env=offline_env(), check=True, stdout=subprocess.DEVNULL)
    (venv / ".installed").touch()


def phase_install(python: str, wheelhouse: Path, venv: Path) -> None:
    marker = venv / ".installed"
    if marker.exists() and marker.stat().st_mtime >= (REPO / "pyproject.toml").stat().st_mtime:
        stamp("install", f"{venv} is installed already")
        return
    stamp("install", f"{venv} from {wheelhouse}, reusing {python}'s packages and torch")
    try:
        install_offline(python, wheelhouse, venv)
    except subprocess.CalledProcessError as exc:
        raise Stop(EXIT_BROKEN, f"the offline install into {venv} failed at "
                   f"`{' '.join(map(str, exc.cmd[:6]))} ...` (see above)") from exc


def phase_preflight(stagelab: Path, profile: str, out: Path, go_on: bool) -> bool:
    stamp("preflight", f"stagelab preflight --profile {profile}")
    status = subprocess.call([str(stagelab), "preflight", "--profile", profile, "--out", str(out)],
                             env=offline_env())
    if status == 0:
        stamp("preflight", "GO")
        return True
    if status == 2:
        raise Stop(EXIT_BAD_REQUEST, "preflight refused the request (its error is above)")
    if status != 3:
        raise Stop(EXIT_BROKEN, f"preflight ended with exit status {status}")
    if not go_on:
        raise Stop(EXIT_NO_GO, f"preflight says NO-GO (see {out}); nothing was run. "
                   "FORCE=1 (or --go-on-no-go) runs the gate profile anyway")
    stamp("preflight", "NO-GO, going on as asked (--go-on-no-go): the evidence will say so")
    return False


def _run_folders() -> set[Path]:
    return {p.parent for p in RUNS_DIR.glob("*/manifest.json")}


def phase_gate(stagelab: Path, profile: str) -> tuple[Path, str]:
    stamp("gate", f"stagelab run --profile {profile}")
    before = _run_folders()
    status = subprocess.call([str(stagelab), "run", "--profile", profile], env=offline_env())
    new = sorted(_run_folders() - before)
    if len(new) != 1:
        raise Stop(EXIT_BROKEN, f"stagelab run ended with exit status {status} and made "
                   f"{len(new)} run folders under {RUNS_DIR}")
    run_status = json.loads((new[0] / "manifest.json").read_text()).get("status", "unknown")
    stamp("gate", f"{new[0]}: {run_status} (exit status {status})")
    return new[0], run_status


def phase_keep(stagelab: Path, run_dir: Path, preflight_json: Path, run_status: str) -> Path:
    shutil.copy2(preflight_json, run_dir / "preflight.json")
    force = [] if run_status == "ok" else ["--force"]
    stamp("keep", f"stagelab keep {run_dir.name} {' '.join(force)}".rstrip())
    proc = subprocess.run([str(stagelab), "keep", *force, str(run_dir)], capture_output=True,
                          text=True, env=offline_env())
    if proc.returncode != 0:
        raise Stop(EXIT_BROKEN, f"stagelab keep failed: {proc.stderr.strip()}")
    return Path(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable,
                        help="the node's interpreter, whose packages (torch) the venv reuses")
    parser.add_argument("--wheelhouse", default="",
                        help="folder of wheels (default: .whl/ or wheelhouse/ in the repository)")
    parser.add_argument("--profile", default="gate", help="the profile to run (default gate)")
    parser.add_argument("--venv", type=Path, default=REPO / ".venv")
    parser.add_argument("--go-on-no-go", action="store_true",
                        help="run the profile even when preflight says no-go (a CPU rehearsal)")
    parser.add_argument("--install-only", action="store_true",
                        help="stop after the check and the install (`make setup OFFLINE_WHEELS=`)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    stagelab = args.venv.resolve() / "bin" / "stagelab"
    preflight_json = RUNS_DIR / "preflight.json"
    try:
        wheelhouse = phase_check(args.python, args.wheelhouse)
        phase_install(args.python, wheelhouse, args.venv.resolve())
        if args.install_only:
            return EXIT_OK
        went = phase_preflight(stagelab, args.profile, preflight_json, args.go_on_no_go)
        run_dir, run_status = phase_gate(stagelab, args.profile)
        kept = phase_keep(stagelab, run_dir, preflight_json, run_status)
    except Stop as stop:
        stamp("stop", f"{stop} (exit status {stop.status})")
        return stop.status
    minutes = (time.perf_counter() - started) / 60
    stamp("keep", f"evidence kept in {kept} (run {run_status}, preflight "
                  f"{'go' if went else 'no-go'}), {minutes:.1f} min in all; commit it with "
                  f"`git add {kept.relative_to(REPO) if kept.is_relative_to(REPO) else kept}`")
    return EXIT_OK if run_status == "ok" else EXIT_RUN_FAILED


if __name__ == "__main__":
    sys.exit(main())
