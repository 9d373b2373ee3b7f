"""Port or close: the decision the suite exists for, from a run folder's tidy data alone.

The decisive experiment is the seed's own step, same code, two stagings (``stagelab.measure.step``):
``seed_pageable`` (a fresh value-initialised ``std::vector`` per step) against ``seed_pinned`` (the
pinned grow-only scratch), interleaved per round in a balanced order with an A/A twin of the
baseline, each timed step following ``forward_ms`` of device work (the decode forward). The
decisive cells (named by the profile: rows x models x K) are one family, decided by
:func:`stagelab.analyse.stats.decide_family` against a smallest effect of interest: a saving of ``delta``
(default 2 %) of the decode step (forward + logprobs step), i.e. a step speedup of
``1 / (1 - delta)`` on the ratio of mean step times:

* PORT: a cell's lower bound at Holm's level lies above that and above its A/A twin's CI, and
  every cell can support a PORT (at least 149 rounds, its mean not slower beyond delta, its p99
  tail not shown heavier beyond delta);
* CLOSE: every cell's upper bound (one-sided 5 %) lies below it (any benefit is too small to be
  worth a change; slower counts too);
* INCONCLUSIVE otherwise, with each cell's reason (not measured, too few rounds, bad timings,
  straddles, or the A/A twin shows the harness seeing a difference between identical arms).

The verdict states its context (``forward_ms``, what delta is a share of with the logprobs-only
bar beside it, where the log-softmax runs, and whether the other place would change the answer).
Other cells are reported, never decide. Copy-level cells (notebook 01) explain the mechanism and
never decide. The ``harness`` block checks every A/A twin of the run as one family (Bonferroni):
whether identical arms differ beyond delta. The ``prediction`` block sets the cost model
(:mod:`stagelab.analyse.predict`, fed this run's own host rates) beside what the run measured.
Deterministic: the same folder gives the same file.
Torch-free. The rule in full (the three questions, the 149-round floor, the p99 tail check, the
allocator regimes, the forward model, the calibration): docs/decision-rule.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stagelab.analyse import analysis, calibration, carryover, predict, stats
from stagelab.core import catalogue, design, forward, records, schema
from stagelab.core.errors import UserError

TABLES = catalogue.tables()
BASELINE, CANDIDATE, TWIN = catalogue.decisive_arms()
REUSED = catalogue.REUSE_LEVER[catalogue.STEP]


def load_tables(run_dir: Path) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """This run's tables, and a sentence for each one missing. A corrupt table raises, naming it."""
    tables, missing = {}, []
    for name, notebook in TABLES.items():
        try:
            tables[name] = schema.read_table(run_dir, name)
        except FileNotFoundError:
            missing.append(f"data/{name}.parquet is absent: notebook {notebook} did not run in "
                           "this profile or did not write it; what needs it is not reported")
    return tables, missing


def _num(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _plain(value: Any) -> Any:
    """A JSON-ready copy: numpy scalars as Python numbers, NaN and missing values as None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) or value is pd.NA or value is None:
        return _num(value)
    return value


def _measured(value: Any) -> bool:
    return _num(value) is not None


def _context(cell: pd.DataFrame) -> dict[str, Any]:
    """The step's context in one cell: the device work queued before each step (``forward_ms``,
    0 when not recorded) and where the seed arms ran the log-softmax."""
    forward = cell[(cell["metric"] == "forward_ms") & (cell["status"] == "ok")]["value"].dropna()
    where = cell["log_softmax"].dropna().unique() if "log_softmax" in cell else []
    return {"forward_ms": float(forward.iloc[0]) if len(forward) else 0.0,
            "log_softmax": str(where[0]) if len(where) else "device"}


def _mean_ms(values: np.ndarray) -> float | None:
    """Mean milliseconds of the positive, finite values; None when there are none."""
    good = values[np.isfinite(values) & (values > 0)]
    return 1e3 * float(good.mean()) if len(good) else None


def cell_evidence(step: pd.DataFrame, rows: int, vocab: int, k: int, candidate: str, *,
                  delta: float, baseline: str = BASELINE,
                  twin: str | None = TWIN) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One ``(n, V, K)`` cell of the step table: what the verdict says about it before deciding
    (sizes, context, the bars, the stage split), and the rule's input (None with the reason in
    the first dict when it cannot be decided: not measured, or no A/A twin).

    delta is a share of the **decode step**, the forward pass and the logprobs step together,
    which is what each timed call measures when ``forward_ms`` of device work is queued before
    it: the bar is ``1 / (1 - delta)`` on the measured step. Beside it, the logprobs-only bar:
    the speedup of the measured step that saves delta of the logprobs step alone. ``baseline``
    and ``twin`` (None: no A/A twin in this comparison) name the other arms compared."""
    cell = step[(step["rows"] == rows) & (step["vocab"] == vocab) & (step["k"] == k)]
    out: dict[str, Any] = {"rows": rows, "vocab": vocab, "k": k, "candidate": candidate,
                           "delta": delta, **_context(cell)}
    step_rounds = analysis.by_round(cell, baseline)
    out["baseline_rounds"] = len(step_rounds)
    out["min_speedup"] = 1 / (1 - delta)
    decode_ms = _mean_ms(step_rounds.to_numpy(dtype=float))
    out["step_ms"] = decode_ms
    if decode_ms is not None:
        logprobs_ms = max(decode_ms - out["forward_ms"], 0.0)
        out["logprobs_step_ms"] = logprobs_ms
        out["logprobs_only_min_speedup"] = (
            decode_ms / (decode_ms - delta * logprobs_ms) if logprobs_ms else None)
    out["stages_ms"] = _stage_split(cell)
    out["vector_regime"] = vector_regime(cell, baseline)
    arms = (baseline, candidate) if twin is None else (baseline, candidate, twin)
    failures = _failures(cell, arms)
    out["failures"] = failures
    for arm, words in ((baseline, "not measured: "), (candidate, "not measured: "),
                       (twin, "the A/A check is missing: ")):
        if arm is not None and analysis.by_round(cell, arm).empty:
            out["reason"] = words + analysis.not_measured_reason(cell, arm)
            return out, None
    paired = analysis.paired_rounds(cell, *arms)
    return out, {"baseline": paired[0], "candidate": paired[1],
                 "twin": paired[2] if twin is not None else None,
                 "min_speedup": out["min_speedup"]}


