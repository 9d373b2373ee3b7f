"""``stagelab predict``: the verdict's three answers per GPU platform and decisive cell, before
any lease, from the cost model (:mod:`stagelab.analyse.predict_model`).

The host rates are, by default, those of each platform's usual hosts (``data/hosts.csv``, the
platform's ``host_classes``): nothing is measured here, so two calls print the same answers, and
every answer names the host it assumed and whether it flips across the host range. ``--host``
names one class, or ``this`` (this machine, measured now at the decisive cells' sizes, its load
watched as the timing notebooks watch it); ``--rates`` reads a folder that recorded them (a run
folder, a kept run or a ``stagelab measure`` folder). The GPU terms come from
``data/platforms.csv``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from stagelab.analyse import predict_check, predict_model, predict_tables
from stagelab.core import catalogue, forward, measured, schema
from stagelab.core.errors import UserError
from stagelab.run import profiles


def decisive_cells(profile: str) -> list[predict_tables.Cell]:
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
        cells += [predict_tables.Cell(n, vocab, k, dims) for n in values["decisive_rows"]
                  for k in values["decisive_ks"]]
    return cells


def model_table() -> dict[str, tuple[int, forward.ModelDims]]:
    """``model -> (vocab, forward dimensions)`` from data/model_shapes.csv."""
    return {name: (int(row["vocab"]), forward.model_dims(name))
            for name, row in forward.model_table().items()}


def rates_from_folder(folder: Path) -> tuple[predict_tables.HostRates, str]:
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
    rates = predict_tables.host_rates(frame)
    if not rates.samples:
        raise UserError(f"--rates {folder}: its step table has no host_rate rows (recorded "
                        "since issue 29; measure again, or leave --rates out to measure here)")
    return rates, f"host rates recorded in {folder}"


def rates_measured_here(cells: list[predict_tables.Cell]) -> tuple[predict_tables.HostRates, str]:
    """The host rates of this machine, measured now at the cells' sizes (torch, no GPU), with
    the machine's load watched as the timing notebooks watch it: busy is said, never hidden."""
    from stagelab.measure import busy, hostrates

    rows = []
    with busy.LoadWatch() as watch:
        for rows_, vocab in sorted({(c.rows, c.vocab) for c in cells}):
            rows += hostrates.measure_rates(rows_, vocab, max(c.k for c in cells), repeats=3)
    return (predict_tables.host_rates(schema.make_rows(rows), origin="this machine, measured now"),
            f"host rates measured on this machine now (repeats=3 per size; {load_words(watch.summary)})")


def load_words(summary: Mapping[str, Any] | None) -> str:
    """The load while this machine was measured, in words: busy (and why), quiet, or unknown."""
    if not summary or summary.get("busy") is None:
        return "load unknown: " + str((summary or {}).get("unavailable") or "not read")
    if summary["busy"]:
        return ("BUSY while measured, so the host terms are inflated: "
                + "; ".join(summary["why"]))
    return f"quiet while measured (load average at most {summary['load_avg_max']:.2f})"


HOST_THIS = "this"


@dataclass
class HostChoice:
    """The host the predictions assume: each platform's usual host classes (``name`` None), one
    named class, or measured rates (this machine's, or a folder's); THP mode and allocator regime
    as stated (None: as the host table says)."""

    name: str | None = None
    rates: predict_tables.HostRates | None = None
    thp: str | None = None
    regime: str | None = None
    words: str = "each platform's usual host classes (data/hosts.csv; nothing measured here)"
    classes: Mapping[str, predict_tables.HostClass] = field(default_factory=dict)

    def hosts(self, platform: predict_tables.Platform) -> list[predict_tables.HostRates | predict_tables.HostClass]:
        """The hosts one platform's answers are given on."""
        if self.rates is not None:
            return [self.rates]
        table = self.classes or predict_tables.load_hosts()
        try:
            chosen = ([predict_tables.host_named(self.name, table)] if self.name
                      else predict_tables.hosts_of(platform, table))
            return [host.options(self.thp, self.regime) for host in chosen]
        except ValueError as exc:
            raise UserError(str(exc)) from exc


