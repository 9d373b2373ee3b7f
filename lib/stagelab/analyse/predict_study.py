"""Notebook 05's study: which host the answers assume, each platform's answers per cell and host,
the sensitivity, the crossings, the saving curves, and the run's two checks of the cost model.

The host rates are a folder's (a run, a kept run or a measured folder), a host class of
``data/hosts.csv``, the run's own, or this machine's measured now (a measuring function given by
the run floor: this floor never measures). Torch-free."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from stagelab.analyse import predict_check, predict_model, predict_tables
from stagelab.core import forward, measured, schema
from stagelab.core.errors import UserError


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


# This machine's host rates measured now at the cells' sizes, and where they came from: given
# by the run floor (stagelab.run.predict_command.rates_measured_here), since this floor never measures.
MeasureHere = Callable[[list[predict_tables.Cell]], tuple[predict_tables.HostRates, str]]


def host_choice(host: str | None, rates_dir: Path | None, cells: list[predict_tables.Cell],
                thp: str | None = None, regime: str | None = None,
                measure_here: MeasureHere | None = None) -> HostChoice:
    """What ``--host``, ``--rates``, ``--thp`` and ``--regime`` ask for; UserError for a host
    that is not a class of data/hosts.csv nor ``this``, and for ``this`` without
    ``measure_here``."""
    if rates_dir is not None and host:
        raise UserError("--host and --rates: give one (a folder's rates are its own host's)")
    if rates_dir is not None:
        rates, origin = rates_from_folder(rates_dir)
        return HostChoice(rates=rates, words=origin)
    if host == HOST_THIS:
        if measure_here is None:
            raise UserError(f"host {HOST_THIS!r} measures this machine, which needs the run "
                            "floor's measuring function (measure_here)")
        rates, origin = measure_here(cells)
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


def answer_records(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every predicted answer of :func:`predictions`, one record per platform, cell, host and
    question: what notebook 05 shows, ``prediction.json`` holds and ``stagelab predict --json``
    prints (one prediction, one shape)."""
    return [{"platform": c["platform"], "rows": c["rows"], "vocab": c["vocab"], "k": c["k"], **a}
            for e in found for c in e["cells"] if c["fits"] for a in c["answers"]]


