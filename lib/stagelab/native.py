"""The seed engine's host path in C++ (``csrc/seed_host.cpp``), built on first use, via ctypes.

Why plain ``ctypes`` and not ``torch.utils.cpp_extension``: the source uses no torch headers, so
one compiler call builds it in about a second with the machine's C++ compiler, and that works on
the GPU node's host compiler too; ``cpp_extension`` would take about a minute and needs ninja.

The build is cached between runs in ``$STAGELAB_CACHE`` (default ``~/.cache/stagelab``), keyed by a
hash of the source, the compiler's identity and the flags, beside a ``.log`` that records the
command and the compiler's identity. It is built atomically (compiled to a temporary name, then
renamed), so concurrent runs never load half a file. Compiler: ``$CXX``, else ``c++``, ``g++``,
``clang++``. Where none exists or the build fails, :func:`status` says so with the compiler's
first error line: there is no stand-in.
"""

from __future__ import annotations

import ctypes
import hashlib
import operator
import os
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from stagelab.errors import NativeUnavailable

SOURCE = Path(__file__).with_name("csrc") / "seed_host.cpp"
# No -march=native: the cached build must run on any machine of the same architecture.
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
COMPILERS = ("c++", "g++", "clang++")
BUILD_TIMEOUT_S = 300


def cache_dir() -> Path:
    """Where builds are kept: ``$STAGELAB_CACHE``, default ``~/.cache/stagelab``."""
    return Path(os.environ.get("STAGELAB_CACHE") or Path.home() / ".cache" / "stagelab")


def find_compiler() -> list[str]:
    """The compiler command: ``$CXX`` (split like a shell word list), else the first of
    ``c++``, ``g++``, ``clang++`` on PATH; raises NativeUnavailable where there is none."""
    if os.environ.get("CXX"):
        command = shlex.split(os.environ["CXX"])
        if not command or shutil.which(command[0]) is None:
            raise NativeUnavailable(f"no C++ compiler: CXX={os.environ['CXX']!r} is not found")
        return command
    for name in COMPILERS:
        if shutil.which(name):
            return [name]
    raise NativeUnavailable(f"no C++ compiler: CXX is unset and none of {', '.join(COMPILERS)} "
                            f"is on PATH")


def compiler_identity(compiler: list[str]) -> str:
    """The compiler's resolved path and its ``--version`` output (part of the cache key)."""
    path = shutil.which(compiler[0]) or compiler[0]
    try:
        done = subprocess.run([*compiler, "--version"], capture_output=True, text=True,
                              timeout=60)
        version = done.stdout.strip() or done.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        version = f"--version failed: {exc}"
    return f"{os.path.realpath(path)} {' '.join(compiler[1:])}\n{version}"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "no output")


