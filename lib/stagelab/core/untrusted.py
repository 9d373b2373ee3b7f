"""Reading files a stranger may have written: a measured folder from another machine, a run
folder someone sent. Only a folder's own regular files are read, by names the caller knows.

* :func:`read_regular` opens without following a link (at the file and at every folder between
  it and the folder it belongs to), refuses a FIFO, a device or a folder, and refuses a file
  larger than its bound before reading a byte of it (a giant sparse file costs nothing).
* :func:`load_json` parses with a bound on nesting, so a deeply nested document is one line,
  not a RecursionError (the JSON parser's, or a later walk's).
* :func:`check_text` refuses a lone surrogate, which no file can encode.

Every refusal is one :class:`~stagelab.core.errors.BadRecord` line naming the file.
Standard library only: the ground floor.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from stagelab.core.errors import BadRecord

MAX_JSON_BYTES = 64 * 2**20  # a manifest, snapshot, preflight or inventory: kilobytes in practice
MAX_ROWS_BYTES = 2**30  # one table's rows as JSON lines: megabytes for the largest profile
# A compressed rows file: `stagelab measure` never writes one past what a lease returns (16 MiB)
MAX_COMPRESSED_ROWS_BYTES = 16 << 20
MAX_JSON_DEPTH = 32  # the records nest a handful of levels deep


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _check_folders(path: Path, root: Path) -> None:
    """BadRecord when a folder between ``root`` and ``path`` is a link (or ``path`` is outside)."""
    try:
        inner = path.relative_to(root)
    except ValueError:
        raise BadRecord(f"{path}: lies outside {root}; a record may not name a path") from None
    here = root
    for part in inner.parts[:-1]:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise BadRecord(f"{here}: cannot be read ({exc.strerror or exc})") from exc
        if not stat.S_ISDIR(mode):
            raise BadRecord(f"{here}: is {_kind(mode)}, not a folder; only the folder's own "
                            "files are read")


def read_regular(path: Path | str, limit: int, root: Path | str | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``), read without following a
    link; with ``root``, no folder between ``root`` and ``path`` may be a link either.
    FileNotFoundError when it is absent; BadRecord naming it for anything else."""
    path = Path(path)
    if root is not None:
        _check_folders(path, Path(root))
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadRecord(f"{path}: is a symbolic link; only the folder's own regular files "
                            "are read") from exc
        raise BadRecord(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadRecord(f"{path}: is {_kind(info.st_mode)}; only regular files are read")
        if info.st_size > limit:
            raise BadRecord(f"{path}: {info.st_size} bytes, more than the {limit} such a file "
                            "may hold; not read")
        data = _read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew while being read
        raise BadRecord(f"{path}: more than the {limit} bytes such a file may hold; not read")
    return data


def _read_up_to(fd: int, most: int) -> bytes:
    chunks, left = [], most
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (0 for a scalar), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((inner, level + 1) for inner in item.values())
        elif isinstance(item, list):
            stack.extend((inner, level + 1) for inner in item)
    return deepest


def check_text(value: Any, source: Path | str) -> Any:
    """``value`` unchanged, or BadRecord when a string in it (key or value) holds a lone
    surrogate: it could be neither written to a file nor shown."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRecord(f"{source}: holds text that is not valid Unicode (a lone "
                                f"surrogate: {item.encode('utf-8', 'backslashreplace')[:60]!r})"
                                ) from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def parse_json(text: str, source: Path | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``text`` parsed as JSON; BadRecord naming ``source`` when it is not JSON, nests deeper
    than ``max_depth`` or holds a lone surrogate."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise BadRecord(f"{source}: nests deeper than {max_depth} levels; not a record") from None
    except ValueError as exc:
        raise BadRecord(f"{source}: cannot be read as JSON ({exc})") from exc
    if depth(value) > max_depth:
        raise BadRecord(f"{source}: nests deeper than {max_depth} levels; not a record")
    return check_text(value, source)


def load_json(path: Path | str, root: Path | str | None = None,
              limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file read as :func:`read_regular` reads it and parsed by :func:`parse_json`."""
    data = read_regular(path, limit, root)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"{path}: is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return parse_json(text, path)


def read_text(path: Path | str, root: Path | str | None = None,
              limit: int = MAX_ROWS_BYTES) -> str:
    """A UTF-8 text file read as :func:`read_regular` reads it."""
    data = read_regular(path, limit, root)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"{path}: is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
