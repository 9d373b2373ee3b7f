"""Records a run leaves, as evidence someone will commit and review: written whole, read with
their shapes checked, and placed by names that come from the file system, never from a record.

* Every record file (JSON, HTML, tables, figures) is written to a temporary file in its folder
  and renamed into place, with the permissions the umask gives (not ``mkstemp``'s 0600).
* ``manifest.json``, ``verdict.json`` and ``kept.json`` are read through :func:`load_record`,
  which checks them against the JSON Schemas in ``stagelab/schemas/`` (each field documented
  there): a wrong shape is one :class:`~stagelab.core.errors.BadRecord` line naming the file.
* A name read from a record (a notebook, a run id) is used in a path only if it is one plain
  path component (:func:`plain_name`).
* :class:`RunFolder` is the run folder as one object: where each of its files lives, reading
  and writing them, and the lock its runner holds while it runs.
* :func:`claim_output` lets a command's ``--out`` replace only an earlier output of the same
  command, and never a run's own record files.

Standard library only: the ground floor.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from stagelab.core import untrusted
from stagelab.core.errors import BadRecord, UserError

SCHEMAS_DIR = Path(__file__).with_name("schemas")
FILE_MODE = 0o666  # before the umask, as open() would create a file
# One plain path component: no separator, no NUL, not empty, not starting with a dot
# (which also rules out ``.`` and ``..``).
PLAIN_NAME = re.compile(r"^[^./\\\x00][^/\\\x00]*$")


class UnreadableJSON(BadRecord):
    """A record file that is not JSON at all (truncated, garbage), as opposed to a wrong shape."""


# ------------------------------------------------------------------------------ atomic writes

def umask() -> int:
    """The process's umask, read without changing it where Linux allows."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomic(path: Path, data: str | bytes) -> Path:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE & ~umask())
        mode, encoding = ("w", "utf-8") if isinstance(data, str) else ("wb", None)
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename.

    The file gets the umask's permissions. On any error the temporary file is removed and the
    error propagates: the old file, if any, stays whole.
    """
    return _write_atomic(path, bytes(data))


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically (see :func:`write_bytes_atomic`)."""
    return _write_atomic(path, str(text))


def write_json_atomic(path: Path, payload: Any, sort_keys: bool = False) -> Path:
    """Write a JSON document atomically (see :func:`write_bytes_atomic`)."""
    return write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=sort_keys,
                                              default=str) + "\n")


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for a library that writes files itself (parquet,
    savefig); renamed onto ``path`` with the umask's permissions when the block succeeds."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, FILE_MODE & ~umask())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------ names

def plain_name(value: Any, what: str, source: Path | str) -> str:
    """``value`` if it is one plain path component, else BadRecord naming ``source``."""
    if not isinstance(value, str) or not PLAIN_NAME.match(value):
        raise BadRecord(f"{source}: {what} {value!r} is not a plain file name; a record may not "
                        "name a path")
    return value


# ----------------------------------------------------------------------------- shape checks

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,),
    "number": (int, float), "boolean": (bool,), "null": (type(None),)}


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[kind])


def _required(value: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The keys ``schema`` requires of ``value``: ``required``, and ``dependentRequired``'s for
    each key present (how a record of a newer format requires what older ones lack)."""
    dependent = schema.get("dependentRequired", {})
    return [*schema.get("required", []),
            *(key for present in dependent if present in value for key in dependent[present])]


def shape_errors(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Where ``value`` breaks ``schema`` (the JSON Schema keywords the record schemas use:
    type, enum, pattern, minimum, required, dependentRequired, properties, additionalProperties,
    items)."""
    here = where or "the document"
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, kind) for kind in kinds):
            return [f"{here} is {type(value).__name__}, not {' or '.join(kinds)}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{here} is {value!r}, not one of {schema['enum']}"]
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        return [f"{here} {value!r} is not {schema.get('title', 'of the expected form')}"]
    if _is(value, "number") and "minimum" in schema and value < schema["minimum"]:
        return [f"{here} is {value!r}, below {schema['minimum']}"]
    errors: list[str] = []
    if isinstance(value, dict):
        errors += [f"{where + '.' if where else ''}{key} is missing"
                   for key in _required(value, schema) if key not in value]
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            if key in properties:
                errors += shape_errors(item, properties[key], inner)
            elif extra is False:
                errors.append(f"{inner} is not a known field")
            elif isinstance(extra, dict):
                errors += shape_errors(item, extra, inner)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += shape_errors(item, schema["items"], f"{where}[{index}]")
    return errors


@cache
def schema(name: str) -> dict[str, Any]:
    """The JSON Schema of a record kind: ``manifest``, ``verdict`` or ``kept``."""
    return json.loads((SCHEMAS_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))


