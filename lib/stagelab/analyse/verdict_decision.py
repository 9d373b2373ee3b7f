"""The decision from the step's rows: each decisive cell's evidence and answer, the family's
answer over them, the four questions and the change they recommend, and the A/A harness check.

The rule itself (the bars, the family, the tail, the rounds a decision needs) is
:mod:`stagelab.analyse.stats`; this module applies it to a run's cells. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from stagelab.analyse import (
    carryover,
    paired,
    quantile_bound,
    sequence,
    stats,
    step_analysis,
    timings,
)
from stagelab.core import catalogue, design

BASELINE, CANDIDATE, TWIN = catalogue.decisive_arms()
REUSED = catalogue.REUSE_LEVER[catalogue.STEP]
DEFERRED = catalogue.DEFERRED_WAIT


@dataclass(frozen=True)
class Rule:
    """The decision rule's settings, built once and passed as one value: the smallest effect of
    interest (``delta``, a share of the decode step), the rounds a cell needs before the rule
    decides it (``min_samples``), the family's ``confidence`` and the bootstrap's ``seed``;
    whether a cell whose order's rows show carry-over is decided on the corrected speedup
    (``carry_over``) and whether a fresh vector's recorded regimes are decided at the family's
    mix (``regimes``; docs/decision-rule.md, issue 49). Checked when built, before any table is
    read; the verdict records it as its parameters."""

    delta: float = 0.02
    min_samples: int = 10
    confidence: float = 0.95
    seed: int = 0
    carry_over: bool = True
    regimes: bool = True

    def __post_init__(self) -> None:
        delta, confidence, min_samples = self.delta, self.confidence, self.min_samples
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if isinstance(confidence, bool) or not isinstance(confidence, float) or not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
            raise ValueError(f"min_samples must be an integer of at least 2, got {min_samples!r}")

    @property
    def min_speedup(self) -> float:
        """The bar on the ratio of mean step times: a saving of delta of the decode step."""
        return 1 / (1 - self.delta)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the verdict's ``parameters``."""
        return asdict(self)


