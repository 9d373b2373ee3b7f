#!/usr/bin/env python3
"""Set up the project's virtual environment (what ``make run``, ``make lab`` and ``make test``
call): torch that fits the machine, then stagelab, editable, with only the extras asked for.

Torch: where ``nvidia-smi`` finds a GPU, PyPI's default build (CUDA). Elsewhere the CPU build,
from PyTorch's CPU wheel index; when that index cannot be reached, PyPI's default (a CUDA build
of several GB, unless the machine's pip configuration offers a local CPU wheel). The build that
was installed is printed. Installs use uv (from PATH, else installed into the environment with
pip), falling back to pip when uv cannot be had. Standard library only: it runs before anything
is installed.

Bytecode: pip compiles what it installs; uv does not, leaving it to the first import, which
writes nothing where ``PYTHONDONTWRITEBYTECODE`` is set: then every notebook kernel and probe
process would compile torch, pandas and seaborn again (about 40 s of a first run here). The
set-up therefore imports what a run (and each extra) imports once, writing its bytecode; the
rest of the environment stays uncompiled, as uv leaves it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CPU_TORCH = "torch==2.13.0"  # the build the suite is developed and tested with
GPU_TORCH = "torch>=2.4"
INDEX_TIMEOUT_S = 10.0
# Prints e.g. "2.13.0+cpu, a CPU build": what torch says of itself.
TORCH_BUILD_PROBE = ("import torch; c = torch.version.cuda; "
                     "print(torch.__version__ + (f', a CUDA {c} build' if c else ', a CPU build'))")
KERNEL_NAME, KERNEL_DISPLAY = "stagelab", "Python (stagelab)"
# Imported once with bytecode writing on (see the module's docstring): every stagelab module
# (its own imports follow), the notebook kernel and its plotting, papermill and the HTML export;
# and what each extra adds.
RUN_IMPORTS = ("ipykernel.kernelapp", "matplotlib_inline.backend_inline", "seaborn", "papermill",
               "nbconvert")
EXTRA_IMPORTS = {"lab": ("jupyterlab",), "test": ("pytest", "playwright.sync_api"),
                 "fleet": ("ray",)}
BYTECODE_WARMUP = """
import importlib, pkgutil, sys
import stagelab
names = [m.name for m in pkgutil.walk_packages(stagelab.__path__, "stagelab.")
         if m.name != "stagelab.__main__"] + sys.argv[1:]
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:  # an optional part missing here: nothing to compile
        print(f"bytecode: {name} not imported ({type(exc).__name__}: {exc})")
print(len(sys.modules))
"""


@dataclass(frozen=True)
class TorchChoice:
    """Which torch to ask for, where from, and why (said to the user)."""

    requirement: str
    index_url: str | None  # None: the installer's default index (PyPI)
    reason: str
    find_links: tuple[str, ...] = ()


@dataclass
class Installer:
    """uv when it can be had, else pip; both install into the environment of ``python``."""

    python: Path
    uv: Path | None

    @property
    def name(self) -> str:
        return "uv" if self.uv else "pip"

    def install(self, requirements: list[str], index_url: str | None = None,
                find_links: tuple[str, ...] = ()) -> None:
        """Install requirements; an installed package that satisfies them is kept."""
        if self.uv:
            command = [str(self.uv), "pip", "install", "--quiet", "--python", str(self.python)]
        else:
            command = [str(self.python), "-m", "pip", "install", "--quiet"]
        if index_url:
            command += ["--index-url", index_url]
        for folder in find_links:
            command += ["--find-links", folder]
        run([*command, *requirements])


def run(command: list[str]) -> None:
    """Run a command, echoed as a shell line; a failure stops the set-up with its exit code."""
    line = shlex.join(command)
    print(f"+ {line}", flush=True)
    result = subprocess.run(command)
    if result.returncode:
        raise SystemExit(f"set-up failed ({result.returncode}): {line}")


def has_nvidia_gpu() -> bool:
    """True when ``nvidia-smi -L`` lists a GPU."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def index_reachable(index_url: str, timeout_s: float = INDEX_TIMEOUT_S) -> bool:
    """True when the index answers for torch; a machine that cannot see it fails at once."""
    try:
        with urllib.request.urlopen(f"{index_url.rstrip('/')}/torch/", timeout=timeout_s):
            return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def local_wheel_folders(python: str = sys.executable) -> tuple[str, ...]:
    """The local folders of wheels that pip is configured to look in (``find-links``), so that
    uv, which reads no pip configuration, takes a CPU wheel lying on disk as pip would."""
    try:
        listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                                text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    folders: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += [f for f in shlex.split(value.strip("'\"")) if Path(f).is_dir()]
    return tuple(dict.fromkeys(folders))


def choose_torch(gpu: bool, cpu_index: str,
                 reachable: Callable[[str], bool] = index_reachable,
                 find_links: tuple[str, ...] = ()) -> TorchChoice:
    """The torch requirement for this machine (see the module's docstring)."""
    if gpu:
        return TorchChoice(GPU_TORCH, None, "nvidia-smi found a GPU: PyPI's default (CUDA) build")
    if reachable(cpu_index):
        return TorchChoice(CPU_TORCH, cpu_index, f"no NVIDIA GPU: the CPU build from {cpu_index}",
                           find_links)
    return TorchChoice(CPU_TORCH, None,
                       f"no NVIDIA GPU, and {cpu_index} cannot be reached: PyPI's default build",
                       find_links)


