"""HTML for a run folder: each notebook exported with its code hidden, and the landing page.

``index.html`` opens with the verdict in plain words and its key plot when the run has a
``verdict.json``, then shows each notebook's status with links, the figures, and the machine.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Mapping

VERDICT_FILE = "verdict.json"
VERDICT_FIGURE = "figures/04_verdict_key.png"

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d232a;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #dde;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ccd;padding:.3em .6em;text-align:left;
vertical-align:top} th{background:#f3f4f8}
.ok{color:#176b2c;font-weight:600}.failed,.interrupted{color:#b3261e;font-weight:600}
.running,.pending,.interactive{color:#8a6d00;font-weight:600}.missing{color:#b3261e;font-style:italic}
.note{border-left:3px solid #8a6d00;padding-left:.6em}
.verdict{border:2px solid #445;border-radius:8px;padding:.8em 1.2em;background:#f8f9fc}
.decision{font-size:1.3em;font-weight:700} .PORT{color:#176b2c}.CLOSE{color:#444}.INCONCLUSIVE{color:#8a6d00}
img{max-width:100%;border:1px solid #eee;margin:.4em 0} .muted{color:#667} code{background:#f3f4f8;padding:0 .2em}
"""


def export_html(notebook_path: Path, html_path: Path) -> Path:
    """Export an executed notebook to HTML with code cells and prompts hidden, plots embedded."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.read(str(notebook_path), as_version=4))
    Path(html_path).write_text(body, encoding="utf-8")
    return Path(html_path)


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _verdict_section(run_dir: Path) -> str:
    path = run_dir / VERDICT_FILE
    if not path.exists():
        return ("<section class='verdict' id='verdict'><p class='decision INCONCLUSIVE'>No verdict yet"
                "</p><p>This run has no <code>verdict.json</code>: the verdict notebook did not run "
                "or did not finish. Nothing below is a decision.</p></section>")
    try:
        verdict = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return (f"<section class='verdict' id='verdict'><p class='decision INCONCLUSIVE'>Verdict "
                f"unreadable</p><p>{_esc(path)}: {_esc(exc)}</p></section>")
    overall = verdict.get("overall", {})
    decision = _esc(overall.get("decision", "INCONCLUSIVE"))
    parts = [f"<section class='verdict' id='verdict'><p class='decision {decision}'>"
             f"Staging verdict: {decision}</p><p>{_esc(overall.get('summary', ''))}</p>"]
    parts.append(_decisive_table(verdict.get("decisive", [])))
    findings = verdict.get("findings", [])
    if findings:
        parts.append("<ul>" + "".join(f"<li>{_esc(f)}</li>" for f in findings) + "</ul>")
    if (run_dir / VERDICT_FIGURE).exists():
        parts.append(f"<img src='{VERDICT_FIGURE}' alt='key plot of the verdict'>")
    parts.append("</section>")
    return "".join(parts)


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _decisive_table(cells: list[Mapping[str, Any]]) -> str:
    """Per decisive cell: the step-level speedup with its CI, delta, the A/A check, and the seed
    step's stage split."""
    if not cells:
        return ""
    head = ("<table id='decisive'><tr><th>cell</th><th>decision</th><th>step speedup [95 % CI]"
            "</th><th>delta (min speedup)</th><th>A/A twin [CI]</th><th>seed step, ms: "
            "log-softmax + zero-fill + copy + host top-K + free</th><th>reason</th></tr>")
    rows = []
    for c in cells:
        split = c.get("stages_ms") or {}
        stages = (" + ".join(_fmt(split.get(s), ".2f") for s in
                             ("device", "alloc", "copy", "host_gather", "free"))
                  + f" = {_fmt(split.get('total'), '.2f')}") if split else "-"
        rows.append(
            f"<tr><td>n={c['rows']} V={c['vocab']} K={c.get('k')}</td>"
            f"<td class='{_esc(c['decision'])}'>{_esc(c['decision'])}</td>"
            f"<td>{_fmt(c.get('speedup'))} [{_fmt(c.get('ci_low'))}, {_fmt(c.get('ci_high'))}]</td>"
            f"<td>{_fmt(c.get('delta'), '.0%')} ({_fmt(c.get('min_speedup'))})</td>"
            f"<td>{_fmt(c.get('twin_speedup'))} [{_fmt(c.get('twin_ci_low'))}, "
            f"{_fmt(c.get('twin_ci_high'))}]</td><td>{_esc(stages)}</td>"
            f"<td>{_esc(c.get('reason'))}</td></tr>")
    return head + "".join(rows) + "</table>"