def host_choice(host: str | None, rates_dir: Path | None, cells: list[predict_tables.Cell],
                thp: str | None = None, regime: str | None = None) -> HostChoice:
    """What ``--host``, ``--rates``, ``--thp`` and ``--regime`` ask for; UserError for a host
    that is not a class of data/hosts.csv nor ``this``."""
    if rates_dir is not None and host:
        raise UserError("--host and --rates: give one (a folder's rates are its own host's)")
    if rates_dir is not None:
        rates, origin = rates_from_folder(rates_dir)
        return HostChoice(rates=rates, words=origin)
    if host == HOST_THIS:
        rates, origin = rates_measured_here(cells)
        return HostChoice(rates=rates, words=origin)
    try:
        classes = predict_tables.load_hosts()
        if host:
            predict_tables.host_named(host, classes)
        for name, value, known in (("--thp", thp, predict_tables.THP_MODES),
                                   ("--regime", regime, predict_tables.REGIMES)):
            if value is not None and value not in known:
                raise ValueError(f"{name} {value!r}: give one of {', '.join(known)}")
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    stated = "".join(f"; {n} {v}" for n, v in (("THP", thp), ("allocator regime", regime)) if v)
    words = (f"host class {host} (data/hosts.csv; nothing measured here{stated})" if host else
             f"each platform's usual host classes (data/hosts.csv; nothing measured here{stated})")
    return HostChoice(host or None, None, thp, regime, words, classes)


def unfit_cell(platform: predict_tables.Platform, cell: predict_tables.Cell, why: str) -> dict[str, Any]:
    """A cell whose configuration exceeds the GPU's memory: marked, with no figure."""
    return {"platform": platform.name, "rows": cell.rows, "vocab": cell.vocab, "k": cell.k,
            "log_softmax": cell.log_softmax, "host": None, "fits": False, "arms": {},
            "answers": [], "notes": [why], "sensitivity": [], "knobs": {}}


def predictions(platforms: list[predict_tables.Platform], cells: list[predict_tables.Cell],
                choice: HostChoice | predict_tables.HostRates, delta: float) -> list[dict[str, Any]]:
    """Per platform: every cell's prediction on each of its hosts (a cell that does not fit
    the GPU's memory marked instead), and the crossing n x V per vocabulary and host."""
    if isinstance(choice, predict_tables.HostRates):
        choice = HostChoice(rates=choice, words="")
    out = []
    for platform in platforms:
        hosts = choice.hosts(platform)
        predicted = []
        for cell in cells:
            why = predict_model.memory_fault(platform, cell)
            predicted += ([unfit_cell(platform, cell, why)] if why else
                          [predict_model.predict_cell(predict_model.gpu_model(platform, cell, host), delta)
                           for host in hosts])
        by_vocab = {(c.vocab, c.k): c.model for c in cells}
        crossings = [predict_model.crossing(platform, vocab, k, model, host, delta)
                     for (vocab, k), model in sorted(by_vocab.items()) for host in hosts]
        out.append({"platform": platform, "hosts": [h.origin for h in hosts],
                    "cells": predicted, "crossings": crossings})
    return out


def across_hosts(answers: list[Mapping[str, Any]]) -> str:
    """One question's answers on several hosts in words: the same on every host, or "depends
    on the host" with each host's answer."""
    decisions = {a["host"]: a["decision"] for a in answers}
    if len(set(decisions.values())) == 1:
        return f"{next(iter(decisions.values()))} on every host ({', '.join(decisions)})"
    return "depends on the host: " + ", ".join(f"{d} on {h}" for h, d in decisions.items())


NEAR_FLIP = 2.0  # the command prints flips within this factor of a knob's range (all in nb 05)
LINK_KNOBS = ("pinned_gbps", "pageable_gbps")  # unmeasured on most platforms: flips always shown


