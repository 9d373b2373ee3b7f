"""Tables as a reader sees them: columns named in words with their units, figures to three
significant digits, a speedup and its CI in one cell, no index, no column left empty. Notebooks display every frame
through :func:`show` (an HTML table in the exported report), never a raw frame.

A column is recognised by its name, the same names the analysis floor gives (``seconds``,
``*_ms``, ``*_bytes``, ``speedup`` with ``ci_low``/``ci_high``...); one it does not know is shown
as it is.
"""

from __future__ import annotations

import html
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from stagelab.core import catalogue

SIGNIFICANT = 3
MIB = 2**20
# Columns renamed only: what they are, in words.
WORDS = {"rows": "n (rows)", "vocab": "V (vocabulary)", "k": "K", "chunk": "chunk C (rows)",
         "n_rounds": "rounds", "twin_n_rounds": "A/A twin rounds", "baseline_rounds": "rounds",
         "n": "samples", "rounds": "rounds",
         "trials": "trials", "allocations": "host allocations (count)",
         "rank_mismatches": "ranks that differ (count)",
         "id_mismatches": "ids that differ (count)"}
YES_NO = {"bitwise_equal": "bitwise equal",  # 1/0 values read as yes/no
          "outside": "measured outside the model's interval"}
# Columns in ms named in words (the cost model's interval around its prediction).
MS_WORDS = {"interval_ms": "model's interval (ms)", "mid_ms": "predicted (ms)",
            "step_ms": "seed step, mean (ms)"}  # the verdict's threshold: a share of it
TEXT = {"noisy": "noisy (IQR ≥ 10 % of median)", "met": "met"}
# Columns whose values may name a stage of the step: shown in the stage's words
# (catalogue.STAGE_WORDS), as every other table, legend and sentence names it.
STAGE_VALUES = ("stage", "name", "term", "dominant_term", "part")
# Columns that say which cell and arm a row is about come first.
LEADING = ("rows", "vocab", "k", "chunk", "arm", "method", "baseline", "candidate", "decision",
           "scenario", "goal")
SECONDS = ("seconds", "median", "q1", "q3", "iqr", "median_seconds", "mean_seconds",
           "best_seconds")
RATIOS = ("min_speedup", "numpy_over_native", "relative", "true_speedup")
PERCENTS = ("iqr_over_median", "port_rate", "close_rate", "inconclusive_rate", "delta",
            "error")  # the cost model's error: predicted / measured - 1


def significant(value: float, digits: int = SIGNIFICANT) -> str:
    """A number to ``digits`` significant digits in plain notation: 2562, 16.4, 1.66, 0.0258."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{round(value, decimals):.{decimals}f}"


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def text(value: Any) -> str:
    """A cell that is not a number, as a reader sees it: missing as an empty cell, a boolean
    as yes or no, text without Markdown's backticks (a table shows no Markdown)."""
    if _missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    return str(value).replace("`", "")


def _number(fmt: Callable[[float], str], counts: bool = False) -> Callable[[Any], str]:
    """A formatter that leaves missing values as an empty cell, text and booleans to :func:`text`;
    with ``counts`` (a column of no known unit), a whole number of an integer type is shown
    without decimals (2, not 2.00)."""
    def shown(value: Any) -> str:
        if _missing(value) or isinstance(value, (bool, np.bool_)):
            return text(value)
        if counts and isinstance(value, numbers.Integral):
            return f"{int(value)}"
        if not isinstance(value, numbers.Real):
            return text(value)
        return fmt(float(value))
    return shown


