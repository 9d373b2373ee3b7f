"""The run's kernels: the project's kernelspec, a private socket folder per kernel, and every
notebook's kernel started at once, its imports done, before the first notebook measures.

A notebook's kernel start and imports (about 1 s and 1.5-3 s each on a 2-core VM) measure
nothing, and one after another they took a fifth of a quick run. So :class:`WarmKernels`
launches every kernel of the plan together, before the first notebook, each importing the
modules its own notebook imports (:func:`notebook_imports`), on every core; then each waits,
idle, for its notebook. Nothing runs beside a measurement: every kernel is ready (or given up)
before notebook 00 starts, and an idle kernel takes no CPU. Each kernel is still a fresh process
of its own, stopped as soon as its notebook is done: a notebook never inherits another's heap,
whose state decides the regime of the seed's fresh vector. The seconds from the first launch
until the last kernel is ready are the manifest's ``kernels.seconds``, counted as kernel start
(:mod:`stagelab.core.phases`).
A kernel that fails to start is stopped and its notebook starts one of its own, as before.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from stagelab.core import paths, phases

KERNEL_NAME = "stagelab"
KERNEL_LOG = "kernel.log"
NO_FD_CAPTURE = "--IPKernelApp.capture_fd_output=False"  # the kernel's stderr to kernel.log only


# ------------------------------------------------------------------------------------ kernels

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


def private_kernel_manager(socket_dir: Path, log: IO[str] | None = None,
                           started: list | None = None) -> type:
    """A kernel manager class whose kernel's IPC sockets and connection file live in
    ``socket_dir``, and whose process output goes to ``log`` rather than the terminal.
    Each manager that launches a kernel is appended to ``started``, so it can be stopped; each
    keeps the clients it made (``clients``), so that whoever owns it can close them.

    IPC rather than loopback TCP: private to this user, and no port can collide.
    """
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class PrivateKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.clients: list[Any] = []

        def client(self, **kwargs: Any) -> Any:
            made = super().client(**kwargs)
            self.clients.append(made)
            return made

        @default("transport")
        def _default_transport(self) -> str:
            return "ipc"

        @default("ip")
        def _default_private_ip(self) -> str:
            return str(Path(socket_dir) / "kernel-ipc")

        @default("connection_file")
        def _default_private_connection_file(self) -> str:
            return str(Path(socket_dir) / "kernel.json")

        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
            if log is not None:
                kw.setdefault("stdout", log)
                kw.setdefault("stderr", log)
                # ipykernel echoes what the process writes to its own stderr into the cell's
                # output: the sweeps' progress lines would land in the notebook as stderr boxes
                kernel_cmd = [*headless_command(kernel_cmd), NO_FD_CAPTURE]
            if started is not None:
                started.append(self)
            await super()._async_launch_kernel(kernel_cmd, **kw)

    return PrivateKernelManager


LAUNCHER = ["-m", "ipykernel_launcher"]
HEADLESS_LAUNCHER = ["-m", "stagelab.run.headless_kernel"]


def headless_command(kernel_cmd: list[str]) -> list[str]:
    """The kernelspec's command with ipykernel's launcher replaced by the headless one
    (:mod:`stagelab.run.headless_kernel`: no debugger); a command without it, unchanged."""
    for at in range(len(kernel_cmd) - 1):
        if kernel_cmd[at:at + 2] == LAUNCHER:
            return [*kernel_cmd[:at], *HEADLESS_LAUNCHER, *kernel_cmd[at + 2:]]
    return list(kernel_cmd)


def kill_kernels(managers: list) -> None:
    """Kill the kernels these managers launched (each in a process group of its own)."""
    for manager in managers:
        process = getattr(manager.provisioner, "process", None)
        if process is None or process.poll() is not None:
            continue
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)


@contextlib.contextmanager
def kernel_sockets() -> Iterator[Path]:
    """A private folder for one kernel's sockets, removed afterwards whatever happens.

    Under the system's temporary folder: a Unix socket path must stay under ~100 bytes, which a
    run folder deep in a checkout may not.
    """
    folder = Path(tempfile.mkdtemp(prefix="stagelab-kernel-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------- warm, before the run

def notebook_imports(notebook: Path) -> list[str]:
    """The modules a notebook's cells import at their top level, in order, each once, up to the
    first cell or statement that could change how a later import behaves, or whether it runs:
    ``import a.b`` gives ``a.b``; ``from a import b`` gives ``a`` and ``a.b`` (b may be a
    module). An import inside a function, an ``if`` or a ``try`` is the notebook's own business
    and is left to it; so is everything after a cell that is not Python (an IPython magic such
    as ``%env``), after a statement that names the environment (``os.environ``, ``putenv``: a
    variable a module reads when it is imported, such as ``TRITON_INTERPRET``), and after any
    statement but an import or a literal assignment (a call may change ``sys.path`` or stop the
    notebook: the kernel must not import what the notebook would not). Relative imports have
    no package here."""
    found: dict[str, None] = {}
    for cell in json.loads(Path(notebook).read_text(encoding="utf-8")).get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse("".join(cell.get("source", "")))
        except SyntaxError:
            break
        for node in tree.body:
            if _names_the_environment(node) or not _leaves_imports_alone(node):
                return list(found)
            if isinstance(node, ast.Import):
                found.update(dict.fromkeys(alias.name for alias in node.names))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found[node.module] = None
                found.update(dict.fromkeys(f"{node.module}.{alias.name}" for alias in node.names
                                           if alias.name != "*"))
    return list(found)


def _leaves_imports_alone(node: ast.stmt) -> bool:
    """Whether a top-level statement can neither change a later import nor stop the notebook:
    an import, or a name given a literal (a parameters cell), or a bare literal (a docstring)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    value = getattr(node, "value", None)
    if isinstance(node, ast.Assign):
        targets_plain = all(isinstance(target, ast.Name) for target in node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.Expr)):
        targets_plain = isinstance(getattr(node, "target", None), (ast.Name, type(None)))
    else:
        return False
    try:
        ast.literal_eval(value) if value is not None else None
    except ValueError:
        return False
    return targets_plain