def flip_words(cell: Mapping[str, Any], question: str) -> list[str]:
    """The knobs whose flip value lies within :data:`NEAR_FLIP` of their range, and the link's
    wherever it flips (a decade either side), in words."""
    return [predict_model.sensitivity_words(row) for row in cell["sensitivity"]
            if row["question"] == question and row["flips_at"] is not None
            and (row["knob"] in LINK_KNOBS
                 or row["low"] / NEAR_FLIP <= row["flips_at"] <= row["high"] * NEAR_FLIP)]


def _ms(low: float, high: float) -> str:
    return f"[{low:.3g}, {high:.3g}] ms"


def format_platform(entry: Mapping[str, Any]) -> str:
    """One platform's prediction in plain lines: per cell, each host's arms and answers (with
    the host named where there are several), the answers across the host range, the flips."""
    p: predict_tables.Platform = entry["platform"]
    several = len(entry.get("hosts") or []) > 1
    lines = [f"{p.name}: {p.link}; pinned D2H {p.pinned_gbps[0]:.3g}-{p.pinned_gbps[1]:.3g} "
             f"GB/s, pageable {p.pageable_gbps[0]:.3g}-{p.pageable_gbps[1]:.3g} GB/s, HBM "
             f"{p.hbm_gbps:g} GB/s, {p.memory_gb:g} GB; hosts: {', '.join(entry.get('hosts') or [])}"]
    by_cell: dict[tuple[int, int, int], list[Mapping[str, Any]]] = {}
    for cell in entry["cells"]:
        by_cell.setdefault((cell["rows"], cell["vocab"], cell["k"]), []).append(cell)
    for (rows, vocab, k), predicted in by_cell.items():
        if not predicted[0]["fits"]:
            lines.append(f"  n={rows} V={vocab} K={k}: {predicted[0]['notes'][0]}")
            continue
        lines.append(f"  n={rows} V={vocab} K={k}:")
        lines += [line for cell in predicted for line in _cell_lines(cell, several)]
        if several:
            for question in predict_model.QUESTIONS:
                answers = [a for c in predicted for a in c["answers"] if a["question"] == question]
                lines.append(f"    across hosts: {question} {across_hosts(answers)}")
    for c in entry["crossings"]:
        sure = f"{c['port_from_nv']:,}" if c["port_from_nv"] else "never in the scan"
        maybe = f"{c['may_port_from_nv']:,}" if c["may_port_from_nv"] else "never in the scan"
        on = f", {c['host']}" if several else ""
        lines.append(f"  crossing ({c['question']}, V={c['vocab']}{on}): PORT for sure from n x V "
                     f"= {sure}; possibly from {maybe} (scanned {c['scanned_nv'][0]:,}-"
                     f"{c['scanned_nv'][1]:,})")
    return "\n".join(lines)


def _cell_lines(cell: Mapping[str, Any], several: bool) -> list[str]:
    on = f" ({cell['host']})" if several else ""
    lines = [f"    {arm:22} {a['mid_ms']:8.3f} ms {_ms(a['low_ms'], a['high_ms'])}{on}"
             for arm, a in cell["arms"].items()]
    for ans in cell["answers"]:
        lines.append(
            f"    {ans['question']:8} {ans['decision']:28} saving {ans['saving_ms']:.3g} ms "
            f"{_ms(ans['saving_low_ms'], ans['saving_high_ms'])} vs bar "
            f"{ans['bar_ms']:.3g} ms {_ms(ans['bar_low_ms'], ans['bar_high_ms'])}; "
            f"dominating term: {ans['dominant_term']}{on}")
        flips = flip_words(cell, ans["question"])
        if flips:
            lines.append(f"      sensitivity ({ans['question']}): {'; '.join(flips)}")
    lines += [f"    note: {note}" for note in cell["notes"]]
    return lines


