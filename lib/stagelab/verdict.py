"""Port or close: the decision the suite exists for, computed from a run folder's tidy data alone.

Per ``(n, vocab)`` cell of the staging notebook, :func:`stagelab.stats.decide` compares the pinned
grow-only scratch with the seed's fresh pageable buffer, against the A/A noise band of that cell
and a minimum effect: a saving of ``min_effect_fraction`` (default 2 %) of the seed's whole step
(notebook 02), converted to the copy speedup that would save it. Rules:

* INCONCLUSIVE where the pinned arm was not measured (no GPU), where a cell has fewer samples than
  ``min_samples``, or where the CI overlaps a boundary; the reason is given per cell.
* PORT only when the CI lies entirely beyond the noise band and the minimum effect.
* CLOSE when the CI lies entirely within the noise band (or below it, or is real but too small).

Overall: PORT when some cell is PORT and no cell shows pinning slower; CLOSE when every cell is
CLOSE; INCONCLUSIVE otherwise. Bootstraps are seeded, so the same folder gives the same file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stagelab import bench, prompt_logprobs, schema, stats
from stagelab import step as step_module

TABLES = {"staging": "01_d2h_staging", "step": "02_logprobs_step",
          "prompt_logprobs": "03_prompt_logprobs"}
BASELINE, CANDIDATE, REUSE = "pageable_fresh", "pinned_grow_only", "pageable_reused"
RECOMMENDATION_FILE = "prompt_chunk_recommendation.json"


def load_tables(run_dir: Path) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """This run's tables, and a sentence for each one missing. A corrupt table raises, naming it."""
    tables, missing = {}, []
    for name, notebook in TABLES.items():
        try:
            tables[name] = schema.read_table(run_dir, name)
        except FileNotFoundError:
            missing.append(f"data/{name}.parquet is missing (notebook {notebook} did not write "
                           "it): the decisions that need it are INCONCLUSIVE")
    return tables, missing


def _seconds(frame: pd.DataFrame, arm: str, stage: str = "total") -> np.ndarray:
    rows = frame[(frame["arm"] == arm) & (frame["metric"] == "time") & (frame["stage"] == stage)
                 & (frame["status"] == "ok")]
    return rows["seconds"].to_numpy(dtype=float)


def _step_seconds(step: pd.DataFrame | None, rows: int, vocab: int) -> float | None:
    """Median seconds of the seed's whole step at this cell (over its K values), if measured."""
    if step is None:
        return None
    cell = step[(step["rows"] == rows) & (step["vocab"] == vocab)]
    seconds = _seconds(cell, "seed_pageable")
    return float(np.median(seconds)) if len(seconds) else None


def min_speedup_for(copy_seconds: float, step_seconds: float | None, fraction: float) -> float:
    """The copy speedup that saves ``fraction`` of the step (of the copy itself without a step);
    infinite when even a free copy would save less."""
    goal = fraction * (step_seconds if step_seconds else copy_seconds)
    if goal >= copy_seconds:
        return float("inf")
    return 1.0 / (1.0 - goal / copy_seconds)


def _unavailable_reason(cell: pd.DataFrame, arm: str) -> str:
    notes = cell.loc[(cell["arm"] == arm) & (cell["status"] != "ok"), "note"]
    return notes.iloc[0] if len(notes) else f"{arm} was not measured"


def decide_cell(cell: pd.DataFrame, candidate: str, step_seconds: float | None, *,
                min_effect_fraction: float, min_samples: int, confidence: float,
                seed: int) -> dict[str, Any]:
    """The decision for one ``(n, vocab)`` cell, with its evidence, as a JSON-ready dict."""
    base, cand = _seconds(cell, BASELINE), _seconds(cell, candidate)
    twin = _seconds(cell, bench.aa_name(BASELINE))
    out: dict[str, Any] = {"rows": int(cell["rows"].iloc[0]), "vocab": int(cell["vocab"].iloc[0]),
                           "candidate": candidate, "step_ms": None if step_seconds is None
                           else 1e3 * step_seconds}
    if len(cand) == 0:
        decision = stats.Decision(stats.INCONCLUSIVE, "not measured: "
                                  + _unavailable_reason(cell, candidate), n_baseline=len(base))
    elif min(len(base), len(twin)) < max(min_samples, 2):
        decision = stats.Decision(stats.INCONCLUSIVE, f"fewer samples than the minimum "
                                  f"({min(len(base), len(twin), len(cand))} < {min_samples})",
                                  n_baseline=len(base), n_candidate=len(cand))
    else:
        noise = stats.noise_band(base, twin, confidence, seed=seed)
        threshold = min_speedup_for(float(np.median(base)), step_seconds, min_effect_fraction)
        decision = stats.decide(base, cand, noise=noise, min_speedup=threshold,
                                min_samples=min_samples, confidence=confidence, seed=seed)
        if step_seconds is None:
            decision.reason += (f" (no step time for this cell: the minimum effect is "
                                f"{min_effect_fraction:.0%} of the copy)")
    out.update(decision.to_dict())
    if out.get("min_speedup") == float("inf"):
        out["min_speedup"] = None
        out["reason"] += "; even a free copy would save less than the minimum effect"
    out["saved_ms"] = None if out.get("saved_seconds") is None else 1e3 * out["saved_seconds"]
    out.pop("saved_seconds", None)
    return out


