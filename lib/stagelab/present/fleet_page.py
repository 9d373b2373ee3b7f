"""The fleet's page: every node's record, whether the answer differs between platforms, the runs
side by side (:mod:`stagelab.present.compare`) and each node's prediction beside what it measured."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from stagelab.core.errors import UserError
from stagelab.core.outcomes import OK
from stagelab.core.records import RunFolder, write_text_atomic

PAGE, COMPARE_PAGE = "index.html", "compare.html"


class NodeTarget(Protocol):
    """What the page reads of a node's target (:class:`stagelab.run.fleet.Target`)."""

    host: str
    accelerator_type: str | None

    @property
    def label(self) -> str: ...


class NodeRecord(Protocol):
    """What the page reads of a node's record (:class:`stagelab.run.fleet.NodeRecord`): the
    fleet's records live on the run floor, above this one. Read-only, so that the record's
    own, narrower types (its target is a ``Target``) match."""

    @property
    def target(self) -> NodeTarget: ...
    @property
    def status(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def attempts(self) -> int: ...
    @property
    def gpu(self) -> str | None: ...
    @property
    def run_dir(self) -> str | None: ...  # its run folder where analysed
    @property
    def verdict(self) -> str | None: ...
    @property
    def seconds(self) -> dict[str, float]: ...


def platform_of(record: NodeRecord) -> str:
    """A node's platform: its GPU's name where torch told it, else Ray's accelerator type."""
    return record.gpu or record.target.accelerator_type or "no GPU"


def answers_by_platform(records: Sequence[NodeRecord]) -> dict[str, list[str]]:
    """The overall verdicts of the nodes that measured everything (ok), by platform."""
    found: dict[str, list[str]] = {}
    for record in records:
        if record.verdict and record.status == OK:
            found.setdefault(platform_of(record), []).append(record.verdict)
    return found


def answer_sentence(records: Sequence[NodeRecord]) -> str:
    """Whether the answer differs between platforms, in one sentence."""
    found = answers_by_platform(records)
    if not found:
        return "No node produced a verdict, so there is no answer to compare."
    answers = {platform: sorted(set(verdicts)) for platform, verdicts in found.items()}
    listed = "; ".join(f"{p}: {', '.join(v)}" for p, v in answers.items())
    if len(answers) == 1:
        return f"Only one platform produced a verdict ({listed}): nothing to compare across."
    if len({tuple(v) for v in answers.values()}) == 1 and all(len(v) == 1 for v in answers.values()):
        return f"The answer is the same on every platform ({listed})."
    return f"The answer differs between platforms ({listed})."


def write_pages(fleet_dir: Path, records: Sequence[NodeRecord], header: dict[str, Any]) -> Path:
    """The fleet page (every node, the answer across platforms, the runs side by side through
    :mod:`stagelab.present.compare`) and ``compare.html``; returns the fleet page."""
    from stagelab.present import compare

    analysed = [r for r in records if r.run_dir]
    side_by_side = ""
    try:
        comparison = labelled_comparison(analysed)
    except UserError as exc:
        side_by_side = f"<p>No comparison: {html.escape(str(exc))}</p>"
    else:
        compare.write_html(comparison, fleet_dir / COMPARE_PAGE)
        side_by_side = (compare.beside(comparison, detail=True)
                        .to_html(escape=True, na_rep=compare.NOT_MEASURED)
                        + f"<p>Beside each later node: its ratio to the first. Also as "
                        f'<a href="{COMPARE_PAGE}">{COMPARE_PAGE}</a>.</p>')
    page = fleet_dir / PAGE
    write_text_atomic(page, render_page(records, header, side_by_side))
    return page


def labelled_comparison(analysed: Sequence[NodeRecord]) -> Any:
    """:func:`stagelab.present.compare.compare` of the analysed nodes' run folders, each column named by
    its node; UserError when none has anything to compare."""
    from stagelab.present import compare

    runs = []
    for record in analysed:
        if record.run_dir:
            runs.append(compare.load_run(record.run_dir))
            runs[-1].run_id = record.target.label
    if not any(run.usable for run in runs):
        raise UserError("no analysed node has anything to compare")
    table = compare.side_by_side(runs)
    return compare.Comparison(runs=runs, table=table, detail=compare.side_by_side(runs, True),
                              ratios=compare.ratios(table))


def _cell(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


def render_page(records: Sequence[NodeRecord], header: dict[str, Any], side_by_side: str) -> str:
    """The self-contained fleet page (inline CSS, every text escaped)."""
    from stagelab.present import compare

    columns = ("node", "host", "accelerator type", "GPU", "status", "verdict", "error", "attempts",
               "dispatch s", "measure s", "return s", "analysis s", "run folder")
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in (
            r.target.label, r.target.host, r.target.accelerator_type, r.gpu, r.status, r.verdict,
            r.error, r.attempts, r.seconds.get("dispatch"), r.seconds.get("measure"),
            r.seconds.get("return"), r.seconds.get("analysis"),
            os.path.relpath(r.run_dir, header["folder"]) if r.run_dir else None)) + "</tr>"
        for r in records)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    facts = "".join(f"<li>{html.escape(k)}: {_cell(v)}</li>" for k, v in header.items()
                    if k != "folder")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>stagelab fleet</title><style>{compare.STYLE}</style></head><body>\n"
            f"<h1>stagelab fleet: {html.escape(str(header['profile']))}</h1>\n"
            f"<p><strong>{html.escape(answer_sentence(records))}</strong></p>\n<ul>{facts}</ul>\n"
            f"<h2>Nodes</h2>\n<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>\n"
            f"<h2>Verdict per platform, copy and step figures against each link</h2>\n"
            f"{side_by_side or '<p>No node was analysed.</p>'}\n"
            f"<h2>Predicted beside measured, per node</h2>\n{prediction_section(records)}\n"
            "</body></html>\n")


def prediction_section(records: Sequence[NodeRecord]) -> str:
    """Each analysed node's check of the cost model against what it measured (its verdict's
    ``prediction``), with the notes where they disagree beyond the interval."""
    from stagelab.present import report

    parts = []
    for record in records:
        if not record.run_dir:
            continue
        try:
            verdict = json.loads(RunFolder(Path(record.run_dir)).verdict_path.read_text(
                encoding="utf-8"))
        except (OSError, ValueError):
            continue
        check = verdict.get("prediction") if isinstance(verdict, dict) else None
        if check:
            notes = [n for cell in check.get("cells") or [] for n in cell.get("notes") or []]
            parts.append(f"<h3>{html.escape(record.target.label)}</h3>"
                         + report.prediction_html(check)
                         + "".join(f"<p>{html.escape(n)}</p>" for n in notes))
    return "".join(parts) or "<p>No analysed node has a prediction to check.</p>"

