"""What a reader does next, on the first screen and in the terminal's last lines.

A run that could not decide (INCONCLUSIVE: no GPU, too few rounds, a busy machine) says what it
measured instead, what each GPU platform is *predicted* to answer (the cost model's bundle answer
on each platform's usual host classes: the figures ``stagelab predict`` prints for the same
cells, read from the run's ``prediction.json``, notebook 05's), and the one command that confirms
it on one's own GPU. A run that decided says how its answer compares with the prediction for its
own platform. Nothing here is measured: every predicted figure is labelled so.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stagelab.analyse import predict_study
from stagelab.core import records
from stagelab.core.errors import BadRecord

PREDICTION_FILE = "prediction.json"  # notebook 05's payload (``predict_command.Study``)
CONFIRM = "make run PROFILE=gate"  # the one command that confirms a prediction on a GPU
PREFLIGHT = "stagelab preflight --profile gate"
HOST_CLASS = predict_study.HOST_CLASS
QUESTION = "bundle"  # the verdict's decision: the pinned grow-only scratch vs the fresh vector
UNDECIDED = "INCONCLUSIVE"


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def read_prediction(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``prediction.json`` (notebook 05's), or None where it has none or it cannot be
    read (the page then says the prediction is not available)."""
    try:
        payload = records.read_json(Path(run_dir) / PREDICTION_FILE)
    except (FileNotFoundError, BadRecord):
        return None
    return payload if isinstance(payload, dict) else None


def _cell(row: Mapping[str, Any]) -> tuple[int, int, int]:
    return int(row["rows"]), int(row["vocab"]), int(row["k"])


def cell_label(cell: tuple[int, int, int]) -> str:
    rows, vocab, k = cell
    return f"n={rows} V={vocab:,} K={k}"


def platform_answers(prediction: Mapping[str, Any] | None
                     ) -> dict[str, dict[tuple[int, int, int], dict[str, Any]]]:
    """Per platform and cell, the bundle's predicted answer across the platform's usual host
    classes, with the saving's and the bar's ranges over those hosts (ms). Rows on another host
    (this run's own, named "this host") are not a platform's answer and are left out."""
    by: dict[str, dict[tuple[int, int, int], list[Mapping[str, Any]]]] = {}
    for row in (prediction or {}).get("answers") or []:
        if row.get("question") != QUESTION or not str(row.get("host", "")).startswith(HOST_CLASS):
            continue
        by.setdefault(str(row["platform"]), {}).setdefault(_cell(row), []).append(row)
    out: dict[str, dict[tuple[int, int, int], dict[str, Any]]] = {}
    for platform, cells in by.items():
        out[platform] = {cell: {
            "answer": predict_study.across_hosts({r["host"]: r["decision"] for r in rows}),
            "saving_ms": (min(r["saving_low_ms"] for r in rows),
                          max(r["saving_high_ms"] for r in rows)),
            "bar_ms": (min(r["bar_low_ms"] for r in rows), max(r["bar_high_ms"] for r in rows))}
            for cell, rows in cells.items()}
    return out


def _range(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.3g}-{pair[1]:.3g} ms"


def _answer_text(answer: Mapping[str, Any]) -> str:
    return (f"{answer['answer']}: saves {_range(answer['saving_ms'])} per step, bar "
            f"{_range(answer['bar_ms'])}")


def platform_of(gpu_name: str | None, platforms: list[str]) -> str | None:
    """The platform of data/platforms.csv a GPU is (its name within the GPU's, longest first;
    else its first word, "H100" for "NVIDIA H100 80GB HBM3"), or None."""
    if not gpu_name:
        return None
    for platform in sorted(platforms, key=len, reverse=True):
        if platform.lower() in gpu_name.lower():
            return platform
    words = gpu_name.lower().split()
    return next((p for p in platforms if p.split()[0].lower() in words), None)


def measured_instead(verdict: Mapping[str, Any]) -> str:
    """What an undecided run measured, in one sentence: each question it could answer, with its
    family's answer, and those it could not."""
    questions = verdict.get("questions") or {}
    done = [f"{q.get('words', name)}: {q['decision']}" for name, q in questions.items()
            if q.get("decision")]
    left = [str(q.get("words", name)) for name, q in questions.items() if not q.get("decision")]
    said = ("; ".join(done) + ".") if done else "none of the three questions."
    return (f"Measured here instead: {said}"
            + (f" Not measured: {', '.join(left)}." if left else ""))