def overall(cells: list[dict[str, Any]]) -> dict[str, str]:
    """One decision over all cells, with a summary in plain words."""
    decisions = [c["decision"] for c in cells]
    if not cells:
        return {"decision": stats.INCONCLUSIVE,
                "summary": "No staging cell was measured in this run: nothing to decide from."}
    measured = [c for c in cells if c.get("n_candidate")]
    if not measured:
        return {"decision": stats.INCONCLUSIVE, "summary": (
            "The pinned staging arm was not measured in this run (" + cells[0]["reason"]
            .removeprefix("not measured: ") + "), so whether pinned staging helps cannot be "
            "decided here. See the findings for what was measured instead.")}
    slower = [c for c in measured if c.get("ci_high") is not None
              and c["ci_high"] < 1 - c["noise_half_width"]]
    ported = [c for c in measured if c["decision"] == stats.PORT]
    if ported and not slower:
        best = max(ported, key=lambda c: c["saved_ms"] or 0)
        return {"decision": stats.PORT, "summary": (
            f"Pinned grow-only staging is faster beyond the noise and the minimum effect in "
            f"{len(ported)} of {len(cells)} cells; the largest saving is {best['saved_ms']:.2f} "
            f"ms per step at n={best['rows']}, V={best['vocab']} ({best['speedup']:.2f}x, CI "
            f"[{best['ci_low']:.2f}, {best['ci_high']:.2f}]).")}
    if all(d == stats.CLOSE for d in decisions):
        return {"decision": stats.CLOSE, "summary": (
            f"In all {len(cells)} cells pinned grow-only staging is within the noise, slower, "
            "or too small to matter against the step: close without porting.")}
    counts = {d: decisions.count(d) for d in sorted(set(decisions))}
    return {"decision": stats.INCONCLUSIVE, "summary": (
        f"The cells disagree or are unresolved ({counts}); see the per-cell reasons.")}


def _lever_rows(staging: pd.DataFrame, step: pd.DataFrame | None,
                **kwargs) -> list[dict[str, Any]]:
    """The reuse lever (grow-only pageable vs fresh pageable) decided like the pinned arm."""
    rows = []
    for (n, vocab), cell in staging.groupby(["rows", "vocab"]):
        if len(_seconds(cell, REUSE)):
            rows.append(decide_cell(cell, REUSE, _step_seconds(step, n, vocab), **kwargs))
    return rows


def _step_levers(step: pd.DataFrame, seed: int) -> list[dict[str, Any]]:
    levers = step_module.lever_savings(step, seed=seed)
    parts = step_module.decomposition(step)
    seed_parts = parts[parts["arm"] == "seed_pageable"].set_index(["rows", "vocab", "k"])
    out = []
    for _, row in levers.iterrows():
        key = (row["rows"], row["vocab"], row["k"])
        share = seed_parts.loc[key] if key in seed_parts.index else None
        out.append({"rows": int(row["rows"]), "vocab": int(row["vocab"]), "k": int(row["k"]),
                    "lever": row["candidate"], "speedup": _num(row.get("speedup")),
                    "ci_low": _num(row.get("ci_low")), "ci_high": _num(row.get("ci_high")),
                    "saved_ms": _num(row.get("saved_ms")),
                    "seed_copy_share": None if share is None else _num(share["copy_share"]),
                    "seed_host_gather_share": None if share is None
                    else _num(share["host_gather_share"])})
    return out


