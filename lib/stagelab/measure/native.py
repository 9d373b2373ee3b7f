"""The seed engine's host path in C++ (``csrc/seed_host.cpp``), built on first use, via ctypes.

Why plain ``ctypes`` and not ``torch.utils.cpp_extension``: the source uses no torch headers, so
one compiler call builds it in about a second with the machine's C++ compiler, and that works on
the GPU node's host compiler too; ``cpp_extension`` would take about a minute and needs ninja.

The build is cached between runs in ``$STAGELAB_CACHE`` (default ``~/.cache/stagelab``; where that
cannot be written, ``.cache/stagelab`` in the repository, then the temp dir), keyed by a hash of
the source, the compiler's identity and the flags, beside a ``.log`` that records the command and
the compiler's identity and a ``.json`` stamp of its size and SHA-256. It is built atomically
(compiled to a temporary name, probe-loaded in a child process, stamped, then renamed), so
concurrent runs never load half a file and a failed or empty build is never cached. A cached
build is loaded only once its size, hash and a probe load in a child process agree (a truncated
file would otherwise kill the process with SIGBUS); otherwise it is built again. Compiler:
``$CXX``, else ``c++``, ``g++``, ``clang++``. Where none exists or the build fails,
:func:`status` says so with the compiler's first error line: there is no stand-in.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import operator
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

from stagelab.core import catalogue, paths, records
from stagelab.core.errors import NativeUnavailable

SOURCE = Path(__file__).with_name("csrc") / "seed_host.cpp"
# No -march=native: the cached build must run on any machine of the same architecture.
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
COMPILERS = ("c++", "g++", "clang++")
BUILD_TIMEOUT_S = 300
PROBE_TIMEOUT_S = 60
PRIVATE_MODE = 0o700  # the temp dir's fallback cache: this user's alone


def cache_dirs() -> list[Path]:
    """Where builds may be kept, in order: ``$STAGELAB_CACHE`` (default ``~/.cache/stagelab``),
    then ``.cache/stagelab`` in the repository, then ``stagelab-<uid>`` in the temp dir; the
    first that is this user's own (:func:`cache_folder_problem`) and holds a verified build, or
    can take a new one, is used. The last is private: created 0700, refused when another user
    owns it or it is open to others."""
    first = Path(os.environ.get("STAGELAB_CACHE") or Path.home() / ".cache" / "stagelab")
    return [first, paths.REPO_ROOT / ".cache" / "stagelab",
            Path(tempfile.gettempdir()) / f"stagelab-{os.getuid()}"]


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


def _digest(path: Path) -> str:
    """The file's SHA-256, read in chunks (``hashlib.file_digest`` is Python 3.11+; the
    measuring floor runs on 3.10)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp_path(library: Path) -> Path:
    """The build's stamp beside it: size and SHA-256 recorded when it was built."""
    return library.with_suffix(".json")


def probe(library: Path) -> str | None:
    """Load ``library`` in a child process (a truncated file kills that process with SIGBUS,
    not this one); None when it loads and has the seed's symbols, else why not."""
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "lib.sl_vector_new; lib.sl_vector_free; lib.sl_gather_logprobs; lib.sl_glibc_mmapped")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(library)], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the probe load failed ({exc})"
    if done.returncode < 0:
        return f"loading it killed the probe process ({signal.Signals(-done.returncode).name})"
    if done.returncode:
        lines = done.stderr.strip().splitlines()
        return f"it does not load ({lines[-1] if lines else f'exit {done.returncode}'})"
    return None