def _notebooks_table(run_dir: Path, notebooks: list[Mapping[str, Any]]) -> str:
    rows = []
    for nb in notebooks:
        html_link = (f"<a href='{_esc(nb['html'])}'>report</a>"
                     if nb.get("html") and (run_dir / nb["html"]).exists() else "")
        nb_link = (f"<a href='{_esc(nb['output'])}'>notebook</a>"
                   if nb.get("output") and (run_dir / nb["output"]).exists() else "")
        rows.append(f"<tr><td>{_esc(nb['name'])}</td><td class='{_esc(nb['status'])}'>"
                    f"{_esc(nb['status'])}</td><td>{_esc(nb.get('duration_s'))}</td>"
                    f"<td>{html_link} {nb_link}</td><td>{_esc(nb.get('error') or '')}</td></tr>")
    return ("<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>open</th>"
            "<th>error</th></tr>" + "".join(rows) + "</table>")


def _machine_table(hardware: Mapping[str, Any]) -> str:
    from stagelab.hardware import flatten

    rows = "".join(f"<tr><td>{_esc(s)}</td><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>"
                   for s, k, v in flatten(hardware))
    return f"<table><tr><th>part</th><th>what</th><th>value</th></tr>{rows}</table>"


def write_index(run_dir: Path) -> Path:
    """(Re)write ``index.html`` of a run folder from its manifest, verdict and files.

    Statuses are the effective ones (:func:`stagelab.rundir.effective_manifest`), as in
    ``stagelab runs``: a dead run shows interrupted, a notebook gone from the folder missing.
    """
    from stagelab import rundir

    run_dir = Path(run_dir)
    manifest = rundir.effective_manifest(run_dir)
    status = manifest.get("status", "unknown")
    git = manifest.get("git") or {}
    figures = sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "figures").glob("*.png"))
    tables = sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "data").glob("*.parquet"))
    body = [
        f"<h1>stagelab run {_esc(manifest.get('run_id'))}</h1>",
        f"<p>Profile <b>{_esc(manifest.get('profile'))}</b> · status "
        f"<span class='{_esc(status)}'>{_esc(status)}</span> · started "
        f"{_esc(manifest.get('created_utc'))} · finished {_esc(manifest.get('finished_utc'))} · "
        f"commit <code>{_esc((git.get('commit') or 'unknown')[:12])}</code>"
        f"{' (uncommitted changes)' if git.get('dirty') else ''}</p>",
        f"<p class='note'>{_esc(manifest['note'])}</p>" if manifest.get("note") else "",
        f"<p class='failed'>{_esc(manifest['error'])}</p>" if manifest.get("error") else "",
        _verdict_section(run_dir),
        "<h2>Notebooks</h2>", _notebooks_table(run_dir, manifest.get("notebooks", [])),
        "<h2>Figures</h2>",
        "".join(f"<figure><img src='{_esc(f)}' alt='{_esc(f)}'><figcaption class='muted'>"
                f"{_esc(f)}</figcaption></figure>" for f in figures if f != VERDICT_FIGURE)
        or "<p class='muted'>No figures.</p>",
        "<h2>Data</h2>",
        "<ul>" + "".join(f"<li><a href='{_esc(t)}'>{_esc(t)}</a></li>" for t in tables) + "</ul>"
        if tables else "<p class='muted'>No tables.</p>",
        "<p>Every table follows one tidy schema, documented in <code>stagelab.schema</code>; "
        "<a href='manifest.json'>manifest.json</a> records parameters, versions and timings.</p>",
        "<h2>Machine</h2>", _machine_table(manifest.get("hardware") or {"unavailable": []}),
    ]
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>stagelab {_esc(manifest.get('run_id'))}</title><style>{_STYLE}</style></head>"
            f"<body>{''.join(body)}</body></html>")
    return rundir.write_text_atomic(run_dir / "index.html", page)