def _with_ci(frame: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """``<prefix>speedup``, ``<prefix>ci_low`` and ``<prefix>ci_high`` as one text column."""
    names = [f"{prefix}speedup", f"{prefix}ci_low", f"{prefix}ci_high"]
    if not set(names) <= set(frame.columns):
        return frame
    text = [("" if pd.isna(s) else f"{s:.3f}x [{lo:.3f}, {hi:.3f}]")
            for s, lo, hi in zip(*(frame[n] for n in names))]
    at = min(list(frame.columns).index(n) for n in names)
    frame = frame.drop(columns=names)
    frame.insert(at, f"{prefix}speedup_ci", text)
    return frame


INTERVAL = "interval"  # ``<p>low<u>`` and ``<p>high<u>`` shown as one ``<p>interval<u>`` column


def _with_interval(frame: pd.DataFrame) -> pd.DataFrame:
    """Each pair ``<prefix>low<unit>`` and ``<prefix>high<unit>`` (the model's interval, a
    saving's range...) as one text column "low – high", where the low one was: one column
    fewer, and a range that reads as one."""
    for low in [c for c in frame.columns if "low" in str(c)]:
        prefix, _, unit = str(low).rpartition("low")
        high = f"{prefix}high{unit}"
        if high not in frame.columns or unit not in ("", "_ms"):
            continue
        text = [("" if _missing(lo) or _missing(hi) else f"{significant(lo)} – {significant(hi)}")
                for lo, hi in zip(frame[low], frame[high])]
        at = list(frame.columns).index(low)
        frame = frame.drop(columns=[low, high])
        frame.insert(at, f"{prefix}{INTERVAL}{unit}", text)
    return frame


SPLIT_MS = ("device_ms", "alloc_ms", "copy_ms", "host_gather_ms", "free_ms", "unattributed_ms")
SPLIT_WORDS = ("seed step, mean ms: log-softmax + zero-fill + copy + host top-K + free + "
               "unattributed = total")


def _with_split(frame: pd.DataFrame) -> pd.DataFrame:
    """A step's parts and total (``*_ms``, as the verdict's decisive table has them) as one
    column that reads as a sum, so that the table fits the page."""
    names = [*SPLIT_MS, "total_ms"]
    if not set(names) <= set(frame.columns):
        return frame
    text = [("" if pd.isna(row[-1]) else
             " + ".join(f"{v:.2f}" for v in row[:-1]) + f" = {row[-1]:.2f}")
            for row in frame[names].itertuples(index=False)]
    return frame.drop(columns=names).assign(**{"stage_split": text})


def _joined_label(name: str) -> str | None:
    """The shown name of a column that :func:`readable` joined from several (a step's split, a
    range, a speedup with its CI), else None."""
    if name == "stage_split":
        return SPLIT_WORDS
    if name.removesuffix("_ms").endswith(INTERVAL):
        label = name.removesuffix("_ms").removesuffix(INTERVAL).replace("_", " ")
        return f"{label}interval{' (ms)' if name.endswith('_ms') else ''}"
    if name.endswith("speedup_ci"):
        return f"{'A/A twin' if name.startswith('twin_') else 'speedup'} [95 % CI]"
    return None


def _column(name: str) -> tuple[str, Callable[[Any], str]]:
    """The shown name of a column and its formatter, from its name."""
    plain = _number(significant, counts=True)
    if name in WORDS:
        return WORDS[name], _number(lambda v: f"{v:.0f}")
    if name in TEXT:
        return TEXT[name], text
    if name in YES_NO:
        return YES_NO[name], lambda v: text(v if _missing(v) else bool(v))
    if name in MS_WORDS:
        return MS_WORDS[name], plain
    joined = _joined_label(name)
    if joined:
        return joined, text
    if name == "gb_per_s" or name.endswith(("_gb_per_s", "_gbps")):
        label = name.removesuffix("gb_per_s").removesuffix("gbps").replace("_", " ").strip()
        return f"{label} (GB/s)" if label else "GB/s", plain
    if name.removesuffix("_ms") in catalogue.STAGE_WORDS and name.endswith("_ms"):
        return f"{catalogue.STAGE_WORDS[name.removesuffix('_ms')]} (ms)", plain
    if name in SECONDS or name.endswith("_s"):
        label = name.removesuffix("_seconds").removesuffix("_s").replace("_", " ")
        return f"{label} (ms)", _number(lambda v: significant(1e3 * v))
    if name.endswith("_ms"):
        return f"{name.removesuffix('_ms').replace('_', ' ')} (ms)", plain
    if name == "bytes" or name.endswith("_bytes"):
        label = name.removesuffix("_bytes").replace("_", " ") or "size"
        return f"{label} (MiB)", _number(lambda v: significant(v / MIB))
    if name in RATIOS:
        return f"{name.replace('_', ' ')} (x)", _number(lambda v: f"{significant(v)}x")
    if name in PERCENTS or name.endswith("_share"):
        return f"{name.replace('_', ' ')} (%)", _number(lambda v: f"{100 * v:.1f} %")
    return name.replace("_", " "), plain


def _stage_words(value: Any) -> Any:
    """A stage's name in words (``host_gather`` -> "host top-K"); any other value as it is."""
    return catalogue.STAGE_WORDS.get(value, value) if isinstance(value, str) else value


def readable(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as text: a flat header, speedups with their CIs, units in the column names,
    stages in words; a named index is shown as columns, an unnamed one (row numbers left by a
    filter) never (before: it showed as a column "index")."""
    frame = frame.copy()
    named = any(name is not None for name in frame.index.names)
    frame = frame.reset_index(drop=not named)
    for name in STAGE_VALUES:
        if name in frame.columns:
            frame[name] = frame[name].map(_stage_words)
    if isinstance(frame.columns, pd.MultiIndex):
        frame.columns = [" · ".join(str(part) for part in col if str(part)) for col in
                         frame.columns]
    leading = [c for c in LEADING if c in frame.columns]
    frame = frame[leading + [c for c in frame.columns if c not in leading]]
    for prefix in ("", "twin_"):
        frame = _with_ci(frame, prefix)
    frame = _with_interval(_with_split(frame))
    shown = {}
    for name in frame.columns:
        label, fmt = _column(str(name))
        while label in shown:
            label += " "
        shown[label] = frame[name].map(fmt)
    table = pd.DataFrame(shown)
    if table.empty:
        return table
    return table.loc[:, (table != "").any()]  # a column with nothing in it is left out


# A goal judged on memory (named so: "... peak extra memory") is met or not whatever the
# timings' trust: only the other goals' "met" is qualified on untrustworthy timings.
MEMORY_GOAL = "memory"
MET_UNTRUSTED = "met on untrustworthy timings"
GOAL_MET_CLASS = "goal-met"  # a timing goal's "met", which the report reads as met on untrustworthy
# timings when the run's timings are not trustworthy (known only once the notebook has run)
# A table of more columns is shown as several, each repeating the columns that say which row it
# is, so that every page fits a 1,366 px screen (a 23-column table was 2,028 px wide).
MAX_COLUMNS = 10  # at 12, notebook 04's decisive table scrolled in its box


class SplitTable:
    """A wide table shown as several narrower ones, one under the other (see
    :data:`MAX_COLUMNS`); displays as HTML like a Styler."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    def to_html(self) -> str:
        return "".join(part.to_html() for part in self.parts)

    def _repr_html_(self) -> str:
        return self.to_html()


class Titled:
    """A table shown under its title (an ``<h4>``); displays as HTML like a Styler."""

    def __init__(self, title: str, table: Any) -> None:
        self.title, self.table = title, table

    def to_html(self) -> str:
        return f"<h4>{html.escape(self.title)}</h4>{self.table.to_html()}"

    def _repr_html_(self) -> str:
        return self.to_html()


# A table of more rows is folded under a line that says what it holds (notebook 05's page was
# 35,000 px tall with 116-row tables); a click opens it, and the run's JSON holds every row.
FOLD_ROWS = 15


class Folded:
    """A long table folded: a ``<details>`` whose summary says what it holds and how many rows,
    the table inside; displays as HTML like a Styler."""

    def __init__(self, summary: str, table: Any) -> None:
        self.summary, self.table = summary, table

    def to_html(self) -> str:
        return (f"<details class='folded'><summary>{html.escape(self.summary)}</summary>"
                f"{self.table.to_html()}</details>")

    def _repr_html_(self) -> str:
        return self.to_html()


def show_folded(frame: pd.DataFrame, what: str, limit: int = FOLD_ROWS) -> Any:
    """:func:`show`, folded under "``what``: N rows (click to open)" where the frame has more
    than ``limit`` rows: the page stays short and every row one click away."""
    shown = show(frame)
    if len(frame) <= limit:
        return shown
    return Folded(f"{what}: {len(frame)} rows (click to open)", shown)


def sections(titled: Mapping[str, pd.DataFrame]) -> SplitTable:
    """Several frames, each shown (:func:`show`) under its title, one under the other."""
    return SplitTable([Titled(title, show(frame)) for title, frame in titled.items()])


def column_groups(table: pd.DataFrame, limit: int = MAX_COLUMNS) -> list[list[str]]:
    """The readable table's columns in groups of at most ``limit``, each group led by the columns
    that say which row it is (the cell, arm, goal...; else the first column)."""
    labels = {_column(name)[0] for name in LEADING}
    columns = list(table.columns)
    ident = [c for c in columns if c in labels][:limit // 2] or columns[:1]
    rest = [c for c in columns if c not in ident]
    if len(columns) <= limit:
        return [columns]
    step = limit - len(ident)
    return [ident + rest[at:at + step] for at in range(0, len(rest), step)]


def _timing_goal(table: pd.DataFrame) -> pd.Series:
    """Which rows are goals judged on timings (every goal not named for memory)."""
    if "goal" not in table.columns:
        return pd.Series(True, index=table.index)
    return ~table["goal"].astype(str).str.contains(MEMORY_GOAL)


# Under a goals table, wherever it shows (JupyterLab too, where no report banner heads the page):
# what a timing goal's "met" rests on.
GOALS_CAPTION = ("A timing goal met holds only on trustworthy timings: the report of the run says at "
                 "its top whether they are. A memory goal is judged on memory.")
GOALS_CAPTION_UNTRUSTED = ("These timings were taken on a busy machine and are not trustworthy: "
                           "a timing goal met here is not a finding. A memory goal is judged on "
                           "memory.")


def _styled(table: pd.DataFrame, untrusted: bool = False) -> Any:
    if "status" in table.columns:
        timing_met = (table["status"] == "met") & _timing_goal(table)
        if untrusted:
            table = table.assign(status=table["status"].where(~timing_met, MET_UNTRUSTED))
    styler = table.style.format(escape="html").format_index(escape="html", axis=1)
    if "status" in table.columns:
        classes = pd.DataFrame("", index=table.index, columns=table.columns)
        classes.loc[timing_met & ~pd.Series(untrusted, index=table.index), "status"] = (
            GOAL_MET_CLASS)
        styler = styler.set_td_classes(classes)
    if {"goal", "status"} <= set(table.columns):
        styler = styler.set_caption(html.escape(GOALS_CAPTION_UNTRUSTED if untrusted
                                                else GOALS_CAPTION))
    return styler.hide(axis="index")  # a record's text is shown, never taken as markup


def show(frame: pd.DataFrame, untrusted: bool = False) -> Any:
    """A frame as an HTML table (a pandas Styler, without its index) a reader can take in; a
    table wider than :data:`MAX_COLUMNS` as several (:class:`SplitTable`); a timing goal's
    status "met" carries :data:`GOAL_MET_CLASS`, or, with ``untrusted`` (the notebook knows its
    timings were taken on a busy machine), reads :data:`MET_UNTRUSTED` there and then, as in
    JupyterLab; a memory goal's is its own."""
    table = readable(frame)
    groups = column_groups(table)
    if len(groups) == 1:
        return _styled(table, untrusted)
    return SplitTable([_styled(table[group], untrusted) for group in groups])
