"""Runs side by side: ``stagelab compare RUN [RUN ...]``, for the questions reviewers ask (this CPU
against an H200, an H100 against an H200, before against after a change).

Each run (a run folder or a kept run under ``data/reference/``) gives one column: its hardware,
the overall verdict, the verdict per decisive cell with its CI, the seed step's stage split, the
copy bandwidth at its largest copy cell against the PCIe link, and the prompt-logprob peaks with
the recommended chunk. The verdicts come first, with whether each run's timings can be trusted
(:mod:`stagelab.analyse.trust`: a busy machine, a failed A/A check). Where a quantity was measured at the
same cell in a run and in the first run given, their ratio (run over first run) stands beside the
run's figure; every figure has three significant digits, its unit in the row's name. A run that
lacks something (no verdict, a verdict of an older format, no tables) is named in a one-line note
and its column says what is missing; the others are still compared. Torch-free: it reads the
run's files only.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from stagelab.analyse import step_analysis, summaries, timings, trust
from stagelab.core import catalogue, paths, records, rundir, schema
from stagelab.core.errors import SchemaError, UserError
from stagelab.core.records import RunFolder
from stagelab.present import tables

VERDICT_FILE = RunFolder.VERDICT
STAGES = (*step_analysis.SPLIT, catalogue.TOTAL)
NOT_MEASURED = "-"
INDEX_NAMES = ("section", "quantity")
BANDWIDTH_COLUMNS = ("arm", "stage", "metric", "status", "rows", "vocab", "gb_per_s")
SECTIONS = ("verdict", "decisive cells", "run", "hardware", "seed step, ms", "copy bandwidth",
            "prompt logprobs")  # the verdicts first


@dataclass
class RunFacts:
    """What one run contributes to a comparison, and what it lacks (short labels for its column,
    one-line notes for the terminal)."""

    path: Path
    run_id: str
    hardware: dict[str, Any] = field(default_factory=dict)
    overall: str | None = None
    recommendation: str | None = None
    decisive: list[dict[str, Any]] = field(default_factory=list)
    carry_over: dict[str, str] = field(default_factory=dict)  # per decisive cell, in words
    # the change under each value of each step condition, as its rows of the verdict section
    conditions: dict[tuple[str, str], str] = field(default_factory=dict)
    copy_cell: tuple[int, int] | None = None
    copy_gbps: dict[str, float] = field(default_factory=dict)
    prompt: dict[str, Any] | None = None
    timings: str | None = None  # whether its timings are trustworthy, in a few words
    trusted: bool = False  # a quiet machine, A/A checks passed with rounds enough to judge
    with_ci: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    factors: dict[str, Any] = field(default_factory=dict)  # what the machine was, to tell apart
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        """Whether the run has any measured evidence to compare."""
        return bool(self.decisive or self.copy_gbps or self.prompt)

    def lacks(self, short: str, note: str) -> None:
        """Record something the run lacks: a short label and the one-line note naming the run."""
        self.missing.append(short)
        self.notes.append(f"{self.run_id}: {note}")


@dataclass
class Comparison:
    """The runs, their side-by-side table (``detail`` adds the reasons), and the ratios to the
    first run."""

    runs: list[RunFacts]
    table: pd.DataFrame
    detail: pd.DataFrame
    ratios: pd.DataFrame

    flags: list[str] = field(default_factory=list)  # figures beyond their CIs, and why

    @property
    def notes(self) -> list[str]:
        """One line per thing a run lacks, naming the run."""
        return [note for run in self.runs for note in run.notes]


# ------------------------------------------------------------------------------ reading a run

def is_run_folder(path: Path) -> bool:
    """A run folder (or a kept run) has a manifest or a verdict."""
    return path.is_dir() and any((path / name).is_file()
                                 for name in (rundir.MANIFEST, VERDICT_FILE))


def _hardware(run: RunFacts, verdict: dict[str, Any] | None) -> dict[str, Any]:
    """The run's hardware: the manifest's snapshot, else hardware.json, else the verdict's."""
    try:
        snapshot = rundir.read_manifest(run.path).get("hardware")
    except UserError as exc:
        run.notes.append(f"{run.run_id}: {exc}")
        snapshot = None
    if not snapshot:
        try:
            snapshot = RunFolder(run.path).read_hardware()
        except UserError as exc:
            run.notes.append(f"{run.run_id}: {exc}")
    if snapshot:
        return summaries.hardware_summary(snapshot)
    if verdict and verdict.get("hardware"):
        return {key: verdict["hardware"].get(key) for key in ("gpu", "link_gbps", "cpu", "torch")}
    run.lacks("hardware", f"no hardware snapshot ({RunFolder.MANIFEST}, {RunFolder.HARDWARE} or "
              f"{RunFolder.VERDICT})")
    return {}