def arm_records(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every arm's predicted step (ms, interval) per platform, host and cell."""
    return [{"platform": c["platform"], "host": c["host"], "rows": c["rows"],
             "vocab": c["vocab"], "k": c["k"], "arm": arm, "mid_ms": a["mid_ms"],
             "low_ms": a["low_ms"], "high_ms": a["high_ms"]}
            for e in found for c in e["cells"] if c["fits"] for arm, a in c["arms"].items()]


def stated_records(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every stated figure of :func:`predictions` (:func:`predict_model.stated_figures`), one
    record per platform, host, cell and figure: the intervals a run's measured figures are
    judged against (the rule: :data:`predict_model.FALSIFICATION_RULE`)."""
    return [{"platform": c["platform"], "host": c["host"], "rows": c["rows"],
             "vocab": c["vocab"], "k": c["k"], **figure}
            for e in found for c in e["cells"] if c["fits"]
            for figure in c["falsification"]["figures"]]


HOST_CLASS = "host class "  # how an answer names a platform's usual host (data/hosts.csv)


def across_hosts(decisions: Mapping[str, str]) -> str:
    """One question's answers on several hosts (host -> answer) as one answer: the answer where
    every host gives it, else "depends on the host" with each host's."""
    if len(set(decisions.values())) == 1:
        return next(iter(decisions.values()))
    return "depends on the host: " + ", ".join(
        f"{d} on {h.removeprefix(HOST_CLASS)}" for h, d in decisions.items())


CELL_KEYS = ["platform", "rows", "vocab", "k"]


def answer_grid(answers: pd.DataFrame) -> pd.DataFrame:
    """One row per platform and cell, one column per question: its answer across the hosts
    (:func:`across_hosts`); what notebook 05 leads with (before: one row per platform, cell,
    host and question, 108 rows for the quick profile)."""
    if answers.empty:
        return answers
    rows = []
    for key, part in answers.groupby(CELL_KEYS, sort=True):
        row = dict(zip(CELL_KEYS, key))
        for question, asked in part.groupby("question", sort=False):
            row[question] = across_hosts(dict(zip(asked["host"], asked["decision"])))
        rows.append(row)
    return pd.DataFrame(rows)


def arm_grid(arms: pd.DataFrame) -> pd.DataFrame:
    """Each arm's predicted step (ms, best value) as one column per arm, one row per platform,
    host and cell."""
    if arms.empty:
        return arms
    keys = ["platform", "host", "rows", "vocab", "k"]
    grid = arms.pivot_table(index=keys, columns="arm", values="mid_ms", sort=False)
    grid.columns = [f"{arm}_ms" for arm in grid.columns]
    return grid.reset_index()


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
    answers per cell and host, the sensitivity table, the crossings, the saving curves, this
    run's two checks (in sample: additivity; out of sample: inputs the run did not produce) and
    the rates this run recorded on its own host ("this host", never in a platform's answer)."""

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
    this_host: pd.DataFrame = field(default_factory=pd.DataFrame)  # the run's own host rates

    def payload(self) -> dict[str, Any]:
        """JSON-ready, for ``prediction.json``."""
        return {"origin": self.origin, "answers": self.answers.to_dict("records"),
                "arms": self.arms.to_dict("records"),
                "crossings": self.crossings.to_dict("records"),
                "sensitivity": self.sensitivity.to_dict("records"),
                "unfit": self.unfit.to_dict("records"), "check": self.check,
                "out_of_sample": self.out_of_sample,
                "this_host": self.this_host.to_dict("records")}


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


def study_choice(cells: list[predict_tables.Cell], rates_dir: str | Path = "", host: str = "",
                 measure_here: MeasureHere | None = None) -> HostChoice:
    """The host notebook 05's platform answers assume: ``rates_dir``'s or ``host`` (a class or
    ``this``, measured by ``measure_here``) where asked, else each platform's usual host
    classes, as ``stagelab predict`` does. Before: a run that recorded host rates fed them into
    every platform, so a busy CPU's rates gave H200 a 104 ms step where ``predict`` said 16.8."""
    if rates_dir or host:
        return host_choice(host or None, Path(rates_dir) if rates_dir else None, cells,
                           measure_here=measure_here)
    return host_choice(None, None, cells)


THIS_HOST = "this host"  # the run's own machine, named so wherever its rates are shown


def this_host_table(step: pd.DataFrame | None, data_dir: Path | str | None) -> pd.DataFrame:
    """The host rates the run recorded on its own machine, as "this host" rows (its regime per
    size): shown beside the host classes, never fed into a platform's answer; empty where the
    run recorded none."""
    if step is None or not predict_tables.host_rates(step).samples:
        return pd.DataFrame()
    rates = predict_tables.host_rates(step, origin=f"{THIS_HOST} (run {Path(str(data_dir)).name})")
    table = predict_tables.host_table(rates)
    table.insert(0, "host", THIS_HOST)
    return table


def study(data_dir: Path | str | None, platforms: list[str], rows: list[int],
          models: list[str | int], ks: list[int], delta: float,
          rates_dir: str | Path = "", host: str = "",
          measure_here: MeasureHere | None = None) -> Study:
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
    choice = study_choice(cells, rates_dir, host, measure_here)
    found = predictions(chosen, cells, choice, delta)
    fit = [c for e in found for c in e["cells"] if c["fits"]]
    answers = pd.DataFrame(answer_records(found))
    arms = pd.DataFrame(arm_records(found))
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
                 predict_check.out_of_sample_run(step, gpu, prior), unfit,
                 this_host_table(step, data_dir))


def host_class_table(found: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The host classes the answers assume: each rate's range (GB/s) and its source."""
    names = {h.removeprefix("host class ") for e in found for h in e["hosts"]}
    classes = predict_tables.load_hosts()
    return pd.DataFrame([{"host": name, "thp": "|".join(classes[name].thp), "rate": rate,
                          "low_gbps": low, "high_gbps": high,
                          "source": classes[name].sources[rate]}
                         for name in sorted(names) if name in classes
                         for rate, (low, high) in classes[name].gbps.items()])