def regime_lines(rates: predict_tables.HostRates | None) -> str:
    """The fresh vector's regime at each measured size, one line each (nothing for a class)."""
    lines: list[str] = []
    if rates is None:
        return ""
    for row in predict_tables.host_table(rates).to_dict("records"):
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
    table = predict_tables.load_platforms()
    try:
        chosen = ([predict_tables.platform_named(name, table) for name in args.platform]
                  if args.platform else list(table.values()))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    cells = decisive_cells(args.profile)
    choice = host_choice(getattr(args, "host", None), args.rates, cells,
                         getattr(args, "thp", None), getattr(args, "regime", None))
    print(f"Predicted, not measured: {choice.words}; GPU terms from data/platforms.csv "
          "(published figures, and ranges where none is published; docs/prediction.md says "
          "which are which); forward = (active bf16 weights + KV cache at "
          f"{forward.DEFAULT_CONTEXT} tokens, sliding windows counted) / HBM. Flips shown within "
          f"{NEAR_FLIP:g}x of a range (the link's anywhere), the others held at their best "
          "values.")
    lines = regime_lines(choice.rates)
    if lines:
        print(lines)
    for entry in predictions(chosen, cells, choice, args.delta):
        print(format_platform(entry))
    return 0


def curves(platforms: list[predict_tables.Platform], cells: list[predict_tables.Cell],
           choice: HostChoice | predict_tables.HostRates, delta: float) -> pd.DataFrame:
    """The predicted saving per step against n x V, per platform, host and vocabulary (the
    plot's data; a platform on several hosts is drawn once per host)."""
    if isinstance(choice, predict_tables.HostRates):
        choice = HostChoice(rates=choice, words="")
    by_vocab = {(c.vocab, c.k): c.model for c in cells}
    frames = []
    for p in platforms:
        hosts = choice.hosts(p)
        for host in hosts:
            frame = pd.concat([predict_model.saving_curve(p, vocab, k, model, host, delta)
                               for (vocab, k), model in sorted(by_vocab.items())],
                              ignore_index=True)
            if len(hosts) > 1:
                frame["platform"] = f"{p.name} on {host.origin.removeprefix('host class ')}"
            frames.append(frame)
    return pd.concat(frames, ignore_index=True)


@dataclass
class Study:
    """What notebook 05 shows: which host the answers assume, the host rates, each platform's
    answers per cell and host, the sensitivity table, the crossings, the saving curves, and this
    run's two checks (in sample: additivity; out of sample: inputs the run did not produce)."""

    origin: str
    host: pd.DataFrame
    answers: pd.DataFrame
    arms: pd.DataFrame
    crossings: pd.DataFrame
    curves: pd.DataFrame
    check: dict[str, Any]
    sensitivity: pd.DataFrame = field(default_factory=pd.DataFrame)
    out_of_sample: dict[str, Any] = field(default_factory=dict)
    unfit: pd.DataFrame = field(default_factory=pd.DataFrame)

    def payload(self) -> dict[str, Any]:
        """JSON-ready, for ``prediction.json``."""
        return {"origin": self.origin, "answers": self.answers.to_dict("records"),
                "arms": self.arms.to_dict("records"),
                "crossings": self.crossings.to_dict("records"),
                "sensitivity": self.sensitivity.to_dict("records"),
                "unfit": self.unfit.to_dict("records"), "check": self.check,
                "out_of_sample": self.out_of_sample}


def cells_of(rows: list[int], models: list[str | int], ks: list[int]) -> list[predict_tables.Cell]:
    """Cells from rows x models (names of data/model_shapes.csv or vocabulary sizes) x K."""
    shapes = model_table()
    out = []
    for model in models:
        if isinstance(model, str) and model not in shapes:
            raise UserError(f"decisive_models: unknown model {model!r}; known: "
                            f"{', '.join(shapes)} (or a vocabulary size)")
        vocab, dims = shapes[model] if isinstance(model, str) else (int(model), None)
        out += [predict_tables.Cell(n, vocab, k, dims) for n in rows for k in ks]
    return out


def _run_step(data_dir: Path | str | None) -> pd.DataFrame | None:
    if not data_dir:
        return None
    try:
        return schema.read_table(data_dir, "step")
    except FileNotFoundError:
        return None


