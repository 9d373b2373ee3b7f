#!/usr/bin/env python3
"""Set up the project's virtual environment (what ``make run``, ``make lab`` and ``make test``
call): torch that fits the machine, then stagelab, editable, with only the extras asked for.

Torch: from the wheel index given (``--torch-index``, ``make setup TORCH_INDEX=URL``), e.g.
PyTorch's ``https://download.pytorch.org/whl/cu126`` for a driver that runs CUDA 12 but not the
CUDA build PyPI ships. Else, where ``nvidia-smi`` finds a GPU, PyPI's default build (CUDA), and
a warning when that build needs a newer driver than the one ``nvidia-smi`` reports. Elsewhere the CPU build,
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
import re
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
# The oldest Linux driver that runs each CUDA major version's builds (NVIDIA's minor version
# compatibility table: docs.nvidia.com/deploy/cuda-compatibility), and the PyTorch index to name
# for it when PyPI's build is too new for the driver.
MIN_DRIVER = {12: 525, 13: 580}
CUDA_INDEX = {12: "https://download.pytorch.org/whl/cu126",
              13: "https://download.pytorch.org/whl/cu130"}
TORCH_CUDA_PROBE = "import torch; print(torch.version.cuda or '')"
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
                 find_links: tuple[str, ...] = (), torch_index: str | None = None) -> TorchChoice:
    """The torch requirement for this machine (see the module's docstring)."""
    if torch_index:
        requirement = CPU_TORCH if torch_index.rstrip("/").endswith("/cpu") else GPU_TORCH
        return TorchChoice(requirement, torch_index, f"the index asked for: {torch_index}",
                           find_links)
    if gpu:
        return TorchChoice(GPU_TORCH, None, "nvidia-smi found a GPU: PyPI's default (CUDA) build")
    if reachable(cpu_index):
        return TorchChoice(CPU_TORCH, cpu_index, f"no NVIDIA GPU: the CPU build from {cpu_index}",
                           find_links)
    return TorchChoice(CPU_TORCH, None,
                       f"no NVIDIA GPU, and {cpu_index} cannot be reached: PyPI's default build",
                       find_links)


@dataclass(frozen=True)
class Driver:
    """What ``nvidia-smi`` says of the driver: its version and the newest CUDA it runs."""

    version: str
    cuda: str

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])


def read_driver(smi_header: str) -> Driver | None:
    """The driver from ``nvidia-smi``'s header ("Driver Version: 550.54.15  CUDA Version: 12.4"),
    or None where it says neither."""
    version = re.search(r"Driver Version:\s*([0-9.]+)", smi_header)
    cuda = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", smi_header)
    return Driver(version.group(1), cuda.group(1)) if version and cuda else None


def driver_fit(driver: Driver, torch_cuda: str) -> str | None:
    """None when a torch built for CUDA ``torch_cuda`` runs on ``driver``; else what to do (a
    CUDA build runs on any driver of its major version from the minimum, never on an older
    major version)."""
    major = int(torch_cuda.split(".")[0])
    if major <= driver.cuda_major:
        return None
    index = CUDA_INDEX.get(driver.cuda_major)
    instead = (f"`make clean setup TORCH_INDEX={index}`" if index else
               f"a driver >= {MIN_DRIVER.get(major, '?')}")
    return (f"torch is a CUDA {torch_cuda} build, which needs driver >= "
            f"{MIN_DRIVER.get(major, '?')}; this driver ({driver.version}) runs CUDA "
            f"{driver.cuda} at most. Use {instead}.")


def nvidia_smi_header() -> str:
    """``nvidia-smi``'s output (its header names the driver), or "" without one."""
    try:
        return subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def warn_driver_fit(python: Path) -> None:
    """Say when the installed CUDA build of torch needs a newer driver than this machine's."""
    driver = read_driver(nvidia_smi_header())
    torch_cuda = subprocess.run([str(python), "-c", TORCH_CUDA_PROBE], capture_output=True,
                                text=True).stdout.strip()
    if driver is None or not torch_cuda:
        return
    print(f"driver {driver.version}: runs CUDA {driver.cuda} builds at most", flush=True)
    advice = driver_fit(driver, torch_cuda)
    if advice:
        print(f"warning: {advice}", flush=True)


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


def ensure_torch(installer: Installer, cpu_index: str, torch_index: str | None = None) -> None:
    """Install torch unless the environment has it, say which build it is and whether it fits
    the driver."""
    present = installed_version(installer.python, "torch")
    if present:
        print(f"torch {present}: already installed"
              + (" (to take it from TORCH_INDEX, `make clean` first)" if torch_index else ""),
              flush=True)
    else:
        gpu = has_nvidia_gpu()
        choice = choose_torch(gpu, cpu_index, find_links=() if gpu else local_wheel_folders(),
                              torch_index=torch_index)
        print(f"torch: {choice.reason}", flush=True)
        installer.install([choice.requirement], choice.index_url, choice.find_links)
        print(f"torch {torch_build(installer.python)}", flush=True)
    warn_driver_fit(installer.python)


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


def set_up(venv: Path, extras: list[str], cpu_index: str = CPU_INDEX,
           torch_index: str | None = None) -> None:
    """Create or complete the environment: torch, then stagelab with ``extras`` (none: what a
    headless run needs) and, with the lab extra, the Jupyter kernel that runs the notebooks."""
    started = time.monotonic()
    venv = venv.absolute()
    python = create_venv(venv)
    uv = find_uv(venv)
    installer = Installer(python, uv)
    ensure_pip(installer)  # for `pip install` in the activated environment too
    ensure_torch(installer, cpu_index, torch_index)
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
    parser.add_argument("--torch-index", default=os.environ.get("TORCH_INDEX") or None,
                        help="the wheel index to take torch from, e.g. "
                             f"{CUDA_INDEX[12]} for a CUDA 12 driver")
    args = parser.parse_args(argv)
    set_up(args.venv, args.extra, args.cpu_index, args.torch_index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