def _read_verdict(run: RunFacts) -> dict[str, Any] | None:
    """The run's verdict.json; notes when it is absent, unreadable or of an older format."""
    try:
        verdict = RunFolder(run.path).read_verdict()
    except UserError as exc:
        run.lacks(f"{RunFolder.VERDICT} unreadable", str(exc))
        return None
    if verdict is None:
        run.lacks(f"no {RunFolder.VERDICT}", f"no {RunFolder.VERDICT} (notebook "
                  f"{catalogue.VERDICT_NOTEBOOK} "
                  "did not run or failed): no verdict, decisive cells, stage split or "
                  "prompt-logprob figures")
    elif "decisive" not in verdict:
        run.lacks(f"older {RunFolder.VERDICT}", f"{RunFolder.VERDICT} is of an older format "
                  "(no `decisive` "
                  "cells): no per-cell verdict or stage split")
    return verdict


def copy_bandwidth(staging: pd.DataFrame) -> tuple[tuple[int, int] | None, dict[str, float]]:
    """The largest copy cell ``(rows, vocab)`` of a staging table and, per arm (A/A twins left
    out), the median GB/s of its ok ``total`` timings there."""
    timed = timings.ok_timings(staging)
    timed = timed[~timed["arm"].str.endswith(catalogue.AA_SUFFIX) & timed["gb_per_s"].notna()]
    if timed.empty:
        return None, {}
    sizes = timed[["rows", "vocab"]].drop_duplicates().astype(int)
    rows, vocab = max(sizes.itertuples(index=False), key=lambda c: (c.rows * c.vocab, c.rows))
    cell = timed[(timed["rows"] == rows) & (timed["vocab"] == vocab)]
    medians = cell.groupby("arm", observed=True)["gb_per_s"].median()
    return (int(rows), int(vocab)), {str(arm): float(gbps) for arm, gbps in medians.items()}


