"""The binding from a measuring notebook to its experiment, written once.

For each experiment of :mod:`stagelab.core.catalogue`: the call its notebook makes (the measuring
function and its arguments, from the notebook's parameters), the sweep cells those parameters
produce, and the per-experiment facts the estimate needs (memory probes, rounds until resolved,
the device work queued before each call). The preflight, ``stagelab measure``, the estimate and
the replay read it; a notebook is found through the catalogue's experiment, never by its name.
``tests/test_experiments.py`` checks each binding's cells against its notebook's own call.

Torch and the standard library only (the measuring floor): ``stagelab measure`` imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stagelab.core import catalogue
from stagelab.core.schema import RowSink
from stagelab.measure import estimate

Parameters = Mapping[str, Any]
Call = tuple[Callable[..., list[dict]], tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Experiment:
    """One experiment's binding: ``call(p)`` is its notebook's measuring call (function,
    positional and keyword arguments), ``cells(p, device)`` the sweep cells it measures."""

    name: str
    call: Callable[[Parameters], Call]
    cells: Callable[[Parameters, str], list[Any]]

    @property
    def notebook(self) -> str:
        """The notebook that measures it (from the catalogue)."""
        return catalogue.notebook_of(self.name).name

    @property
    def table(self) -> str:
        """The table under ``data/`` its rows go to."""
        return catalogue.notebook_of(self.name).table

    def measure(self, p: Parameters, sink: RowSink | None) -> list[dict]:
        """Measure it exactly as its notebook does, rows into ``sink``."""
        function, args, kwargs = self.call(p)
        return function(*args, sink=sink, **kwargs)

    def memory_probes_per_arm(self, p: Parameters) -> float:
        """Fresh processes started per arm of a cell to measure its peaks."""
        if self.name != catalogue.PROMPT or not p.get("measure_memory"):
            return 0.0
        from stagelab.measure import prompt_logprobs

        overlaps = list(p.get("overlaps") or [True])
        configs = prompt_logprobs.configurations(p["tokens"] - 1, p["chunks"], p["methods"],
                                                 overlaps, _prompt_tiles(p))
        return len(prompt_logprobs.probed(configs, overlaps)) / max(1, len(configs))

    def max_rounds(self, p: Parameters) -> int | None:
        """The cap on rounds when rounds are added until resolved, else None (a fixed number)."""
        precise = self.name == catalogue.DECISIVE_EXPERIMENT and p.get("max_rounds", 0) > p[
            "rounds"]
        return p["max_rounds"] if precise else None

    def forward_s(self, p: Parameters, cell: Any, kind: str) -> float:
        """The device work queued before each timed step: the notebook's ``forward_ms``, or its
        default (the model's active weights and KV cache read once at the basis's bandwidth,
        :func:`stagelab.core.forward.forward_ms`); 0 elsewhere."""
        if self.name != catalogue.STEP:
            return 0.0
        if p.get("forward_ms") is not None:
            return p["forward_ms"] / 1e3
        return estimate.default_forward_s(cell.sizes.get("model") or "", cell.sizes["rows"],
                                          kind)

    def predictor(self, p: Parameters, kind: str) -> Callable[[Any, int, int], float]:
        """``predict(cell, rounds, warmup)``: seconds by :func:`estimate.cell_seconds`."""
        probes_per_arm, max_rounds = self.memory_probes_per_arm(p), self.max_rounds(p)

        def predict(cell: Any, rounds: int, warmup: int) -> float:
            if cell.invalid:
                return 0.0
            return estimate.cell_seconds(
                cell.sizes, cell.arms, rounds=rounds, warmup=warmup, kind=kind,
                sources=p.get("sources", 1), memory_probes=round(probes_per_arm * len(cell.arms)),
                forward_s=self.forward_s(p, cell, kind), max_rounds=max_rounds,
                max_seconds=p.get("max_seconds", math.inf))
        return predict


# ----------------------------------------------------------------------------------- staging
# Each experiment: its notebook's parameters as the experiment's frozen spec, then the measuring
# call and the cells, both from that one spec.

def _given(p: Parameters, *names: str) -> dict[str, Any]:
    """The timing settings ``p`` gives, by name (those it leaves out: the spec's defaults; the
    cells never read them)."""
    return {name: p[name] for name in names if name in p}


def _staging_spec(p: Parameters) -> Any:
    """The notebook's staging sweep (:class:`stagelab.measure.staging.StagingSweep`)."""
    from stagelab.measure import shapes, staging

    return staging.StagingSweep(
        shapes.resolve_vocabs(p["models"]), p["rows"], shapes.torch_dtype(p["dtype"]), p["arms"],
        aa_arm=p["aa_arm"], sources=p["sources"], **_given(p, "rounds", "warmup", "seed"))


