"""A measured folder (``stagelab measure``'s output): its layout (which files hold a table's
rows, found by names this code knows), its manifest and the one writer of it, reading it back as
a stranger's files are read, its checks, its rows, its gaps, copying its record and its origin.
Here, on the core floor, so that the node command, the replay, ``keep`` and ``predict`` read and
write a measured folder one way.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from stagelab.core import catalogue, provenance, records, rundir, untrusted
from stagelab.core.errors import SchemaError, UserError
from stagelab.core.outcomes import (
    DEADLINE,
    FAILED,
    INTERRUPTED,
    NO_GO,
    OK,
    PENDING,
    RUNNING,
)
from stagelab.core.schema import make_rows, part_path, read_json_lines

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
    parts = LEASE_MAX_FILES - len(RECORD_FILES)  # a one-table measurement's, at the most
    return [part_path(first, index).as_posix() for index in range(1, parts + 1)] + [
        f"{plain}{PLAIN_ROWS_SUFFIX}"]


FORMAT, VERSION = "stagelab-measured", 1


SNAPSHOT_NOTEBOOK = catalogue.ENVIRONMENT_NOTEBOOK
# The measuring notebooks with a table, and the table each writes (the replay reads these).
TABLES = {notebook: table for table, notebook in catalogue.tables().items()}
UNMEASURED = "unmeasured"  # every experiment ran, no table holds an ok row (all skipped)
MEASURING = (SNAPSHOT_NOTEBOOK, *TABLES)


def rows_file(table: str) -> str:
    """Where a table's rows are written, relative to the measured folder."""
    return f"{ROWS_DIR}/{table}{ROWS_SUFFIX}"


def spare_files(manifest: Mapping[str, Any]) -> int:
    """How many files a measurement may add, beyond its record and one rows file per table,
    and still be returned whole: what a rows file may roll over into."""
    tables = sum(1 for e in manifest["experiments"] if e["table"])
    return max(0, LEASE_MAX_FILES - len(RECORD_FILES) - tables)


def return_problems(out: Path | str) -> list[str]:
    """What a lease would not return of the measured folder ``out`` (more than 8 files, a file
    over 16 MiB, a file too deep, a link), in words; empty when everything comes back."""
    out = Path(out)
    found = sorted(p for p in out.rglob("*") if not p.is_dir() or p.is_symlink())
    problems = [f"{len(found)} files, more than the {LEASE_MAX_FILES} a lease returns"
                ] if len(found) > LEASE_MAX_FILES else []
    for path in found:
        name = path.relative_to(out).as_posix()
        if path.is_symlink() or not path.is_file():
            problems.append(f"{name}: not a plain file")
        elif path.stat().st_size > LEASE_MAX_FILE_BYTES:
            problems.append(f"{name}: {path.stat().st_size} B, over {LEASE_MAX_FILE_BYTES} B")
        if len(path.relative_to(out).parts) - 1 > LEASE_MAX_FOLDERS_BELOW_OUT:
            problems.append(f"{name}: deeper than a lease returns")
    return problems


class Recorder:
    """The one writer of ``measured.json``: every change is saved atomically at once, its
    digests (:data:`DIGESTS`) first, so that a folder killed at any moment still verifies."""

    def __init__(self, out: Path, manifest: dict[str, Any]) -> None:
        self.out, self.manifest = out, manifest
        self.saved: dict[str, Any] | None = None  # the digest of the manifest last saved

    def save(self) -> None:
        data = (json.dumps(self.manifest, indent=2, default=str) + "\n").encode()
        write_digests(self.out, data, self.saved)
        records.write_bytes_atomic(self.out / MANIFEST, data)
        self.saved = file_digest(data)

    def experiment(self, notebook: str) -> dict[str, Any]:
        return next(e for e in self.manifest["experiments"] if e["notebook"] == notebook)