def read_older_table(run_dir: Path, name: str, needed: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """A table written before some schema columns existed (a kept run of an older format): the
    columns it lacks are filled as not recorded, provided ``needed`` are all there and it has no
    column the schema does not know. Returns the frame and a note naming what was filled;
    SchemaError otherwise."""
    path = schema.table_path(run_dir, name)
    try:
        frame = pd.read_parquet(path).rename(columns=schema.LEGACY_COLUMNS)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise SchemaError(f"{path}: cannot be read as a parquet table ({exc})") from exc
    absent = [column for column in schema.COLUMNS if column not in frame.columns]
    extra = [column for column in frame.columns if column not in schema.COLUMN_DTYPES]
    lacking = [column for column in needed if column in absent]
    if extra or lacking:
        raise SchemaError(f"{path}: table does not follow the schema: missing {absent}, "
                          f"extra {extra}")
    filled = frame.reindex(columns=list(schema.COLUMNS))
    return schema.conform(filled), f"{path} is of an older schema (without {', '.join(absent)})"


def _read_staging(run: RunFacts) -> None:
    """Fill the run's copy bandwidth from the staging table, or say why it cannot be."""
    notebook = catalogue.notebook_of(catalogue.STAGING)
    try:
        staging = schema.read_table(run.path, notebook.table)
    except FileNotFoundError:
        run.lacks("no staging table", f"no data/{notebook.table}.parquet (notebook "
                  f"{notebook.name} did not run or failed): no copy bandwidth")
        return
    except SchemaError:
        try:
            staging, note = read_older_table(run.path, notebook.table, BANDWIDTH_COLUMNS)
        except SchemaError as exc:
            run.lacks("staging table of another schema", f"{exc}: no copy bandwidth")
            return
        run.notes.append(f"{run.run_id}: {note}; its copy bandwidth is read all the same")
    run.copy_cell, run.copy_gbps = copy_bandwidth(staging)
    if not run.copy_gbps:
        run.lacks("no copy timings", f"data/{notebook.table}.parquet has no ok copy timings")


def load_run(path: Path | str) -> RunFacts:
    """Read what a run folder or kept run holds for a comparison; a path that is not a run folder
    raises UserError."""
    path = Path(path)
    if not is_run_folder(path):
        raise UserError(f"{path} is not a run folder (no {rundir.MANIFEST} or {VERDICT_FILE})")
    run = RunFacts(path=path, run_id=path.resolve().name)
    verdict = _read_verdict(run)
    run.hardware = _hardware(run, verdict)
    if verdict is not None:
        run.overall = (verdict.get("overall") or {}).get("decision")
        if "decisive" not in verdict and run.overall:
            run.overall += " (older format)"
        run.recommendation = (verdict.get("recommendation") or {}).get("change")
        run.decisive = verdict.get("decisive") or []
        run.carry_over = carry_over_words(verdict.get("carry_over"))
        run.conditions = condition_words(verdict.get("conditions"))
        run.prompt = verdict.get("prompt_logprobs")
        if run.prompt is None:
            run.lacks("no prompt data", f"no prompt-logprob figures in {RunFolder.VERDICT} "
                      "(notebook "
                      f"{catalogue.notebook_of(catalogue.PROMPT).name} did not run or failed)")
    _read_staging(run)
    run.timings = _timings(run, verdict)
    run.trusted = run.timings.startswith("yes")
    run.with_ci = figures_with_ci(verdict or {})
    run.factors = machine_factors(_snapshot(run))
    return run


def _snapshot(run: RunFacts) -> dict[str, Any]:
    """The run's full hardware snapshot (manifest, else hardware.json), {} where neither reads."""
    try:
        return rundir.read_manifest(run.path).get("hardware") or RunFolder(
            run.path).read_hardware() or {}
    except (UserError, FileNotFoundError):
        return {}


def machine_factors(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a machine was, factor by factor, to say which differs between two runs: the GPU,
    its link, the CPU model, the cores, memory, torch and the OS."""
    host, nvml = snapshot.get("host") or {}, snapshot.get("nvml") or {}
    total = host.get("memory_total_bytes")
    return {"GPU": (snapshot.get("gpu") or {}).get("name") or ("none" if snapshot else None),
            "PCIe link GB/s": nvml.get("pcie_max_gbps_per_direction"),
            "CPU": host.get("cpu_model"), "logical cores": host.get("logical_cores"),
            "usable cores": host.get("usable_cores"),
            "memory GiB": None if total is None else round(total / 2**30),
            "torch": (snapshot.get("torch") or {}).get("torch"), "OS": host.get("os")}


def _cell_key(cell: dict[str, Any]) -> str:
    k = f" K={cell['k']}" if cell.get("k") is not None else ""
    return f"n={cell.get('rows')} V={cell.get('vocab')}{k}"


def figures_with_ci(verdict: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """Every figure of a verdict that has a CI, by name: the decisive speedups, the step levers
    and the copy-level speedups, as (point, low, high)."""
    found = {}
    groups = (("step speedup", verdict.get("decisive")), ("step lever", verdict.get("step_levers")),
              ("copy speedup", verdict.get("copy_cells")))
    for what, cells in groups:
        for cell in cells or []:
            point, low, high = cell.get("speedup"), cell.get("ci_low"), cell.get("ci_high")
            if None not in (point, low, high):
                found[f"{what} {cell.get('candidate')} at {_cell_key(cell)}"] = (point, low, high)
    return found


def beyond_cis(first: RunFacts, other: RunFacts) -> list[str]:
    """The figures of two trustworthy runs whose CIs do not overlap, one sentence each, and
    which machine factors differ between them; [] where either run is not trustworthy (its
    figures may differ for that alone) or all agree within their CIs."""
    if not (first.trusted and other.trusted):
        return []
    apart = []
    for name in (n for n in first.with_ci if n in other.with_ci):
        (a, a_low, a_high), (b, b_low, b_high) = first.with_ci[name], other.with_ci[name]
        if a_high < b_low or b_high < a_low:
            apart.append(f"{name}: {a:.3f}x [{a_low:.3f}, {a_high:.3f}] in {first.run_id} "
                         f"against {b:.3f}x [{b_low:.3f}, {b_high:.3f}] in {other.run_id}, "
                         f"{b / a:.2f} times, beyond both CIs")
    if not apart:
        return []
    differ = [f"{factor} ({first.factors.get(factor)} vs {other.factors.get(factor)})"
              for factor in first.factors
              if first.factors.get(factor) != other.factors.get(factor)]
    why = ("machine factors that differ: " + "; ".join(differ) if differ else
           "no recorded machine factor differs (" + ", ".join(first.factors) + "): the "
           "difference is the machine's state between the runs, or the code")
    return [*apart, f"{first.run_id} vs {other.run_id}: {why}"]


def _timings(run: RunFacts, verdict: dict[str, Any] | None) -> str:
    """Whether the run's timings can be trusted (:mod:`stagelab.analyse.trust`); a note when not."""
    try:
        manifest = rundir.read_manifest(run.path)
    except UserError:
        manifest = {}
    busy, harness = trust.load_reasons(manifest), trust.harness_reasons(verdict or {})
    if busy or harness:
        run.notes.append(f"{run.run_id}: timings not trustworthy: {'; '.join(busy + harness)}")
        causes = ["busy machine"] * bool(busy) + ["A/A check failed"] * bool(harness)
        return f"NOT TRUSTWORTHY ({', '.join(causes)}; see the note)"
    fewest = trust.too_few_rounds(verdict or {})
    if fewest is not None:
        return f"{trust.NOT_JUDGED} ({fewest} rounds per cell)"
    load = "quiet" if trust.load_known(manifest) else "load not recorded"
    checked = "A/A passed" if trust.harness_checked(verdict or {}) else "A/A not checked"
    return f"yes ({load}, {checked})" if load == "quiet" and checked == "A/A passed" else (
        f"{checked}; {load}")


# ------------------------------------------------------------------------- the table of runs

def _cell_name(cell: dict[str, Any]) -> str:
    return f"n={cell['rows']} V={cell['vocab']} K={cell['k']}"


def _ci_text(cell: dict[str, Any], prefix: str = "") -> str | None:
    speedup = cell.get(f"{prefix}speedup")
    if speedup is None:
        return None
    low, high = cell.get(f"{prefix}ci_low"), cell.get(f"{prefix}ci_high")
    ci = "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"
    return f"{speedup:.3f}x{ci}"


def _verdict_text(cell: dict[str, Any]) -> str:
    """A decisive cell's decision, speedup, CI and the smallest speedup that would count."""
    measured = _ci_text(cell)
    if measured is None:
        return cell["decision"]
    least = cell.get("min_speedup")
    return f"{cell['decision']} {measured}" + ("" if least is None else f" min {least:.3f}x")


def carry_over_words(block: dict[str, Any] | None) -> dict[str, str]:
    """Each decisive cell's carry-over in a few words, by cell name: the largest arm's effect on
    the next call with its CI, flagged beyond delta/2; empty for a verdict without the block."""
    out = {}
    for cell in (block or {}).get("cells") or []:
        name = _cell_name(cell)
        if not cell.get("estimated") or not cell.get("arms"):
            out[name] = "not estimated"
            continue
        worst = max(cell["arms"], key=lambda a: abs(a["carry_over"]))
        out[name] = (f"{'FLAGGED ' if cell['flagged'] else ''}after {worst['arm']} "
                     f"{worst['carry_over']:+.1%} [{worst['ci_low']:+.1%}, "
                     f"{worst['ci_high']:+.1%}]")
    return out


def condition_words(blocks: Any) -> dict[tuple[str, str], str]:
    """The recommended change under each value of each step condition (the decided one marked)
    and the seed sampler's overlap order, as rows ``("verdict", "<condition>: <value>")``;
    empty for a verdict before the conditions block (format 1)."""
    if not isinstance(blocks, dict):
        return {}
    out = {}
    for name, block in blocks.items():
        for value, found in (block.get("under") or {}).items():
            change = (f"{found['decision']}, {found['change']} over {len(found['cells'])} cell(s)"
                      if found.get("measured") else "not measured")
            out[("verdict", f"{name}: {value}")] = change + (
                " (decided)" if value == block.get("decided") else "")
        if "seed" in block:
            out[("verdict", f"{name}: seed's order")] = block["seed"].get("order") or "unknown"
    return out


def _run_rows(run: RunFacts, detail: bool) -> dict[tuple[str, str], Any]:
    """One run's column as ``{(section, quantity): value}``; numbers stay numbers."""
    hw = run.hardware
    rows: dict[tuple[str, str], Any] = {
        ("run", "path"): str(run.path),
        ("run", "missing"): "; ".join(run.missing) or None,
        ("hardware", "GPU"): hw.get("gpu") or ("none" if hw else None),
        ("hardware", "PCIe link GB/s per direction"): hw.get("link_gbps"),
        ("hardware", "CPU"): hw.get("cpu"),
        ("hardware", "torch"): hw.get("torch"),
        ("verdict", "overall"): run.overall,
        ("verdict", "recommendation"): run.recommendation,
        ("verdict", "timings"): run.timings,
    }
    rows.update(run.conditions)
    for cell in run.decisive:
        name = _cell_name(cell)
        rows[("decisive cells", f"{name} verdict")] = _verdict_text(cell)
        for question, answer in (cell.get("answers") or {}).items():
            if question != "bundle":
                rows[("decisive cells", f"{name} {question} alone")] = _verdict_text(answer)
        rows[("decisive cells", f"{name} saved ms/step")] = cell.get("saved_ms")
        if name in run.carry_over:
            rows[("decisive cells", f"{name} carry-over")] = run.carry_over[name]
        if detail:
            rows[("decisive cells", f"{name} A/A twin")] = _ci_text(cell, "twin_")
            rows[("decisive cells", f"{name} reason")] = cell.get("reason")
        split = cell.get("stages_ms") or {}
        for stage in (s for s in STAGES if s in split):
            rows[("seed step, ms", f"{name} {stage}")] = split[stage]
    if run.copy_cell:
        where = f"n={run.copy_cell[0]} V={run.copy_cell[1]}"
        link = hw.get("link_gbps")
        for arm, gbps in run.copy_gbps.items():
            rows[("copy bandwidth", f"{where} {arm} GB/s")] = gbps
            if link:
                rows[("copy bandwidth", f"{where} {arm} % of link")] = 100.0 * gbps / link
    if run.prompt:
        rec = run.prompt.get("recommendation") or {}
        rows[("prompt logprobs", "recommended chunk")] = (
            None if rec.get("chunk") is None else f"{rec['chunk']} ({rec.get('arm')})")
        if detail:
            rows[("prompt logprobs", "why")] = rec.get("reason")
        for peak in run.prompt.get("peaks") or []:
            where = peak["metric"].removeprefix("peak_").removesuffix("_bytes")
            rows[("prompt logprobs", f"peak {where} MiB {peak['arm']} chunk {peak['chunk']}")] = (
                peak["bytes"] / 2**20)
    return rows


def column_labels(runs: Sequence[RunFacts]) -> list[str]:
    """One label per run: its id, numbered where two runs share one."""
    labels: list[str] = []
    for run in runs:
        label, n = run.run_id, 2
        while label in labels:
            label, n = f"{run.run_id} ({n})", n + 1
        labels.append(label)
    return labels


def side_by_side(runs: Sequence[RunFacts], detail: bool = False) -> pd.DataFrame:
    """One column per run, one row per quantity any run measured (None where a run did not);
    ``detail`` adds the reasons behind each decision and the chunk recommendation."""
    columns = [_run_rows(run, detail) for run in runs]
    order: list[tuple[str, str]] = []
    for column in columns:
        order += [key for key in column if key not in order]
    order.sort(key=lambda key: SECTIONS.index(key[0]))  # stable: keeps each run's own order
    index = pd.MultiIndex.from_tuples(order, names=INDEX_NAMES)
    return pd.DataFrame({label: [column.get(key) for key in order]
                         for label, column in zip(column_labels(runs), columns)},
                        index=index, dtype=object)


def _number(value: Any) -> float | None:
    """A measured number as a float; None for text, flags, missing values and NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or pd.isna(value):
        return None
    return float(value)


def ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Each later run over the first, for every quantity measured (as a number) in both; rows
    with no such pair are left out."""
    first, others = table.columns[0], list(table.columns[1:])
    out = {}
    for key, row in table.iterrows():
        base = _number(row[first])
        if not base:
            continue
        pairs = {f"{other} / {first}": value / base for other in others
                 if (value := _number(row[other])) is not None}
        if pairs:
            out[key] = pairs
    return pd.DataFrame(list(out.values()), columns=[f"{other} / {first}" for other in others],
                        index=pd.MultiIndex.from_tuples(list(out), names=INDEX_NAMES),
                        dtype=float)


def compare(run_dirs: Sequence[Path | str]) -> Comparison:
    """Read the runs and put them side by side; UserError when no run has anything to compare."""
    if not run_dirs:
        raise UserError("compare: name at least one run folder")
    runs = [load_run(path) for path in run_dirs]
    usable = [run for run in runs if run.usable]
    if not usable:
        raise UserError("no run to compare: " + "; ".join(
            f"{run.run_id} ({', '.join(run.missing) or 'nothing measured'})" for run in runs))
    table = side_by_side(runs)
    flags = [line for other in runs[1:] for line in beyond_cis(runs[0], other)]
    return Comparison(runs=runs, table=table, detail=side_by_side(runs, detail=True),
                      ratios=ratios(table), flags=flags)


# ------------------------------------------------------------------------------- rendering

def format_value(value: Any) -> str:
    """A table cell as text: numbers to three significant digits, missing as ``-``, anything
    else as the report's tables show it (:func:`stagelab.present.tables.text`: yes or no, no
    Markdown backticks)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return NOT_MEASURED
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return tables.significant(value)
    return tables.text(value)


def format_ratio(value: float) -> str:
    """A ratio as text to three significant digits, e.g. ``2.50x``; empty where it was not
    measured in both runs."""
    return "" if pd.isna(value) else f"{tables.significant(value)}x"


def _shown(frame: pd.DataFrame, formatter: Callable[[Any], str]) -> pd.DataFrame:
    return frame.map(formatter)


def beside(comparison: Comparison, detail: bool = False) -> pd.DataFrame:
    """The runs as text, each later run's column followed by its ratio to the first run."""
    table = comparison.detail if detail else comparison.table
    shown = _shown(table, format_value)
    first = shown.columns[0]
    columns = {first: shown[first]}
    for label in shown.columns[1:]:
        ratio = f"{label} / {first}"
        columns[label] = shown[label]
        columns[ratio] = comparison.ratios[ratio].reindex(shown.index).map(format_ratio)
    return pd.DataFrame(columns, index=shown.index)


NO_RATIO = "No quantity was measured as a number in the first run and another."
FLAG = "DIFFERS BEYOND CI"


def render_text(comparison: Comparison) -> str:
    """The terminal table: the verdicts first, one column per run, each later run with its ratio
    to the first beside it."""
    text = beside(comparison).to_string()
    flags = "".join(f"\n{FLAG}: {line}" for line in comparison.flags)
    return text + (f"\n\n{NO_RATIO}" if comparison.ratios.empty else "") + (
        f"\n{flags}" if flags else "")


def _json_value(value: Any) -> Any:
    """A table cell as JSON: a number as a number, missing (None, NaN) as null, else text."""
    if isinstance(value, bool) or value is None:
        return value
    number = _number(value)
    if number is not None:
        return int(number) if isinstance(value, int) else number
    return None if isinstance(value, float) else str(value)


def to_json(comparison: Comparison) -> dict[str, Any]:
    """The comparison, machine-readable (``stagelab compare --json``): each run with its trust,
    what it lacks and the machine factors; each quantity with every run's value (null where not
    measured) and each later run's ratio to the first; the figures beyond their CIs."""
    labels = list(comparison.detail.columns)
    runs = [{"label": label, "run_id": run.run_id, "path": str(run.path),
             "timings": run.timings, "trusted": run.trusted, "missing": run.missing,
             "factors": {key: _json_value(value) for key, value in run.factors.items()}}
            for label, run in zip(labels, comparison.runs)]
    quantities = []
    for (section, quantity), row in comparison.detail.iterrows():
        key = (section, quantity)
        ratio = (comparison.ratios.loc[key] if key in comparison.ratios.index else None)
        quantities.append({
            "section": section, "quantity": quantity,
            "values": {label: _json_value(row[label]) for label in labels},
            "ratios_to_first": {} if ratio is None else {
                name: float(value) for name, value in ratio.items() if not pd.isna(value)}})
    return {"format": "stagelab-compare", "version": 1, "runs": runs,
            "quantities": quantities, "differs_beyond_ci": list(comparison.flags),
            "notes": comparison.notes}


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
thead th { background: #f0f0f0; }
tbody th { background: #fafafa; font-weight: normal; }
.notes li { color: #8a4b00; }
"""


def render_html(comparison: Comparison) -> str:
    """A self-contained page (inline CSS, nothing fetched) with every text escaped."""
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in comparison.notes)
    flags = "".join(f"<li>{html.escape(line)}</li>" for line in comparison.flags)
    runs = "".join(f"<li>{html.escape(label)}: {html.escape(str(run.path))}</li>"
                   for label, run in zip(comparison.table.columns, comparison.runs))
    table = beside(comparison, detail=True).to_html(escape=True, na_rep=NOT_MEASURED)
    first = html.escape(str(comparison.table.columns[0]))
    ratio_note = (f"<p>{NO_RATIO}</p>" if comparison.ratios.empty else
                  f"<p>Beside each later run: its ratio to {first} (same cell in both runs). "
                  f"Figures to {tables.SIGNIFICANT} significant digits; units in each row's "
                  "name.</p>")
    made = datetime.now(UTC).isoformat(timespec="seconds")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>stagelab compare</title>{records.generator_tag(COMMAND)}"
            f"<style>{STYLE}</style></head><body>\n"
            f"<h1>stagelab compare</h1>\n<p>Made {made}. Runs:</p><ul>{runs}</ul>\n"
            + (f"<h2 id=\"beyond-ci\">{FLAG}: figures of trustworthy runs that differ beyond "
               f"their CIs</h2><ul class=\"notes\">{flags}</ul>\n" if flags else "")
            + (f"<h2>Notes on the runs (what some lack, timings not to trust)</h2>"
               f"<ul class=\"notes\">{notes}</ul>\n" if notes else "")
            + f"<h2>Side by side</h2>\n{ratio_note}\n{table}\n</body></html>\n")


def default_out() -> Path:
    """Where the page goes without ``--out``: ``papermill_runs/compare_<UTC time>.html``."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return paths.RUNS_DIR / f"compare_{stamp}.html"


COMMAND = "stagelab compare"


def claim_out(out: Path | str | None = None, force: bool = False) -> Path:
    """``out`` (or :func:`default_out`) if the page may be written there: a new file, an
    earlier compare page, or with ``force`` any file but a run's record; UserError otherwise."""
    return records.claim_output(Path(out) if out is not None else default_out(), COMMAND, force)


def write_html(comparison: Comparison, out: Path | str | None = None,
               force: bool = False) -> Path:
    """Write the page (atomically) to ``out`` or :func:`default_out`, which must not be a file
    it did not make (see :func:`claim_out`); UserError naming ``--out`` when its folder cannot
    be made."""
    out = claim_out(out, force)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return records.write_text_atomic(out, render_html(comparison))
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write the page ({exc.strerror or exc})") from exc
