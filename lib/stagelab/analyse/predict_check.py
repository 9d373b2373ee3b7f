"""The cost model checked against a run: in sample (fed the run's own host rates: additivity) and
out of sample (fed host rates the run did not produce), per stage, arm and question, in words and
tables. Torch-free."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from stagelab.analyse.predict_model import (
    FALSIFICATION_RULE,
    QUESTIONS,
    Model,
    cpu_model,
    gpu_model,
    stated_figures,
)
from stagelab.analyse.predict_tables import (
    BASELINE,
    CPU_PLATFORM,
    HOST_METRIC,
    REUSED,
    Cell,
    HostClass,
    HostRates,
    Platform,
    at_mid,
    corners,
    host_rates,
    hosts_of,
    platform_of_gpu,
)
from stagelab.core import catalogue, forward, paths


def _measured_stage_means(cell: pd.DataFrame, arm: str) -> dict[str, float]:
    """An arm's mean ms per stage and in total (rounds where its total was timed)."""
    timed = cell[(cell["metric"] == "time") & (cell["status"] == "ok") & (cell["arm"] == arm)]
    return {str(stage): 1e3 * float(part["seconds"].mean())
            for stage, part in timed.groupby("stage", observed=True)}


def _error(predicted: float, measured: float | None) -> float | None:
    if measured is None or not measured or not math.isfinite(predicted):
        return None
    return predicted / measured - 1


def check_cell(step: pd.DataFrame, rows: int, vocab: int, k: int, *,
               platform: Platform | None, dims: forward.ModelDims | None = None,
               log_softmax: str = "device") -> dict[str, Any] | None:
    """One measured cell against the model fed that cell's own host rates: per stage of the
    seed's step and per arm, predicted (interval) beside measured (mean) with the error, a note
    where the measurement lies outside the interval; and the reuse lever's ratio. None where the
    cell has no host rates or no timed seed step."""
    cell = step[(step["rows"] == rows) & (step["vocab"] == vocab) & (step["k"] == k)]
    rates = host_rates(cell)
    if not rates.samples or not _measured_stage_means(cell, BASELINE):
        return None
    forward = cell[(cell["metric"] == "forward_ms") & (cell["status"] == "ok")]["value"].dropna()
    shape = Cell(rows, vocab, k, dims, log_softmax)
    model = (cpu_model(shape, rates) if platform is None else
             gpu_model(platform, shape, rates, float(forward.iloc[0]) if len(forward) else None))
    stages, arms = _stage_and_arm_checks(model, cell)
    return {"platform": model.platform, "rows": rows, "vocab": vocab, "k": k,
            "stages": stages, "arms": arms, "reuse_ratio": _reuse_ratio(model, cell),
            "notes": model.notes + [f"{c['name']}: measured {c['measured_ms']:.3g} ms lies "
                                    f"outside the predicted [{c['low_ms']:.3g}, "
                                    f"{c['high_ms']:.3g}] ms"
                                    for c in stages + arms if c["outside"]]}


UNTIMED_STAGES = ("forward", "wait", "host_softmax")  # checked only where the step timed them