def decide_cells(step: pd.DataFrame, named: list[tuple[int, int, int]], candidate: str, *,
                 delta: float, min_samples: int, confidence: float, seed: int,
                 baseline: str = BASELINE, twin: str | None = TWIN,
                 ) -> tuple[list[dict[str, Any]], stats.FamilyDecision | None]:
    """Every named decisive cell with its decision, and the family's decision over the measured
    ones (:func:`stagelab.analyse.stats.decide_family`; None when no cell was measured)."""
    evidence = [cell_evidence(step, n, v, k, candidate, delta=delta, baseline=baseline,
                              twin=twin) for n, v, k in named]
    measured = [inputs for _, inputs in evidence if inputs is not None]
    family = (stats.decide_family(measured, min_samples=min_samples, confidence=confidence,
                                  seed=seed) if measured else None)
    decided = iter(family.cells if family else [])
    cells = []
    for out, inputs in evidence:
        decision = (next(decided) if inputs is not None else
                    stats.Decision(stats.INCONCLUSIVE, out.pop("reason"),
                                   min_speedup=out["min_speedup"]))
        if out["failures"]:
            decision.reason += f" (note: {out['failures']})"
        cell = {**out, **decision.to_dict()}
        cell["saved_ms"] = None if cell["saved_seconds"] is None else 1e3 * cell["saved_seconds"]
        for key in ("saved_seconds", "failures"):
            cell.pop(key)
        cells.append(cell)
    return cells, family


def vector_regime(cell: pd.DataFrame, baseline: str = BASELINE) -> dict[str, Any]:
    """Which regime the baseline's fresh vector met in a cell's timed steps: how many of its
    ``alloc`` rows were mapped fresh and their median minor faults, in words; ``recorded``
    False for rows that predate the columns."""
    alloc = cell[(cell["arm"] == baseline) & (cell["stage"] == "alloc")
                 & (cell["status"] == "ok")] if "mapped" in cell else cell.iloc[0:0]
    faults = alloc["minor_faults"].dropna() if "minor_faults" in alloc else alloc.iloc[0:0]
    if faults.empty:
        return {"recorded": False, "words": "the vector's regime was not recorded (rows "
                                             "before the mapped and minor_faults columns)"}
    mapped = alloc["mapped"].dropna()
    fresh = int(mapped.sum())
    median = float(faults.median())
    regime = ("mapped fresh (faulted in) every step" if len(mapped) and fresh == len(mapped)
              else "warm from the heap every step" if len(mapped) and fresh == 0
              else f"mapped fresh in {fresh} of {len(mapped)} steps" if len(mapped)
              else "under a malloc whose mapping is not read")
    return {"recorded": True, "steps": int(len(alloc)), "mapped_steps": fresh,
            "median_minor_faults": median,
            "words": f"the seed's vector was {regime}, {median:g} minor faults per step (median)"}


def _failures(cell: pd.DataFrame, arms: tuple[str, ...]) -> str:
    """The failed rows of the decision's arms in a cell, in words (empty when none failed)."""
    failed = cell[cell["arm"].isin(arms) & (cell["status"] == "failed")]
    return "; ".join(f"{r.arm} failed after {r.round} rounds: {r.note}"
                     for r in failed.itertuples())


def _stage_split(cell: pd.DataFrame) -> dict[str, float] | None:
    """The seed step's mean ms per part (forward, device, alloc, copy, host top-K, free,
    unattributed)
    and in total, in one cell: the parts add up to the total."""
    parts = analysis.decomposition(cell)
    seed = parts[parts["arm"] == BASELINE]
    if seed.empty:
        return None
    row = seed.iloc[0]
    return {stage: 1e3 * float(row[stage]) for stage in (*analysis.SPLIT, catalogue.TOTAL)}


def _cell_name(cell: dict[str, Any]) -> str:
    return f"n={cell['rows']} V={cell['vocab']} K={cell['k']}"


def _answer_words(cell: dict[str, Any]) -> str:
    """A cell's answer in a few words: its decision and speedup with CI."""
    if cell.get("speedup") is None:
        return f"{_cell_name(cell)} {cell['decision']} (not measured)"
    return (f"{_cell_name(cell)} {cell['decision']} {cell['speedup']:.3f}x "
            f"[{cell['ci_low']:.3f}, {cell['ci_high']:.3f}]")


def _blocks_port(cell: dict[str, Any]) -> str:
    """Why a decisive cell keeps the family from PORT ('' when it does not)."""
    if cell.get("speedup") is None:
        return "not measured"
    return cell.get("port_blocked") or ""


def overall(decisive: list[dict[str, Any]]) -> dict[str, str]:
    """One decision over the decisive cells, a summary and where the effect lies. PORT needs a
    cell that ports and every cell able to support it (measured, non-inferior in mean and tail,
    with the rounds a PORT needs): intersection-union, so no decisive cell is left to regress."""
    if not decisive:
        return {"decision": stats.INCONCLUSIVE, "where": "",
                "summary": "No decisive cell was named or measured: nothing to decide from."}
    decisions = [c["decision"] for c in decisive]
    ported = [c for c in decisive if c["decision"] == stats.PORT]
    blocked = [c for c in decisive if _blocks_port(c)]
    where = effect_location(decisive)
    if ported and not blocked:
        best = max(ported, key=lambda c: c["saved_ms"] or 0)
        each = "; ".join(_answer_words(c) for c in decisive)
        roles = stats.port_roles([(c["decision"], c.get("tail") or "") for c in decisive],
                                 [_cell_name(c) for c in decisive])
        return {"decision": stats.PORT, "where": where, "summary": (
            f"Pinned grow-only staging saves more than delta of the seed's step: {roles}; "
            f"the largest saving is "
            f"{best['saved_ms']:.2f} ms per step at n={best['rows']}, V={best['vocab']}, "
            f"K={best['k']} ({best['speedup']:.3f}x, CI [{best['ci_low']:.3f}, "
            f"{best['ci_high']:.3f}]). Each cell: {each}. {where}".strip())}
    if all(d == stats.CLOSE for d in decisions):
        return {"decision": stats.CLOSE, "where": where, "summary": (
            f"In all {len(decisive)} decisive cells any benefit of pinned grow-only staging is "
            f"smaller than delta ({decisive[0]['delta']:.0%}) of the seed's step, or it is "
            "slower: close without porting.")}
    unmeasured = [c for c in decisive if c["reason"].startswith("not measured")]
    if len(unmeasured) == len(decisive):
        return {"decision": stats.INCONCLUSIVE, "where": "", "summary": (
            "No decisive cell was measured (" + unmeasured[0]["reason"].removeprefix(
                "not measured: ") + "), so whether pinned staging helps cannot be decided "
            "here. See the findings for what was measured instead.")}
    counts = {d: decisions.count(d) for d in sorted(set(decisions))}
    extra = (" a PORT is blocked by " + "; ".join(
        f"{_cell_name(c)}: {_blocks_port(c)}" for c in blocked) + ";") if ported else ""
    return {"decision": stats.INCONCLUSIVE, "where": where, "summary": (
        f"The decisive cells disagree or are unresolved ({counts});{extra} see the per-cell "
        f"reasons. {where}").strip()}