def _owned_problem(path: Path, private: bool) -> str | None:
    """Why ``path`` (a cache folder, a library or its stamp) is not this user's alone to write:
    a link, another owner, or writable by others (with ``private``, open to them at all)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    if info.st_uid != os.getuid():
        return f"{path} is owned by uid {info.st_uid}, not this user ({os.getuid()})"
    open_to_others = 0o077 if private else 0o022
    if info.st_mode & open_to_others:
        return f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def cache_folder_problem(folder: Path, private: bool) -> str | None:
    """Make ``folder`` if absent (mode 0700 where ``private``: the temp dir's fallback, whose
    name anyone can guess) and say why a library there may not be trusted, or None."""
    try:
        if private:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, PRIVATE_MODE)
        else:
            folder.mkdir(parents=True, exist_ok=True)
        if private and _owned_problem(folder, private=False) is None:
            os.chmod(folder, PRIVATE_MODE)  # ours from an older stagelab: closed to others now
    except OSError as exc:
        return f"{folder} ({exc.strerror or exc})"
    return _owned_problem(folder, private)


def verified(library: Path) -> str | None:
    """None when a cached library and its stamp are this user's own files (no link, not
    writable by others), the library matches the size and hash stamped at its build and loads
    in a probe process; else why it may not be trusted."""
    for path in (library, _stamp_path(library)):  # the folder's privacy is checked apart
        problem = _owned_problem(path, private=False)
        if problem:
            return problem
    try:
        stamp = json.loads(_stamp_path(library).read_text(encoding="utf-8"))
        size = library.stat().st_size
    except (OSError, ValueError) as exc:
        return f"no readable build stamp ({exc})"
    if not isinstance(stamp, dict) or stamp.get("size") != size:
        return f"its size ({size} bytes) is not the one stamped at its build"
    if stamp.get("sha256") != _digest(library):
        return "its SHA-256 is not the one stamped at its build"
    return probe(library)


def _compile(compiler: list[str], identity: str, target: Path) -> Path:
    """Build into a temporary file beside ``target``, check it (non-empty, loads in a probe
    process), stamp its size and hash, then rename it into place. A failed build leaves nothing
    behind. OSError when the folder cannot be written; NativeUnavailable when the build fails."""
    handle, temporary = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so",
                                         dir=target.parent)
    os.close(handle)
    command = [*compiler, *FLAGS, "-o", temporary, str(SOURCE)]
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NativeUnavailable(f"building {SOURCE.name} failed: {exc}") from None
        if done.returncode != 0:
            raise NativeUnavailable(f"building {SOURCE.name} failed: "
                                    f"{_first_line(done.stderr or done.stdout)}")
        built = Path(temporary)
        why = "it is empty" if built.stat().st_size == 0 else probe(built)
        if why:
            raise NativeUnavailable(f"building {SOURCE.name} gave an unusable library: {why}")
        os.chmod(built, 0o755 & ~records.umask())
        records.write_text_atomic(target.with_suffix(".log"),
            f"command: {shlex.join(command)}\nflags: {' '.join(FLAGS)}\ncompiler: {identity}\n"
            f"output:\n{done.stdout}{done.stderr}")
        records.write_json_atomic(_stamp_path(target), {"size": built.stat().st_size,
                                                        "sha256": _digest(built)})
        os.replace(built, target)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return target


def build(compiler: list[str]) -> Path:
    """The cached shared library for this source, compiler and flags: a cached build is used
    only once verified (:func:`verified`), else it is built again, in the first cache folder
    that can take it (:func:`cache_dirs`). Raises NativeUnavailable with the compiler's first
    error line where the build fails, or naming each folder where none can be written."""
    source = SOURCE.read_bytes()
    identity = compiler_identity(compiler)
    key = hashlib.sha256(b"\0".join([source, identity.encode(), " ".join(FLAGS).encode()]))
    name = f"seed_host-{key.hexdigest()[:16]}.so"
    unusable = []
    folders = cache_dirs()
    for folder in folders:
        private = folder == folders[-1]  # the temp dir's: a name anyone can take first
        problem = cache_folder_problem(folder, private)
        if problem:
            unusable.append(problem)
            continue
        target = folder / name
        if target.is_file() and verified(target) is None:
            return target
        try:
            return _compile(compiler, identity, target)
        except OSError as exc:
            unusable.append(f"{folder} ({exc.strerror or exc})")
    raise NativeUnavailable(f"no cache folder can take the native build: {'; '.join(unusable)}")


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    i32 = ctypes.c_int32
    library.sl_vector_new.argtypes = [i64, i32, ctypes.POINTER(ctypes.c_void_p)]
    library.sl_vector_new.restype = p
    library.sl_vector_free.argtypes = [p, i32]
    library.sl_vector_free.restype = None
    library.sl_glibc_mmapped.argtypes = [p]
    library.sl_glibc_mmapped.restype = i32
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
    """The loaded library (raises NativeUnavailable with the reason where it is not)."""
    require()  # what status() says (tests replace it)
    loaded = _load()
    if isinstance(loaded, str):  # the reason, where status() was not asked
        raise NativeUnavailable(loaded)
    return loaded


MALLOC, MAPPED = catalogue.ALLOCATOR.values  # the two regimes the native vector can take
REGIME_CODES = {MALLOC: 0, MAPPED: 1}
PRELOADABLE = {"jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
               "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so")}
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                "/usr/lib", "/usr/local/lib")
# glibc's dynamic mmap threshold (malloc(3), mallopt(3)): 128 KiB at start, raised to the size of
# every mapped block freed, up to 32 MiB on a 64-bit machine; larger blocks are always mapped.
GLIBC_MMAP_THRESHOLD_MAX = 32 * 2 ** 20


def process_allocator(maps: str | None = None) -> str:
    """Whose malloc this process calls: ``jemalloc`` or ``tcmalloc`` where one was preloaded
    (``LD_PRELOAD``; seen in ``/proc/self/maps``), else ``glibc``. Without ``maps``, learnt once
    per process (:func:`_allocator_of_this_process`), never inside a timed stage."""
    return _allocator_of_this_process() if maps is None else _allocator_in(maps)


@cache
def _allocator_of_this_process() -> str:
    """This process's malloc, read from ``/proc/self/maps`` on the first call only: a malloc
    is preloaded before the process starts and cannot change afterwards (what CUDA or a library
    maps later serves no ``malloc``), and reading and scanning the maps took 2.2 ms per call,
    inside the seed vector's timed ``alloc`` stage, before it was learnt once."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    return _allocator_in(maps)