def predicted_table(answers: Mapping[str, Mapping[tuple[int, int, int], Mapping[str, Any]]]
                    ) -> str:
    """One row per platform, one column per decisive cell: the bundle's predicted answer."""
    cells = sorted({cell for per in answers.values() for cell in per})
    head = "<tr><th>platform</th>" + "".join(
        f"<th>{_esc(cell_label(c))}</th>" for c in cells) + "</tr>"
    body = "".join(
        f"<tr><td>{_esc(platform)}</td>" + "".join(
            f"<td>{_esc(_answer_text(per[c]) if c in per else 'does not fit: not predicted')}</td>"
            for c in cells) + "</tr>"
        for platform, per in sorted(answers.items()))
    return f"<table id='predicted'>{head}{body}</table>"


def first_screen(run_dir: Path, verdict: Mapping[str, Any], profile: str | None) -> str:
    """The block under the verdict: for an undecided run, what was measured instead, each
    platform's predicted answer and the command that confirms it; for a decided one, how it
    compares with its platform's prediction; '' where there is no prediction to show."""
    answers = platform_answers(read_prediction(run_dir))
    decision = (verdict.get("overall") or {}).get("decision")
    if decision != UNDECIDED:
        return _compared(verdict, answers)
    source = f"stagelab predict --profile {profile}" if profile else "stagelab predict"
    parts = [f"<div id='next-step'><p>{_esc(measured_instead(verdict))}</p>",
             f"<p id='confirm'><b>To confirm on your GPU</b>: <code>{CONFIRM}</code> "
             f"(<code>{PREFLIGHT}</code> first says whether it can; README: "
             "\"On a GPU machine of your own\").</p>"]
    if answers:
        parts.append(
            "<h3>What a GPU would answer: predicted, not measured</h3>"
            + predicted_table(answers)
            + f"<p class='muted'>The bundle (the pinned grow-only scratch against the fresh "
            "vector) per platform and decisive cell, from the cost model on each platform's "
            f"usual hosts (<code>{_esc(source)}</code> prints the same figures; notebook 05 "
            "shows them all): PORT where the whole predicted saving clears the bar, CLOSE where "
            "none does, \"depends on X\" where the range of input X decides.</p>")
    else:
        parts.append("<p class='muted'>No prediction per platform in this run (notebook 05 did "
                     f"not write {PREDICTION_FILE}): <code>{_esc(source)}</code> prints it.</p>")
    parts.append("</div>")
    return "".join(parts)


def _compared(verdict: Mapping[str, Any],
              answers: Mapping[str, Mapping[tuple[int, int, int], Mapping[str, Any]]]) -> str:
    """A decided run beside its platform's predicted answer, one sentence."""
    gpu = (verdict.get("hardware") or {}).get("gpu")  # the GPU's name, None on a CPU
    platform = platform_of(gpu if isinstance(gpu, str) else None, list(answers))
    if platform is None:
        return ""
    predicted = "; ".join(f"{cell_label(c)}: {a['answer']}"
                          for c, a in sorted(answers[platform].items()))
    decision = (verdict.get("overall") or {}).get("decision")
    return (f"<p id='versus-prediction'>Measured <b>{_esc(decision)}</b>; predicted for "
            f"{_esc(platform)} on its usual hosts (not measured): {_esc(predicted)}.</p>")


def terminal_lines(run_dir: Path, verdict: Mapping[str, Any] | None,
                   profile: str | None) -> list[str]:
    """For an undecided run, the two lines the terminal ends with after the verdict's: the
    predicted answers grouped by answer, and the confirming command."""
    if not verdict or (verdict.get("overall") or {}).get("decision") != UNDECIDED:
        return []
    answers = platform_answers(read_prediction(run_dir))
    grouped: dict[str, list[str]] = {}
    for platform, per in sorted(answers.items()):
        for cell, answer in sorted(per.items()):
            grouped.setdefault(f"{answer['answer']} at n={cell[0]}", []).append(platform)
    said = "; ".join(f"{what} on {', '.join(names)}" for what, names in grouped.items())
    source = f"stagelab predict --profile {profile}" if profile else "stagelab predict"
    return [f"predicted on a GPU, not measured ({source}): bundle {said}" if said else
            f"predicted on a GPU: not in this run ({source} prints it)",
            f"to confirm on your GPU: {CONFIRM} (after {PREFLIGHT})"]