def _names_the_environment(node: ast.stmt) -> bool:
    return any(isinstance(part, (ast.Attribute, ast.Name))
               and getattr(part, "attr", getattr(part, "id", "")) in ("environ", "putenv")
               for part in ast.walk(node))


def preload_source(modules: list[str]) -> str:
    """Code a kernel runs at start-up (``IPKernelApp.exec_files``): import ``modules`` and leave
    no name behind in the notebook's namespace. A module that fails to import is passed over:
    the notebook's own import then fails in its cell and says why."""
    return ("def _stagelab_preload():\n"
            "    import importlib\n"
            f"    for name in {modules!r}:\n"
            "        try:\n"
            "            importlib.import_module(name)\n"
            "        except Exception:\n"
            "            pass\n"
            "\n"
            "\n"
            "_stagelab_preload()\n"
            "del _stagelab_preload\n")


@dataclass
class WarmKernel:
    """One notebook's kernel, launched before the run's first notebook."""

    notebook: str
    manager: Any  # a private_kernel_manager instance
    folder: Path  # its sockets, connection file, marks file and preload code
    ready: bool = False
    error: str = ""
    stopped: bool = False

    @property
    def marks(self) -> Path:
        """The file the kernel marks its phases in (:mod:`stagelab.core.phases`)."""
        return self.folder / "marks.json"

    def alive(self) -> bool:
        """Whether its process still runs (an idle kernel can die: the OOM killer, a stray
        kill)."""
        process = getattr(self.manager.provisioner, "process", None)
        return process is not None and process.poll() is None

    def stop(self) -> None:
        """Close the clients made for it (papermill's too: given a kernel it does not own, it
        leaves its client's channels open, a heartbeat thread that wakes every second in this
        process), kill the kernel (its notebook is done, or the run stops), reap its process and
        release its sockets and its zmq context."""
        if self.stopped:
            return
        self.stopped = True
        for client in self.manager.clients:
            with contextlib.suppress(Exception):
                client.stop_channels()
        kill_kernels([self.manager])
        process = getattr(self.manager.provisioner, "process", None)
        if process is not None:
            with contextlib.suppress(Exception):
                process.wait(timeout=10)
        with contextlib.suppress(Exception):
            asyncio.run(self.manager.cleanup_resources())
        if getattr(self.manager, "_created_context", False):  # its zmq context: two threads,
            self.manager.context.destroy(linger=0)  # 6 descriptors, else held until a collection


