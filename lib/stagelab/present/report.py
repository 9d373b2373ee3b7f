"""HTML for a run folder: each notebook exported with its code hidden, and the landing page.

``index.html`` opens with the verdict in plain words and its key plot when the run has a
``verdict.json``, then shows each notebook's status with links, the figures, and the machine.
"""

from __future__ import annotations

import base64
import functools
import html
import mimetypes
import re
from collections.abc import Callable, Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from stagelab.analyse import predict_check, trust, verdict_words
from stagelab.core import catalogue, records
from stagelab.core import untrusted as stranger  # a run's files, read as a stranger's
from stagelab.core.errors import UserError
from stagelab.core.records import RunFolder
from stagelab.present import inert, machine, next_step, sanitise, tables

VERDICT_FILE = RunFolder.VERDICT
VERDICT_FIGURE = f"figures/{catalogue.VERDICT_NOTEBOOK}_key.png"  # notebook 04's key plot
# What a run's pages take in, bounded: a figure is about 100 KB, an executed notebook under
# 1 MiB, a single-file report a few MiB. A sent run's file past its bound is refused in one
# line before it is read (a giant sparse figure costs nothing), and so is a page past its own.
MAX_FIGURE_BYTES = 8 << 20
MAX_NOTEBOOK_BYTES = 32 << 20
MAX_PAGE_BYTES = 64 << 20

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d232a;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #dde;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0;display:block;max-width:100%;overflow-x:auto}
td,th{border:1px solid #ccd;padding:.3em .6em;text-align:left;
vertical-align:top} th{background:#f3f4f8}
.ok{color:#176b2c;font-weight:600}.failed,.interrupted{color:#b3261e;font-weight:600}
.running,.pending,.interactive{color:#8a6d00;font-weight:600}.missing{color:#b3261e;font-style:italic}
.note{border-left:3px solid #8a6d00;padding-left:.6em}
.untrusted{border:2px solid #b3261e;background:#fdecea;padding:.2em .8em;margin-bottom:.6em}
.rehearsal{border:2px solid #667;background:#f1f2f6;padding:.2em .8em;margin-bottom:.6em}
.verdict{border:2px solid #445;border-radius:8px;padding:.8em 1.2em;background:#f8f9fc}
.decision{font-size:1.3em;font-weight:700} .PORT{color:#176b2c}.CLOSE{color:#444}.INCONCLUSIVE{color:#8a6d00}
img{max-width:100%;border:1px solid #eee;margin:.4em 0} .muted{color:#667} code{background:#f3f4f8;padding:0 .2em}
"""


def export_html(notebook_path: Path, html_path: Path, banner: str = "",
                untrusted: bool = False) -> Path:
    """Export an executed notebook to HTML with code cells and prompts hidden, figures inlined
    and every style in the page: nothing is fetched when it opens (nbconvert's default template
    loads require.js and MathJax from a CDN; the 'basic' one is the notebook's body alone).
    ``banner`` (:func:`page_banner`) heads the page, so that a page sent alone says whether its
    run's timings can be trusted; with ``untrusted`` its goals read "met on untrustworthy
    timings"."""
    name = _esc(Path(notebook_path).stem)
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>stagelab {name}</title><style>{_STYLE}{_NOTEBOOK_STYLE}</style></head>"
            f"<body>{banner}{notebook_body(Path(notebook_path), untrusted)}</body></html>")
    return records.write_text_atomic(Path(html_path), page)


# A goal's "met" cell, as present.tables.show marks it.
_MET_CELL = re.compile(r"(<td\b[^>]*\bclass=\"[^\"]*\b" + tables.GOAL_MET_CLASS
                       + r"\b[^\"]*\"[^>]*>)\s*met\s*(</td>)")
MET_UNTRUSTED = tables.MET_UNTRUSTED


def notebook_body(notebook_path: Path, untrusted: bool = False) -> str:
    """An executed notebook's outputs and prose as HTML, figures as data: URIs, no script, no
    stylesheet or font to fetch: nothing from the notebook is live (:mod:`.sanitise`); with
    ``untrusted``, each goal met reads as met on untrustworthy timings."""
    import nbformat

    text = stranger.read_text(notebook_path, limit=MAX_NOTEBOOK_BYTES)
    notebook = sanitise.shown_outputs(inert.inert_notebook(nbformat.reads(text, as_version=4)))
    body, _ = _exporter().from_notebook_node(notebook)  # records' text in it is data, not markup
    body = sanitise.sanitised_html(body)
    return _MET_CELL.sub(rf"\1{MET_UNTRUSTED}\2", body) if untrusted else body


@functools.lru_cache(maxsize=1)
def _exporter() -> Any:
    """One HTML exporter for every page a process writes: its templates are compiled once (a
    seventh of a page's export, each time, when every page made its own)."""
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="basic", exclude_input=True, exclude_input_prompt=True,
                        exclude_output_prompt=True, embed_images=True)


def page_banner(run_dir: Path, manifest: Mapping[str, Any], notebook: str = "") -> str:
    """The head of a notebook's page: which run and notebook it is, and the run's trust as the
    first screen says it (a few-round rehearsal, the reasons its timings are not trustworthy,
    a load not recorded, or that the timings can be trusted)."""
    try:
        verdict = RunFolder(run_dir).read_verdict() or {}
    except UserError:
        verdict = {}
    found = trust.reasons(run_dir, manifest, verdict)
    state = trust.run_trust(run_dir, manifest, verdict)
    where = (f"<p class='muted' id='page-of'>Notebook <b>{_esc(notebook)}</b> of stagelab run "
             f"<b>{_esc(manifest.get('run_id'))}</b>, profile {_esc(manifest.get('profile'))}: "
             f"timings <span class='{_TRUST_CLASS.get(state, 'running')}'>{_esc(state)}</span>"
             "</p>")
    return where + _scope_banner(verdict) + _trust_banner(found, manifest)


_TRUST_CLASS = {trust.TRUSTWORTHY: "ok", trust.NOT_TRUSTWORTHY: "failed",
                trust.REHEARSAL: "pending", trust.LOAD_UNKNOWN: "pending",
                trust.NO_TIMINGS: "muted"}


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


_BACKTICKED = re.compile(r"`([^`]+)`")


def _prose(value: Any) -> str:
    """A sentence of the verdict as HTML: escaped, its Markdown `code` as <code>, never as
    literal backticks."""
    return _BACKTICKED.sub(r"<code>\1</code>", _esc(value))


def _scope_banner(verdict: Mapping[str, Any]) -> str:
    """What a few-round run can judge (:func:`stagelab.analyse.trust.scope_label`): a neutral
    label, not a warning, since nothing went wrong; '' for a run with rounds enough."""
    label = trust.scope_label(verdict)
    if not label:
        return ""
    head, _, rest = label.partition(":")
    return f"<div class='rehearsal' id='not-judged'><p><b>{_esc(head)}</b>:{_esc(rest)}.</p></div>"


def _trust_banner(found: list[str], manifest: Mapping[str, Any]) -> str:
    """The warning that heads the verdict box when the timings are not trustworthy, or a quiet
    note where the machine's load was not recorded (an older run, one run by hand)."""
    if not found:
        return ("" if trust.load_known(manifest) else
                "<p class='muted' id='load-unknown'>The machine's load was not recorded for this "
                "run's timing notebooks: whether it was busy is not known.</p>")
    items = "".join(f"<li>{_esc(reason)}</li>" for reason in found)
    return ("<div class='untrusted' id='untrusted'><p><b>TIMINGS NOT TRUSTWORTHY</b>: run it "
            f"again on a quiet machine before relying on these figures.</p><ul>{items}</ul></div>")


def _verdict_section(run_dir: Path, manifest: Mapping[str, Any]) -> str:
    try:
        verdict = RunFolder(run_dir).read_verdict()
    except UserError as exc:
        return (f"<section class='verdict' id='verdict'><p class='decision INCONCLUSIVE'>Verdict "
                f"unreadable</p><p>{_esc(exc)}</p></section>")
    if verdict is None:
        return ("<section class='verdict' id='verdict'>"
                f"{_trust_banner(trust.reasons(run_dir, manifest, {}), manifest)}"
                "<p class='decision INCONCLUSIVE'>No verdict yet</p><p>This run has no "
                f"<code>{RunFolder.VERDICT}</code>: the verdict notebook did not run or did not finish. "
                "Nothing below is a decision.</p></section>")
    overall = verdict.get("overall", {})
    decision = _esc(overall.get("decision", "INCONCLUSIVE"))
    parts = [f"<section class='verdict' id='verdict'>"
             f"{_scope_banner(verdict)}"
             f"{_trust_banner(trust.reasons(run_dir, manifest, verdict), manifest)}"
             f"<p class='decision {decision}'>Staging verdict: {decision}</p>"
             f"{_changed_decision(manifest)}"
             + "".join(f"<p><b>{_esc(line)}</b></p>"  # a GPU run: the prediction held or failed
                       for line in predict_check.stated_lines(verdict.get("out_of_sample")))
             + f"<p>{_prose(overall.get('summary', ''))}</p>",
             next_step.first_screen(run_dir, verdict, manifest.get("profile")),
             _chunk_answer(verdict)]
    recommendation = verdict.get("recommendation")  # absent in verdicts of older runs
    if recommendation:
        parts.append(f"<p class='recommendation'>Recommended change: "
                     f"<b>{_esc(recommendation['change'])}</b>: {_prose(recommendation['reason'])}"
                     f"</p>{_questions_table(verdict.get('questions') or {})}")
    parts.append(_decisive_table(verdict.get("decisive", []), overall.get("summary", "")))
    parts.append(_findings(verdict.get("findings", []), _quoted_above(verdict)))
    parts.append(_context_details(verdict.get("context") or {}, verdict.get("conditions") or {}))
    parts.append(prediction_html(verdict.get("prediction")))
    parts.append(prediction_html(verdict.get("out_of_sample")))
    if (run_dir / VERDICT_FIGURE).exists():
        parts.append(f"<img src='{VERDICT_FIGURE}' alt='key plot of the verdict'>")
    parts.append("</section>")
    return "".join(parts)


def _chunk_answer(verdict: Mapping[str, Any]) -> str:
    """The second question, the prompt-logprob chunk, answered on the first screen beside the
    staging verdict (before: only notebook 03's page and a finding said it), '' without it."""
    answer = verdict_words.chunk_answer(dict(verdict))
    if answer is None:
        return ""
    return (f"<p id='chunk'><b>Prompt logprobs chunk</b>: {_prose(answer)} "
            f"(<a href='{catalogue.notebook_of(catalogue.PROMPT).name}.html'>notebook "
            f"{catalogue.notebook_of(catalogue.PROMPT).name}</a>)</p>")


FRONT_FINDINGS = 3  # the findings the first screen shows; notebook 04's page has them all
# What bears on the staging decision, in the order the front page prefers it: the levers the
# questions measure, then where the seed's step goes.
FRONT_TOPICS = ("Reuse lever", "Seed's step")
FRONT_CHARS = 160  # a front-page finding at most: its first sentence, cut at a clause
_SENTENCE_END = re.compile(r"(?<=[a-z0-9%)\]])\. (?=[A-Z])")


def first_sentence(text: str, limit: int = FRONT_CHARS) -> str:
    """A finding's short form for the front page: its first sentence (its figure is in it),
    cut before a semicolon once a figure was said, and at a clause within ``limit`` characters."""
    sentence = _SENTENCE_END.split(str(text), maxsplit=1)[0].rstrip(".")
    at = sentence.find("; ")
    if at > 0 and any(ch.isdigit() for ch in sentence[:at]):
        sentence = sentence[:at]
    if len(sentence) > limit:
        return sentence[:sentence.rfind(", ", 0, limit)] + ", …"
    return sentence + "."


def front_findings(findings: list[str], count: int = FRONT_FINDINGS) -> list[str]:
    """The few findings that bear on the decision (:data:`FRONT_TOPICS` first, in their order),
    each in its short form."""
    def rank(finding: str) -> int:
        return next((i for i, topic in enumerate(FRONT_TOPICS) if str(finding).startswith(topic)),
                    len(FRONT_TOPICS))
    return [first_sentence(f) for f in sorted(findings, key=rank)[:count]]


def _quoted_above(verdict: Mapping[str, Any]) -> tuple[str, ...]:
    """The finding topics the questions table above the findings quotes already: the reuse
    lever, where its question was measured (before: the front page quoted three CIs of it)."""
    reuse = (verdict.get("questions") or {}).get("reuse") or {}
    return ("Reuse lever",) if verdict.get("recommendation") and reuse.get("decision") else ()


def _findings(findings: list[str], quoted: tuple[str, ...] = ()) -> str:
    """The few findings that bear on the decision, each short, and a link to notebook 04's
    page, where every finding is in full (before: 16 dense bullets on the front page, one of
    9 lines on glibc's mmap threshold); none of the topics ``quoted`` above them."""
    if not findings:
        return ""
    kept = [f for f in findings if not str(f).startswith(quoted)] if quoted else findings
    shown = "".join(f"<li>{_prose(f)}</li>" for f in front_findings(kept))
    page = f"{catalogue.VERDICT_NOTEBOOK}.html"
    return (f"<ul id='findings'>{shown}</ul><p class='muted'>Every finding in full "
            f"({len(findings)}): <a href='{page}'>notebook {catalogue.VERDICT_NOTEBOOK}</a>.</p>")


def _context_details(context: Mapping[str, Any], conditions: Mapping[str, Any]) -> str:
    """What the step included and each step condition's note, folded under the tables; the
    forward's overlap order only where a forward was queued (a CPU run queues none: before, its
    paragraph on the seed's sampler.cpp lines headed a CPU run's first screen)."""
    words = context.get("words")  # absent in verdicts of older runs
    if not words:
        return ""
    queued = any(ms for ms in context.get("forward_ms") or [])
    notes = "".join(f"<p class='condition {_esc(name)}'>{_prose(condition['note'])}</p>"
                    for name, condition in conditions.items()  # format 2 on
                    if condition.get("note") and (queued or name != catalogue.OVERLAP.name))
    return (f"<details id='context'><summary>Context: what each timed step includes</summary>"
            f"<p class='context'>{_prose(words)}</p>{notes}</details>")


def _changed_decision(manifest: Mapping[str, Any]) -> str:
    """A line under the verdict naming each parameter of the decision the run recorded other
    than its profile sets it (:func:`stagelab.present.rederive.decision_changes`), or ''."""
    from stagelab.present import rederive

    changed = rederive.decision_changes(manifest)
    if not changed:
        return ""
    return ("<p class='changed' id='changed-decision'><b>Decided with parameters changed from "
            f"its profile</b>: {_esc('; '.join(changed))}.</p>")


def _questions_table(questions: Mapping[str, Any]) -> str:
    """The three questions (bundle, reuse alone, pinning alone): each family's answer and each
    cell's speedup with its CI."""
    if not questions:
        return ""
    rows = "".join(
        f"<tr><td>{_esc(q.get('words', name))}</td><td>{_esc(q.get('decision') or NOT_MEASURED)}"
        f"</td><td>{_esc('; '.join(_answer_cell(c, bool(q.get('decision'))) for c in q.get('cells', [])))}"
        "</td></tr>" for name, q in questions.items())
    return ("<table class='questions'><tr><th>question</th><th>family</th>"
            f"<th>per cell</th></tr>{rows}</table>")


# A cell's reason that opens by restating its speedup and CI, shown beside them already.
_RESTATED_CI = re.compile(r"^speedup [\d.]+x \(\d+% CI \[[^\]]*\]\) ")


def _answer_cell(cell: Mapping[str, Any], family_measured: bool = True) -> str:
    """A cell's answer with its speedup and CI (quoted once: a reason that restates them is
    shown without), and, where a measured cell is INCONCLUSIVE, why (before: a CI wholly above
    the bar read INCONCLUSIVE with the reason, the Holm-level bound, only in verdict.json; an
    unmeasured cell's reason is the summary's). A cell of a question not measured says so
    (before: "INCONCLUSIVE", as if it had been)."""
    measured = _with_ci(cell)
    where = f"n={cell['rows']} V={cell['vocab']} K={cell['k']}"
    if not family_measured and not measured:
        return f"{where}: {NOT_MEASURED}"
    why = cell.get("reason") if cell.get("decision") == "INCONCLUSIVE" and measured else None
    why = _RESTATED_CI.sub("", why) if why else None
    return (f"{where}: {cell['decision']}" + (f" {measured}" if measured else "")
            + (f" ({why})" if why else ""))


def prediction_html(check: Mapping[str, Any] | None) -> str:
    """The cost model beside this run's measurement (verdict.json's ``prediction``), as a
    table, or nothing for a verdict written before it existed."""
    if not check:
        return ""
    titled = {title: table.drop(columns="host") if "host" in table and table["host"].nunique() <= 1
              else table for title, table in predict_check.check_tables(check).items()}  # host: said once
    outside = str(check.get("kind") or "").startswith("out of sample")
    what = (f"out of sample: the model fed {check.get('host')}, not this run's own rates" if outside
            else "in sample (additivity): the model fed this run's own host rates")
    if not titled:
        return f"<p>Prediction, {_esc(what)}: {_esc(check.get('note') or 'nothing to check')}</p>"
    return (f"<h3>Predicted beside measured ({_esc(check.get('platform'))}; {_esc(what)}; error = "
            "predicted / measured - 1)</h3>" + tables.sections(titled).to_html())


# Each figure a notebook saves (figures/<notebook>_<name>.png), in words: what it shows and which
# statistic, as its notebook draws it.
FIGURE_CAPTIONS = {
    "01_d2h_staging_bandwidth": "Copy bandwidth per arm against bytes per copy (median GB/s, "
                                "band: interquartile range; dashed: the PCIe link)",
    "01_d2h_staging_speedups": "Each arm's paired speedup over the seed's fresh buffer, per "
                               "copy size (ratio of mean times, 95 % CI)",
    "01_d2h_staging_saved_ms": "Milliseconds each arm saves per copy (difference of mean times)",
    "01_d2h_staging_pcie": "PCIe throughput sampled by NVML during the copy loop",
    "02_logprobs_step_timeline": "Each step arm's short sequence on a timeline: host and device "
                                 "rows, coloured by stage (does the copy and the host top-K run "
                                 "beside the next forward?)",
    "02_logprobs_step_stages": "Where the seed's step goes, per arm and cell (mean ms per part, "
                               "stacked to the total)",
    "02_logprobs_step_copy_share": "The copy's share of the seed's step per cell (means; dashed: "
                                   "the 10 % 'dwarfed' line)",
    "02_logprobs_step_levers": "Milliseconds each lever saves per step (difference of mean "
                               "times)",
    "03_prompt_logprobs_memory": "Peak working memory of chunked prompt logprobs per chunk size: "
                                 "measured (solid) and the model (dashed), per arm",
    "03_prompt_logprobs_time": "Time per prompt against chunk size, and relative to the same "
                               "arm unchunked (means, 95 % CI)",
    f"{catalogue.VERDICT_NOTEBOOK}_key": "The verdict's key plot: each decisive cell's speedup "
                                         "with its CI",
    "05_prediction_prediction": "The cost model's predicted saving per step against n × V, one "
                                "panel per platform (band: its interval; dotted: the platform's "
                                "bar; grey: the sizes whose host rates were measured)",
}


# Captions that differ where no GPU link was drawn (a CPU run): a caption names only what is drawn.
CPU_CAPTIONS = {
    "01_d2h_staging_bandwidth": "Copy bandwidth per arm against bytes per copy (median GB/s, "
                                "band: interquartile range; a CPU run: no PCIe link to draw)",
}


def figure_caption(path: str, gpu: bool = True) -> str:
    """A figure's caption in words, from its file name (``gpu``: whether the run had a GPU,
    whose link some figures draw); a figure without one is named by its notebook and title,
    never by its path."""
    stem = Path(path).stem
    if not gpu and stem in CPU_CAPTIONS:
        return CPU_CAPTIONS[stem]
    if stem in FIGURE_CAPTIONS:
        return FIGURE_CAPTIONS[stem]
    for notebook in catalogue.NOTEBOOKS:
        if stem.startswith(f"{notebook}_"):
            return (f"{stem.removeprefix(notebook + '_').replace('_', ' ').capitalize()}, from "
                    f"notebook {notebook}")
    return stem.replace("_", " ").capitalize()


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


NOT_MEASURED = "not measured"
STAGE_SPLIT = ("forward", *catalogue.STAGES, "unattributed", catalogue.TOTAL)
STAGE_WORDS = ("forward + log-softmax + zero-fill + copy + host top-K + free + unattributed = "
               "total")


def _ratio(value: Any) -> str | None:
    return None if value is None else f"{value:.3f}x"


def _with_ci(cell: Mapping[str, Any], prefix: str = "") -> str | None:
    """``1.234x [1.200, 1.260]``, or None where the speedup was not measured."""
    speedup = cell.get(f"{prefix}speedup")
    if speedup is None:
        return None
    return f"{speedup:.3f}x [{cell[f'{prefix}ci_low']:.3f}, {cell[f'{prefix}ci_high']:.3f}]"


def _stage_sum(split: Mapping[str, Any]) -> str | None:
    """The seed step's mean ms per part and the total they add up to."""
    if not split:
        return None
    if "unattributed" not in split:  # a verdict written before the split used means
        parts = " + ".join(f"{split[s]:.2f}" for s in catalogue.STAGES)
        return (f"{parts}; total {split[catalogue.TOTAL]:.2f} (medians of an older verdict: "
                "they need not add up)")
    parts = " + ".join(f"{split.get(s, 0.0):.2f}" for s in STAGE_SPLIT[:-1])
    return f"{parts} = {split[catalogue.TOTAL]:.2f}"


def _decisive_table(cells: list[Mapping[str, Any]], said: str = "") -> str:
    """Per decisive cell: the step-level speedup with its CI, the smallest speedup that counts,
    the A/A check, and the seed step's stage split (means, adding up to the total). A column no
    cell has a value for is left out; a reason every cell shares is said once, under the table,
    or not at all where ``said`` (the summary above it) says it already."""
    if not cells:
        return ""
    delta = cells[0].get("delta")
    columns = {"decision": "decision", "speedup": "step speedup [95 % CI]",
               "min_speedup": f"counts from (delta {_fmt(delta, '.0%')})",
               "twin": "A/A twin [95 % CI]", "stages": f"seed step, mean ms: {STAGE_WORDS}",
               "reason": "reason"}
    rows = [{"decision": c["decision"], "speedup": _with_ci(c),
             "min_speedup": _ratio(c.get("min_speedup")), "twin": _with_ci(c, "twin_"),
             "stages": _stage_sum(c.get("stages_ms") or {}), "reason": c.get("reason")}
            for c in cells]
    reasons = {row["reason"] for row in rows}
    shared = reasons.pop() if len(reasons) == 1 else None
    shown = [key for key in columns if any(row[key] for row in rows)
             and not (key == "reason" and shared)]
    head = "<tr><th>cell</th>" + "".join(f"<th>{_esc(columns[k])}</th>" for k in shown) + "</tr>"
    body = "".join(
        f"<tr><td>n={c['rows']} V={c['vocab']} K={c.get('k')}</td>"
        + "".join((f"<td class='{_esc(row[key])}'>" if key == "decision" else "<td>")
                  + f"{_esc(row[key] or NOT_MEASURED)}</td>" for key in shown) + "</tr>"
        for c, row in zip(cells, rows))
    repeated = shared and shared.removeprefix(f"{NOT_MEASURED}: ") in said
    note = f"<p class='muted'>Every cell: {_esc(shared)}</p>" if shared and not repeated else ""
    return f"<table id='decisive'>{head}{body}</table>{note}"


def _load_cell(load: Mapping[str, Any] | None) -> str:
    """The machine's load while a notebook ran, as a table cell (busy in red)."""
    if not load or load.get("busy") is None:
        return "<td class='muted'>not recorded</td>"
    text = (f"{'busy' if load['busy'] else 'quiet'}: others took {load['others_cores']:.2f} of "
            f"{load['cpus']} cores, load average up to {load['load_avg_max']:.1f}")
    return f"<td class='{'failed' if load['busy'] else 'ok'}'>{_esc(text)}</td>"


def _notebooks_table(run_dir: Path, notebooks: list[Mapping[str, Any]]) -> str:
    rows = []
    for nb in notebooks:
        html_link = (f"<a href='{_esc(nb['html'])}'>report</a>"
                     if nb.get("html") and (run_dir / nb["html"]).exists() else "")
        nb_link = (f"<a href='{_esc(nb['output'])}'>notebook</a>"
                   if nb.get("output") and (run_dir / nb["output"]).exists() else "")
        rows.append(f"<tr><td>{_esc(nb['name'])}</td><td class='{_esc(nb['status'])}'>"
                    f"{_esc(nb['status'])}</td><td>{_esc(nb.get('duration_s'))}</td>"
                    f"{_load_cell(nb.get('load'))}"
                    f"<td>{html_link} {nb_link}</td><td>{_esc(nb.get('error') or '')}</td></tr>")
    return ("<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>machine load</th>"
            "<th>open</th><th>error</th></tr>" + "".join(rows) + "</table>")


def _machine_table(hardware: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><td>{_esc(s)}</td><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>"
                   for s, k, v in machine.readable_rows(hardware))
    return f"<table><tr><th>part</th><th>what</th><th>value</th></tr>{rows}</table>"


def origin_text(manifest: Mapping[str, Any]) -> str:
    """Where a run's numbers were measured and where they were analysed, in one sentence; ''
    for a live run (measured where it ran)."""
    measured = manifest.get("measured_on")
    if not measured:
        return ""
    analysed = manifest.get("analysed_on") or {}
    gaps = measured.get("gaps") or []
    return (f"Measured on {measured.get('host')} ({measured.get('gpu') or measured.get('device')})"
            f" at {measured.get('created_utc')} by `stagelab measure` (status "
            f"{measured.get('status')}{', preflight forced' if measured.get('forced') else ''}"
            f"{', a CPU rehearsal' if measured.get('rehearsal') else ''});"
            f" analysed on {analysed.get('host')} at {analysed.get('created_utc')}."
            + source_sentence(measured.get("source"))
            + (f" Missing: {'; '.join(gaps)}." if gaps else ""))


def source_sentence(source: Mapping[str, Any] | None) -> str:
    """The measured source in words: the commit its tree id matched here, or that none did."""
    if not source or not source.get("tree"):
        return ""
    if source.get("matched_commit"):
        return f" Its source is commit {source['matched_commit'][:12]}."
    named = f" (it names {source['commit_env']})" if source.get("commit_env") else ""
    return f" Its source (tree {source['tree'][:12]}) matches no commit here{named}."


def _origin_paragraph(manifest: Mapping[str, Any]) -> str:
    text = origin_text(manifest)
    return f"<p class='note'>{_esc(text)}</p>" if text else ""


def write_index(run_dir: Path) -> Path:
    """(Re)write ``index.html`` of a run folder from its manifest, verdict and files.

    Statuses are the effective ones (:func:`stagelab.core.rundir.effective_manifest`), as in
    ``stagelab runs``: a dead run shows interrupted, a notebook gone from the folder missing.
    """
    from stagelab.core import rundir

    run_dir = Path(run_dir)
    manifest = rundir.effective_manifest(run_dir)
    status = manifest.get("status", "unknown")
    git = manifest.get("git") or {}
    folder = RunFolder(run_dir)
    figures = [p.relative_to(run_dir).as_posix() for p in folder.figures()]
    data_files = [p.relative_to(run_dir).as_posix() for p in folder.tables()]
    gpu = bool((manifest.get("hardware") or {}).get("gpu"))
    try:
        state = trust.run_trust(run_dir, manifest, folder.read_verdict() or {})
    except UserError:
        state = trust.run_trust(run_dir, manifest, {})
    body = [
        f"<h1>stagelab run {_esc(manifest.get('run_id'))}</h1>",
        f"<p>Profile <b>{_esc(manifest.get('profile'))}</b> · status "
        f"<span class='{_esc(status)}'>{_esc(status)}</span> · timings "
        f"<span class='{_TRUST_CLASS.get(state, 'running')}' id='trust'>{_esc(state)}</span>"
        " · started "
        f"{_esc(manifest.get('created_utc'))} · finished {_esc(manifest.get('finished_utc'))} · "
        f"commit <code>{_esc((git.get('commit') or 'unknown')[:12])}</code>"
        f"{' (uncommitted changes)' if git.get('dirty') else ''}</p>",
        f"<p class='note'>{_esc(manifest['note'])}</p>" if manifest.get("note") else "",
        f"<p class='failed'>{_esc(manifest['error'])}</p>" if manifest.get("error") else "",
        _origin_paragraph(manifest),
        _verdict_section(run_dir, manifest),
        "<h2>Notebooks</h2>", _notebooks_table(run_dir, manifest.get("notebooks", [])),
        "<h2>Figures</h2>",
        "".join(f"<figure><img src='{_esc(f)}' alt='{_esc(figure_caption(f, gpu))}'>"
                f"<figcaption class='muted'>{_esc(figure_caption(f, gpu))}</figcaption></figure>"
                for f in figures if f != VERDICT_FIGURE)
        or "<p class='muted'>No figures.</p>",
        "<h2>Data</h2>",
        "<ul>" + "".join(f"<li><a href='{_esc(t)}'>{_esc(t)}</a></li>" for t in data_files)
        + "</ul>" if data_files else "<p class='muted'>No tables.</p>",
        "<p>Every table follows one tidy schema, documented in <code>stagelab.core.schema</code>; "
        "<a href='manifest.json'>manifest.json</a> records parameters, versions and timings.</p>",
        "<h2>Machine</h2>", _machine_table(manifest.get("hardware") or {"unavailable": []}),
    ]
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>stagelab {_esc(manifest.get('run_id'))}</title><style>{_STYLE}</style></head>"
            f"<body>{''.join(body)}</body></html>")
    return rundir.write_text_atomic(run_dir / "index.html", page)


# ------------------------------------------------------------------------ single-file report

SINGLE_FILE_SUFFIX = "_report.html"
# Attributes through which a browser fetches something when the page loads.
_FETCHING_ATTRIBUTES = {"src", "srcset", "poster", "background", "data", "action", "formaction"}
_CSS_URL = re.compile(r"""url\(\s*(['"]?)(.*?)\1\s*\)|@import\s+(['"])(.*?)\3""", re.IGNORECASE)
_NOTEBOOK_STYLE = """
section.notebook{border-top:3px solid #445;margin-top:2.5em}
section.notebook>p.muted{margin:.4em 0 1em}
.anchor-link{display:none} .output_area pre,.output_text pre{white-space:pre-wrap;margin:.3em 0}
.output_stderr,.output_error{background:#fdecea;padding:.2em .5em}
.dataframe td,.dataframe th{font-size:.9em}
"""


def _inside(run_dir: Path, reference: str) -> Path | None:
    """The file of ``run_dir`` that a relative reference names, if any."""
    if not reference or urlsplit(reference).scheme or reference.startswith(("/", "#")):
        return None
    path = (run_dir / unquote(urlsplit(reference).path)).resolve()
    return path if path.is_file() and path.is_relative_to(run_dir.resolve()) else None


def _data_uri(path: Path, run_dir: Path) -> str:
    """A run's file as a data: URI, read as a stranger's file is, at most a figure's bound."""
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    data = stranger.read_regular(path, MAX_FIGURE_BYTES, root=run_dir.resolve())
    return f"data:{kind};base64,{base64.b64encode(data).decode('ascii')}"


def _is_local(reference: str) -> bool:
    return reference.startswith(("data:", "#"))


class _AttributeRewriter(HTMLParser):
    """Re-emits a page as it came, except the start tags whose attributes ``rewrite`` changes."""

    DROP = object()

    def __init__(self, rewrite: Callable[[str, str, str], Any]) -> None:
        super().__init__(convert_charrefs=False)
        self._rewrite = rewrite
        self.parts: list[str] = []

    def _start(self, tag: str, attrs: list[tuple[str, str | None]], closing: str) -> None:
        new = [(k, v if v is None else self._rewrite(tag, k, v)) for k, v in attrs]
        if new == attrs:
            self.parts.append(self.get_starttag_text() or "")
            return
        kept = "".join(f" {k}" if v is None else f' {k}="{html.escape(v)}"'
                       for k, v in new if v is not self.DROP)
        self.parts.append(f"<{tag}{kept}{closing}>")

    def handle_starttag(self, tag, attrs):
        self._start(tag, attrs, "")

    def handle_startendtag(self, tag, attrs):
        self._start(tag, attrs, " /")

    def handle_endtag(self, tag):
        self.parts.append(f"</{tag}>")

    def handle_data(self, data):
        self.parts.append(data)

    def handle_entityref(self, name):
        self.parts.append(f"&{name};")

    def handle_charref(self, name):
        self.parts.append(f"&#{name};")

    def handle_comment(self, data):
        self.parts.append(f"<!--{data}-->")

    def handle_decl(self, decl):
        self.parts.append(f"<!{decl}>")

    def handle_pi(self, data):
        self.parts.append(f"<?{data}>")

    def unknown_decl(self, data):
        self.parts.append(f"<![{data}]>")


def _inline(page: str, run_dir: Path, anchors: Mapping[str, str]) -> str:
    """Embed the run folder's files that ``page`` loads as data: URIs, point links to notebooks at
    their sections (``anchors``: file name -> #id) and drop every other link and fetch."""
    def rewrite(tag: str, name: str, value: str) -> Any:
        if _is_local(value):
            return value
        if name == "href" and tag == "a":
            return anchors.get(unquote(value), _AttributeRewriter.DROP)
        if name in _FETCHING_ATTRIBUTES or name == "href":
            local = _inside(run_dir, value) if name == "src" else None
            return _data_uri(local, run_dir) if local else _AttributeRewriter.DROP
        return value

    rewriter = _AttributeRewriter(rewrite)
    rewriter.feed(page)
    rewriter.close()
    return "".join(rewriter.parts)


def _srcset_urls(value: str) -> list[str]:
    """The URL of each candidate of a ``srcset`` (URLs may hold commas, as data: URIs do)."""
    urls, want_url = [], True
    for token in value.split():
        if not want_url:  # a descriptor (2x, 300w), maybe glued to the next URL by a comma
            if "," not in token:
                continue
            token, want_url = token.partition(",")[2], True
            if not token:
                continue
        urls.append(token.rstrip(","))
        want_url = token.endswith(",")
    return urls


class _References(HTMLParser):
    """Collects what a page would fetch or link to: attribute URLs and CSS ``url()``/``@import``."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if not value:
                continue
            if name in _FETCHING_ATTRIBUTES or name in ("href", "xlink:href"):
                self.found.extend(_srcset_urls(value) if name == "srcset"
                                  else [value.strip()])
            elif name == "style":
                self._css(value)
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self._css(data)

    def _css(self, text: str) -> None:
        self.found.extend((m.group(2) or m.group(4) or "").strip() for m in _CSS_URL.finditer(text))


def external_references(page: str) -> list[str]:
    """Every URL in ``page`` that is neither a data: URI nor a #fragment: each would be fetched
    from, or lead to, somewhere outside the file. Empty for a self-contained page."""
    parser = _References()
    parser.feed(page)
    parser.close()
    return [ref for ref in parser.found if not _is_local(ref)]


def _notebook_section(run_dir: Path, entry: Mapping[str, Any], untrusted: bool = False) -> str:
    """One executed notebook as a section of the single file: outputs only, nothing to fetch."""
    body = notebook_body(run_dir / entry["output"], untrusted)
    return (f"<section class='notebook' id='notebook-{_esc(entry['name'])}'>"
            f"<p class='muted'>Notebook <b>{_esc(entry['name'])}</b> · status "
            f"<span class='{_esc(entry.get('status'))}'>{_esc(entry.get('status'))}</span></p>"
            f"{body}</section>")


SINGLE_FILE_COMMAND = "stagelab report --single-file"


def single_file_out(run_dir: Path, out: Path | None = None, force: bool = False) -> Path:
    """Where the single file goes, checked before anything is written: ``out`` (a new file, an
    earlier single-file report, or with ``force`` anything but a run's record) or
    ``<run_dir>/<run folder name>_report.html``. UserError naming ``--out`` otherwise."""
    out = Path(out) if out is not None else Path(run_dir) / f"{Path(run_dir).name}{SINGLE_FILE_SUFFIX}"
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: the folder {out.parent} does not exist")
    return records.claim_output(out, SINGLE_FILE_COMMAND, force)


def write_single_file(run_dir: Path, out: Path | None = None, force: bool = False,
                      say: Callable[[str], None] = lambda _line: None) -> Path:
    """Write one self-contained HTML file of a run: the landing page followed by every executed
    notebook, figures inlined as data: URIs, nothing fetched from elsewhere, so that it can be
    attached to a review and read offline. Default: ``<run_dir>/<run folder name>_report.html``;
    an existing ``out`` is replaced only as :func:`single_file_out` allows; ``say`` is told
    each notebook as it is inlined."""
    from stagelab.core import rundir

    run_dir = Path(run_dir)
    if not RunFolder(run_dir).manifest_path.is_file():
        raise UserError(f"{run_dir}: no manifest.json; is it a run folder?")
    manifest = rundir.read_manifest(run_dir)
    out = single_file_out(run_dir, out, force)
    found = set(RunFolder(run_dir).notebooks())  # regular files only: a link is not the run's
    notebooks = [nb for nb in manifest["notebooks"]
                 if nb.get("output") and run_dir / nb["output"] in found]
    anchors = {nb[key]: f"#notebook-{nb['name']}" for nb in notebooks
               for key in ("html", "output") if nb.get(key)}
    landing = write_index(run_dir).read_text(encoding="utf-8")
    head, _, rest = landing.partition("</head>")
    body, _, tail = rest.rpartition("</body>")
    untrusted = trust.run_trust(run_dir, manifest) == trust.NOT_TRUSTWORTHY
    sections = ""
    for number, nb in enumerate(notebooks, 1):
        say(f"single file: notebook {number}/{len(notebooks)}: {nb['name']}")
        sections += _notebook_section(run_dir, nb, untrusted)
    say("single file: inlining the figures")
    page = _inline(f"{head}{records.generator_tag(SINGLE_FILE_COMMAND)}<style>{_NOTEBOOK_STYLE}"
                   f"</style></head>{body}<h2>Notebooks in full</h2>{sections}</body>{tail}",
                   run_dir, anchors)
    leftover = external_references(page)
    if leftover:
        raise RuntimeError(f"the single-file report would still load {leftover[:5]}")
    if len(page) > MAX_PAGE_BYTES:
        raise UserError(f"{run_dir}: its single-file report would hold {len(page)} characters, "
                        f"more than the {MAX_PAGE_BYTES} a report may; not written")
    return records.write_text_atomic(out, page)