def _allocator_in(maps: str) -> str:
    for name in PRELOADABLE:
        if f"lib{name}" in maps:
            return name
    return "glibc"


def regime_label(regime: str) -> str:
    """What a row records of the regime: the process's malloc by name, or ``mapped fresh``."""
    if regime not in REGIME_CODES:
        raise ValueError(f"allocator: {regime!r} is not one of {list(REGIME_CODES)}")
    return process_allocator() if regime == MALLOC else MAPPED


def regimes(maps: str | None = None) -> list[dict[str, object]]:
    """Every allocation regime of the seed's vector, with whether this process can take it and
    why not: the process's malloc (glibc with its dynamic threshold, or a preloaded jemalloc or
    tcmalloc), every vector mapped fresh (its own mmap), and each preloadable allocator this
    process was not started with (its library's path where the node has it)."""
    current = process_allocator(maps)
    out: list[dict[str, object]] = [
        {"regime": current, "native": MALLOC, "available": True,
         "note": ("glibc's malloc: mmap threshold dynamic, from 128 KiB up to 32 MiB; a vector "
                  "above the threshold is mapped fresh (zero pages faulted in) every step, one "
                  "below it reuses the heap" if current == "glibc" else
                  f"{current} preloaded (LD_PRELOAD) serves the vector")},
        {"regime": "glibc, mapped fresh", "native": MAPPED, "available": True,
         "note": "every vector its own mmap and munmap, as glibc above its threshold, whatever "
                 "the process freed before (the heap is never touched)"}]
    for name, files in PRELOADABLE.items():
        if name == current:
            continue
        found = next((f"{d}/{f}" for d in LIBRARY_DIRS for f in files
                      if Path(d, f).is_file()), None)
        out.append({"regime": name, "native": MALLOC, "available": False,
                    "note": (f"{found} is on this node, but this process was not started with "
                             f"LD_PRELOAD={found}" if found else f"{name} is not installed on "
                             "this node")})
    return out