def _stage_and_arm_checks(model: Model, cell: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """Each stage of the seed's step and each arm's step: the stated interval
    (:func:`stagelab.analyse.predict_model.stated_figures`) beside the measured mean."""
    stages, arms = [], []
    measured_base = _measured_stage_means(cell, BASELINE)
    for figure in stated_figures(model):
        if figure["level"] == "stage" and (figure["name"] not in UNTIMED_STAGES
                                           or figure["name"] in measured_base):
            stages.append(_compared(figure, measured_base.get(figure["name"])))
        elif figure["level"] == "arm":
            measured = _measured_stage_means(cell, figure["name"]).get(catalogue.TOTAL)
            if measured is not None:
                arms.append(_compared(figure, measured))
    return stages, arms


def falsifies(measured: float | None, low: float, high: float) -> bool | None:
    """The falsification rule for one figure (:data:`FALSIFICATION_RULE`): True where the
    measured value lies outside the stated ``[low, high]``, False inside, None where nothing was
    measured."""
    if measured is None:
        return None
    return not low <= measured <= high


def _compared(figure: Mapping[str, Any], measured: float | None) -> dict[str, Any]:
    mid, low, high = figure["predicted_ms"], figure["low_ms"], figure["high_ms"]
    return {"name": figure["name"], "predicted_ms": mid, "low_ms": low, "high_ms": high,
            "measured_ms": measured, "error": _error(mid, measured),
            "outside": bool(falsifies(measured, low, high))}


def _reuse_ratio(model: Model, cell: pd.DataFrame) -> dict[str, Any] | None:
    """The reuse lever's ratio of mean steps (fresh vector / reused buffer), predicted beside
    measured."""
    base = _measured_stage_means(cell, BASELINE).get(catalogue.TOTAL)
    reused = _measured_stage_means(cell, REUSED).get(catalogue.TOTAL)
    every = corners(model.knobs)
    ratios = model.totals(BASELINE, every) / model.totals(REUSED, every)
    mid = at_mid(model.knobs)
    predicted = float((model.totals(BASELINE, mid) / model.totals(REUSED, mid))[0])
    measured = base / reused if base and reused else None
    return {"predicted": predicted, "low": float(ratios.min()), "high": float(ratios.max()),
            "measured": measured, "error": _error(predicted, measured),
            "outside": measured is not None and not ratios.min() <= measured <= ratios.max()}


def models_by_vocab() -> dict[int, forward.ModelDims]:
    """Forward dimensions by vocabulary size, from the model table (the first model of each
    vocabulary); the forward of a cell given as a bare size is unknown (0)."""
    out: dict[int, forward.ModelDims] = {}
    for name, row in forward.model_table().items():
        out.setdefault(int(row["vocab"]), forward.model_dims(name))
    return out


def check_run(step: pd.DataFrame | None, gpu_name: str | None,
              platforms: Mapping[str, Platform] | None = None) -> dict[str, Any]:
    """Every measured step cell against the model: a GPU run against its platform's row (when
    the table has one), a CPU run against the host model; JSON-ready, for the verdict."""
    if step is None or step.empty:
        return {"platform": None, "cells": [], "note": "no step table: nothing to check"}
    platform = platform_of_gpu(gpu_name, platforms)
    if gpu_name and platform is None:
        return {"platform": None, "cells": [],
                "note": f"{gpu_name} has no row in data/platforms.csv: not checked"}
    models = models_by_vocab()
    step, log_softmax = _one_place(step)  # both places measured: the device's are checked
    keys = step[step["metric"] == HOST_METRIC][["rows", "vocab", "k"]].drop_duplicates()
    cells = [check_cell(step, int(r.rows), int(r.vocab), int(r.k), platform=platform,
                        dims=models.get(int(r.vocab)), log_softmax=log_softmax)
             for r in keys.sort_values(["vocab", "rows", "k"]).itertuples()]
    cells = [c for c in cells if c is not None]
    return {"platform": platform.name if platform else CPU_PLATFORM, "cells": cells,
            "kind": IN_SAMPLE_KIND,
            "note": "" if cells else "no cell has both host rates and a timed seed step"}


IN_SAMPLE_KIND = ("additivity: the model fed the cell's own host rates (and, on a GPU, the "
                  "forward the run queued), so it tests that the stages add up, not a prediction")
OUT_OF_SAMPLE_KIND = ("out of sample: the model fed host rates the run did not produce (measured "
                      "before it in another process, or the platform's host classes) and its "
                      "own forward, against the run's measured stages and savings")
PRIOR_ORIGIN = "host rates measured before the run, in another process"


def prior_rates(run_dir: Path | str) -> HostRates | None:
    """The host rates a run measured before its step, in another process
    (:mod:`stagelab.measure.priorrates`), bounded; None where it has none."""
    path = Path(run_dir) / paths.HOST_PRIOR_ROWS
    if not path.is_file():
        return None
    from stagelab.core import measured, schema

    rows = schema.read_json_lines(path, root=run_dir, most=measured.MAX_TABLE_ROWS)
    rates = host_rates(schema.make_rows(rows), origin=PRIOR_ORIGIN)
    return rates if rates.samples else None


def _question_checks(model: Model, cell: pd.DataFrame) -> list[dict[str, Any]]:
    """Per question the run measured both arms of: the stated saving per step (point and
    interval) beside the measured one (difference of mean steps), with the error."""
    out = []
    for figure in stated_figures(model):
        if figure["level"] != "question":
            continue
        base_arm, cand_arm = QUESTIONS[figure["name"]]
        base = _measured_stage_means(cell, base_arm).get(catalogue.TOTAL)
        cand = _measured_stage_means(cell, cand_arm).get(catalogue.TOTAL)
        if base is None or cand is None:
            continue
        checked = _compared(figure, base - cand)
        checked["error_ms"] = figure["predicted_ms"] - (base - cand)
        out.append(checked)
    return out


def _step_cells(step: pd.DataFrame) -> list[tuple[int, int, int]]:
    timed = step[(step["metric"] == "time") & (step["arm"] == BASELINE)]
    return sorted({(int(r.rows), int(r.vocab), int(r.k))
                   for r in timed[["rows", "vocab", "k"]].drop_duplicates().itertuples()},
                  key=lambda c: (c[1], c[0], c[2]))


def out_of_sample_run(step: pd.DataFrame | None, gpu_name: str | None,
                      prior: HostRates | None = None,
                      platforms: Mapping[str, Platform] | None = None) -> dict[str, Any]:
    """The model fed inputs the run did not produce, against what it measured, per cell: each
    stage and arm, and each question's saving (the pinning saving where both arms ran). Its
    host: the rates measured before the run in another process, else (a GPU run) its
    platform's usual host classes; its forward: the model's, not the one the run queued.
    JSON-ready, for the verdict (``out_of_sample``)."""
    empty: dict[str, Any] = {"kind": OUT_OF_SAMPLE_KIND, "platform": None, "host": None,
                             "cells": []}
    if step is None or step.empty:
        return {**empty, "note": "no step table: nothing to check"}
    platform = platform_of_gpu(gpu_name, platforms)
    if gpu_name and platform is None:
        return {**empty, "note": f"{gpu_name} has no row in data/platforms.csv: not checked"}
    hosts: list[HostRates | HostClass] = []
    if prior is not None and prior.samples:
        hosts.append(prior)
    elif platform is not None:
        hosts += hosts_of(platform)
    if not hosts:
        return {**empty, "note": "no host rates were measured before this CPU run: nothing out "
                                 "of sample to check (the in-sample check tests additivity)"}
    step, log_softmax = _one_place(step)
    models = models_by_vocab()
    cells = []
    for rows, vocab, k in _step_cells(step):
        frame = step[(step["rows"] == rows) & (step["vocab"] == vocab) & (step["k"] == k)]
        shape = Cell(rows, vocab, k, models.get(vocab), log_softmax)
        for host in hosts:
            model = (gpu_model(platform, shape, host) if platform is not None
                     else cpu_model(shape, host) if isinstance(host, HostRates) else None)
            if model is None:
                continue
            stages, arms = _stage_and_arm_checks(model, frame)
            cells.append({"rows": rows, "vocab": vocab, "k": k, "host": model.host,
                          "stages": stages, "arms": arms,
                          "questions": _question_checks(model, frame), "notes": model.notes})
    return {**empty, "platform": platform.name if platform else CPU_PLATFORM,
            "host": ", ".join(h.origin for h in hosts), "cells": cells,
            "note": "" if cells else "no timed seed step", "falsification": falsification(cells)}


def _figures(cell: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [*cell["stages"], *cell["arms"], *cell["questions"]]


def falsification(cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each figure's pass or fail under :data:`FALSIFICATION_RULE` (per cell of ``rows``,
    ``vocab``, ``k``: ``held`` True when its measured value lies inside the interval of at least
    one host, None where it was not measured), and the overall answer: ``held`` True (the model
    held), False (it failed at the figures named in ``failed_at``), None (nothing measured)."""
    verdicts: dict[tuple[int, int, int, str], bool | None] = {}
    for cell in cells:
        for figure in _figures(cell):
            key = (cell["rows"], cell["vocab"], cell["k"], figure["name"])
            fails = falsifies(figure.get("measured_ms"), figure["low_ms"], figure["high_ms"])
            inside = None if fails is None else not fails
            figure["held"] = inside
            if inside is not None:
                verdicts[key] = bool(verdicts.get(key)) or inside
    failed = [f"{name} at n={rows}, V={vocab}, K={k}"
              for (rows, vocab, k, name), inside in verdicts.items() if inside is False]
    held = None if not verdicts else not failed
    words = ("nothing measured to check the model against" if held is None else
             f"the model held: all {len(verdicts)} measured figures lie inside their predicted "
             "intervals" if held else
             f"the model failed at {len(failed)} of {len(verdicts)} figures: {'; '.join(failed)}")
    return {"rule": FALSIFICATION_RULE, "held": held, "failed_at": failed,
            "figures": len(verdicts), "words": words}


FIRST_SCREEN_FAILED = 3  # the failed figures the first screen names; the rest are counted


def stated_lines(check: Mapping[str, Any] | None) -> list[str]:
    """The first screen's line for a GPU run's out-of-sample check (``out_of_sample``): whether
    the prediction stated before the run held or FAILED, and where; none for a CPU run, a
    verdict before the check, or nothing measured to judge."""
    verdict = (check or {}).get("falsification") or {}
    if check is None or check.get("platform") in (None, CPU_PLATFORM) or verdict.get(
            "held") is None:
        return []
    if verdict["held"]:
        return [f"Prediction stated before the run held ({check['platform']}): all "
                f"{verdict['figures']} measured figures lie inside their predicted intervals."]
    failed = verdict["failed_at"]
    named = "; ".join(failed[:FIRST_SCREEN_FAILED]) + (
        f"; and {len(failed) - FIRST_SCREEN_FAILED} more" if len(failed) > FIRST_SCREEN_FAILED
        else "")
    return [f"Prediction stated before the run FAILED ({check['platform']}) at {len(failed)} "
            f"of {verdict['figures']} figures: {named}."]


def _one_place(step: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The step rows of one log-softmax placement (the device's, where both were measured)."""
    where = sorted(step["log_softmax"].dropna().unique()) if "log_softmax" in step else []
    log_softmax = "device" if "device" in where or not where else str(where[0])
    if len(where) > 1:
        step = step[step["log_softmax"].isna() | (step["log_softmax"] == log_softmax)]
    return step, log_softmax


def out_of_sample_words(check: Mapping[str, Any]) -> list[str]:
    """The out-of-sample check in sentences: per cell and host, the seed step and each measured
    saving, predicted beside measured with the error; first whether the model held or failed
    (:func:`falsification`)."""
    verdict = check.get("falsification") or {}
    out = [f"Out of sample, {verdict['words']} ({verdict['rule']})."] if verdict.get(
        "held") is not None else []
    for cell in check.get("cells") or []:
        total = next((a for a in cell["arms"] if a["name"] == BASELINE), None)
        parts = []
        if total:
            parts.append(f"seed step predicted {total['predicted_ms']:.2f} ms, measured "
                         f"{total['measured_ms']:.2f} ms ({_percent(total['error'])})")
        parts += [f"{q['name']} saving predicted {q['predicted_ms']:.3g} ms [{q['low_ms']:.3g}, "
                  f"{q['high_ms']:.3g}], measured {q['measured_ms']:.3g} ms ("
                  f"{q['error_ms']:+.3g} ms)" for q in cell["questions"]]
        if parts:
            out.append(f"Out of sample ({check['platform']}, {cell['host']}, n={cell['rows']}, "
                       f"V={cell['vocab']}, K={cell['k']}): {'; '.join(parts)}.")
    return out


def check_words(check: Mapping[str, Any]) -> list[str]:
    """The check in sentences: per cell, the seed step's total and the reuse ratio, predicted
    beside measured with the error, and every disagreement beyond the interval."""
    out = []
    for cell in check.get("cells") or []:
        total = next((a for a in cell["arms"] if a["name"] == BASELINE), None)
        ratio = cell.get("reuse_ratio")
        parts = []
        if total:
            parts.append(f"seed step predicted {total['predicted_ms']:.2f} ms "
                         f"[{total['low_ms']:.2f}, {total['high_ms']:.2f}], measured "
                         f"{total['measured_ms']:.2f} ms ({_percent(total['error'])})")
        if ratio and ratio["measured"] is not None:
            parts.append(f"reuse lever predicted {ratio['predicted']:.2f}x "
                         f"[{ratio['low']:.2f}, {ratio['high']:.2f}], measured "
                         f"{ratio['measured']:.2f}x ({_percent(ratio['error'])})")
        if parts:
            disagree = [n for n in cell["notes"] if "outside the predicted" in n]
            out.append(f"Prediction ({check['platform']}, n={cell['rows']}, V={cell['vocab']}, "
                       f"K={cell['k']}): {'; '.join(parts)}."
                       + (f" Outside the interval: {'; '.join(disagree)}." if disagree else ""))
    return out


def _percent(error: float | None) -> str:
    return "error unknown" if error is None else f"error {error:+.0%}"


# The check table's columns in reading order: which cell, what, predicted, measured, the error.
CHECK_COLUMNS = ("rows", "vocab", "k", "host", "level", "name", "predicted_ms", "low_ms",
                 "high_ms", "measured_ms", "error", "outside", "error_ms")


def check_table(check: Mapping[str, Any]) -> pd.DataFrame:
    """The check as one table: per cell (and host, out of sample), each stage, arm and
    question's saving, predicted beside measured."""
    rows = []
    for cell in check.get("cells") or []:
        on = {"host": cell["host"]} if "host" in cell else {}
        for kind in ("stages", "arms", "questions"):
            rows += [{"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"], **on,
                      "level": kind[:-1], **c} for c in cell.get(kind) or []]
        ratio = cell.get("reuse_ratio")
        if ratio:
            rows.append({"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"],
                         "level": "ratio", "name": "reuse lever (x)",
                         "predicted_ms": ratio["predicted"], "low_ms": ratio["low"],
                         "high_ms": ratio["high"], "measured_ms": ratio["measured"],
                         "error": ratio["error"], "outside": ratio["outside"]})
    table = pd.DataFrame(rows)
    order = [c for c in CHECK_COLUMNS if c in table] + [c for c in table if c not in CHECK_COLUMNS]
    return table[order]  # a verdict.json read back has its keys sorted: its order is not ours


# Each level of the check, as its own table's title.
LEVEL_TITLES = {"stage": "Each stage of the seed's step (ms)",
                "arm": "Each arm's whole step (ms)",
                "question": "Each question's saving per step, baseline − candidate (ms)",
                "ratio": "The reuse lever: the ratio of the two arms' steps (x, not ms)"}


def check_tables(check: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """:func:`check_table` as one table per level (stages, arms, questions, the ratio), each
    under its title and with only its own columns: narrower, and the ratio's figures not
    labelled as milliseconds."""
    table = check_table(check)
    if table.empty:
        return {}
    out = {}
    for level, rows in table.groupby("level", sort=False):
        rows = rows.drop(columns="level").dropna(axis=1, how="all").reset_index(drop=True)
        if level == "ratio":
            rows = rows.rename(columns=lambda c: c.removesuffix("_ms"))
        out[LEVEL_TITLES.get(level, str(level))] = rows
    return out