def measurement_manifest(request: Any, out: Path) -> dict[str, Any]:
    """The manifest of a measurement that starts now: every experiment pending."""
    experiments = []
    for name, parameters in request.notebooks.items():
        table = TABLES.get(name)
        experiments.append({
            "notebook": name, "table": table, "parameters": parameters, "status": PENDING,
            "rows": rows_file(table) if table else None,
            "file": None if table else "hardware.json", "error": None,
            "cells_planned": None, "predicted_s": None, "measured_s": None, "cells": []})
    return {
        "format": FORMAT, "version": VERSION, "measured_id": f"{out.name}-{uuid.uuid4().hex[:12]}",
        "profile": request.profile, "command": request.command, "status": RUNNING,
        "created_utc": rundir.now_utc(), "finished_utc": None, "host": socket.gethostname(),
        "pid": os.getpid(), "device": None, "gpu": None, "versions": None,
        "git": commit_state(), "source": provenance.source_record(),
        "deadline_s": request.deadline_s, "forced": request.force,
        "rehearsal": request.rehearse, "preflight": None, "experiments": experiments,
    }


def commit_state() -> dict[str, Any]:
    """The commit of the checkout (git), else the one named in ``STAGELAB_COMMIT`` (a lease
    copies the tree without ``.git``; the source's tree id is recorded beside it)."""
    state = rundir.git_state()
    if state["commit"] is None and os.environ.get(provenance.COMMIT_ENV):
        return {"commit": os.environ[provenance.COMMIT_ENV], "dirty": None,
                "from": provenance.COMMIT_ENV}
    return state


# A table's rows come back in at most a few files of 16 MiB (about 0.8 million rows each): a
# manifest claiming more is refused before a row is parsed.
MAX_TABLE_ROWS = 2_000_000
STATUSES = (OK, FAILED, DEADLINE, INTERRUPTED, RUNNING, PENDING, NO_GO, UNMEASURED)
# Top-level fields a replay copies into its run's record, and the types each may have.
TEXT_FIELDS = ("measured_id", "profile", "status", "created_utc", "finished_utc", "host",
               "device", "gpu")


def _field_problem(value: Any, kinds: tuple[type, ...], where: str) -> str | None:
    wrong = (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds)
    if wrong:
        return (f"has {where} of type {type(value).__name__}, not "
                f"{' or '.join(k.__name__ for k in kinds)}")
    return None


def _load_problem(load: Any, where: str) -> str | None:
    if load is None:
        return None
    if not isinstance(load, dict) or not isinstance(load.get("busy"), (bool, type(None))):
        return f"has {where}.load that is not a load summary"
    why = load.get("why", [])
    if not isinstance(why, list) or not all(isinstance(w, str) for w in why):
        return f"has {where}.load.why that is not a list of text"
    return None


def _experiment_problem(entry: Any, where: str) -> str | None:
    if not isinstance(entry, dict):
        return f"has {where} that is not an object"
    notebook = entry.get("notebook")
    if notebook not in MEASURING:
        return (f"has {where}.notebook {notebook!r}, not a measuring notebook "
                f"({', '.join(MEASURING)})")
    if entry.get("table") != TABLES.get(notebook):
        return (f"has {where}.table {entry.get('table')!r}, not {notebook}'s "
                f"({TABLES.get(notebook)!r})")
    if entry.get("status") not in STATUSES:
        return f"has {where}.status {entry.get('status')!r}, not one of {', '.join(STATUSES)}"
    checks = [(entry.get("parameters", {}), (dict,), "parameters"),
              (entry.get("error"), (str, type(None)), "error"),
              (entry.get("cells_planned"), (int, type(None)), "cells_planned"),
              (entry.get("cells"), (list,), "cells")]
    for value, kinds, name in checks:
        problem = _field_problem(value, kinds, f"{where}.{name}")
        if problem:
            return problem
    for index, cell in enumerate(entry["cells"]):
        inner = f"{where}.cells[{index}]"
        if not isinstance(cell, dict) or cell.get("status") not in STATUSES:
            return f"has {inner} that is not a cell with a known status"
        rows = cell.get("rows", 1)
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            return f"has {inner}.rows {rows!r}, not a count"
        problem = _field_problem(cell.get("cell", ""), (str,), f"{inner}.cell")
        if problem:
            return problem
    return _load_problem(entry.get("load"), where)