def _num(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


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
    step_rounds = timings.by_round(cell, baseline)
    out["baseline_rounds"] = len(step_rounds)
    out["min_speedup"] = 1 / (1 - delta)
    decode_ms = _mean_ms(step_rounds.to_numpy(dtype=float))
    out["step_ms"] = decode_ms
    if decode_ms is not None:
        logprobs_ms = max(decode_ms - out["forward_ms"], 0.0)
        out["logprobs_step_ms"] = logprobs_ms
        out["logprobs_only_min_speedup"] = (
            decode_ms / (decode_ms - delta * logprobs_ms) if logprobs_ms else None)
        forward_ms = out["forward_ms"] or 0.0
        out["forward_only_min_speedup"] = (  # the bar for delta of the forward alone
            decode_ms / (decode_ms - delta * forward_ms) if 0 < delta * forward_ms < decode_ms
            else None)
    out["stages_ms"] = _stage_split(cell)
    out["vector_regime"] = vector_regime(cell, baseline)
    out["p99_step"] = quantile_bound.bound(timings.by_round(cell, candidate).to_numpy(dtype=float),
                                           candidate).to_dict()
    arms = (baseline, candidate) if twin is None else (baseline, candidate, twin)
    failures = _failures(cell, arms)
    out["failures"] = failures
    for arm, words in ((baseline, "not measured: "), (candidate, "not measured: "),
                       (twin, "the A/A check is missing: ")):
        if arm is not None and timings.by_round(cell, arm).empty:
            out["reason"] = words + timings.not_measured_reason(cell, arm)
            return out, None
    paired = timings.paired_rounds(cell, *arms)
    inputs = {"baseline": paired[0], "candidate": paired[1],
              "twin": paired[2] if twin is not None else None,
              "min_speedup": out["min_speedup"], **order_effects(cell, arms)}
    return out, inputs


def _as_ruled(inputs: dict[str, Any], rule: Rule) -> dict[str, Any]:
    """A cell's inputs without what ``rule`` leaves out (the carry-over correction, the
    regimes)."""
    left_out = (("carry_over",) * (not rule.carry_over)
                + ("regime", "twin_regime") * (not rule.regimes))
    return {key: value for key, value in inputs.items() if key not in left_out}


def forward_only_answer(cell: dict[str, Any]) -> str | None:
    """Where the cell's CI lies against the bar for delta of the forward alone (the bar in ms
    that does not grow with the host step being measured): ``above``, ``below`` or
    ``straddles``; None where either is unknown."""
    bar, low, high = (cell.get("forward_only_min_speedup"), cell.get("ci_low"),
                      cell.get("ci_high"))
    if bar is None or low is None or high is None:
        return None
    return "above" if low > bar else "below" if high < bar else "straddles"


def order_effects(cell: pd.DataFrame, arms: tuple[str, ...]) -> dict[str, Any]:
    """What the rule takes from a cell's rows beside the timings: the fresh vectors' regime per
    paired round (``regime``, ``twin_regime``: whether the vector was mapped fresh, where
    every paired round recorded it and both regimes occur) and the carry-over correction of the
    first two arms' comparison (:func:`stagelab.analyse.carryover.correction`, None where the
    order's rows do not show it)."""
    rounds = sorted(set.intersection(*(set(timings.by_round(cell, a).index) for a in arms)))
    calls, names = carryover.calls_from_rows(cell)
    found: dict[str, Any] = {"carry_over": (
        carryover.correction(calls, len(names), names.index(arms[0]), names.index(arms[1]))
        if arms[0] in names and arms[1] in names else None)}
    for key, arm in zip(("regime", "twin_regime"), (arms[0], arms[2] if len(arms) > 2 else None)):
        labels = _mapped_by_round(cell, arm, rounds) if arm is not None else None
        if labels is not None:
            found[key] = labels
    return found


def _mapped_by_round(cell: pd.DataFrame, arm: str, rounds: list[int]) -> np.ndarray | None:
    """Whether ``arm``'s fresh vector was mapped fresh in each of ``rounds`` (its ``alloc``
    rows' ``mapped``); None unless every round has it and both regimes occur."""
    if "mapped" not in cell:
        return None
    alloc = cell[(cell["arm"] == arm) & (cell["stage"] == "alloc") & (cell["status"] == "ok")
                 & cell["mapped"].notna() & cell["round"].notna()]
    mapped = alloc.drop_duplicates("round").set_index("round")["mapped"]
    if not set(rounds) <= set(mapped.index) or mapped.loc[rounds].nunique() < 2:
        return None
    return mapped.loc[rounds].astype(bool).to_numpy()


def decide_cells(step: pd.DataFrame, named: list[tuple[int, int, int]], candidate: str,
                 rule: Rule, *, baseline: str = BASELINE, twin: str | None = TWIN,
                 ) -> tuple[list[dict[str, Any]], stats.FamilyDecision | None]:
    """Every named decisive cell with its decision, and the family's decision over the measured
    ones (:func:`stagelab.analyse.stats.decide_family`; None when no cell was measured)."""
    evidence = [cell_evidence(step, n, v, k, candidate, delta=rule.delta, baseline=baseline,
                              twin=twin) for n, v, k in named]
    measured = [_as_ruled(inputs, rule) for _, inputs in evidence if inputs is not None]
    family = (stats.decide_family(measured, min_samples=rule.min_samples,
                                  confidence=rule.confidence, seed=rule.seed)
              if measured else None)
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
        cell["forward_only_answer"] = forward_only_answer(cell)
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
    parts = step_analysis.decomposition(cell)
    seed = parts[parts["arm"] == BASELINE]
    if seed.empty:
        return None
    row = seed.iloc[0]
    return {stage: 1e3 * float(row[stage]) for stage in (*step_analysis.SPLIT, catalogue.TOTAL)}


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
    "deferral": (CANDIDATE, DEFERRED, None),  # tested last, only where the scratch is ported
}
QUESTION_WORDS = {
    "bundle": "reuse + pinning: pinned grow-only scratch vs a fresh zero-filled vector",
    "reuse": "reuse alone: grow-only pageable buffer vs a fresh zero-filled vector",
    "pinning": "pinning alone: pinned grow-only scratch vs grow-only pageable buffer",
    "deferral": "deferring the wait, given pinning: the pinned scratch with its wait one step "
                "late vs the pinned scratch",
}
ANSWER_KEYS = ("decision", "speedup", "ci_low", "ci_high", "tail_speedup", "tail_bound",
               "tail_upper_bound", "tail", "noninferior_bound", "saved_ms", "n_rounds", "reason")