def _run_gpu(data_dir: Path | str | None) -> str | None:
    if not data_dir or not (Path(data_dir) / "manifest.json").is_file():
        return None
    from stagelab.core.records import RunFolder

    return ((RunFolder(data_dir).read_manifest().get("hardware") or {}).get("gpu") or {}
            ).get("name")


def study_choice(step: pd.DataFrame | None, data_dir: Path | str | None, cells: list[predict_tables.Cell],
                 rates_dir: str | Path = "", host: str = "") -> HostChoice:
    """The host notebook 05 assumes: ``rates_dir``'s, ``host`` (a class or ``this``), else the
    run's own recorded rates (a run made on this host), else each platform's host classes."""
    if rates_dir or host:
        return host_choice(host or None, Path(rates_dir) if rates_dir else None, cells)
    if step is not None and predict_tables.host_rates(step).samples:
        return HostChoice(rates=predict_tables.host_rates(step, origin="this run's host"),
                          words=f"host rates recorded by run {Path(str(data_dir)).name}")
    return host_choice(None, None, cells)


def study(data_dir: Path | str | None, platforms: list[str], rows: list[int],
          models: list[str | int], ks: list[int], delta: float,
          rates_dir: str | Path = "", host: str = "") -> Study:
    """Notebook 05's figures: the host of :func:`study_choice`; every chosen platform (all when
    none is named); the run's in-sample and out-of-sample checks."""
    table = predict_tables.load_platforms()
    try:
        chosen = ([predict_tables.platform_named(n, table) for n in platforms] if platforms
                  else list(table.values()))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    cells = cells_of(rows, models, ks)
    step = _run_step(data_dir)
    choice = study_choice(step, data_dir, cells, rates_dir, host)
    found = predictions(chosen, cells, choice, delta)
    fit = [c for e in found for c in e["cells"] if c["fits"]]
    answers = pd.DataFrame([{"platform": c["platform"], "rows": c["rows"], "vocab": c["vocab"],
                             "k": c["k"], **a} for c in fit for a in c["answers"]])
    arms = pd.DataFrame([{"platform": c["platform"], "host": c["host"], "rows": c["rows"],
                          "vocab": c["vocab"], "k": c["k"], "arm": arm, "mid_ms": a["mid_ms"],
                          "low_ms": a["low_ms"], "high_ms": a["high_ms"]}
                         for c in fit for arm, a in c["arms"].items()])
    sensitivity = pd.DataFrame([{"platform": c["platform"], "host": c["host"], "rows": c["rows"],
                                 "vocab": c["vocab"], "k": c["k"], **row,
                                 "words": predict_model.sensitivity_words(row)}
                                for c in fit for row in c["sensitivity"]])
    unfit = pd.DataFrame([{"platform": c["platform"], "rows": c["rows"], "vocab": c["vocab"],
                           "k": c["k"], "why": c["notes"][0]}
                          for e in found for c in e["cells"] if not c["fits"]])
    crossings = pd.DataFrame([c for e in found for c in e["crossings"]])
    gpu = _run_gpu(data_dir)
    prior = predict_check.prior_rates(data_dir) if data_dir else None
    return Study(choice.words,
                 predict_tables.host_table(choice.rates) if choice.rates else host_class_table(found),
                 answers, arms, crossings, curves(chosen, cells, choice, delta),
                 predict_check.check_run(step, gpu), sensitivity,
                 predict_check.out_of_sample_run(step, gpu, prior), unfit)


def host_class_table(found: list[Mapping[str, Any]]) -> pd.DataFrame:
    """The host classes the answers assume: each rate's range (GB/s) and its source."""
    names = {h.removeprefix("host class ") for e in found for h in e["hosts"]}
    classes = predict_tables.load_hosts()
    return pd.DataFrame([{"host": name, "thp": "|".join(classes[name].thp), "rate": rate,
                          "low_gbps": low, "high_gbps": high,
                          "source": classes[name].sources[rate]}
                         for name in sorted(names) if name in classes
                         for rate, (low, high) in classes[name].gbps.items()])