def manifest_problem(manifest: Mapping[str, Any]) -> str | None:
    """What in a measured manifest a replay could not use as data, or None."""
    for name in TEXT_FIELDS:
        problem = _field_problem(manifest.get(name), (str, type(None)), name)
        if problem:
            return problem
    for name, kinds in (("preflight", (dict, type(None))), ("versions", (dict, type(None))),
                        ("git", (dict, type(None))), ("forced", (bool, type(None)))):
        problem = _field_problem(manifest.get(name), kinds, name)
        if problem:
            return problem
    experiments = manifest.get("experiments")
    if not isinstance(experiments, list):
        return "has no readable list of experiments"
    seen = set()
    for index, entry in enumerate(experiments):
        problem = _experiment_problem(entry, f"experiments[{index}]")
        if problem:
            return problem
        if entry["notebook"] in seen:
            return f"lists {entry['notebook']} twice"
        if recorded_rows(entry) > MAX_TABLE_ROWS:
            return (f"says {entry['notebook']} measured {recorded_rows(entry)} rows, more than "
                    f"the {MAX_TABLE_ROWS} a measured table holds")
        seen.add(entry["notebook"])
    return None


def recorded_rows(entry: Mapping[str, Any]) -> int:
    """How many rows an experiment's finished cells say they wrote."""
    return sum(c.get("rows", 1) for c in entry["cells"] if c["status"] in (OK, FAILED))


def gaps(manifest: Mapping[str, Any]) -> list[str]:
    """What a measured folder lacks, in words: experiments not ``ok``, with their cells."""
    found = []
    for entry in manifest["experiments"]:
        if entry["status"] == OK:
            continue
        done = sum(1 for c in entry["cells"] if c["status"] == OK)
        planned = entry.get("cells_planned")
        cells = f", {done} of {planned} cells measured" if planned is not None else ""
        found.append(f"{entry['notebook']}: {entry['status']}{cells}"
                     f"{' (' + entry['error'] + ')' if entry.get('error') else ''}")
    return found


DIGESTS, DIGESTS_FORMAT = "digests.json", "stagelab-digests"  # sha256 and size of each file
RECORD_FILES = (MANIFEST, "hardware.json", "preflight.json", "inventory.json", DIGESTS)
RECORD_COPY = "measured"  # the node's record inside a replayed run folder
RUN_OWNED = ("run_id", "notebook")  # columns a run fills itself, never taken from a node's rows


def record_names() -> list[str]:
    """The only names a measured folder's record is read by (a path in it is never followed)."""
    return [*RECORD_FILES, *(name for table in TABLES.values() for name in rows_names(table))]


def matched_source(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The measurement's source record with ``matched_commit``: the commit here whose
    ``lib/stagelab`` has the tree id the node recorded (None where none has it)."""
    source = manifest.get("source")
    if not isinstance(source, dict):
        return None
    tree, named = source.get("tree"), source.get("commit_env")
    if not isinstance(tree, str) or len(tree) != 40 or not tree.isalnum():
        tree = None  # a stranger's folder: only a tree id is looked up
    return {"path": provenance.SOURCE, "tree": tree,
            "commit_env": named if isinstance(named, str) else None,
            "matched_commit": provenance.matching_commit(tree)}




def file_digest(data: bytes) -> dict[str, Any]:
    """What :data:`DIGESTS` records of a file: its SHA-256 and its size."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def write_digests(out: Path, manifest: bytes | None = None,
                  before: dict[str, Any] | None = None) -> None:
    """Write :data:`DIGESTS`: the digest of every file of the record in ``out`` (of
    ``manifest``, the manifest about to be saved, where given) and ``before``, that of the
    manifest it replaces: a process killed between the two writes leaves a folder that still
    verifies. A digest binds the bytes; it proves nothing of who wrote them."""
    files = {name: file_digest((out / name).read_bytes()) for name in record_names()
             if name not in (MANIFEST, DIGESTS) and (out / name).is_file()}
    data = (out / MANIFEST).read_bytes() if manifest is None else manifest
    records.write_json_atomic(out / DIGESTS, {
        "format": DIGESTS_FORMAT, "files": {MANIFEST: file_digest(data), **files},
        "manifest_before": before})


def _digest_problem(value: Any) -> bool:
    return not (isinstance(value, dict) and isinstance(value.get("sha256"), str)
                and isinstance(value.get("bytes"), int) and not isinstance(value["bytes"], bool)
                and value["bytes"] >= 0)


