"""``stagelab predict``: the verdict's three answers per GPU platform and decisive cell, before
any lease, from the cost model (:mod:`stagelab.analyse.predict`).

The host rates come from a folder that recorded them (a run folder, a kept run or a ``stagelab
measure`` folder: its step table's ``host_rate`` rows) or, without one, are measured here and now
at the decisive cells' sizes (:mod:`stagelab.measure.hostrates`, a few seconds; no GPU needed).
The GPU terms come from ``data/platforms.csv``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from stagelab.analyse import predict
from stagelab.core import catalogue, forward, measured, schema
from stagelab.core.errors import UserError
from stagelab.run import profiles


def decisive_cells(profile: str) -> list[predict.Cell]:
    """The profile's decisive cells (its verdict notebook's rows x models x K), each with its
    model's forward dimensions."""
    values = profiles.profile_parameters(profile).get(catalogue.VERDICT_NOTEBOOK)
    if values is None:
        raise UserError(f"profile {profile!r} has no {catalogue.VERDICT_NOTEBOOK}: "
                        "no decisive cells")
    shapes = model_table()
    cells = []
    for model in values["decisive_models"]:
        vocab, dims = (shapes[model] if isinstance(model, str) and model in shapes
                       else (int(model), None))
        cells += [predict.Cell(n, vocab, k, dims) for n in values["decisive_rows"]
                  for k in values["decisive_ks"]]
    return cells


def model_table() -> dict[str, tuple[int, forward.ModelDims]]:
    """``model -> (vocab, forward dimensions)`` from data/model_shapes.csv."""
    return {name: (int(row["vocab"]), forward.model_dims(name))
            for name, row in forward.model_table().items()}


def rates_from_folder(folder: Path) -> tuple[predict.HostRates, str]:
    """The host rates a folder recorded (a measured folder, a replay's ``measured/`` copy or a
    run's step table), and where they came from; UserError when it has none. A measured folder
    is read as a stranger's files are."""
    folder = Path(folder)
    frame = None
    for candidate in (folder, folder / "measured"):
        try:
            frame = schema.make_rows(measured.MeasuredFolder(candidate).table_rows("step"))
            break
        except FileNotFoundError:
            continue
    if frame is None:
        try:
            frame = schema.read_table(folder, "step")
        except FileNotFoundError:
            raise UserError(f"--rates {folder}: no step table (rows/step.jsonl.gz or "
                            "data/step.parquet) to read host rates from") from None
    rates = predict.host_rates(frame)
    if not rates.samples:
        raise UserError(f"--rates {folder}: its step table has no host_rate rows (recorded "
                        "since issue 29; measure again, or leave --rates out to measure here)")
    return rates, f"host rates recorded in {folder}"


def rates_measured_here(cells: list[predict.Cell]) -> tuple[predict.HostRates, str]:
    """The host rates of this machine, measured now at the cells' sizes (torch, no GPU)."""
    from stagelab.measure import hostrates

    rows = []
    for rows_, vocab in sorted({(c.rows, c.vocab) for c in cells}):
        rows += hostrates.measure_rates(rows_, vocab, max(c.k for c in cells), repeats=3)
    return (predict.host_rates(schema.make_rows(rows)),
            "host rates measured on this machine now (repeats=3 per size)")


def predictions(platforms: list[predict.Platform], cells: list[predict.Cell],
                rates: predict.HostRates, delta: float) -> list[dict[str, Any]]:
    """Per platform: every cell's prediction, and the crossing n x V per vocabulary."""
    out = []
    for platform in platforms:
        predicted = [predict.predict_cell(predict.gpu_model(platform, cell, rates), delta)
                     for cell in cells]
        by_vocab = {(c.vocab, c.k): c.model for c in cells}
        crossings = [predict.crossing(platform, vocab, k, model, rates, delta)
                     for (vocab, k), model in sorted(by_vocab.items())]
        out.append({"platform": platform, "cells": predicted, "crossings": crossings})
    return out


def _ms(low: float, high: float) -> str:
    return f"[{low:.3g}, {high:.3g}] ms"


def format_platform(entry: Mapping[str, Any]) -> str:
    """One platform's prediction in plain lines."""
    p: predict.Platform = entry["platform"]
    lines = [f"{p.name}: {p.link}; pinned D2H {p.pinned_gbps[0]:g}-{p.pinned_gbps[1]:g} GB/s, "
             f"pageable {p.pageable_gbps[0]:g}-{p.pageable_gbps[1]:g} GB/s, HBM "
             f"{p.hbm_gbps:g} GB/s"]
    for cell in entry["cells"]:
        lines.append(f"  n={cell['rows']} V={cell['vocab']} K={cell['k']}:")
        for arm, a in cell["arms"].items():
            lines.append(f"    {arm:22} {a['mid_ms']:8.3f} ms {_ms(a['low_ms'], a['high_ms'])}")
        for ans in cell["answers"]:
            lines.append(
                f"    {ans['question']:8} {ans['decision']:28} saving {ans['saving_ms']:.3g} ms "
                f"{_ms(ans['saving_low_ms'], ans['saving_high_ms'])} vs bar "
                f"{ans['bar_ms']:.3g} ms {_ms(ans['bar_low_ms'], ans['bar_high_ms'])}; "
                f"dominating term: {ans['dominant_term']}")
        for note in cell["notes"]:
            lines.append(f"    note: {note}")
    for c in entry["crossings"]:
        sure = f"{c['port_from_nv']:,}" if c["port_from_nv"] else "never in the scan"
        maybe = f"{c['may_port_from_nv']:,}" if c["may_port_from_nv"] else "never in the scan"
        lines.append(f"  crossing ({c['question']}, V={c['vocab']}): PORT for sure from n x V = "
                     f"{sure}; possibly from {maybe} (scanned {c['scanned_nv'][0]:,}-"
                     f"{c['scanned_nv'][1]:,})")
    return "\n".join(lines)