def installed_version(python: Path, distribution: str) -> str | None:
    """The version of a distribution installed in the environment of ``python``, or None."""
    probe = ("import importlib.metadata as m, sys\n"
             "try: print(m.version(sys.argv[1]))\n"
             "except m.PackageNotFoundError: pass")
    out = subprocess.run([str(python), "-c", probe, distribution], capture_output=True,
                         text=True).stdout.strip()
    return out or None


def bytecode_writing_env() -> dict[str, str]:
    """This environment with bytecode writing on (see the module's docstring)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def torch_build(python: Path) -> str:
    """What torch in the environment is, from torch itself: version and CPU or CUDA build (its
    import writes torch's bytecode on the way)."""
    done = subprocess.run([str(python), "-c", TORCH_BUILD_PROBE], capture_output=True, text=True,
                          env=bytecode_writing_env())
    return done.stdout.strip() if done.returncode == 0 else "torch does not import"


def find_uv(venv: Path) -> Path | None:
    """uv from PATH, else installed with pip into the environment itself; None without either."""
    on_path = shutil.which("uv")
    if on_path:
        return Path(on_path)
    own = venv / "bin" / "uv"
    if not own.exists():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-qq",
                               "--root-user-action=ignore", "--prefix", str(venv), "uv"])
        if done.returncode:
            print("uv could not be installed: installing with pip", flush=True)
            return None
    return own


def create_venv(venv: Path) -> Path:
    """A virtual environment of this interpreter, without pip (uv needs none); its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    return python


def ensure_pip(installer: Installer) -> None:
    """pip in the environment: to install without uv, and for a user's own `pip install`."""
    if installed_version(installer.python, "pip") is not None:
        return
    if installer.uv:
        installer.install(["pip"])
    else:
        run([str(installer.python), "-m", "ensurepip", "--default-pip"])


def ensure_torch(installer: Installer, cpu_index: str) -> None:
    """Install torch unless the environment has it, and say which build it is."""
    present = installed_version(installer.python, "torch")
    if present:
        print(f"torch {present}: already installed", flush=True)
        return
    gpu = has_nvidia_gpu()
    choice = choose_torch(gpu, cpu_index, find_links=() if gpu else local_wheel_folders())
    print(f"torch: {choice.reason}", flush=True)
    installer.install([choice.requirement], choice.index_url, choice.find_links)
    print(f"torch {torch_build(installer.python)}", flush=True)


def compile_bytecode(python: Path, extras: list[str]) -> None:
    """Write the bytecode of what a run (and ``extras``) imports, in the environment of
    ``python``, whatever ``PYTHONDONTWRITEBYTECODE`` says; print how many modules and how long."""
    started = time.monotonic()
    modules = [*RUN_IMPORTS] if not extras else [m for e in extras for m in EXTRA_IMPORTS.get(e, ())]
    try:
        done = subprocess.run([str(python), "-c", BYTECODE_WARMUP, *modules],
                              capture_output=True, text=True, env=bytecode_writing_env())
    except OSError as exc:
        print(f"bytecode: not written ({exc})", flush=True)
        return
    if done.returncode:  # the environment works without it, only slower to start
        lines = done.stderr.strip().splitlines()
        print(f"bytecode: not written ({lines[-1] if lines else f'exit {done.returncode}'})",
              flush=True)
        return
    *notes, count = done.stdout.strip().splitlines()
    for note in notes:
        print(note, flush=True)
    what = f"the extras {', '.join(extras)}" if extras else "a run"
    print(f"bytecode: written for what {what} imports ({count} modules) in "
          f"{time.monotonic() - started:.0f} s", flush=True)


def set_up(venv: Path, extras: list[str], cpu_index: str = CPU_INDEX) -> None:
    """Create or complete the environment: torch, then stagelab with ``extras`` (none: what a
    headless run needs) and, with the lab extra, the Jupyter kernel that runs the notebooks."""
    started = time.monotonic()
    venv = venv.absolute()
    python = create_venv(venv)
    uv = find_uv(venv)
    installer = Installer(python, uv)
    ensure_pip(installer)  # for `pip install` in the activated environment too
    ensure_torch(installer, cpu_index)
    target = f"{REPO}[{','.join(extras)}]" if extras else str(REPO)
    installer.install(["--editable", target])
    if "lab" in extras:  # `stagelab run` installs the kernel itself; JupyterLab needs it first
        run([str(python), "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL_NAME,
             "--display-name", KERNEL_DISPLAY])
    compile_bytecode(python, extras)
    what = f"the extras {', '.join(extras)}" if extras else "what a headless run needs"
    print(f"set-up: {what} installed with {installer.name} in {time.monotonic() - started:.0f} s",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=REPO / ".venv")
    parser.add_argument("--extra", action="append", default=[],
                        help="an optional-dependencies group of pyproject.toml (repeatable)")
    parser.add_argument("--cpu-index", default=os.environ.get("TORCH_CPU_INDEX", CPU_INDEX),
                        help="PyTorch's CPU wheel index (default %(default)s)")
    args = parser.parse_args(argv)
    set_up(args.venv, args.extra, args.cpu_index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
