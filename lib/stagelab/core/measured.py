"""A measured folder's layout (``stagelab measure``'s output): which files hold a table's rows,
found by names this code knows and read as a stranger's files are. Here, on the core floor, so
that the replay, ``keep`` and ``predict`` read a measured folder one way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stagelab.core import records
from stagelab.core.schema import part_path, read_json_lines

MANIFEST = "measured.json"
ROWS_DIR = "rows"
ROWS_SUFFIX, PLAIN_ROWS_SUFFIX = ".jsonl.gz", ".jsonl"  # written; read as well (older folders)
# What a lease returns of its output folder: at most 8 files, each at most 16 MiB, none more
# than two folders below it (``--out`` is one, ``rows/`` the second).
LEASE_MAX_FILES, LEASE_MAX_FILE_BYTES, LEASE_MAX_FOLDERS_BELOW_OUT = 8, 16 << 20, 1


def rows_names(table: str) -> list[str]:
    """The names a table's rows may have in a measured folder, in reading order: its compressed
    file and the files it may roll over into, then the plain file older folders wrote. Names
    this code knows (a path in the manifest is never followed)."""
    plain = f"{ROWS_DIR}/{records.plain_name(table, 'table', MANIFEST)}"
    first = f"{plain}{ROWS_SUFFIX}"
    return [part_path(first, index).as_posix() for index in range(1, LEASE_MAX_FILES + 1)] + [
        f"{plain}{PLAIN_ROWS_SUFFIX}"]


def rows_paths(folder: Path | str, table: str) -> list[Path]:
    """A measured table's rows files in order: the compressed file and those it rolled over
    into, or the plain file of an older folder; empty where there is none (a link counts as
    there, for the reader to refuse)."""
    folder = Path(folder)
    *compressed, plain = (folder / name for name in rows_names(table))
    found = []
    for path in compressed:
        if not os.path.lexists(path):
            break
        found.append(path)
    return found or ([plain] if os.path.lexists(plain) else [])


def rows_path(folder: Path | str, table: str) -> Path:
    """A measured table's first rows file (its compressed name where there is none)."""
    found = rows_paths(folder, table)
    return found[0] if found else Path(folder) / rows_names(table)[0]


def table_rows(folder: Path | str, table: str) -> list[dict[str, Any]]:
    """Every row of a measured table's files, read as a stranger's files are; FileNotFoundError
    where it has none."""
    found = rows_paths(folder, table)
    if not found:
        raise FileNotFoundError(rows_path(folder, table))
    return [row for path in found for row in read_json_lines(path, root=folder)]
