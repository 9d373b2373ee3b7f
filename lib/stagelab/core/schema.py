"""The one tidy-data schema that every measurement row carries, and the helpers that write tables.

Every notebook turns its measurements into rows of this schema and writes them with
:func:`write_table` into ``<run folder>/data/<name>.parquet``; ``stagelab measure`` appends the
same rows as JSON lines (:class:`JsonLinesSink`), with the standard library alone. pandas is
imported only by the frame functions (:func:`make_rows`, :func:`conform`, :func:`write_table`,
:func:`read_table`, :class:`TableSink`), never by the measuring floor.

One row is one observation: one round of one arm of one experiment at one size, or one
non-timing measurement (a peak, an error).

========== ======= ============================================================================
column     type    meaning
========== ======= ============================================================================
run_id     str     the run folder's name
notebook   str     the notebook that measured it, e.g. ``01_d2h_staging``
experiment str     what was measured: the catalogue's experiment (``staging``, ``step``,
                   ``prompt_logprobs``); tables kept before it say ``d2h_copy`` for staging
arm        str     the variant under test, e.g. ``pageable_fresh``; A/A twins end in ``~aa``
stage      str     part of a pipeline (``copy``, ``host_gather``...) or ``total``
metric     str     ``time`` for timings; otherwise what ``bytes``/``value`` hold:
                   bytes: ``peak_host_bytes``, ``peak_device_bytes``, ``predicted_peak_bytes``,
                   ``pinned_bytes_held``; value: ``allocations``, ``pcie_tx_bytes_per_s``,
                   ``max_abs_error``, ``rank_mismatches``, ``id_mismatches``,
                   ``bitwise_equal`` (1 or 0), ``order_seed`` (the seed of a cell's balanced
                   arm order), ``rounds`` (rounds a cell ran; the note says why it stopped),
                   ``forward_ms`` (device work queued before each step, ms, nominal),
                   ``forward_measured_ms`` (that work between its own CUDA events, mean ms
                   per call), ``sm_clock_mhz`` (the GPU's SM clock, sampled between a
                   cell's rounds: stage ``min``, ``median``, ``max``; the note gives the
                   throttle reasons seen), ``num_host_alloc`` (pinned host allocations
                   torch made during a cell),
                   ``host_rate`` (a host cost of the step timed alone at the cell's size:
                   arm ``host_rates``, stage the term, one row per repeat; see
                   ``stagelab.measure.hostrates``), ``read_rate`` (the one-pass kernel
                   alone on a step cell's logits, once per size: arm ``onepass``, stage
                   ``l2_warm`` or ``l2_cold``, ``seconds`` the median call, ``bytes`` the
                   logits read, ``value`` the share of the GPU's HBM peak, missing where it
                   is not known; see ``stagelab.measure.onepass.read_rate_rows``)
device     str     where the source lived: ``cpu`` or ``cuda:0 <name>``
model      str     model whose shape was used, empty when sizes were given as numbers
rows       int     rows per step (``n``) or scored prompt positions (``T - 1``)
vocab      int     vocabulary size ``V``
hidden     int     hidden size ``H`` (prompt logprobs), else missing
k          int     top-K logprobs requested, else missing
chunk      int     prompt-logprob chunk rows, else missing (unchunked: equal to ``rows``)
overlap    bool    whether the copy overlapped compute (prompt logprobs), else missing
tile       int     the ``head_fused`` prompt method's vocabulary tile (lm_head rows per
                   product), else missing
dtype      str     element type of the tensor that was moved or scored
log_softmax str    where the seed arms ran the log-softmax: ``device`` or ``host`` (the step),
                   else missing
regime     str     the seed vector's allocation regime (the step): the process's malloc
                   (``glibc``, or a preloaded ``jemalloc``/``tcmalloc``) or ``mapped fresh``;
                   else missing
overlap_order str  how the step met the forward queued before it (the step):
                   ``queued`` (the fresh vector's allocation and zero-fill overlap it) or
                   ``waited`` (the device waited on before the allocation: the fill paid in
                   full; the wait is inside the timed call, outside every stage); missing in
                   tables kept before it (read as ``queued``) and elsewhere
steps      int     consecutive decode steps per timed call (the step: forward queued, step,
                   next forward ...; a deferred arm drained at the call's end): ``seconds``
                   and ``host_seconds`` are the call's divided by it, stages per step;
                   missing in tables kept before it (one step per call) and elsewhere
mapped     bool    whether the step's fresh seed vector was a fresh mapping (its pages faulted
                   in) rather than heap memory back from an earlier step, read from glibc's
                   chunk header after the timed ``alloc`` stage (row stage ``alloc`` of an arm
                   with a fresh vector); missing elsewhere or under another malloc
minor_faults int   the minor page faults the allocating thread took during a step's timed
                   ``alloc`` stage (``getrusage`` read just outside it); else missing
round      int     the round (interleaved arms of one round share it: samples pair by it);
                   warm-up rounds are not recorded
position   int     the sample's place in its round (0 = first), from the balanced order
seconds    float   the primary timer's reading (CUDA events on a GPU, else ``perf_counter``)
host_seconds float host-clock reading of the same round, to cross-check events; else missing
clock_agrees bool  whether the host clock agreed with the CUDA events on this round (within
                   ``stagelab.measure.bench.clocks_agree``); missing where only one clock ran
bytes      int     bytes moved (timings) or the measured quantity in bytes
value      float   a dimensionless measurement (errors, counts), else missing
gb_per_s   float   derived: ``bytes / seconds / 1e9`` for timings that move bytes
timer      str     ``cuda_event``, ``perf_counter`` or empty
status     str     ``ok``, ``unavailable`` (could not be measured here), ``skipped`` (would not
                   fit, or not a valid cell) or ``failed`` (the arm or cell raised)
note       str     why a row is unavailable, skipped or failed, or other plain-words context
========== ======= ============================================================================
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from stagelab.core import untrusted
from stagelab.core.errors import BadRecord, RowsFileFull, SchemaError
from stagelab.core.outcomes import FAILED, OK
from stagelab.core.records import RunFolder, atomic_target

if TYPE_CHECKING:
    import pandas as pd

COLUMN_DTYPES: dict[str, str] = {
    "run_id": "string",
    "notebook": "string",
    "experiment": "string",
    "arm": "string",
    "stage": "string",
    "metric": "string",
    "device": "string",
    "model": "string",
    "rows": "Int64",
    "vocab": "Int64",
    "hidden": "Int64",
    "k": "Int64",
    "chunk": "Int64",
    "overlap": "boolean",
    "tile": "Int64",
    "dtype": "string",
    "log_softmax": "string",
    "regime": "string",
    "overlap_order": "string",
    "steps": "Int64",
    "mapped": "boolean",
    "minor_faults": "Int64",
    "round": "Int64",
    "position": "Int64",
    "seconds": "float64",
    "host_seconds": "float64",
    "clock_agrees": "boolean",
    "bytes": "Int64",
    "value": "float64",
    "gb_per_s": "float64",
    "timer": "string",
    "status": "string",
    "note": "string",
}
COLUMNS: tuple[str, ...] = tuple(COLUMN_DTYPES)
# Columns renamed since evidence was first kept: read under their new names.
LEGACY_COLUMNS: dict[str, str] = {"repeat": "round"}
# Columns added since evidence was first kept: missing in older tables, read as missing values.
ADDED_COLUMNS: tuple[str, ...] = ("position", "log_softmax", "regime", "mapped",
                                  "minor_faults", "tile", "overlap_order", "steps")
STATUSES = (OK, "unavailable", "skipped", FAILED)
READ_RATE = "read_rate"  # the metric of the one-pass kernel's read-rate rows (the step)
_DEFAULTS: dict[str, Any] = {"stage": "total", "metric": "time", "model": "", "timer": "",
                             "status": "ok", "note": ""}


def normalise_rows(records: Iterable[Mapping[str, Any]], **common: Any) -> list[dict[str, Any]]:
    """Schema rows as plain dicts, every column present: ``common`` fills every row, missing
    columns get their default or None, ``gb_per_s`` is derived where a timing moved bytes.

    Unknown keys are an error (a typo must not become a silently dropped column).
    """
    rows = [{**_DEFAULTS, **common, **record} for record in records]
    unknown = sorted({key for row in rows for key in row} - set(COLUMNS))
    if unknown:
        raise SchemaError(f"unknown column(s) {unknown}; the schema's columns are {list(COLUMNS)}")
    rows = [{column: row.get(column) for column in COLUMNS} for row in rows]
    for row in rows:
        seconds, moved = row["seconds"], row["bytes"]
        if (_missing(row["gb_per_s"]) and row["metric"] == "time" and not _missing(seconds)
                and seconds > 0 and not _missing(moved)):
            row["gb_per_s"] = float(moved) / seconds / 1e9
    return rows


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def make_rows(records: Iterable[Mapping[str, Any]], **common: Any) -> pd.DataFrame:
    """Build a schema-conforming frame from dict records (see :func:`normalise_rows`)."""
    import pandas as pd

    return conform(pd.DataFrame(normalise_rows(records, **common), columns=list(COLUMNS)))


def conform(frame: pd.DataFrame) -> pd.DataFrame:
    """Check a frame has exactly the schema's columns and valid statuses; cast to the schema types."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    extra = [c for c in frame.columns if c not in COLUMN_DTYPES]
    if missing or extra:
        raise SchemaError(f"table does not follow the schema: missing {missing}, extra {extra}")
    frame = frame[list(COLUMNS)].astype(COLUMN_DTYPES)
    bad = sorted(set(frame["status"].dropna()) - set(STATUSES))
    if bad:
        raise SchemaError(f"unknown status value(s) {bad}; valid: {list(STATUSES)}")
    return frame


