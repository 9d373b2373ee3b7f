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
(:mod:`stagelab.analyse.predict_model`, fed this run's own host rates) beside what the run measured.
Deterministic: the same folder gives the same file.
Torch-free. The rule in full (the three questions, the 149-round floor, the p99 tail check, the
allocator regimes, the forward model, the calibration): docs/decision-rule.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stagelab.analyse import (
    calibration,
    carryover,
    goal_rows,
    predict_check,
    prompt_analysis,
    sequence,
    stats,
    step_analysis,
    summaries,
    timings,
    trust,
)
from stagelab.analyse.verdict_decision import (
    BASELINE,
    CANDIDATE,
    Rule,
    _cell_name,
    _num,
    answer_questions,
    check_parameters,
    decide_cells,
    decide_order,
    decisive_cells,
    harness_check,
    not_a_decision,
    overall,
)
from stagelab.analyse.verdict_words import (
    GLIBC_THRESHOLD_WORDS,
    SEED_OVERLAP,
    _fault_path,
    condition_note,
    context_words,
    findings,
)
from stagelab.core import catalogue, forward, records, schema
from stagelab.core.errors import UserError

TABLES = catalogue.tables()


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


def _copy_cells(staging: pd.DataFrame, seed: int) -> list[dict[str, Any]]:
    """Copy level (the mechanism): pinned grow-only and reused pageable against fresh pageable."""
    out = []
    fresh = catalogue.baseline(catalogue.STAGING)
    levers = (catalogue.candidate(catalogue.STAGING), catalogue.REUSE_LEVER[catalogue.STAGING],
              catalogue.ZERO_FILL_LEVER)
    for candidate in levers:
        compared = timings.compare(staging, fresh, candidate, ["rows", "vocab"], twin=True,
                                    seed=seed)
        out += compared.to_dict("records")
    return out


def _prompt_summary(prompt: pd.DataFrame | None,
                    manifest: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The recommended chunk (computed from the table, its one source; none where the prompt
    notebook ran on a busy machine, as the run's record says) and the measured peaks."""
    if prompt is None:
        return None
    busy = [r for r in trust.load_reasons(manifest or {})
            if r.startswith(catalogue.notebook_of(catalogue.PROMPT).name)]
    recommendation = prompt_analysis.recommend_chunk(prompt, trusted=not busy)
    peaks = prompt[prompt["metric"].isin(["peak_device_bytes", "peak_host_bytes"])
                   & (prompt["status"] == "ok")]
    return {"recommendation": recommendation,
            "peaks": [{"arm": r["arm"], "chunk": int(r["chunk"]), "metric": r["metric"],
                       "bytes": int(r["bytes"]),
                       # head_fused's vocabulary tile: before, its tiles' peaks were mixed
                       **({"tile": int(r["tile"])} if not pd.isna(r.get("tile")) else {})}
                      for _, r in peaks.iterrows() if not pd.isna(r["bytes"])]}


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


def calibrate_rule(decisive: list[dict[str, Any]], trials: int,
                   rule: Rule) -> list[dict[str, Any]]:
    """The rule's simulated error rates at the rounds this run's decisive cells have (the fewest)
    and for a family of as many cells, under every noise model at fixed rounds (rounds until
    resolved are calibrated in docs/decision-rule.md); none where no trials were asked for or no
    decisive cell has two rounds."""
    rounds = [c["baseline_rounds"] for c in decisive if c["baseline_rounds"] >= 2]
    if not trials or not rounds:
        return []
    plan = calibration.Plan(trials=trials, rounds=min(rounds), delta=rule.delta, seed=rule.seed,
                            cells=len(decisive))
    return calibration.calibrate(plan, adaptive=[False]).to_dict("records")


def context_summary(decisive: list[dict[str, Any]], delta: float, decided: Mapping[str, str],
                    family: stats.FamilyDecision | None, on_cpu: bool = False) -> dict[str, Any]:
    """What every verdict states beside its decision: the device work queued before each step,
    what delta is a share of (with the logprobs-only bar beside it), where the log-softmax ran,
    each step condition's value decided under (``decided``, by condition name) and how the
    family of cells was combined."""
    forwards = sorted({c["forward_ms"] for c in decisive})
    bars = [c["logprobs_only_min_speedup"] for c in decisive
            if c.get("logprobs_only_min_speedup") is not None]
    return {"forward_ms": forwards,
            "delta": delta,
            "delta_of": "the decode step: forward pass + logprobs step (each timed call queues "
                        "forward_ms of device work before the step)",
            "min_speedup": 1 / (1 - delta),
            "logprobs_only_min_speedup": [min(bars), max(bars)] if bars else None,
            "log_softmax": decided[catalogue.LOG_SOFTMAX.name],
            "family": stats.FAMILY_METHOD,
            "family_reason": family.reason if family else "no decisive cell was measured",
            "words": context_words(forwards, delta, decided, on_cpu)}


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


FORMAT = 2  # 1: before issue 47, the conditions were three blocks (see the schema's format)
CONDITION_CONTEXT: dict[str, dict[str, Any]] = {  # what a condition's block says beside it
    catalogue.OVERLAP.name: {"seed": SEED_OVERLAP},
    catalogue.ALLOCATOR.name: {"threshold": GLIBC_THRESHOLD_WORDS},
}


def at_values(step: pd.DataFrame, decided: dict[str, str], but: str = "") -> pd.DataFrame:
    """The step rows at each condition's decided value (every value of the condition ``but``)."""
    for condition in catalogue.CONDITIONS:
        if condition.name != but:
            step = step_analysis.where_condition(step, condition, decided[condition.name])
    return step


def _flips(under: dict[str, dict[str, Any]], decided: str) -> dict[str, list[str]]:
    """Per other value of a condition, the cells whose answer differs from the decided value's."""
    return {value: [name for name, answer in found["answers"].items()
                    if under[decided]["answers"].get(name) not in (None, answer)]
            for value, found in under.items() if value != decided}


def _changes(under: dict[str, dict[str, Any]], decided: str, flips: dict[str, list[str]]
             ) -> bool | None:
    """Whether another measured value of a condition changes the answer: a cell flips, or over
    the same cells the recommended change differs (None where no other value was measured)."""
    measured = [value for value in flips if under[value]["measured"]]
    if not measured or not under[decided]["measured"]:
        return None
    return any(flips[value] or (under[value]["cells"] == under[decided]["cells"]
                                and under[value]["change"] != under[decided]["change"])
               for value in measured)


def condition_summary(step: pd.DataFrame, named: list[tuple[int, int, int]],
                      condition: catalogue.Condition, decided: dict[str, str],
                      rule: Rule) -> dict[str, Any]:
    """One step condition in the verdict: the value decided, the values the rows record, under
    each value its family decision and recommended change over the decisive cells measured
    there (the other conditions at their decided values; never a comparison across values),
    whether another value changes the answer, and the cells it flips. ``step``: every row."""
    rows = at_values(step, decided, but=condition.name)
    value = decided[condition.name]
    under = {v: decide_order(step_analysis.where_condition(rows, condition, v), named, rule)
             for v in dict.fromkeys((value, *condition.values))}
    flips = _flips(under, value)
    return {"column": condition.column, "decided": value,
            "values": step_analysis.condition_values(rows, condition), "under": under,
            "changes_answer": _changes(under, value, flips),
            "flipped_cells": sorted({cell for cells in flips.values() for cell in cells}),
            "words": condition.words[value], "note": condition_note(condition, under, value, flips),
            **CONDITION_CONTEXT.get(condition.name, {})}


# Notebook 04's parameters that build its rule (its ``conditions`` choose each step condition's
# decided value, by name).
RULE_PARAMETERS = ("delta", "min_samples", "confidence", "seed")


def decided_conditions(chosen: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each step condition's decided value: its catalogue default, under ``chosen`` (by
    condition name); ValueError naming an unknown condition or value."""
    chosen = dict(chosen or {})
    unknown = set(chosen) - {c.name for c in catalogue.CONDITIONS}
    if unknown:
        raise ValueError(f"conditions: no step condition {sorted(unknown)}; known: "
                         f"{[c.name for c in catalogue.CONDITIONS]}")
    for condition in catalogue.CONDITIONS:
        value = chosen.setdefault(condition.name, condition.decides)
        if value not in condition.values:
            raise ValueError(f"conditions: {condition.name} must be one of "
                             f"{list(condition.values)}, got {value!r}")
    return chosen


def arguments(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`build_verdict`'s rule and conditions from notebook 04's parameters of those names
    (the notebook's call and ``keep``'s re-derivation read them alike; parameters recorded in an
    older shape are read through :mod:`stagelab.core.parameter_history` first)."""
    return {"rule": Rule(**{k: parameters[k] for k in RULE_PARAMETERS if k in parameters}),
            "conditions": dict(parameters.get("conditions") or {})}


def build_verdict(run_dir: Path | str, *, decisive_rows: list[int], decisive_vocabs: list[int],
                  decisive_ks: list[int], rule: Rule | None = None,
                  conditions: Mapping[str, str] | None = None,
                  reference_root: Path | None = None,
                  calibration_trials: int = 0) -> dict[str, Any]:
    """The verdict of a run folder as a JSON-ready dict (deterministic for the same folder).

    The decisive cells are decided as one family (:func:`stagelab.analyse.stats.decide_family`)
    by ``rule`` (:class:`Rule`'s defaults where None), under each step condition's decided value
    (``conditions``, by name, over the catalogue's defaults: where the seed's log-softmax runs,
    the fresh vector's allocator, the overlap order): every figure is of those rows alone, and
    each condition's other values, their family and recommended change, are given beside it
    (``conditions``, :func:`condition_summary`). With ``calibration_trials``, the rule's error
    rates are simulated at this run's own number of rounds (the fewest the baseline has in a
    decisive cell) and its delta."""
    rule = rule or Rule()
    decided_values = decided_conditions(conditions)
    log_softmax = decided_values[catalogue.LOG_SOFTMAX.name]
    check_parameters(decisive_rows, decisive_vocabs, decisive_ks)
    run_dir = Path(run_dir)
    tables, missing = load_tables(run_dir)
    staging, step = tables.get("staging"), tables.get("step")
    named = decisive_cells(decisive_rows, decisive_vocabs, decisive_ks)
    step_all = step if step is not None else schema.make_rows([])
    assumed_rows = at_values(step_all, decided_values)
    if step is not None:  # every step figure below: each condition's decided value's rows
        step = tables["step"] = assumed_rows
    decisive, family = decide_cells(assumed_rows, named, CANDIDATE, rule)
    decided = overall(decisive)
    questions, recommendation = answer_questions(assumed_rows, named, rule, bundle=decisive)
    for index, cell in enumerate(decisive):
        cell["answers"] = {q: {key: answer["cells"][index].get(key) for key in
                               ("decision", "speedup", "ci_low", "ci_high")}
                           for q, answer in questions.items()}
    carry_over = carry_over_summary(assumed_rows, decisive, rule)
    short = not_a_decision(decisive)
    if short:
        decided = {**decided, "decision": stats.INCONCLUSIVE,
                   "summary": f"{short} {decided['summary']}"}
        recommendation = {**recommendation, "change": sequence.NOT_A_DECISION, "reason": short}
    step_levers = [] if step is None else step_analysis.lever_savings(step, seed=rule.seed).to_dict(
        "records")
    folder = records.RunFolder(run_dir)
    manifest = folder.read_manifest() if folder.manifest_path.exists() else {}
    hardware = manifest.get("hardware") or {}
    goals = []
    if staging is not None:
        goals += goal_rows.staging_goals(staging, hardware)
    if step is not None:
        goals.append(goal_rows.fused_goal(step))
    if tables.get("prompt_logprobs") is not None:
        goals += goal_rows.prompt_goals(tables["prompt_logprobs"])
    timed = [t for t in (staging, step) if t is not None]
    clocks = [summaries.clock_disagreements(t) for t in timed]
    verdict = {
        "format": FORMAT,
        "run_id": run_dir.name,
        "hardware": summaries.hardware_summary(hardware),
        "parameters": {**rule.as_dict(), "decisive_rows": decisive_rows,
                       "decisive_vocabs": decisive_vocabs, "decisive_ks": decisive_ks,
                       "log_softmax": log_softmax,
                       catalogue.OVERLAP.column: decided_values[catalogue.OVERLAP.name],
                       "conditions": decided_values},
        "overall": decided,
        "recommendation": recommendation,
        "questions": questions,
        "context": with_machine({
            **context_summary(decisive, rule.delta, decided_values, family,
                              on_cpu=step_analysis.measured_on_cpu(step_all)),
            "forward": forward_summary(assumed_rows)}, hardware),
        "conditions": {condition.name: condition_summary(step_all, named, condition,
                                                         decided_values, rule)
                       for condition in catalogue.CONDITIONS},
        "decisive": decisive,
        "carry_over": carry_over,
        "step_levers": step_levers,
        "copy_cells": [] if staging is None else _copy_cells(staging, rule.seed),
        "harness": harness_check(staging, step, named, rule),
        "goals": goals,
        "clock_check": {"checked": sum(c["checked"] for c in clocks),
                        "disagree": sum(c["disagree"] for c in clocks)},
        "prompt_logprobs": _prompt_summary(tables.get("prompt_logprobs"), manifest),
        "calibration": calibrate_rule(decisive, calibration_trials, rule),
        "calibration_requirements": calibration.REQUIREMENTS,
        "missing": missing,
        "measured_on": measured_origin(manifest),
    }
    verdict["reference"], verdict["reference_skipped"] = (
        reference_verdicts(reference_root) if reference_root else ([], []))
    verdict["prediction"] = predict_check.check_run(step,
                                              summaries.hardware_summary(hardware).get("gpu"))
    verdict["out_of_sample"] = predict_check.out_of_sample_run(
        step, summaries.hardware_summary(hardware).get("gpu"), predict_check.prior_rates(run_dir))
    verdict = _plain(verdict)
    verdict["findings"] = (findings(verdict, tables) + predict_check.check_words(verdict["prediction"])
                           + predict_check.out_of_sample_words(verdict["out_of_sample"]))
    if verdict["measured_on"] and verdict["measured_on"]["gaps"]:
        verdict["findings"].append("The measurement is partial, so cells may be missing: "
                                   + "; ".join(verdict["measured_on"]["gaps"]) + ".")
    if verdict["measured_on"] and verdict["measured_on"].get("rehearsal"):
        verdict["findings"].append("The measurement was a rehearsal (--rehearse-on-cpu, past a "
                                   "no-go on its decisive arms): it shows the suite runs, and is "
                                   "never evidence for the decision.")
    return verdict


def carry_over_summary(step: pd.DataFrame, decisive: list[dict[str, Any]],
                       rule: Rule) -> dict[str, Any]:
    """Each decisive cell's first-order carry-over (:mod:`stagelab.analyse.carryover`); a
    flagged cell's answer says so in its reason (``carry_over_flagged`` on the cell)."""
    cells = []
    for cell in decisive:
        rows = step[(step["rows"] == cell["rows"]) & (step["vocab"] == cell["vocab"])
                    & (step["k"] == cell["k"])]
        found = carryover.estimate(rows, delta=rule.delta, confidence=rule.confidence,
                                   baseline=BASELINE, candidate=CANDIDATE)
        cell["carry_over_flagged"] = found["flagged"]
        if found["flagged"]:
            cell["reason"] = f"{cell['reason']}; {carryover.words(found, rule.delta)}"
        cells.append({"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"], **found})
    return {"method": carryover.METHOD, "bar": rule.delta / 2, "cells": cells,
            "flagged": [_cell_name(c) for c in cells if c["flagged"]]}


def measured_origin(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Where a replayed run (``stagelab run --from``) was measured and what its measurement
    lacks; None for a run measured where it ran."""
    measured = manifest.get("measured_on")
    if not measured:
        return None
    return {key: measured.get(key) for key in ("host", "gpu", "device", "created_utc", "status",
                                               "forced", "rehearsal", "source", "gaps")}