def answer_questions(step: pd.DataFrame, named: list[tuple[int, int, int]], rule: Rule, *,
                     bundle: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The four questions, each a family over the decisive cells
    (:func:`stagelab.analyse.stats.decide_family`): their answers, and the change recommended
    from them as a fixed sequence (:func:`stagelab.analyse.sequence.recommend`). ``bundle``: the
    decisive cells, already decided. A question none of whose arms ran is None."""
    answers: dict[str, Any] = {}
    for question, (baseline, candidate, twin) in QUESTIONS.items():
        cells = bundle if question == "bundle" else decide_cells(
            step, named, candidate, rule, baseline=baseline, twin=twin)[0]
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
    change, reason = sequence.recommend(answers["bundle"]["decision"], pinning_family,
                                     answers["reuse"]["decision"],
                                     cells=[_cell_name(c) for c in pinning["cells"]])
    change, reason = sequence.recommend_deferral(change, reason, answers["deferral"]["decision"])
    return answers, {"change": change, "reason": reason,
                     "method": f"{sequence.SEQUENCE}; {sequence.DEFERRAL_SEQUENCE}"}


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


def harness_check(staging: pd.DataFrame | None, step: pd.DataFrame | None,
                  named: list[tuple[int, int, int]], rule: Rule) -> dict[str, Any]:
    """The run's A/A harness check, every twin as one family (:func:`stagelab.analyse.paired.twin_checks`):
    the seed's step against its twin in each decisive cell, and the fresh pageable copy against
    its twin in each copy cell. :mod:`stagelab.analyse.trust` reads it."""
    labelled: list[tuple[dict[str, Any], list[np.ndarray]]] = []
    if step is not None:
        for n, v, k in named:
            cell = step[(step["rows"] == n) & (step["vocab"] == v) & (step["k"] == k)]
            labelled.append(({"level": "step", "rows": n, "vocab": v, "k": k},
                             timings.paired_rounds(cell, BASELINE, TWIN)))
    if staging is not None:
        fresh = catalogue.baseline(catalogue.STAGING)
        for key, part in timings.cells(staging, ["rows", "vocab"]):
            labelled.append(({"level": "copy", **key},
                             timings.paired_rounds(part, fresh, catalogue.aa_name(fresh))))
    level, checks = paired.twin_checks([(pair[0], pair[1]) for _, pair in labelled if len(pair[0])],
                                      delta=rule.delta, confidence=rule.confidence,
                                      seed=rule.seed)
    found = iter(checks)  # a cell without twin rounds is listed, unchecked, and not counted in m
    unchecked = {"n_rounds": 0, "twin_speedup": None, "twin_ci_low": None, "twin_ci_high": None,
                 "differs": None, "note": "no round timed both the baseline and its twin"}
    return {"method": paired.TWIN_METHOD, "confidence": level,
            "family_confidence": rule.confidence, "delta": rule.delta,
            "checks": [{**label, **(next(found) if len(pair[0]) else unchecked)}
                       for label, pair in labelled]}


def check_parameters(decisive_rows: list[int], decisive_vocabs: list[int],
                     decisive_ks: list[int]) -> None:
    """The decisive cells :func:`build_verdict` is given, checked before any table is read (its
    :class:`Rule` checks itself when built)."""
    for name, values in (("decisive_rows", decisive_rows), ("decisive_vocabs", decisive_vocabs),
                         ("decisive_ks", decisive_ks)):
        if not values:
            raise ValueError(f"{name} is empty: name the cells that decide")


def decide_order(step: pd.DataFrame, named: list[tuple[int, int, int]],
                 rule: Rule) -> dict[str, Any]:
    """The decisive family and the recommended change in one overlap order's rows, over the
    named cells whose seed step was timed in it (a profile may measure the other order at some
    cells only); ``measured``: whether any of them has its speedup (False where none, or no
    cell, was). Fewer rounds than a decision needs: not a decision. Measured at only some of the
    named cells: not decided (``decision`` and ``change`` None, the reason says where it was
    measured), since the family of the cells measured is not the decisive family and its answer
    is one the rule would not give (issue 49: the gate's waited order at one cell)."""
    here = [cell for cell in named if not timings.by_round(
        step[(step["rows"] == cell[0]) & (step["vocab"] == cell[1]) & (step["k"] == cell[2])],
        BASELINE).empty]
    if not here:
        return {"measured": False, "cells": [], "decision": None, "change": None,
                "reason": "not measured under this value", "answers": {}}
    bundle, _ = decide_cells(step, here, CANDIDATE, rule)
    if len(here) < len(named):  # a family of some cells is not the decisive family
        return {"measured": any(c.get("speedup") is not None for c in bundle),
                "cells": [_cell_name(c) for c in bundle], "decision": None, "change": None,
                "reason": f"measured at {len(here)} of the {len(named)} decisive cells, not "
                          "decided: each cell's answer is shown, but a family answer needs "
                          "every decisive cell measured in this order",
                "answers": {_cell_name(c): c["decision"] for c in bundle}}
    decided = overall(bundle)["decision"]
    _, recommendation = answer_questions(step, here, rule, bundle=bundle)
    short = not_a_decision(bundle)
    return {"measured": any(c.get("speedup") is not None for c in bundle),
            "cells": [_cell_name(c) for c in bundle],
            "decision": stats.INCONCLUSIVE if short else decided,
            "change": sequence.NOT_A_DECISION if short else recommendation["change"],
            "reason": short or recommendation["reason"],
            "answers": {_cell_name(c): c["decision"] for c in bundle}}