def _says_running(manifest: bytes) -> bool:
    """Whether a manifest's bytes say the measurement was still running (it was killed)."""
    try:
        parsed = json.loads(manifest)
    except (ValueError, RecursionError):
        return False
    return isinstance(parsed, dict) and parsed.get("status") == RUNNING


def record_limit(name: str) -> int:
    """The most bytes a file of the record may hold: compressed rows what a lease returns,
    plain rows (older folders) a GiB, the JSON records 64 MiB."""
    if name.endswith(ROWS_SUFFIX):
        return untrusted.MAX_COMPRESSED_ROWS_BYTES
    return untrusted.MAX_ROWS_BYTES if name.startswith(ROWS_DIR) else untrusted.MAX_JSON_BYTES


def read_rows_names(table: str, present: Collection[str]) -> list[str]:
    """Of a table's rows names, those the reader reads when ``present`` are there: its
    compressed file and each part after it up to the first missing one, or else its plain
    file (:meth:`MeasuredFolder.rows_paths` reads the same)."""
    *parts, plain = rows_names(table)
    read = list(itertools.takewhile(lambda name: name in present, parts))
    return read or ([plain] if plain in present else [])


def unread_rows(present: Collection[str]) -> list[str]:
    """The rows files among ``present`` that no reader reads (a part after a missing one, a
    plain file beside compressed ones): never rows, so never copied nor kept."""
    read = {name for table in TABLES.values() for name in read_rows_names(table, present)}
    return [name for name in present if name.startswith(f"{ROWS_DIR}/") and name not in read]