def table_path(run_dir: Path | str, name: str) -> Path:
    """Where the table ``name`` of a run folder lives (see :class:`stagelab.core.records.RunFolder`)."""
    return RunFolder(run_dir).table_path(name)


def write_table(frame: pd.DataFrame, run_dir: Path | str, name: str) -> Path:
    """Validate ``frame`` against the schema and write it as ``data/<name>.parquet`` in the run,
    atomically: a reader (or a kill) never sees half a file."""
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"table name {name!r} must be letters, digits and underscores")
    path = table_path(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = conform(frame)
    with atomic_target(path) as temporary:
        frame.to_parquet(temporary, index=False)
    return path


class RowSink(Protocol):
    """Where a sweep puts each finished cell's records."""

    def append(self, records: Iterable[Mapping[str, Any]]) -> Path:
        """Take one cell's records and make them durable."""


class JsonLinesSink:
    """Appends each cell's rows, complete schema rows, to a JSON-lines file and flushes them to
    disk, with the standard library alone: a killed process leaves every finished cell
    readable (:func:`read_json_lines`). ``common`` fills every row (``run_id``, ``notebook``)."""

    def __init__(self, path: Path | str, **common: Any) -> None:
        self.path, self.common = Path(path), common
        self.rows: list[dict[str, Any]] = []

    def append(self, records: Iterable[Mapping[str, Any]]) -> Path:
        """Add one cell's rows at the end of the file."""
        rows = normalise_rows(records, **self.common)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
            handle.flush()
            os.fsync(handle.fileno())
        self.rows += rows
        return self.path


GZIP_ROWS = ".jsonl.gz"


def part_path(path: Path | str, index: int) -> Path:
    """The ``index``-th file (1 is ``path`` itself) of a table's compressed rows, e.g.
    ``step.jsonl.gz``, ``step.2.jsonl.gz``."""
    path = Path(path)
    if index == 1:
        return path
    return path.with_name(f"{path.name.removesuffix(GZIP_ROWS)}.{index}{GZIP_ROWS}")


class GzipJsonLinesSink(JsonLinesSink):
    """Appends each cell's rows as one gzip member of JSON lines (``.jsonl.gz``), flushed to
    disk: a killed process leaves every finished cell readable, at about a twentieth of the
    plain size. With ``max_bytes``, a cell that would make the file larger goes to a new file
    (:func:`part_path`) when ``another_file()`` allows one, else it is refused with
    :class:`RowsFileFull` before anything is written: no file passes what a lease returns, and
    none is half-written."""

    def __init__(self, path: Path | str, max_bytes: int | None = None,
                 another_file: Callable[[], bool] | None = None, **common: Any) -> None:
        super().__init__(path, **common)
        self.max_bytes, self.another_file = max_bytes, another_file
        self.parts, self.written = 1, 0  # rows are not kept in memory: a table may be large

    def append(self, records: Iterable[Mapping[str, Any]]) -> Path:
        """Add one cell's rows as one gzip member at the end of the current file."""
        rows = normalise_rows(records, **self.common)
        member = gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode(),
                               mtime=0)
        target = self._target(len(member), len(rows))
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "ab") as handle:
            handle.write(member)
            handle.flush()
            os.fsync(handle.fileno())
        self.written += len(rows)
        return target

    def _target(self, member_bytes: int, rows: int) -> Path:
        current = part_path(self.path, self.parts)
        size = current.stat().st_size if current.exists() else 0
        if self.max_bytes is None or size + member_bytes <= self.max_bytes:
            return current
        if member_bytes <= self.max_bytes and size and self.another_file and self.another_file():
            self.parts += 1
            return part_path(self.path, self.parts)
        raise RowsFileFull(f"{current.name}: {rows} more rows ({member_bytes} B compressed) "
                           f"would pass {self.max_bytes} B ({size} B written) and no other "
                           "file may take it")