def regime_lines(rates: predict.HostRates) -> str:
    """The fresh vector's regime at each measured size, one line each."""
    lines = []
    for row in predict.host_table(rates).to_dict("records"):
        if "regime" in row:
            lines.append(f"host: {row['bytes'] / 1e6:.1f} MB fresh vector "
                         f"{row['fresh_vector_ms']:.3g} ms ({row['regime']}: faults "
                         f"{row['faults_ms']:.3g} ms, warm fill {row['warm_fill_ms']:.3g} ms), "
                         f"C++ top-K {row.get('top_k_ms', float('nan')):.3g} ms")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``stagelab predict``: prints the predictions; 0, or 2 (UserError) for a bad request."""
    if not 0 < args.delta < 1:
        raise UserError(f"--delta {args.delta}: give a share in (0, 1)")
    table = predict.load_platforms()
    try:
        chosen = ([predict.platform_named(name, table) for name in args.platform]
                  if args.platform else list(table.values()))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    cells = decisive_cells(args.profile)
    rates, origin = (rates_from_folder(args.rates) if args.rates else rates_measured_here(cells))
    print(f"Predicted, not measured: {origin}; GPU terms from data/platforms.csv (published "
          "figures, and ranges where none is published); forward = (active bf16 weights + KV "
          f"cache at {forward.DEFAULT_CONTEXT} tokens) / HBM.")
    print(regime_lines(rates))
    for entry in predictions(chosen, cells, rates, args.delta):
        print(format_platform(entry))
    return 0


def curves(platforms: list[predict.Platform], cells: list[predict.Cell],
           rates: predict.HostRates, delta: float) -> pd.DataFrame:
    """The predicted saving per step against n x V, per platform and vocabulary (the plot's
    data)."""
    by_vocab = {(c.vocab, c.k): c.model for c in cells}
    frames = [predict.saving_curve(p, vocab, k, model, rates, delta)
              for p in platforms for (vocab, k), model in sorted(by_vocab.items())]
    return pd.concat(frames, ignore_index=True)


@dataclass
class Study:
    """What notebook 05 shows: where the host rates came from, each platform's answers per
    cell, the crossings, the saving curves, and this run's own check."""

    origin: str
    host: pd.DataFrame
    answers: pd.DataFrame
    arms: pd.DataFrame
    crossings: pd.DataFrame
    curves: pd.DataFrame
    check: dict[str, Any]

    def payload(self) -> dict[str, Any]:
        """JSON-ready, for ``prediction.json``."""
        return {"origin": self.origin, "answers": self.answers.to_dict("records"),
                "arms": self.arms.to_dict("records"),
                "crossings": self.crossings.to_dict("records"), "check": self.check}


def cells_of(rows: list[int], models: list[str | int], ks: list[int]) -> list[predict.Cell]:
    """Cells from rows x models (names of data/model_shapes.csv or vocabulary sizes) x K."""
    shapes = model_table()
    out = []
    for model in models:
        if isinstance(model, str) and model not in shapes:
            raise UserError(f"decisive_models: unknown model {model!r}; known: "
                            f"{', '.join(shapes)} (or a vocabulary size)")
        vocab, dims = shapes[model] if isinstance(model, str) else (int(model), None)
        out += [predict.Cell(n, vocab, k, dims) for n in rows for k in ks]
    return out


def study(data_dir: Path | str | None, platforms: list[str], rows: list[int],
          models: list[str | int], ks: list[int], delta: float,
          rates_dir: str | Path = "") -> Study:
    """Notebook 05's figures: the host rates of ``rates_dir``, else of the run ``data_dir``,
    else measured here now; every chosen platform (all when none is named)."""
    table = predict.load_platforms()
    try:
        chosen = ([predict.platform_named(n, table) for n in platforms] if platforms
                  else list(table.values()))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    cells = cells_of(rows, models, ks)
    step = None
    if data_dir:
        try:
            step = schema.read_table(data_dir, "step")
        except FileNotFoundError:
            step = None
    if rates_dir:
        rates, origin = rates_from_folder(Path(rates_dir))
    elif step is not None and predict.host_rates(step).samples:
        rates, origin = predict.host_rates(step), f"host rates recorded by run {Path(data_dir).name}"
    else:
        rates, origin = rates_measured_here(cells)
    found = predictions(chosen, cells, rates, delta)
    answers = pd.DataFrame([{"platform": e["platform"].name, "rows": c["rows"],
                             "vocab": c["vocab"], "k": c["k"], **a}
                            for e in found for c in e["cells"] for a in c["answers"]])
    arms = pd.DataFrame([{"platform": e["platform"].name, "rows": c["rows"], "vocab": c["vocab"],
                          "k": c["k"], "arm": arm, "mid_ms": a["mid_ms"], "low_ms": a["low_ms"],
                          "high_ms": a["high_ms"]}
                         for e in found for c in e["cells"] for arm, a in c["arms"].items()])
    crossings = pd.DataFrame([c for e in found for c in e["crossings"]])
    gpu = None
    if data_dir and (Path(data_dir) / "manifest.json").is_file():
        from stagelab.core.records import RunFolder

        gpu = ((RunFolder(data_dir).read_manifest().get("hardware") or {}).get("gpu") or {}
               ).get("name")
    return Study(origin, predict.host_table(rates), answers, arms, crossings, curves(chosen, cells, rates, delta),
                 predict.check_run(step, gpu))