class MeasuredFolder:
    """A measured folder read as a stranger's: its manifest, its files by the names this code
    knows (a path in a record is never followed), their digests, its rows, their checks, the
    copy a replay analyses and where it came from. Every refusal is one
    :class:`~stagelab.core.errors.UserError` line naming the folder (``shown``: the folder a
    user gave, where this one is the checked copy of it)."""

    def __init__(self, path: Path | str, shown: Path | str | None = None) -> None:
        self.path = Path(path)
        self.shown = Path(shown) if shown is not None else self.path

    def __repr__(self) -> str:
        return f"MeasuredFolder({str(self.path)!r})"

    def refusal(self, text: str) -> UserError:
        return UserError(f"measured folder {self.shown}: {text}")

    # ---------------------------------------------------------------------------- manifest

    def manifest(self) -> dict[str, Any]:
        """The folder's manifest, every field a replay uses shape-checked
        (:func:`manifest_problem`); a manifest still saying ``running`` was written by a
        process that was killed (or that still writes): its running experiment reads
        ``interrupted``."""
        try:
            manifest = untrusted.load_json(self.path / MANIFEST, root=self.path)
        except FileNotFoundError:
            raise self.refusal(f"not a measured folder (no {MANIFEST}; make one with "
                               "`stagelab measure`)") from None
        except UserError as exc:
            raise self.refusal(str(exc)) from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise self.refusal(f"{MANIFEST} is not a stagelab measurement")
        if manifest.get("version") != VERSION:
            raise self.refusal(f"measurement format version {manifest.get('version')!r}, "
                               f"this stagelab reads {VERSION}")
        problem = manifest_problem(manifest)
        if problem:
            raise self.refusal(f"{MANIFEST} {problem}")
        if manifest.get("status") == RUNNING:
            manifest["status"] = INTERRUPTED
            for entry in manifest["experiments"]:
                if entry["status"] in (RUNNING, PENDING):
                    entry.update(status=INTERRUPTED, error="the measuring process was killed")
        return manifest

    # ------------------------------------------------------------------------------- files

    def check_files(self) -> None:
        """A refusal, naming the file, when one of the record's known names is not a regular
        file of bounded size inside the folder (a link, a FIFO, a device, a giant file)."""
        for name in record_names():
            self._read(name)

    def _read(self, name: str) -> bytes | None:
        try:
            return untrusted.read_regular(self.path / name, record_limit(name), root=self.path)
        except FileNotFoundError:
            return None
        except UserError as exc:
            raise self.refusal(str(exc)) from exc

    def _digests(self) -> dict[str, Any]:
        try:
            found = untrusted.load_json(self.path / DIGESTS, root=self.path)
        except FileNotFoundError:
            raise self.refusal(f"has no {DIGESTS} (the SHA-256 of every file `stagelab "
                               "measure` wrote): not a complete measurement of this stagelab; "
                               "measure again") from None
        except UserError as exc:
            raise self.refusal(str(exc)) from exc
        files = found.get("files") if isinstance(found, dict) else None
        before = found.get("manifest_before") if isinstance(found, dict) else None
        if (not isinstance(files, dict) or found.get("format") != DIGESTS_FORMAT
                or any(_digest_problem(v) for v in files.values())
                or (before is not None and _digest_problem(before))):
            raise self.refusal(f"{DIGESTS} is not a list of digests")
        unknown = sorted(set(files) - set(record_names()) - {DIGESTS})
        if unknown or MANIFEST not in files:
            raise self.refusal(f"{DIGESTS} names {unknown[0] if unknown else 'no manifest'}, "
                               "not a file of a measured folder")
        return found

    def verified(self) -> dict[str, bytes]:
        """Every file of the record, by its known name, read once and checked against
        :data:`DIGESTS`: the bytes a replay analyses. A refusal for a file the digests do not
        list, a file they list that is missing, and bytes that differ. A rows file may run on
        past its digest only where the measurement was killed (its manifest says ``running``):
        that tail is a cell never recorded, and left out."""
        digests = self._digests()
        files, found = digests["files"], {}
        for name in record_names():
            data = self._read(name)
            if data is None:
                if name in files:
                    raise self.refusal(f"{name} is missing, although {DIGESTS} lists it")
                continue
            if name != DIGESTS:
                found[name] = data
        for name in unread_rows(found):
            raise self.refusal(f"{name} is not read as rows (a part after a missing one, or "
                               "plain rows beside compressed ones); refused")
        manifest = found.get(MANIFEST, b"")
        if file_digest(manifest) not in (files[MANIFEST], digests.get("manifest_before")):
            raise self.refusal(f"{MANIFEST} differs from its digest in {DIGESTS}; refused")
        killed = _says_running(manifest) or file_digest(manifest) != files[MANIFEST]
        for name, data in found.items():
            if name == MANIFEST:
                continue
            if name not in files:
                raise self.refusal(f"{name} is not listed in {DIGESTS}; refused")
            size = files[name]["bytes"]
            tail = name.startswith(ROWS_DIR) and killed and len(data) >= size
            if (len(data) != size and not tail) or file_digest(data[:size]) != files[name]:
                raise self.refusal(f"{name} differs from its digest in {DIGESTS}; refused")
            found[name] = data[:size]
        return found

    def check_digests(self) -> None:
        """A refusal, in one line, where any file differs from its digest."""
        self.verified()

    def copy_verified(self, dest: Path) -> MeasuredFolder:
        """Copy the verified bytes (:meth:`verified`) into the new folder ``dest``, read once,
        with digests of exactly what was copied; the copy, as a measured folder that names this
        one. Rows stay compressed, and the plain rows of an older folder are compressed on the
        way (kept evidence must fit a lease)."""
        dest = Path(dest)
        (dest / ROWS_DIR).mkdir(parents=True)
        copied = set()
        for name, data in self.verified().items():
            if name.endswith(PLAIN_ROWS_SUFFIX):  # kept compressed: its whole rows, one member
                name, data = f"{name}.gz", gzip.compress(data[:data.rfind(b"\n") + 1], mtime=0)
                if name in copied:
                    continue
            records.write_bytes_atomic(dest / name, data)
            copied.add(name)
        write_digests(dest)
        return MeasuredFolder(dest, self.shown)

    def staged_copy(self) -> MeasuredFolder:
        """The verified copy in a private temporary folder (0700), made before any run folder
        exists: every check, and every notebook, then reads that copy and never this folder
        again (a file swapped in here after the check changes nothing)."""
        staging = Path(tempfile.mkdtemp(prefix="stagelab-measured-"))
        try:
            return self.copy_verified(staging / RECORD_COPY)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    # -------------------------------------------------------------------------------- rows

    def rows_paths(self, table: str) -> list[Path]:
        """A measured table's rows files in order: the compressed file and those it rolled
        over into, or the plain file of an older folder; empty where there is none (a link
        counts as there, for the reader to refuse)."""
        *compressed, plain = (self.path / name for name in rows_names(table))
        found = []
        for path in compressed:
            if not os.path.lexists(path):
                break
            found.append(path)
        return found or ([plain] if os.path.lexists(plain) else [])

    def rows_path(self, table: str) -> Path:
        """A measured table's first rows file (its compressed name where there is none)."""
        found = self.rows_paths(table)
        return found[0] if found else self.path / rows_names(table)[0]

    def table_rows(self, table: str, most: int = MAX_TABLE_ROWS) -> list[dict[str, Any]]:
        """The rows of a measured table's files, read as a stranger's files are: reading stops
        after ``most + 1`` lines (by default the most a measured table holds, never
        unbounded); FileNotFoundError where it has none."""
        found = self.rows_paths(table)
        if not found:
            raise FileNotFoundError(self.rows_path(table))
        rows: list[dict[str, Any]] = []
        for path in found:
            left = most - len(rows)
            if left < 0:
                break
            rows += read_json_lines(path, root=self.path, most=left)
        return rows

    def measured_rows(self, table: str) -> list[dict[str, Any]]:
        """The rows of one measured table that its manifest's cells account for (empty where
        the experiment measured no cell); the rows of a cell a kill cut off before it was
        recorded are left out."""
        entry = next((e for e in self.manifest()["experiments"] if e["table"] == table), None)
        if entry is None or not recorded_rows(entry):
            return []
        try:
            return self.table_rows(table, recorded_rows(entry))[:recorded_rows(entry)]
        except FileNotFoundError:
            return []

    def replayed_frame(self, table: str, run_id: str, notebook: str) -> Any:
        """A measured table as the run that replays it holds it (``data/<table>.parquet``):
        the rows its cells account for (:meth:`measured_rows`), less the columns a run owns,
        as one schema frame. The notebook writes this and ``keep`` rebuilds it to compare:
        one function, so that both build the same table."""
        rows = [{key: value for key, value in row.items() if key not in RUN_OWNED}
                for row in self.measured_rows(table)]
        return make_rows(rows, run_id=run_id, notebook=notebook)

    def check_rows(self, entry: Mapping[str, Any]) -> None:
        """A refusal when an experiment's rows file does not hold exactly the rows its cells
        recorded: fewer is a lost or truncated ``rows/`` (a replay would analyse part of it as
        whole), more is rows no cell accounts for (only a measurement killed between writing
        a cell's rows and recording the cell may hold those, and they are left out)."""
        expected = recorded_rows(entry)
        if entry["table"] is None or not expected:
            return
        name = self.rows_path(entry["table"]).relative_to(self.path).as_posix()
        try:
            found = len(self.table_rows(entry["table"], expected))  # parsed no further
        except FileNotFoundError:
            cells = sum(1 for c in entry["cells"] if c["status"] in (OK, FAILED))
            raise self.refusal(f"{name} is missing, although {entry['notebook']} recorded "
                               f"{cells} measured cells") from None
        except (OSError, SchemaError, UserError) as exc:
            raise self.refusal(f"{name} cannot be read ({exc})") from exc
        if found < expected:
            raise self.refusal(f"{name} holds {found} rows, fewer than the {expected} that "
                               f"{entry['notebook']}'s cells recorded")
        if found > expected and entry["status"] != INTERRUPTED:
            raise self.refusal(f"{name} holds {found} rows, more than the {expected} that "
                               f"{entry['notebook']}'s cells recorded")

    # ------------------------------------------------------------------------------ origin

    def origin(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Where and when a measurement was made, for the run's manifest and report;
        ``record`` is its copy inside the run folder, ``folder`` where it was read from on the
        analysing host."""
        return {"folder": str(self.shown.resolve()), "record": RECORD_COPY,
                "measured_id": manifest.get("measured_id"),
                "preflight": manifest.get("preflight"), "host": manifest.get("host"),
                "gpu": manifest.get("gpu"), "device": manifest.get("device"),
                "created_utc": manifest.get("created_utc"), "profile": manifest.get("profile"),
                "status": manifest.get("status"), "forced": manifest.get("forced"),
                "rehearsal": bool(manifest.get("rehearsal")), "git": manifest.get("git"),
                "source": matched_source(manifest), "versions": manifest.get("versions"),
                "gaps": gaps(manifest),
                "loads": {e["notebook"]: e["load"] for e in manifest["experiments"]
                          if e.get("load")}}