def _num(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _prompt_summary(run_dir: Path, prompt: pd.DataFrame | None) -> dict[str, Any] | None:
    if prompt is None:
        return None
    path = run_dir / RECOMMENDATION_FILE
    recommendation = (json.loads(path.read_text()) if path.exists()
                      else prompt_logprobs.recommend_chunk(prompt))
    peaks = prompt[prompt["metric"].isin(["peak_device_bytes", "peak_host_bytes"])]
    return {"recommendation": recommendation,
            "peaks": [{"arm": r["arm"], "chunk": int(r["chunk"]), "metric": r["metric"],
                       "bytes": int(r["bytes"])} for _, r in peaks.iterrows()
                      if not pd.isna(r["bytes"])],
            "goals": prompt_logprobs.goal_checks(prompt).to_dict("records")}


def reference_verdicts(reference_root: Path) -> list[dict[str, Any]]:
    """Verdicts committed as evidence under ``data/reference/<gpu>/<run id>/``, labelled."""
    found = []
    for path in sorted(Path(reference_root).glob("*/*/verdict.json")):
        data = json.loads(path.read_text())
        found.append({"path": str(path.relative_to(reference_root)), "hardware": data.get("hardware"),
                      "overall": data.get("overall"), "run_id": data.get("run_id")})
    return found


def findings(verdict: dict[str, Any]) -> list[str]:
    """Plain sentences of what this run measured, for the report's first screen."""
    out = []
    reuse = [r for r in verdict["reuse_lever"] if r.get("speedup") is not None]
    if reuse:
        big = max(reuse, key=lambda r: r["rows"] * r["vocab"])
        out.append(f"Reuse lever (a grow-only pageable buffer vs a fresh one), largest cell n="
                   f"{big['rows']}, V={big['vocab']}: {big['speedup']:.2f}x (95 % CI "
                   f"[{big['ci_low']:.2f}, {big['ci_high']:.2f}]), {big['saved_ms']:.2f} ms per "
                   f"copy. Judged by the pinned arm's rules it is {big['decision']}: "
                   f"{big['reason']}.")
    shares = [s for s in verdict["step_levers"] if s["lever"] == "fused"]
    if shares:
        big = max(shares, key=lambda r: (r["rows"] * r["vocab"], r["k"]))
        out.append(f"Seed's step at n={big['rows']}, V={big['vocab']}, K={big['k']}: the copy is "
                   f"{big['seed_copy_share']:.0%} of it, the host top-K "
                   f"{big['seed_host_gather_share']:.0%}; the fused device path is "
                   f"{big['speedup']:.2f}x the seed's step (CI [{big['ci_low']:.2f}, "
                   f"{big['ci_high']:.2f}]), {big['saved_ms']:.2f} ms saved per step.")
    prompt = verdict.get("prompt_logprobs")
    if prompt and prompt["recommendation"].get("chunk") is not None:
        rec = prompt["recommendation"]
        out.append(f"Prompt logprobs: chunk {rec['chunk']} recommended for {rec['arm']} "
                   f"({rec['reason']}).")
        fused = [p for p in prompt["peaks"] if p["arm"].startswith("fused")]
        soft = [p for p in prompt["peaks"] if p["arm"].startswith("logsoftmax")]
        if fused and soft:
            out.append(f"Prompt-logprob peak working memory: fused {min(p['bytes'] for p in fused) / 2**20:.1f}-"
                       f"{max(p['bytes'] for p in fused) / 2**20:.1f} MiB, logsoftmax "
                       f"{min(p['bytes'] for p in soft) / 2**20:.1f}-"
                       f"{max(p['bytes'] for p in soft) / 2**20:.1f} MiB over the chunk sizes.")
    out.extend(verdict["missing"])
    for ref in verdict["reference"]:
        hardware = ref.get("hardware") or {}
        machine = hardware.get("gpu") or f"CPU only, {hardware.get('cpu') or 'unknown CPU'}"
        out.append(f"Committed reference evidence ({machine}; not this run): run "
                   f"{ref['run_id']} decided {(ref.get('overall') or {}).get('decision')}.")
    return out


def build_verdict(run_dir: Path | str, *, min_effect_fraction: float = 0.02,
                  min_samples: int = 10, confidence: float = 0.95, seed: int = 0,
                  reference_root: Path | None = None) -> dict[str, Any]:
    """The verdict of a run folder as a JSON-ready dict (deterministic for the same folder)."""
    if not 0 <= min_effect_fraction < 1:
        raise ValueError(f"min_effect_fraction must be in [0, 1), got {min_effect_fraction}")
    if min_samples < 2:
        raise ValueError(f"min_samples must be at least 2, got {min_samples}")
    run_dir = Path(run_dir)
    tables, missing = load_tables(run_dir)
    staging, step = tables.get("staging"), tables.get("step")
    kwargs = dict(min_effect_fraction=min_effect_fraction, min_samples=min_samples,
                  confidence=confidence, seed=seed)
    cells = [] if staging is None else [
        decide_cell(cell, CANDIDATE, _step_seconds(step, rows, vocab), **kwargs)
        for (rows, vocab), cell in staging.groupby(["rows", "vocab"])]
    manifest_path = run_dir / "manifest.json"
    hardware = json.loads(manifest_path.read_text()).get("hardware", {}) if (
        manifest_path.exists()) else {}
    verdict = {
        "run_id": run_dir.name,
        "hardware": {"gpu": (hardware.get("gpu") or {}).get("name"),
                     "cpu": (hardware.get("host") or {}).get("cpu_model"),
                     "torch": (hardware.get("torch") or {}).get("torch")},
        "parameters": {**kwargs},
        "overall": overall(cells) if staging is not None else {
            "decision": stats.INCONCLUSIVE,
            "summary": "The staging table is missing from this run: nothing to decide from."},
        "cells": cells,
        "reuse_lever": [] if staging is None else _lever_rows(staging, step, **kwargs),
        "step_levers": [] if step is None else _step_levers(step, seed),
        "prompt_logprobs": _prompt_summary(run_dir, tables.get("prompt_logprobs")),
        "missing": missing,
        "reference": reference_verdicts(reference_root) if reference_root else [],
    }
    verdict["findings"] = findings(verdict)
    return json.loads(json.dumps(verdict, default=_num))  # plain JSON types only