def read_json(path: Path) -> Any:
    """A JSON file's content; BadRecord naming the file when it cannot be read or parsed (read
    as :func:`stagelab.core.untrusted.load_json` reads: no link, bounded size and depth).
    A missing file raises FileNotFoundError."""
    path = Path(path)
    try:
        return untrusted.load_json(path)
    except BadRecord as exc:  # a link, a FIFO, too large, too deep, not JSON: one line
        raise UnreadableJSON(str(exc)) from exc


def check_record(payload: Any, kind: str, source: Path | str) -> dict[str, Any]:
    """``payload`` if it has the shape of a ``kind`` record, else one BadRecord line."""
    errors = shape_errors(payload, schema(kind))
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise BadRecord(f"{source}: not a valid {kind} record: {errors[0]}{more}")
    return payload


def load_record(path: Path, kind: str) -> dict[str, Any]:
    """Read and shape-check a ``kind`` record (see :func:`check_record`)."""
    return check_record(read_json(path), kind, path)


# ---------------------------------------------------------------------------------- outputs

def generator_tag(command: str) -> str:
    """The mark a command's HTML output carries, by which a later ``--out`` recognises it."""
    return f'<meta name="generator" content="{command}">'


RUN_MARKERS = ("manifest.json", "measured.json")  # a run folder's, a measured folder's


def enclosing_run(path: Path | str) -> Path | None:
    """The run folder (or measured folder) that ``path`` lies in, at any depth, or None."""
    parent = Path(path).parent.resolve()
    for folder in (parent, *parent.parents):
        if any((folder / marker).is_file() for marker in RUN_MARKERS):
            return folder
    return None


def _is_earlier_output(out: Path, command: str) -> bool:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(out, encoding="utf-8") as handle:
            return generator_tag(command) in handle.read(4096)
    return False


def claim_output(out: Path, command: str, force: bool = False) -> Path:
    """Check that ``command`` may write ``out``: a new file, or an earlier output of the same
    command (it carries :func:`generator_tag`), or with ``force`` anything outside a run.
    Nothing of a run (at any depth: tables, figures, ``measured/``, manifest, verdict) is ever
    replaced, ``force`` or not. UserError naming ``--out`` otherwise."""
    out = Path(out)
    if out.is_symlink() or out.is_dir():
        raise UserError(f"--out {out}: is a {'link' if out.is_symlink() else 'folder'}; "
                        "name a new file")
    if not out.exists():
        return out
    run = enclosing_run(out)
    if run is not None and (out.parent.resolve() != run or RunFolder(run).owns(out)):
        raise UserError(f"--out {out}: is one of the run's own record files; it is never "
                        "replaced, name another file")
    if _is_earlier_output(out, command):
        return out
    if force and run is None:
        return out
    if force:
        raise UserError(f"--out {out}: lies in the run folder {run}; --force never replaces a "
                        "file of a run: name a new file")
    raise UserError(f"--out {out}: exists and is not an earlier output of `{command}`; name "
                    "a new file, or add --force to replace it")


# ------------------------------------------------------------------------------- run folder

TRACE_SUFFIX = ".trace.json.gz"  # a compressed Chrome trace (Perfetto opens it)