# `measure` writes one gzip member per cell: no profile comes near this many cells in a table.
MAX_GZIP_MEMBERS = 100_000
_GZIP_PIECE = 4096  # input fed per call: what zlib copies of the rest stays this small


def _gzip_member(view: memoryview, start: int, left: int, source: Path | str
                 ) -> tuple[bytes, int] | None:
    """The text of the gzip member at ``start`` and where the next one starts; None for a
    member cut short or damaged. Fed in small pieces, so that reading every member costs
    time linear in the data (zlib copies what it leaves unused)."""
    decoder, pos, parts = zlib.decompressobj(wbits=31), start, []
    try:
        while not decoder.eof and pos < len(view):
            piece = view[pos:pos + _GZIP_PIECE]
            pos += len(piece)
            chunk = decoder.decompress(piece, left + 1)
            while True:
                parts.append(chunk)
                left -= len(chunk)
                if left < 0:
                    raise BadRecord(f"{source}: its rows decompress past the bound")
                if not decoder.unconsumed_tail:
                    break
                chunk = decoder.decompress(decoder.unconsumed_tail, left + 1)
    except zlib.error:
        return None
    if not decoder.eof:
        return None
    return b"".join(parts), pos - len(decoder.unused_data)


def gzip_members_text(data: bytes, source: Path | str,
                      limit: int = untrusted.MAX_ROWS_BYTES) -> str:
    """The text of every whole gzip member of ``data``; a last member cut short (a kill while
    writing) is left out. BadRecord naming ``source`` where the text would pass ``limit``
    bytes (a small file must not decompress into a giant one), where it holds more than
    :data:`MAX_GZIP_MEMBERS` members, or is not UTF-8. Linear in the size of ``data``."""
    found: list[bytes] = []
    view, pos, left = memoryview(data), 0, limit
    while pos < len(view):
        if len(found) >= MAX_GZIP_MEMBERS:
            raise BadRecord(f"{source}: more than {MAX_GZIP_MEMBERS} gzip members (one a cell)")
        try:
            member = _gzip_member(view, pos, left, source)
        except BadRecord:
            raise BadRecord(f"{source}: its rows decompress past {limit} bytes") from None
        if member is None:
            break
        text, pos = member
        found.append(text)
        left -= len(text)
    try:
        return b"".join(found).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"{source}: is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """Each line of ``text`` with its number and whether a newline ends it, one at a time (a
    table of a GiB is never split into a list of all its lines)."""
    start, number = 0, 0
    while start < len(text):
        end = text.find("\n", start)
        number += 1
        if end < 0:
            yield number, text[start:], False
            return
        yield number, text[start:end], True
        start = end + 1


def read_json_lines(path: Path | str, root: Path | str | None = None,
                    most: int | None = None) -> list[dict[str, Any]]:
    """The rows of a JSON-lines table, plain (``.jsonl``) or gzip members (``.jsonl.gz``); a
    last line or member cut short by a kill is left out, any other damaged line names the file
    and line. Read as :func:`stagelab.core.untrusted.read_text` reads (a regular file of
    bounded size, no link, none between ``root`` and it); a row must be a JSON object of
    bounded depth. With ``most``, reading stops after ``most + 1`` lines, blank ones counted
    (``measure`` writes none): a caller that expects ``most`` rows learns there are more, or
    that some lines are not rows, without reading the rest."""
    path = Path(path)
    if path.name.endswith(".gz"):
        text = gzip_members_text(
            untrusted.read_regular(path, untrusted.MAX_COMPRESSED_ROWS_BYTES, root), path)
        if text and not text.endswith("\n"):
            raise SchemaError(f"{path}: a gzip member does not end with a whole row")
    else:
        text = untrusted.read_text(path, root)
    rows: list[dict[str, Any]] = []
    for number, line, whole in _lines(text):
        if most is not None and number > most + 1:
            break
        if not line.strip():
            continue
        try:
            row = untrusted.parse_json(line, f"{path}:{number}")
        except BadRecord as exc:
            if not whole:  # no newline after it: the write was cut short
                break
            raise SchemaError(f"{path}:{number}: not a JSON row "
                              f"({exc.__cause__ or str(exc).split(': ', 1)[-1]})") from exc
        if not isinstance(row, dict):
            raise SchemaError(f"{path}:{number}: not a JSON row (a {type(row).__name__}, not "
                              "an object)")
        rows.append({LEGACY_COLUMNS.get(str(key), str(key)): value for key, value in row.items()})
    return rows


class TableSink:
    """Collects a sweep's records and rewrites its table after every cell, so that a notebook that
    is interrupted or killed leaves every finished cell on disk. ``common`` fills every row
    (``run_id``, ``notebook``)."""

    def __init__(self, run_dir: Path | str, name: str, **common: Any) -> None:
        self.run_dir, self.name, self.common = Path(run_dir), name, common
        self.records: list[dict] = []

    def append(self, records: Iterable[Mapping[str, Any]]) -> Path:
        """Add one cell's records and write the whole table so far."""
        self.records.extend(dict(record) for record in records)
        return write_table(self.frame(), self.run_dir, self.name)

    def frame(self) -> pd.DataFrame:
        """Every record so far as a schema frame."""
        return make_rows(self.records, **self.common)


def read_table(run_dir: Path | str, name: str) -> pd.DataFrame:
    """Read a run's table; a missing file raises FileNotFoundError, a corrupt one names the file."""
    import pandas as pd

    path = table_path(run_dir, name)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such table in this run")
    try:
        frame = pd.read_parquet(path).rename(columns=LEGACY_COLUMNS)
        for column in ADDED_COLUMNS:
            if column not in frame.columns:
                frame[column] = pd.NA
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise SchemaError(f"{path}: cannot be read as a parquet table ({exc})") from exc
    try:
        return conform(frame)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from exc