def _staging_call(p: Parameters) -> Call:
    from stagelab.measure import staging

    return staging.measure, (_staging_spec(p),), {}


def _staging_cells(p: Parameters, device: str) -> list[Any]:
    from stagelab.measure import staging

    return staging.cells(_staging_spec(p), device=device)


# -------------------------------------------------------------------------------------- step

def _step_spec(p: Parameters) -> Any:
    """The notebook's step sweep (:class:`stagelab.measure.step.StepSweep`): its sizes, each step
    condition's values (``conditions``, by the catalogue's names) and where they are measured."""
    from stagelab.measure import shapes, step

    return step.StepSweep(
        shapes.resolve_vocabs(p["models"]), p["rows"], p["ks"],
        shapes.torch_dtype(p["logits_dtype"], "logits_dtype"), p["arms"], aa_arm=p["aa_arm"],
        sources=p["sources"], conditions=p.get("conditions"),
        condition_cells=p.get("condition_cells"),
        steps_per_call=p.get("steps_per_call", 1),  # one step: before sequences
        **_given(p, "rounds", "warmup", "seed", "forward_ms", "delta", "max_rounds",
                 "max_seconds"))


def _step_call(p: Parameters) -> Call:
    from stagelab.measure import step

    return step.measure, (_step_spec(p),), {}


def _step_cells(p: Parameters, device: str) -> list[Any]:
    from stagelab.measure import step

    return step.cells(_step_spec(p), device=device)


# --------------------------------------------------------------------------- prompt logprobs

def _prompt_spec(p: Parameters) -> Any:
    """The notebook's prompt sweep (:class:`stagelab.measure.prompt_logprobs.PromptSweep`)."""
    from stagelab.measure import prompt_logprobs, shapes

    shape = shapes.override(shapes.resolve_vocabs([p["model"]], "model")[0], vocab=p["vocab"],
                            hidden=p["hidden"])
    return prompt_logprobs.PromptSweep(
        p["tokens"], shape, shape.hidden, shapes.positive_ints(p["chunks"], "chunks"),
        shapes.torch_dtype(p["dtype"]), p["k"], p["methods"], p["overlaps"],
        tiles=_prompt_tiles(p), **_given(p, "rounds", "warmup", "seed", "measure_memory"))


def _prompt_tiles(p: Parameters) -> list[int] | None:
    from stagelab.measure import shapes

    return shapes.positive_ints(p["tiles"], "tiles") if p.get("tiles") is not None else None


def _prompt_call(p: Parameters) -> Call:
    from stagelab.measure import prompt_logprobs

    return prompt_logprobs.measure, (_prompt_spec(p),), {}


def _prompt_cells(p: Parameters, device: str) -> list[Any]:
    from stagelab.measure import prompt_logprobs

    return [prompt_logprobs.prompt_cell(_prompt_spec(p), device=device)]


EXPERIMENTS = {e.name: e for e in (
    Experiment(catalogue.STAGING, _staging_call, _staging_cells),
    Experiment(catalogue.STEP, _step_call, _step_cells),
    Experiment(catalogue.PROMPT, _prompt_call, _prompt_cells),
)}


def of_notebook(notebook: str) -> Experiment | None:
    """The binding of the experiment a notebook measures (None for a notebook that measures
    nothing by arm: the snapshot, the verdict), through the catalogue."""
    return EXPERIMENTS.get(catalogue.experiment_of(notebook))


def notebook_cells(notebook: str, p: Parameters, device: str) -> list[Any]:
    """The sweep cells a notebook measures with parameters ``p`` (none where it measures none)."""
    experiment = of_notebook(notebook)
    return experiment.cells(p, device) if experiment else []