@dataclass
class WarmKernels:
    """Every notebook's kernel of a run, started at once (:meth:`start`); a context that stops
    whichever are still alive and removes their folders, whatever happens."""

    notebooks: list[tuple[str, Path]]  # (name, path) in the plan's order
    log: IO[str]
    timeout_s: float
    kernels: list[WarmKernel] = field(default_factory=list)
    seconds: float = 0.0

    def __enter__(self) -> WarmKernels:
        return self

    def __exit__(self, *_: Any) -> None:
        for kernel in self.kernels:
            kernel.stop()
            shutil.rmtree(kernel.folder, ignore_errors=True)

    def start(self) -> None:
        """Launch every kernel, then wait until each is ready (its imports done) or gives up
        within ``timeout_s``; one that gives up is stopped."""
        began = time.perf_counter()
        asyncio.run(self._start_all())
        self.seconds = round(time.perf_counter() - began, 2)
        for kernel in self.kernels:
            if not kernel.ready:
                kernel.stop()

    def get(self, index: int) -> WarmKernel | None:
        """The ready kernel of the plan's ``index``-th notebook, or None (it starts its own): one
        that died while it waited is stopped and its death recorded (:meth:`record`)."""
        kernel = self.kernels[index] if index < len(self.kernels) else None
        if kernel is None or not kernel.ready or kernel.stopped:
            return None
        if not kernel.alive():
            kernel.error = "it died while it waited for its notebook, which started its own"
            kernel.stop()
            return None
        return kernel

    def record(self) -> dict[str, Any]:
        """What the manifest keeps of the start: how many, how long, what failed."""
        return {"started": len(self.kernels), "ready": sum(k.ready for k in self.kernels),
                "seconds": self.seconds,
                "errors": {k.notebook: k.error for k in self.kernels if k.error}}

    async def _start_all(self) -> None:
        for name, _ in self.notebooks:
            folder = Path(tempfile.mkdtemp(prefix="stagelab-kernel-"))
            manager = private_kernel_manager(folder, self.log)(kernel_name=KERNEL_NAME)
            self.kernels.append(WarmKernel(name, manager, folder))
        await asyncio.gather(*(self._start_one(kernel, path) for kernel, (_, path)
                               in zip(self.kernels, self.notebooks)))

    async def _start_one(self, kernel: WarmKernel, notebook: Path) -> None:
        env = {**os.environ, phases.PHASES_ENV: str(kernel.marks), paths.HEADLESS_ENV: "1"}
        try:
            preload = kernel.folder / "preload.py"  # an unreadable notebook: its own error
            preload.write_text(preload_source(notebook_imports(notebook)), encoding="utf-8")
            await kernel.manager.start_kernel(
                cwd=str(notebook.parent), env=env,
                extra_arguments=[f"--IPKernelApp.exec_files={preload}"])
            client = kernel.manager.client()
            client.start_channels()
            try:
                await client.wait_for_ready(timeout=self.timeout_s)
            finally:
                client.stop_channels()
            kernel.ready = True
        except Exception as exc:  # the notebook then starts a kernel of its own
            kernel.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