QUESTIONS = {  # question: (baseline, candidate, A/A twin)
    "bundle": (BASELINE, CANDIDATE, TWIN),
    "reuse": (BASELINE, REUSED, TWIN),
    "pinning": (REUSED, CANDIDATE, None),
}
QUESTION_WORDS = {
    "bundle": "reuse + pinning: pinned grow-only scratch vs a fresh zero-filled vector",
    "reuse": "reuse alone: grow-only pageable buffer vs a fresh zero-filled vector",
    "pinning": "pinning alone: pinned grow-only scratch vs grow-only pageable buffer",
}
ANSWER_KEYS = ("decision", "speedup", "ci_low", "ci_high", "tail_speedup", "tail_bound",
               "tail_upper_bound", "tail", "noninferior_bound", "saved_ms", "n_rounds", "reason")


def answer_questions(step: pd.DataFrame, named: list[tuple[int, int, int]], *,
                     bundle: list[dict[str, Any]],
                     **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three questions, each a family over the decisive cells
    (:func:`stagelab.analyse.stats.decide_family`): their answers, and the change recommended
    from them as a fixed sequence (:func:`stagelab.analyse.stats.recommend`). ``bundle``: the
    decisive cells, already decided. A question none of whose arms ran is None."""
    answers: dict[str, Any] = {}
    for question, (baseline, candidate, twin) in QUESTIONS.items():
        cells = bundle if question == "bundle" else decide_cells(
            step, named, candidate, baseline=baseline, twin=twin, **kwargs)[0]
        measured = any(c.get("speedup") is not None for c in cells)
        answers[question] = {
            "baseline": baseline, "candidate": candidate, "words": QUESTION_WORDS[question],
            "measured": measured, **(overall(cells) if measured else {
                "decision": None, "where": "", "summary": cells[0]["reason"] if cells else ""}),
            "cells": [{"rows": c["rows"], "vocab": c["vocab"], "k": c["k"],
                       **{key: c.get(key) for key in ANSWER_KEYS}} for c in cells]}
    pinning = answers["pinning"]
    pinning_family = None if pinning["decision"] is None else stats.FamilyDecision(
        pinning["decision"], pinning["summary"],
        [stats.Decision(c["decision"], c["reason"] or "") for c in pinning["cells"]])
    change, reason = stats.recommend(answers["bundle"]["decision"], pinning_family,
                                     answers["reuse"]["decision"],
                                     cells=[_cell_name(c) for c in pinning["cells"]])
    return answers, {"change": change, "reason": reason, "method": stats.SEQUENCE}


def not_a_decision(decisive: list[dict[str, Any]]) -> str:
    """Why this run's rounds cannot decide ('' when they can): a decisive cell measured with
    fewer rounds than a PORT needs (a smoke profile), whose PORT or CLOSE would not be one."""
    short = [c for c in decisive if c.get("n_rounds") and c["n_rounds"] < design.TAIL_ROUNDS]
    if not short:
        return ""
    fewest = min(c["n_rounds"] for c in short)
    return (f"Not a decision: {len(short)} decisive cell(s) have as few as {fewest} rounds, "
            f"fewer than the {design.TAIL_ROUNDS} a decision needs (to have seen a 1-in-50 stall "
            "with 95 % probability); the answers below show the machinery, not the verdict.")


def effect_location(decisive: list[dict[str, Any]]) -> str:
    """One sentence on where the effect lies: PORT from which n x V up (a size counts as PORT
    only when every K there is), and what lies below."""
    by_size: dict[int, set[str]] = {}
    for cell in decisive:
        by_size.setdefault(cell["rows"] * cell["vocab"], set()).add(cell["decision"])
    sizes = sorted(by_size)
    start = len(sizes)
    while start > 0 and by_size[sizes[start - 1]] == {stats.PORT}:
        start -= 1
    if start == len(sizes):
        return ""
    below = sorted(set().union(*(by_size[size] for size in sizes[:start])))
    rest = f"; {'/'.join(below)} below" if below else ""
    return f"PORT from n x V >= {sizes[start]:,}{rest}."


def decisive_cells(rows: list[int], vocabs: list[int],
                   ks: list[int]) -> list[tuple[int, int, int]]:
    """The cells the profile names as decisive (each is decided, measured or not)."""
    return [(n, v, k) for v in vocabs for n in rows for k in ks]


def _copy_cells(staging: pd.DataFrame, seed: int) -> list[dict[str, Any]]:
    """Copy level (the mechanism): pinned grow-only and reused pageable against fresh pageable."""
    out = []
    fresh = catalogue.baseline(catalogue.STAGING)
    levers = (catalogue.candidate(catalogue.STAGING), catalogue.REUSE_LEVER[catalogue.STAGING],
              catalogue.ZERO_FILL_LEVER)
    for candidate in levers:
        compared = analysis.compare(staging, fresh, candidate, ["rows", "vocab"], twin=True,
                                    seed=seed)
        out += compared.to_dict("records")
    return out


def harness_check(staging: pd.DataFrame | None, step: pd.DataFrame | None,
                  named: list[tuple[int, int, int]], *, delta: float, confidence: float,
                  seed: int) -> dict[str, Any]:
    """The run's A/A harness check, every twin as one family (:func:`stagelab.analyse.stats.twin_checks`):
    the seed's step against its twin in each decisive cell, and the fresh pageable copy against
    its twin in each copy cell. :mod:`stagelab.analyse.trust` reads it."""
    labelled: list[tuple[dict[str, Any], list[np.ndarray]]] = []
    if step is not None:
        for n, v, k in named:
            cell = step[(step["rows"] == n) & (step["vocab"] == v) & (step["k"] == k)]
            labelled.append(({"level": "step", "rows": n, "vocab": v, "k": k},
                             analysis.paired_rounds(cell, BASELINE, TWIN)))
    if staging is not None:
        fresh = catalogue.baseline(catalogue.STAGING)
        for key, part in analysis.cells(staging, ["rows", "vocab"]):
            labelled.append(({"level": "copy", **key},
                             analysis.paired_rounds(part, fresh, catalogue.aa_name(fresh))))
    level, checks = stats.twin_checks([(pair[0], pair[1]) for _, pair in labelled if len(pair[0])],
                                      delta=delta, confidence=confidence, seed=seed)
    found = iter(checks)  # a cell without twin rounds is listed, unchecked, and not counted in m
    unchecked = {"n_rounds": 0, "twin_speedup": None, "twin_ci_low": None, "twin_ci_high": None,
                 "differs": None, "note": "no round timed both the baseline and its twin"}
    return {"method": stats.TWIN_METHOD, "confidence": level, "family_confidence": confidence,
            "delta": delta, "checks": [{**label, **(next(found) if len(pair[0]) else unchecked)}
                                       for label, pair in labelled]}


def _prompt_summary(prompt: pd.DataFrame | None) -> dict[str, Any] | None:
    """The recommended chunk (computed from the table, its one source) and the measured peaks."""
    if prompt is None:
        return None
    recommendation = analysis.recommend_chunk(prompt)
    peaks = prompt[prompt["metric"].isin(["peak_device_bytes", "peak_host_bytes"])
                   & (prompt["status"] == "ok")]
    return {"recommendation": recommendation,
            "peaks": [{"arm": r["arm"], "chunk": int(r["chunk"]), "metric": r["metric"],
                       "bytes": int(r["bytes"])} for _, r in peaks.iterrows()
                      if not pd.isna(r["bytes"])]}


def reference_verdicts(reference_root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Verdicts kept as evidence under ``data/reference/<machine>/<run id>/`` (labelled), and a
    sentence naming each folder or file that was not read as evidence, and why: hidden folders
    (a keep that was stopped), folders without ``kept.json``, records of the wrong shape."""
    root = Path(reference_root)
    folders, skipped = records.kept_folders(root)
    found = []
    for folder in folders:
        where = folder.path.relative_to(root).as_posix()
        try:
            data, label = folder.read_verdict(), folder.read_kept() or {}
        except UserError as exc:
            skipped.append(f"{where}: {exc}")
            continue
        if data is None:
            skipped.append(f"{where}: no {records.RunFolder.VERDICT}")
            continue
        found.append({"path": f"{where}/{records.RunFolder.VERDICT}",
                      "hardware": data.get("hardware"), "overall": data["overall"],
                      "run_id": folder.name, "forced": bool(label.get("forced")),
                      "status": label.get("status")})
    return found, skipped


def findings(verdict: dict[str, Any], tables: dict[str, pd.DataFrame]) -> list[str]:
    """Plain sentences of what this run measured, for the report's first screen."""
    out = []
    for cell in verdict["decisive"]:
        split = cell.get("stages_ms")
        if split:
            out.append(
                f"Seed's step at n={cell['rows']}, V={cell['vocab']}, K={cell['k']}: "
                f"{split['total']:.2f} ms on average, made of the queued forward "
                f"{split.get('forward', 0.0):.2f}, log-softmax "
                f"{split['device']:.2f}, zero-filled vector {split['alloc']:.2f}, copy "
                f"{split['copy']:.2f}, host top-K (C++) {split['host_gather']:.2f}, free "
                f"{split['free']:.2f} and unattributed {split['unattributed']:.2f} ms (time "
                "outside the timed stages; negative where stages overlap, as the vector's "
                "zero-fill and the log-softmax do on a GPU).")
    step = tables.get("step")
    if step is not None:
        for lever in verdict["step_levers"]:
            if _measured(lever.get("speedup")) and lever["candidate"] == REUSED:
                out.append(f"Reuse lever at step level (grow-only pageable vs fresh vector) at "
                           f"n={lever['rows']}, V={lever['vocab']}, K={lever['k']}: "
                           f"{lever['speedup']:.2f}x (CI [{lever['ci_low']:.2f}, "
                           f"{lever['ci_high']:.2f}]), {lever['saved_ms']:.2f} ms per step.")
        flagged = analysis.sync_warnings(step)
        if flagged:
            out.append(flagged)
        backends = analysis.host_gather_backends(step)
        for _, row in backends.iterrows():
            out.append(f"Host top-K at n={row['rows']}, V={row['vocab']}, K={row['k']}: native "
                       f"C++ {row['native_ms']:.2f} ms, numpy {row['numpy_ms']:.2f} ms on "
                       f"average ({row['numpy_over_native']:.1f}x).")
    out.extend(_zero_fill_findings(verdict, step))
    for cell in (verdict.get("carry_over") or {}).get("cells", []):
        if cell["flagged"]:
            out.append(f"Carry-over at {_cell_name(cell)}: "
                       f"{carryover.words(cell, verdict['carry_over']['bar'] * 2)}.")
    clocks = verdict["clock_check"]
    if clocks["checked"]:
        out.append(f"Host clock vs CUDA events: {clocks['disagree']} of {clocks['checked']} "
                   "timed calls disagreed beyond the tolerance (flagged in the data).")
    prompt = verdict.get("prompt_logprobs")
    if prompt and prompt["recommendation"].get("chunk") is not None:
        rec = prompt["recommendation"]
        out.append(f"Prompt logprobs: chunk {rec['chunk']} recommended for {rec['arm']} "
                   f"({rec['reason']}).")
    out.extend(verdict["missing"])
    out.extend(f"Not read as reference evidence: {why}." for why in verdict["reference_skipped"])
    for ref in verdict["reference"]:
        hardware = ref.get("hardware") or {}
        machine = hardware.get("gpu") or f"CPU only, {hardware.get('cpu') or 'unknown CPU'}"
        forced = (f", kept with --force although its status was {ref.get('status')}"
                  if ref.get("forced") else "")
        out.append(f"Committed reference evidence ({machine}; not this run{forced}): run "
                   f"{ref['run_id']} decided {(ref.get('overall') or {}).get('decision')}.")
    return out


def _zero_fill_findings(verdict: dict[str, Any], step: pd.DataFrame | None) -> list[str]:
    """The zero-fill cost from the seed's native vector (the step's ``alloc`` stage) and the
    shares of the step, each with its CI, at the largest cell measured; where the native step was
    not timed, the copy-level stand-in (a zero-filled torch buffer), labelled as such."""
    shares = analysis.stage_shares(step) if step is not None else pd.DataFrame()
    if not shares.empty:
        big = shares.assign(size=shares["rows"] * shares["vocab"]).sort_values("size").iloc[-1]
        if big["zero_fill_s_low"] is None or pd.isna(big["zero_fill_s_low"]):
            cost = f"{1e3 * big['zero_fill_s']:.2f} ms per step (one round: no CI)"
        else:
            cost = (f"{1e3 * big['zero_fill_s']:.2f} ms per step (CI "
                    f"{1e3 * big['zero_fill_s_low']:.2f}-{1e3 * big['zero_fill_s_high']:.2f})")
        size = int(big["rows"]) * int(big["vocab"]) * 4
        side = "above" if size > THRESHOLD_BYTES else "at or below"
        return [f"Zero-fill of the seed's fresh native vector (a value-initialised "
                f"std::vector, the step's alloc stage) at n={int(big['rows'])}, "
                f"V={int(big['vocab'])}, K={int(big['k'])}: {cost}; the vector is "
                f"{size / 2 ** 20:.1f} MiB, {side} glibc's largest mmap threshold (32 MiB): "
                f"{GLIBC_THRESHOLD_WORDS}, so a jump in zero-fill cost between sizes may be that "
                f"boundary. The copy is "
                f"{analysis.share_words(big, 'copy_share')} of the seed's step; alloc + copy + "
                f"free, which pinning removes or shrinks, "
                f"{analysis.share_words(big, 'pinning_share')}."]
    zero_fill = [c for c in verdict["copy_cells"]
                 if c["candidate"] == catalogue.ZERO_FILL_LEVER and _measured(c.get("speedup"))]
    if not zero_fill:
        return []
    big = max(zero_fill, key=lambda c: c["rows"] * c["vocab"])
    return [f"Zero-fill and free of a fresh {big['rows']} x {big['vocab']} fp32 buffer at the "
            f"copy level (a zero-filled torch buffer standing in for the seed's vector, whose "
            f"step was not timed) cost {big['saved_ms']:.2f} ms per copy: it takes "
            f"{big['speedup']:.2f}x the time of an uninitialised one (CI [{big['ci_low']:.2f}, "
            f"{big['ci_high']:.2f}])."]


def calibrate_rule(decisive: list[dict[str, Any]], trials: int, delta: float,
                   seed: int) -> list[dict[str, Any]]:
    """The rule's simulated error rates at the rounds this run's decisive cells have (the fewest)
    and for a family of as many cells, under every noise model at fixed rounds (rounds until
    resolved are calibrated in docs/decision-rule.md); none where no trials were asked for or no
    decisive cell has two rounds."""
    rounds = [c["baseline_rounds"] for c in decisive if c["baseline_rounds"] >= 2]
    if not trials or not rounds:
        return []
    return calibration.calibrate(trials=trials, rounds=min(rounds), delta=delta, seed=seed,
                                 cells=len(decisive), adaptive=[False]).to_dict("records")


def calibration_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """The calibration rows of a verdict, or one line saying why there are none."""
    if not verdict["calibration"]:
        return pd.DataFrame([{"calibration": "not simulated: no decisive cell has two rounds of "
                                             "the seed's step, or no trials were asked for"}])
    return pd.DataFrame(verdict["calibration"])


def check_parameters(delta: float, min_samples: int, confidence: float, decisive_rows: list[int],
                     decisive_vocabs: list[int], decisive_ks: list[int]) -> None:
    """Every parameter of :func:`build_verdict`, checked before any table is read."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, float) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
        raise ValueError(f"min_samples must be an integer of at least 2, got {min_samples!r}")
    for name, values in (("decisive_rows", decisive_rows), ("decisive_vocabs", decisive_vocabs),
                         ("decisive_ks", decisive_ks)):
        if not values:
            raise ValueError(f"{name} is empty: name the cells that decide")


def context_summary(decisive: list[dict[str, Any]], delta: float, log_softmax: str,
                    family: stats.FamilyDecision | None, on_cpu: bool = False,
                    overlap_order: str = forward.QUEUED) -> dict[str, Any]:
    """What every verdict states beside its decision: the device work queued before each step,
    what delta is a share of (with the logprobs-only bar beside it), where the log-softmax ran,
    and how the family of cells was combined."""
    forwards = sorted({c["forward_ms"] for c in decisive})
    bars = [c["logprobs_only_min_speedup"] for c in decisive
            if c.get("logprobs_only_min_speedup") is not None]
    return {"forward_ms": forwards,
            "delta": delta,
            "delta_of": "the decode step: forward pass + logprobs step (each timed call queues "
                        "forward_ms of device work before the step)",
            "min_speedup": 1 / (1 - delta),
            "logprobs_only_min_speedup": [min(bars), max(bars)] if bars else None,
            "log_softmax": log_softmax,
            "family": stats.FAMILY_METHOD,
            "family_reason": family.reason if family else "no decisive cell was measured",
            "words": context_words(forwards, delta,
                                   catalogue.log_softmax_place(log_softmax, on_cpu),
                                   overlap_order)}


OVERLAP_WORDS = {
    forward.QUEUED: ("the forward is queued without a wait before each timed step, so the seed's "
                     "host allocation (the fresh vector and its zero-fill) runs while the device "
                     "works, as in an engine that launches its forward asynchronously and first "
                     "waits at the logprobs copy; the copy itself cannot start before the "
                     "forward ends"),
    forward.WAITED: ("the device is waited on just before the seed's host allocation (outside "
                     "every timed stage, inside the timed call, in every arm alike), so the "
                     "fresh vector's zero-fill is paid in full after the forward, as in an "
                     "engine that waits (a synchronised copy, a pinned result read) before it "
                     "allocates: the other bound"),
}
# Which order the seed's sampler has, read from what this suite holds of the seed: its issue
# (shared/seed/000_536b2d57bdbc1ec4.txt) names the lines; sampler.cpp itself is not here.
SEED_OVERLAP = {
    "order": "unknown",
    "lead": forward.WAITED,
    "source": "the seed issue's line references (src/vllm/v1/sample/sampler.cpp); the sampler's "
              "code is not part of this suite",
    "words": ("The seed's sampler's overlap order is unknown: this suite holds the seed issue, "
              "not sampler.cpp. The issue places the processed_out vector at "
              "src/vllm/v1/sample/sampler.cpp:289, its copy at :293 and its b.Synchronize(q) at "
              ":296, and the raw_logprobs vector at :405, its copy from logits.data at :412 and "
              "its synchronize at :414, with the pinned greedy-argmax scratch (AllocPinned) at "
              ":225-255. Read in line order, raw_logprobs is allocated after the wait at :296 "
              "(the waited order), and processed_out after the greedy-argmax read if that read "
              "comes first; whether one step runs them in that order, or both at all, cannot be "
              "told from the issue, so the recommendation is given under both orders."),
}


def decide_order(step: pd.DataFrame, named: list[tuple[int, int, int]],
                 **kwargs: Any) -> dict[str, Any]:
    """The decisive family and the recommended change in one overlap order's rows, over the
    named cells whose seed step was timed in it (a profile may measure the other order at some
    cells only); ``measured``: whether any of them has its speedup (False where none, or no
    cell, was). Fewer rounds than a decision needs: not a decision."""
    here = [cell for cell in named if not analysis.by_round(
        step[(step["rows"] == cell[0]) & (step["vocab"] == cell[1]) & (step["k"] == cell[2])],
        BASELINE).empty]
    if not here:
        return {"measured": False, "cells": [], "decision": None, "change": None,
                "reason": "not measured in this order", "answers": {}}
    bundle, _ = decide_cells(step, here, CANDIDATE, **kwargs)
    decided = overall(bundle)["decision"]
    _, recommendation = answer_questions(step, here, bundle=bundle, **kwargs)
    short = not_a_decision(bundle)
    return {"measured": any(c.get("speedup") is not None for c in bundle),
            "cells": [_cell_name(c) for c in bundle],
            "decision": stats.INCONCLUSIVE if short else decided,
            "change": stats.NOT_A_DECISION if short else recommendation["change"],
            "reason": short or recommendation["reason"],
            "answers": {_cell_name(c): c["decision"] for c in bundle}}


def overlap_summary(step: pd.DataFrame, named: list[tuple[int, int, int]], assumed: str,
                    decisive: list[dict[str, Any]], decided: str,
                    recommendation: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The overlap order decided (``assumed``) and the other beside it, each with its family
    decision and recommended change (never a comparison across orders), whether the other
    changes any cell's answer, and which order the seed's sampler has (:data:`SEED_OVERLAP`).
    ``step``: the rows of every order, at the assumed place and regime."""
    under = {assumed: {"measured": bool(decisive) and any(
                           c.get("speedup") is not None for c in decisive),
                       "cells": [_cell_name(c) for c in decisive], "decision": decided,
                       "change": recommendation["change"], "reason": recommendation["reason"],
                       "answers": {_cell_name(c): c["decision"] for c in decisive}}}
    for order in forward.OVERLAP_ORDERS:
        if order != assumed:
            under[order] = decide_order(analysis.where_overlap(step, order), named, **kwargs)
    other = next(order for order in forward.OVERLAP_ORDERS if order != assumed)
    flips = [name for name, answer in under[other]["answers"].items()
             if under[assumed]["answers"].get(name) not in (None, answer)]
    changes = (None if not (under[other]["measured"] and under[assumed]["measured"]) else
               bool(flips) or (under[other]["cells"] == under[assumed]["cells"]
                               and under[other]["change"] != under[assumed]["change"]))
    return {"assumed": assumed, "recorded": analysis.overlap_orders(step), "under": under,
            "other": other, "changes_answer": changes, "flipped_cells": flips,
            "seed": SEED_OVERLAP,
            "words": f"Overlap order decided: {assumed}: {OVERLAP_WORDS[assumed]}.",
            "note": overlap_note(under, assumed, other, flips)}


def overlap_note(under: dict[str, dict[str, Any]], assumed: str, other: str,
                 flips: list[str]) -> str:
    """The recommendation under each overlap order, and the seed's, in sentences."""
    def one(order: str) -> str:
        found = under[order]
        if not found["cells"]:
            return f"with the forward {order}: not measured in this run"
        cells = ", ".join(found["cells"])
        return f"with the forward {order} ({cells}): {found['decision']}, {found['change']}"

    flipped = (f"; the {other} order changes the answer at {', '.join(flips)}" if flips else "")
    return (f"Recommendation {one(assumed)} (decided); {one(other)}{flipped}. "
            f"{SEED_OVERLAP['words']}")


def forward_summary(step: pd.DataFrame) -> dict[str, Any]:
    """The decode forward queued before each step: its nominal ms (per distinct value, with how
    it was reached) and the measured duration of the queued device work where recorded
    (``forward_measured_ms``; None on a CPU or where the run did not record it)."""
    ok = step[step["status"] == "ok"] if "status" in step else step
    nominal = ok[ok["metric"] == "forward_ms"]
    measured = ok[ok["metric"] == "forward_measured_ms"]["value"].dropna()
    return {"nominal_ms": sorted({float(v) for v in nominal["value"].dropna()}),
            "how": sorted({str(n) for n in nominal["note"].dropna() if str(n)}),
            "measured_ms": None if measured.empty else float(measured.mean()),
            "context_tokens": forward.DEFAULT_CONTEXT,
            "achievable_fraction": forward.ACHIEVABLE_FRACTION}


GLIBC_THRESHOLD_WORDS = ("glibc maps a block above its mmap threshold fresh every step (zero "
                         "pages faulted in, then unmapped); the threshold starts at 128 KiB and "
                         "rises to each mapped block freed, up to 32 MiB on a 64-bit machine, so "
                         "in a loop a vector up to 32 MiB reuses the heap and a larger one is "
                         "mapped fresh every step")
THRESHOLD_BYTES = 32 * 2 ** 20


def allocator_summary(step: pd.DataFrame, named: list[tuple[int, int, int]], decided: str,
                      **kwargs: Any) -> dict[str, Any]:
    """The seed vector's allocation regimes this run recorded (the process's malloc assumed, as
    the engine gets it), glibc's threshold in words, and whether the other regime, where it was
    measured, changes the answer (the decisive family decided under it)."""
    recorded = analysis.regimes(step)
    out: dict[str, Any] = {"regimes": recorded, "assumed": recorded[0] if recorded else None,
                           "threshold": GLIBC_THRESHOLD_WORDS, "other": []}
    if not recorded:
        out["note"] = ("not recorded: this run's rows predate the regime (glibc's malloc, "
                       "assumed)")
        return out
    for regime in recorded[1:]:
        cells, _ = decide_cells(analysis.where_regime(step, regime), named, CANDIDATE, **kwargs)
        answer = overall(cells)["decision"]
        out["other"].append({"regime": regime, "decision": answer,
                             "changes_answer": answer != decided,
                             "note": f"with the seed vector {regime} the family decides {answer}"})
    out["note"] = ("the regime changes the answer" if any(o["changes_answer"] for o in out["other"])
                   else "the regime does not change the answer" if out["other"] else
                   f"one regime measured ({recorded[0]}); the full profile measures both")
    return out


def with_machine(context: dict[str, Any], snapshot: dict[str, Any]) -> dict[str, Any]:
    """The context with the machine under the numbers (:func:`machine_context`), its sentence
    added to the context's words, and the measured forward beside the nominal."""
    machine = machine_context(snapshot)
    measured = (context.get("forward") or {}).get("measured_ms")
    forward = (f" The queued forward measured {measured:.3g} ms per call between its own CUDA "
               "events." if measured is not None else "")
    return {**context, "machine": machine,
            "words": f"{context['words']}{forward} {machine['words']}"}


def machine_context(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The runtime, kernel, THP, affinity and cgroup of the measuring machine, and how fast a
    fresh buffer filled there against the rate typical of bare metal: the seed's cost is that
    fill and its page faults, which memory virtualisation inflates."""
    machine = (snapshot or {}).get("machine") or {}
    if not machine:
        return {"recorded": False, "words": "The runtime and the fresh buffer's fill rate were "
                                            "not recorded (a snapshot taken before they were)."}
    runtime, fill = machine.get("runtime") or {}, machine.get("fresh_fill") or {}
    rate, typical = fill.get("fill_gbps"), fill.get("bare_metal_typical_gbps")
    below = rate is not None and typical is not None and rate < typical
    faults = (fill.get("stages") or {}).get("zero_fill", {}).get("minor_faults")
    where = (f"{runtime.get('kind', 'unknown')}, kernel {runtime.get('kernel', 'unknown')}, "
             f"THP {(machine.get('thp') or {}).get('enabled')}")
    if rate is None:
        words = f"The fresh buffer's fill rate was not measured ({where})."
    else:
        words = (f"A fresh {fill['bytes'] >> 20} MiB buffer filled at {rate:.2f} GB/s with "
                 f"{faults} minor page faults ({where})")
        words += (f", below the {typical:g} GB/s typical of bare metal: the seed's zero-fill "
                  "cost here is likely inflated by the machine." if below else ".")
    fault_path = _fault_path(str(runtime.get("kind") or ""), rate,
                             fill.get("bare_metal_range_gbps"))
    words += f" {fault_path}" if fault_path else ""
    return {"recorded": True, "runtime": runtime.get("kind"), "kernel": runtime.get("kernel"),
            "thp": machine.get("thp"), "affinity": machine.get("affinity"),
            "cgroup": machine.get("cgroup"), "fresh_fill_gbps": rate,
            "bare_metal_typical_gbps": typical, "fill_below_bare_metal": below,
            "zero_fill_minor_faults": faults, "fault_path": fault_path or None,
            "page_faults_per_stage": {
                name: stage.get("minor_faults")
                for name, stage in (fill.get("stages") or {}).items()},
            "words": words}


def _fault_path(kind: str, rate: float | None, bare_metal: list[float] | None) -> str:
    """On a VM, the sentence that names its fault path beside bare metal's fill range ('' on
    bare metal, or where the fill was not measured)."""
    if "vm" not in kind.split() or rate is None:
        return ""
    low, high = bare_metal or (4.0, 10.0)
    return (f"The measuring machine is a VM: each first-touch page fault goes through its memory "
            f"virtualisation (a nested page walk, the hypervisor's fault path), {rate:.2f} GB/s "
            f"here against {low:g}-{high:g} GB/s typical of bare metal, so the size of a margin "
            "in cells whose fresh vector faults afresh is partly a property of this VM's fault "
            "path, not of an engine's production host.")


def context_words(forwards: list[float], delta: float, log_softmax: str,
                  overlap_order: str = forward.QUEUED) -> str:
    """The context in one sentence, stated next to every verdict."""
    forward = ("no device work before the step (forward_ms = 0: a CPU run, or the upper bound "
               "of the saving)" if forwards == [0.0] else
               f"forward_ms = {', '.join(f'{f:g}' for f in forwards)} ms of device work queued "
               "before each step")
    return (f"Context: {forward}; delta = {delta:.0%} of the decode step (forward + logprobs "
            f"step); the log-softmax runs on the {log_softmax}. Overlap order {overlap_order}: "
            f"{OVERLAP_WORDS[overlap_order]}.")


def _other_assumption(step: pd.DataFrame, named: list[tuple[int, int, int]], assumed: str,
                      decided: str, **kwargs: Any) -> dict[str, Any]:
    """Whether the other place of the log-softmax, where this run measured it, would change the
    answer."""
    other = "host" if assumed == "device" else "device"
    rows = analysis.where_log_softmax(step, other)
    if analysis.ok_timings(rows).empty:
        return {"log_softmax": other, "measured": False, "decision": None,
                "changes_answer": None, "note": f"the log-softmax on the {other} was not "
                                                "measured in this run (the full profile does)"}
    cells, _ = decide_cells(rows, named, CANDIDATE, **kwargs)
    answer = overall(cells)["decision"]
    return {"log_softmax": other, "measured": True, "decision": answer,
            "changes_answer": answer != decided,
            "note": f"with the log-softmax on the {other} the family decides {answer}"}


def build_verdict(run_dir: Path | str, *, decisive_rows: list[int], decisive_vocabs: list[int],
                  decisive_ks: list[int], delta: float = 0.02, min_samples: int = 10,
                  confidence: float = 0.95, seed: int = 0, reference_root: Path | None = None,
                  calibration_trials: int = 0, log_softmax: str = "device",
                  overlap_order: str = forward.QUEUED) -> dict[str, Any]:
    """The verdict of a run folder as a JSON-ready dict (deterministic for the same folder).

    The decisive cells are decided as one family (:func:`stagelab.analyse.stats.decide_family`) under
    the assumption ``log_softmax`` (where the seed's log-softmax runs: ``device`` or ``host``);
    where the run also measured the other place, the verdict says whether it would change the
    answer. Likewise ``overlap_order`` (how the step meets the queued forward: ``queued`` or
    ``waited``): every figure is of that order's rows alone, and the other order's family and
    recommended change are given beside it (``context.overlap``, :func:`overlap_summary`).
    With ``calibration_trials``, the rule's error rates are simulated at this run's own number
    of rounds (the fewest the baseline has in a decisive cell) and its delta."""
    if log_softmax not in ("device", "host"):
        raise ValueError(f"log_softmax must be 'device' or 'host', got {log_softmax!r}")
    if overlap_order not in forward.OVERLAP_ORDERS:
        raise ValueError(f"overlap_order must be one of {list(forward.OVERLAP_ORDERS)}, got "
                         f"{overlap_order!r}")
    check_parameters(delta, min_samples, confidence, decisive_rows, decisive_vocabs, decisive_ks)
    run_dir = Path(run_dir)
    tables, missing = load_tables(run_dir)
    staging, step = tables.get("staging"), tables.get("step")
    kwargs: dict[str, Any] = dict(delta=delta, min_samples=min_samples, confidence=confidence,
                                  seed=seed)
    named = decisive_cells(decisive_rows, decisive_vocabs, decisive_ks)
    step_all = step if step is not None else schema.make_rows([])
    if step is not None:  # every step figure below: the assumed place, regime and order's rows
        step = tables["step"] = analysis.where_overlap(analysis.where_regime(
            analysis.where_log_softmax(step, log_softmax)), overlap_order)
    in_order = analysis.where_overlap(step_all, overlap_order)
    at_place = analysis.where_log_softmax(in_order, log_softmax)
    assumed_rows = analysis.where_regime(at_place)
    decisive, family = decide_cells(assumed_rows, named, CANDIDATE, **kwargs)
    decided = overall(decisive)
    questions, recommendation = answer_questions(assumed_rows, named, bundle=decisive, **kwargs)
    for index, cell in enumerate(decisive):
        cell["answers"] = {q: {key: answer["cells"][index].get(key) for key in
                               ("decision", "speedup", "ci_low", "ci_high")}
                           for q, answer in questions.items()}
    carry_over = carry_over_summary(assumed_rows, decisive, delta=delta,
                                    confidence=confidence)
    short = not_a_decision(decisive)
    if short:
        decided = {**decided, "decision": stats.INCONCLUSIVE,
                   "summary": f"{short} {decided['summary']}"}
        recommendation = {**recommendation, "change": stats.NOT_A_DECISION, "reason": short}
    overlap = overlap_summary(
        analysis.where_regime(analysis.where_log_softmax(step_all, log_softmax)), named,
        overlap_order, decisive, decided["decision"], recommendation, **kwargs)
    step_levers = [] if step is None else analysis.lever_savings(step, seed=seed).to_dict(
        "records")
    folder = records.RunFolder(run_dir)
    manifest = folder.read_manifest() if folder.manifest_path.exists() else {}
    hardware = manifest.get("hardware") or {}
    goals = []
    if staging is not None:
        goals += analysis.staging_goals(staging, hardware)
    if step is not None:
        goals.append(analysis.fused_goal(step))
    if tables.get("prompt_logprobs") is not None:
        goals += analysis.prompt_goals(tables["prompt_logprobs"])
    timed = [t for t in (staging, step) if t is not None]
    clocks = [analysis.clock_disagreements(t) for t in timed]
    verdict = {
        "run_id": run_dir.name,
        "hardware": analysis.hardware_summary(hardware),
        "parameters": {**kwargs, "decisive_rows": decisive_rows,
                       "decisive_vocabs": decisive_vocabs, "decisive_ks": decisive_ks,
                       "log_softmax": log_softmax, "overlap_order": overlap_order},
        "overall": decided,
        "recommendation": recommendation,
        "questions": questions,
        "context": with_machine({
            **context_summary(decisive, delta, log_softmax, family,
                              on_cpu=analysis.measured_on_cpu(step_all),
                              overlap_order=overlap_order),
            "forward": forward_summary(assumed_rows), "overlap": overlap,
            "allocator": allocator_summary(at_place, named, decided["decision"], **kwargs)},
            hardware),
        "other_log_softmax": _other_assumption(analysis.where_regime(in_order), named,
                                               log_softmax, decided["decision"], **kwargs),
        "decisive": decisive,
        "carry_over": carry_over,
        "step_levers": step_levers,
        "copy_cells": [] if staging is None else _copy_cells(staging, seed),
        "harness": harness_check(staging, step, named, delta=delta, confidence=confidence,
                                 seed=seed),
        "goals": goals,
        "clock_check": {"checked": sum(c["checked"] for c in clocks),
                        "disagree": sum(c["disagree"] for c in clocks)},
        "prompt_logprobs": _prompt_summary(tables.get("prompt_logprobs")),
        "calibration": calibrate_rule(decisive, calibration_trials, delta, seed),
        "calibration_requirements": calibration.REQUIREMENTS,
        "missing": missing,
        "measured_on": measured_origin(manifest),
    }
    verdict["reference"], verdict["reference_skipped"] = (
        reference_verdicts(reference_root) if reference_root else ([], []))
    verdict["prediction"] = predict.check_run(step,
                                              analysis.hardware_summary(hardware).get("gpu"))
    verdict["out_of_sample"] = predict.out_of_sample_run(
        step, analysis.hardware_summary(hardware).get("gpu"), predict.prior_rates(run_dir))
    verdict = _plain(verdict)
    verdict["findings"] = (findings(verdict, tables) + predict.check_words(verdict["prediction"])
                           + predict.out_of_sample_words(verdict["out_of_sample"]))
    if verdict["measured_on"] and verdict["measured_on"]["gaps"]:
        verdict["findings"].append("The measurement is partial, so cells may be missing: "
                                   + "; ".join(verdict["measured_on"]["gaps"]) + ".")
    if verdict["measured_on"] and verdict["measured_on"].get("rehearsal"):
        verdict["findings"].append("The measurement was a rehearsal (--rehearse-on-cpu, past a "
                                   "no-go on its decisive arms): it shows the suite runs, and is "
                                   "never evidence for the decision.")
    return verdict


def carry_over_summary(step: pd.DataFrame, decisive: list[dict[str, Any]], *, delta: float,
                       confidence: float) -> dict[str, Any]:
    """Each decisive cell's first-order carry-over (:mod:`stagelab.analyse.carryover`); a
    flagged cell's answer says so in its reason (``carry_over_flagged`` on the cell)."""
    cells = []
    for cell in decisive:
        rows = step[(step["rows"] == cell["rows"]) & (step["vocab"] == cell["vocab"])
                    & (step["k"] == cell["k"])]
        found = carryover.estimate(rows, delta=delta, confidence=confidence,
                                   baseline=BASELINE, candidate=CANDIDATE)
        cell["carry_over_flagged"] = found["flagged"]
        if found["flagged"]:
            cell["reason"] = f"{cell['reason']}; {carryover.words(found, delta)}"
        cells.append({"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"], **found})
    return {"method": carryover.METHOD, "bar": delta / 2, "cells": cells,
            "flagged": [_cell_name(c) for c in cells if c["flagged"]]}


def measured_origin(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Where a replayed run (``stagelab run --from``) was measured and what its measurement
    lacks; None for a run measured where it ran."""
    measured = manifest.get("measured_on")
    if not measured:
        return None
    return {key: measured.get(key) for key in ("host", "gpu", "device", "created_utc", "status",
                                               "forced", "rehearsal", "source", "gaps")}


# ------------------------------------------------------------------------- tables to show

DECISIVE_COLUMNS = ["rows", "vocab", "k", "decision", "speedup", "ci_low", "ci_high",
                    "min_speedup", "logprobs_only_min_speedup", "median_speedup", "port_bound",
                    "twin_speedup", "twin_ci_low", "twin_ci_high", "saved_ms", "step_ms",
                    "forward_ms", "log_softmax", "n_rounds", "reason", "note"]


def decisive_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """The decisive cells with their evidence and the seed step's stage split (ms)."""
    rows = [{**{c: cell.get(c) for c in DECISIVE_COLUMNS},
             **{f"{stage}_ms": ms for stage, ms in (cell.get("stages_ms") or {}).items()}}
            for cell in verdict["decisive"]]
    return pd.DataFrame(rows, columns=None if rows else DECISIVE_COLUMNS)


QUESTION_COLUMNS = ["question", "family", "rows", "vocab", "k", "decision", "speedup", "ci_low",
                    "ci_high", "tail_speedup", "tail", "n_rounds"]


def questions_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """The three questions (bundle, reuse alone, pinning alone) per decisive cell, each with its
    family's answer and the cell's speedup, CI, p99 tail speedup and its test (heavier, not
    heavier, unresolved)."""
    rows = [{"question": answer["words"], "family": answer["decision"] or "not measured",
             **{key: cell.get(key) for key in QUESTION_COLUMNS[2:]}}
            for answer in (verdict.get("questions") or {}).values() for cell in answer["cells"]]
    return pd.DataFrame(rows, columns=QUESTION_COLUMNS)


def levers_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """Every step-level lever against the seed's step, per cell."""
    return pd.DataFrame(verdict["step_levers"])


def copy_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """The copy-level comparisons (the mechanism), per cell."""
    return pd.DataFrame(verdict["copy_cells"])


def prompt_sentence(verdict: dict[str, Any]) -> str:
    """The prompt-logprob recommendation in one sentence, or why there is none."""
    prompt = verdict.get("prompt_logprobs")
    if not prompt:
        return "Notebook 03's data is missing from this run."
    return analysis.recommendation_sentence(prompt["recommendation"])


def reference_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """Committed reference verdicts from other machines, labelled; empty when there are none."""
    return pd.DataFrame([{"path": r["path"], "gpu": (r["hardware"] or {}).get("gpu"),
                          "cpu": (r["hardware"] or {}).get("cpu"),
                          "decision": (r["overall"] or {}).get("decision"),
                          "summary": (r["overall"] or {}).get("summary")}
                         for r in verdict["reference"]],
                        columns=["path", "gpu", "cpu", "decision", "summary"])