class _Vector:
    """Owns one ``new std::vector<float>(numel)`` under a regime; deleted by :meth:`delete` or,
    failing that, when the last reference (a SeedVector, or the memory behind its tensor) goes."""

    def __init__(self, numel: int, regime: str) -> None:
        self._library = library()
        self._code = REGIME_CODES[regime]
        data = ctypes.c_void_p()
        self._handle = self._library.sl_vector_new(numel, self._code, ctypes.byref(data))
        if not self._handle:
            raise MemoryError(f"std::vector<float>({numel}) could not be allocated")
        self.address: int = data.value or 0  # null only for an empty vector

    @property
    def deleted(self) -> bool:
        return self._handle is None

    def delete(self) -> None:
        if self._handle is not None:
            self._library.sl_vector_free(self._handle, self._code)
            self._handle = None

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.delete()


class SeedVector:
    """The seed's copy destination: ``new std::vector<float>(numel)``, value-initialised (zeroed),
    under ``regime`` (:data:`MALLOC`: the process's malloc; :data:`MAPPED`: its own fresh mapping).

    ``tensor`` is a 1-D fp32 host tensor over the vector's data (no copy). :meth:`free` runs the
    vector's destructor, as the engine does when the step ends; it is idempotent, and afterwards
    ``tensor`` raises (tensors taken from it earlier point at freed memory: do not use them).
    A context manager that frees on exit. Without ``free()`` the vector lives as long as its
    tensor or this object, whichever goes last. ``mapped`` says whether its memory was a fresh
    mapping (for glibc's malloc, read from the chunk's header; None for another malloc): read
    on first use, not when the vector is made, so that a caller timing the construction times
    the seed's allocation alone; it is read from the chunk, so ask before :meth:`free`.
    """

    def __init__(self, numel: int, regime: str = MALLOC) -> None:
        numel = operator.index(numel)
        if numel < 0:
            raise ValueError(f"numel must be >= 0, got {numel}")
        if regime not in REGIME_CODES:
            raise ValueError(f"regime must be one of {list(REGIME_CODES)}, got {regime!r}")
        self.numel, self.regime = numel, regime
        self._vector = _Vector(numel, regime)
        self.address = self._vector.address  # the vector's data(): the tensor's data_ptr()
        self._mapped: bool | None = None
        self._tensor = torch.empty(0, dtype=torch.float32)
        if numel:
            memory = (ctypes.c_float * numel).from_address(self.address)
            # the tensor keeps the vector alive (no cycle); a ctypes array takes attributes,
            # which typeshed's stubs do not declare
            memory.owner = self._vector  # type: ignore[attr-defined]
            self._tensor = torch.frombuffer(memory, dtype=torch.float32)

    @property
    def mapped(self) -> bool | None:
        """Whether the vector's memory was a fresh mapping (None for an empty vector or a malloc
        other than glibc's); RuntimeError once freed, when its chunk can no longer be read."""
        if self._mapped is None and self.numel:
            if self._vector.deleted:
                raise RuntimeError("SeedVector.mapped read after free(): ask before it")
            self._mapped = _mapped(self._vector, self.regime)
        return self._mapped

    @property
    def tensor(self) -> torch.Tensor:
        if self._vector.deleted:
            raise RuntimeError("SeedVector.tensor used after free()")
        return self._tensor

    def free(self) -> None:
        """Delete the vector (its destructor frees the memory); a second call does nothing."""
        self._tensor = torch.empty(0, dtype=torch.float32)  # lets go of the vector's memory
        self._vector.delete()

    def __enter__(self) -> SeedVector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


def _mapped(vector: _Vector, regime: str) -> bool | None:
    if regime == MAPPED:
        return True
    if process_allocator() != "glibc":
        return None
    return bool(library().sl_glibc_mmapped(vector.address))


def seed_vector(numel: int, regime: str = MALLOC) -> SeedVector:
    """A fresh zeroed ``std::vector<float>`` of ``numel`` elements under ``regime`` (raises
    NativeUnavailable)."""
    return SeedVector(numel, regime)


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