def build(compiler: list[str]) -> Path:
    """The cached shared library for this source, compiler and flags; built here if missing.
    Raises NativeUnavailable with the compiler's first error line where the build fails."""
    source = SOURCE.read_bytes()
    identity = compiler_identity(compiler)
    key = hashlib.sha256(b"\0".join([source, identity.encode(), " ".join(FLAGS).encode()]))
    folder = cache_dir()
    target = folder / f"seed_host-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=folder)
    os.close(handle)
    command = [*compiler, *FLAGS, "-o", temporary, str(SOURCE)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        os.unlink(temporary)
        raise NativeUnavailable(f"building {SOURCE.name} failed: {exc}") from None
    if done.returncode != 0:
        os.unlink(temporary)
        raise NativeUnavailable(f"building {SOURCE.name} failed: "
                                f"{_first_line(done.stderr or done.stdout)}")
    target.with_suffix(".log").write_text(
        f"command: {shlex.join(command)}\nflags: {' '.join(FLAGS)}\ncompiler: {identity}\n"
        f"output:\n{done.stdout}{done.stderr}")
    os.replace(temporary, target)
    return target


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    library.sl_vector_new.argtypes = [i64, ctypes.POINTER(ctypes.c_void_p)]
    library.sl_vector_new.restype = p
    library.sl_vector_free.argtypes = [p]
    library.sl_vector_free.restype = None
    library.sl_gather_logprobs.argtypes = [p, i64, i64, p, i64, p, p, p]
    library.sl_gather_logprobs.restype = i64
    return library


@cache
def _load() -> ctypes.CDLL | str:
    """The loaded library, or the reason it is unavailable (once per process)."""
    try:
        path = build(find_compiler())
        return _declare(ctypes.CDLL(str(path)))
    except NativeUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"loading the native library failed: {exc}"


def status() -> tuple[bool, str]:
    """``(True, library path)`` where the native path works, else ``(False, reason)``; builds and
    loads on the first call, cached in this process."""
    library = _load()
    return (False, library) if isinstance(library, str) else (True, library._name)


def require() -> None:
    """Raise :class:`NativeUnavailable` with the reason where the native path does not work."""
    available, reason = status()
    if not available:
        raise NativeUnavailable(reason)


def library() -> ctypes.CDLL:
    """The loaded library (raises NativeUnavailable)."""
    require()
    return _load()


class _Vector:
    """Owns one ``new std::vector<float>(numel)``; deleted by :meth:`delete` or, failing that,
    when the last reference (a SeedVector, or the memory behind its tensor) goes."""

    def __init__(self, numel: int) -> None:
        self._library = library()
        data = ctypes.c_void_p()
        self._handle = self._library.sl_vector_new(numel, ctypes.byref(data))
        if not self._handle:
            raise MemoryError(f"std::vector<float>({numel}) could not be allocated")
        self.address = data.value

    @property
    def deleted(self) -> bool:
        return self._handle is None

    def delete(self) -> None:
        if self._handle is not None:
            self._library.sl_vector_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.delete()


class SeedVector:
    """The seed's copy destination: ``new std::vector<float>(numel)``, value-initialised (zeroed).

    ``tensor`` is a 1-D fp32 host tensor over the vector's data (no copy). :meth:`free` runs the
    vector's destructor, as the engine does when the step ends; it is idempotent, and afterwards
    ``tensor`` raises (tensors taken from it earlier point at freed memory: do not use them).
    A context manager that frees on exit. Without ``free()`` the vector lives as long as its
    tensor or this object, whichever goes last.
    """

    def __init__(self, numel: int) -> None:
        numel = operator.index(numel)
        if numel < 0:
            raise ValueError(f"numel must be >= 0, got {numel}")
        self.numel = numel
        self._vector = _Vector(numel)
        self.address = self._vector.address  # the vector's data(): the tensor's data_ptr()
        self._tensor = torch.empty(0, dtype=torch.float32)
        if numel:
            memory = (ctypes.c_float * numel).from_address(self.address)
            memory.owner = self._vector  # the tensor keeps the vector alive (no cycle)
            self._tensor = torch.frombuffer(memory, dtype=torch.float32)

    @property
    def tensor(self) -> torch.Tensor:
        if self._vector.deleted:
            raise RuntimeError("SeedVector.tensor used after free()")
        return self._tensor

    def free(self) -> None:
        """Delete the vector (its destructor frees the memory); a second call does nothing."""
        self._tensor = None
        self._vector.delete()

    def __enter__(self) -> SeedVector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


def seed_vector(numel: int) -> SeedVector:
    """A fresh zeroed ``std::vector<float>`` of ``numel`` elements (raises NativeUnavailable)."""
    return SeedVector(numel)


def gather_logprobs(logprobs: torch.Tensor, targets: torch.Tensor, num_logprobs: int,
                    ids: torch.Tensor, values: torch.Tensor, ranks: torch.Tensor) -> None:
    """The seed's GatherLogprobs into preallocated outputs. The caller checked shapes and types:
    ``logprobs`` contiguous fp32 ``[n, V]``, ``targets`` contiguous int64 ``[n]``, ``ids`` int32
    and ``values`` fp32 ``[n, K+1]``, ``ranks`` int32 ``[n]``, all on the host.
    Raises ValueError naming the first target outside ``[0, V)`` (checked in C, per row)."""
    rows, vocab = logprobs.shape
    bad = library().sl_gather_logprobs(logprobs.data_ptr(), rows, vocab, targets.data_ptr(),
                                       num_logprobs, ids.data_ptr(), values.data_ptr(),
                                       ranks.data_ptr())
    if bad >= 0:
        raise ValueError(f"token_ids out of range [0, {vocab}): row {bad} holds "
                         f"{int(targets[bad])}")