class RunFolder:
    """A run folder: where its manifest, tables, figures, verdict, hardware snapshot, notebooks
    and their HTML live, read and written in one place."""

    MANIFEST = "manifest.json"
    VERDICT = "verdict.json"
    HARDWARE = "hardware.json"
    KEPT = "kept.json"
    PREFLIGHT = "preflight.json"
    INDEX = "index.html"
    RECORDS = (MANIFEST, VERDICT, HARDWARE, KEPT, PREFLIGHT, INDEX)

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def manifest_path(self) -> Path:
        return self.path / self.MANIFEST

    @property
    def verdict_path(self) -> Path:
        return self.path / self.VERDICT

    @property
    def hardware_path(self) -> Path:
        return self.path / self.HARDWARE

    @property
    def kept_path(self) -> Path:
        return self.path / self.KEPT

    @property
    def index_path(self) -> Path:
        return self.path / self.INDEX

    @property
    def data_dir(self) -> Path:
        return self.path / "data"

    @property
    def figures_dir(self) -> Path:
        return self.path / "figures"

    def table_path(self, name: str) -> Path:
        """Where the table ``name`` lives: ``data/<name>.parquet``."""
        return self.data_dir / f"{name}.parquet"

    def figure_path(self, notebook: str, name: str) -> Path:
        """Where a notebook's figure lives: ``figures/<notebook>_<name>.png``."""
        return self.figures_dir / f"{notebook}_{name}.png"

    def trace_path(self, name: str) -> Path:
        """Where a compressed Chrome trace lives (a step's timeline):
        ``data/<name>.trace.json.gz``."""
        return self.data_dir / f"{name}{TRACE_SUFFIX}"

    def tables(self) -> list[Path]:
        """The tables found in ``data/``, sorted."""
        return sorted(self.data_dir.glob("*.parquet"))

    def figures(self) -> list[Path]:
        """The figures found in ``figures/``, sorted."""
        return sorted(self.figures_dir.glob("*.png"))

    def notebooks(self) -> list[Path]:
        """The notebook files found at the top of the folder (regular files only), sorted."""
        return sorted(p for p in self.path.glob("*.ipynb")
                      if p.is_file() and not p.is_symlink() and PLAIN_NAME.match(p.name))

    def html_for(self, notebook: Path | str) -> Path:
        """Where a notebook file's HTML export goes: its name with ``.html``."""
        return self.path / f"{Path(notebook).stem}.html"

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is one of this run's record files (manifest, verdict, index, a
        notebook or its HTML, a table, a figure), given that the folder holds a manifest."""
        path = Path(path)
        if not self.manifest_path.is_file():
            return False
        if path.parent == self.path:
            return (path.name in self.RECORDS or path.suffix == ".ipynb"
                    or (path.suffix == ".html" and (self.path / f"{path.stem}.ipynb").exists()))
        return path.parent in (self.data_dir, self.figures_dir)

    # reading and writing
    def read_manifest(self) -> dict[str, Any]:
        """The manifest, shape-checked; FileNotFoundError when there is none."""
        manifest = load_record(self.manifest_path, "manifest")
        for entry in manifest["notebooks"]:
            plain_name(entry["name"], "notebook name", self.manifest_path)
        return manifest

    def write_manifest(self, manifest: dict[str, Any]) -> Path:
        return write_json_atomic(self.manifest_path, manifest)

    def read_verdict(self) -> dict[str, Any] | None:
        """The verdict, shape-checked; None when the run has none."""
        try:
            return load_record(self.verdict_path, "verdict")
        except FileNotFoundError:
            return None

    def read_kept(self) -> dict[str, Any] | None:
        """A kept run's label, shape-checked; None when there is none."""
        try:
            return load_record(self.kept_path, "kept")
        except FileNotFoundError:
            return None

    def read_hardware(self) -> dict[str, Any] | None:
        """``hardware.json`` (the environment notebook's snapshot); None when absent."""
        try:
            payload = read_json(self.hardware_path)
        except FileNotFoundError:
            return None
        if not isinstance(payload, dict):
            raise BadRecord(f"{self.hardware_path}: not a JSON object")
        return payload

    def write_json(self, name: str, payload: Any) -> Path:
        """Write a JSON document at the folder's top level (``verdict.json``, ...)."""
        plain_name(name, "file name", self.path)
        return write_json_atomic(self.path / name, payload, sort_keys=True)

    # the runner's lock
    def hold_lock(self) -> FolderLock:
        """Take the run's lock (on the folder itself: no file is added) for as long as the
        returned lock stays open; the runner keeps it for the whole run and the system releases
        it when the process dies. UserError when another process holds it."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise UserError(f"{self.path}: cannot take the run's lock ({exc.strerror or exc})") \
                from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{self.path}: another stagelab process is writing this run "
                            "(it is still running, or being reported); try again when it ends"
                            ) from None
        return FolderLock(fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The lock for the length of a block (see :meth:`hold_lock`)."""
        lock = self.hold_lock()
        try:
            yield
        finally:
            lock.close()


class FolderLock:
    """A held folder lock; :meth:`close` releases it (closing is idempotent)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ------------------------------------------------------------------------------ kept runs

def kept_folders(root: Path) -> tuple[list[RunFolder], list[str]]:
    """The kept runs under ``<root>/<machine>/<run id>/`` and a sentence for each folder left
    out (a dot-folder such as a keep's leftover staging, or a folder without ``kept.json``)."""
    root = Path(root)
    kept, skipped = [], []
    for folder in sorted(p for p in root.glob("*/*") if p.is_dir()):
        where = folder.relative_to(root).as_posix()
        if any(part.startswith(".") for part in folder.relative_to(root).parts):
            skipped.append(f"{where}: a hidden folder (e.g. a keep that was stopped), not evidence")
        elif folder.is_symlink() or folder.parent.is_symlink():
            skipped.append(f"{where}: a symbolic link, not evidence")
        elif not (folder / RunFolder.KEPT).is_file():
            skipped.append(f"{where}: no {RunFolder.KEPT} (not kept by `stagelab keep`, or kept "
                           "before it labelled its runs), so not read as evidence")
        else:
            kept.append(RunFolder(folder))
    return kept, skipped
