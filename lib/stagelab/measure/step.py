"""The step as an experiment: its cells (sizes x the step's conditions), every arm timed over
interleaved rounds until the rule resolves, the forward queued before each step, and the checks
beside the timings (agreement, sync debug, read rates, clocks, host allocations)."""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import stagelab.measure.device
from stagelab.core import catalogue, design, forward, schema
from stagelab.core.catalogue import aa_name
from stagelab.core.schema import RowSink
from stagelab.measure import bench, hostrates, native, onepass, sequence, sweep
from stagelab.measure import logprobs as lp
from stagelab.measure.device import default_device, device_label
from stagelab.measure.shapes import ModelShape, positive_ints
from stagelab.measure.step_pipelines import (
    BASELINE,
    CANDIDATE,
    LOG_SOFTMAX,
    STEP_ARMS,
    DeviceStep,
    Pipeline,
    SeedStep,
    build_pipelines,
    copied_bytes,
    make_pipeline,
)

HOST_RATE_REPEATS = 5  # host-rate calls kept per cell, taken between its rounds


def default_forward_ms(shape: ModelShape, device: str, rows: int,
                       context: int = forward.DEFAULT_CONTEXT) -> tuple[float, str]:
    """The device work of one decode forward of ``rows`` sequences of ``shape``'s model, ms, and
    how it was reached: the active weights and every sequence's KV cache of ``context`` tokens
    read at an achievable share of the GPU's peak bandwidth (:func:`stagelab.core.forward.forward_ms`).
    0 on a CPU (there is no device work to overlap), and 0 where the model's dimensions or the
    GPU's bandwidth are unknown (then set ``forward_ms`` by hand)."""
    if torch.device(device).type != "cuda":
        return 0.0, "0 on a CPU: no device work runs beside the host's"
    name = torch.cuda.get_device_name(torch.device(device))
    bandwidth = forward.peak_bandwidth_gbps(name)
    known = shape.model in forward.model_table()
    if not known or bandwidth is None:
        missing = "the model's dimensions" if not known else f"{name}'s bandwidth"
        return 0.0, f"0: {missing} unknown; set forward_ms by hand"
    dims = forward.model_dims(shape.model)
    return (forward.forward_ms(dims, rows, peak_gbps=bandwidth, context=context),
            forward.forward_words(dims, rows, peak_gbps=bandwidth, gpu=name, context=context))


class ForwardLoad:
    """``forward_ms`` of device work queued before each step, as the decode forward is in the
    engine, so that the host's allocation overlaps it: on CUDA a busy kernel
    (``torch.cuda._sleep``) whose cycles per ms are calibrated once against CUDA events, after
    the clock is warmed; nothing when ``forward_ms`` is 0. Each queued kernel sits between CUDA
    events of its own, so :meth:`measured_ms` says what it really took (the SM clock sags
    between steps). A positive ``forward_ms`` on a CPU is refused: there is no device to queue
    it on."""

    def __init__(self, forward_ms: float, device: str) -> None:
        if not (isinstance(forward_ms, (int, float)) and forward_ms >= 0):
            raise ValueError(f"forward_ms must be a number >= 0, got {forward_ms!r}")
        if forward_ms and torch.device(device).type != "cuda":
            raise ValueError(f"forward_ms={forward_ms} needs a CUDA device; on a CPU the step "
                             "has no device work to overlap (give 0)")
        self.forward_ms = float(forward_ms)
        self.cycles = round(forward_ms * _cycles_per_ms(device)) if forward_ms else 0
        self.events: list[tuple[Any, Any]] = []

    def queue(self) -> None:
        """Queue the work, between its own CUDA events, on the current stream; returns at once."""
        if self.cycles:
            start, end = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
            start.record()
            torch.cuda._sleep(self.cycles)
            end.record()
            self.events.append((start, end))

    def measured_ms(self) -> float | None:
        """The queued work's mean measured ms per call (None when nothing was queued)."""
        if not self.events:
            return None
        self.events[-1][1].synchronize()
        times = [start.elapsed_time(end) for start, end in self.events]
        return sum(times) / len(times)

    def rows(self, how: str) -> list[dict]:
        """The cell's forward rows: the nominal ms and, where work was queued, the measured."""
        found = [{"arm": "forward", "metric": "forward_ms", "value": self.forward_ms,
                  "note": how}]
        measured = self.measured_ms()
        if measured is not None:
            found.append({"arm": "forward", "metric": "forward_measured_ms", "value": measured,
                          "note": f"mean of {len(self.events)} calls between their own CUDA "
                                  f"events; nominal {self.forward_ms:g} ms"})
        return found


# Busy device time before calibrating: an idle GPU's SM clock takes a while to ramp up, and a
# calibration against a low clock queues too many cycles once it has.
CLOCK_WARM_MS = 200.0


def warm_clock(probe_cycles: int, warm_ms: float = CLOCK_WARM_MS) -> None:
    """Keep the current device busy for at least ``warm_ms`` (at most 100 kernels)."""
    busy = 0.0
    for _ in range(100):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe_cycles)
        end.record()
        end.synchronize()
        busy += start.elapsed_time(end)
        if busy >= warm_ms:
            return


def _cycles_per_ms(device: str, probe_cycles: int = 10_000_000) -> float:
    """How many ``torch.cuda._sleep`` cycles take a millisecond on this GPU (its clock, warmed)."""
    with torch.cuda.device(torch.device(device)):
        warm_clock(probe_cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe_cycles)
        end.record()
        end.synchronize()
        return probe_cycles / start.elapsed_time(end)


def host_allocations(device: str) -> int | None:
    """torch's count of pinned host allocations so far (``host_memory_stats()``'s
    ``num_host_alloc``), None on a CPU or where this torch has no such key."""
    if torch.device(device).type != "cuda":
        return None
    stats = getattr(torch.cuda, "host_memory_stats", None)
    try:
        value = (stats() if stats else {}).get("num_host_alloc")
    except RuntimeError:
        return None
    return None if value is None else int(value)


def host_allocation_rows(device: str, before: int | None) -> list[dict]:
    """The pinned host allocations a cell made (metric ``num_host_alloc``): a grow-only
    scratch takes one per size it grows to, in its first call, never one per step."""
    if torch.device(device).type != "cuda":
        return []
    after = host_allocations(device)
    if before is None or after is None:
        return [{"arm": "pinned_host", "metric": "num_host_alloc", "status": "unavailable",
                 "note": "this torch's host_memory_stats() has no num_host_alloc"}]
    return [{"arm": "pinned_host", "metric": "num_host_alloc", "value": float(after - before),
             "note": "pinned host allocations during the cell (torch.cuda.host_memory_stats)"}]


CLOCK_STRIDE = 5  # rounds between two SM clock samples


class ClockSampler:
    """The GPU's SM clock and throttle reasons, sampled between rounds (every
    :data:`CLOCK_STRIDE`, never inside a timed call) through NVML; a cell's rows give their
    min, median and max (metric ``sm_clock_mhz``, stage ``min``/``median``/``max``) and the
    throttle reasons seen. Nothing on a CPU; ``read`` stands in for NVML in tests."""

    def __init__(self, device: str,
                 read: Callable[[], tuple[int | None, int | None, str]] | None = None) -> None:
        self.on_gpu = torch.device(device).type == "cuda"
        index = torch.device(device).index or 0
        if read is None:
            from stagelab.measure import hardware

            read = functools.partial(hardware.sm_clock_sample, index)
        self.read, self.why = read, ""
        self.mhz: list[int] = []
        self.reasons: set[int] = set()  # NVML's throttle bit masks seen
        self.rounds = itertools.count()

    def sample(self) -> None:
        mhz, reasons, why = self.read()
        if mhz is None:
            self.why = why
            return
        self.mhz.append(mhz)
        if reasons:
            self.reasons.add(reasons)

    def between_rounds(self) -> None:
        """A between-rounds hook: one sample every :data:`CLOCK_STRIDE` rounds."""
        if self.on_gpu and next(self.rounds) % CLOCK_STRIDE == 0:
            self.sample()

    def rows(self) -> list[dict]:
        """The cell's clock rows (one sample now where the rounds took none)."""
        if not self.on_gpu:
            return []
        if not self.mhz:
            self.sample()
        if not self.mhz:
            return [{"arm": "sm_clock", "metric": "sm_clock_mhz", "status": "unavailable",
                     "note": self.why}]
        seen = ", ".join(f"0x{r:x}" for r in sorted(self.reasons)) or "none"
        note = (f"{len(self.mhz)} samples between rounds; throttle reasons seen (NVML mask): "
                f"{seen}")
        values = {"min": min(self.mhz), "median": statistics.median(self.mhz),
                  "max": max(self.mhz)}
        return [{"arm": "sm_clock", "metric": "sm_clock_mhz", "stage": stage,
                 "value": float(value), "note": note} for stage, value in values.items()]


def chosen_arms(arms: Sequence[str] | None) -> list[str]:
    """The arms to time: those named, or (None) every step arm of the catalogue."""
    return list(STEP_ARMS) if arms is None else list(arms)


def check_arms(arms: list[str], aa_arm: str | None) -> None:
    """Known arm names, and the A/A arm among them."""
    if not arms:
        raise ValueError("arms is empty: name at least one step arm")
    for name in arms:
        if name not in STEP_ARMS:
            raise ValueError(f"arms: unknown step arm {name!r}; valid: {', '.join(STEP_ARMS)}")
    if aa_arm is not None and aa_arm not in arms:
        raise ValueError(f"aa_arm {aa_arm!r} must be one of arms {arms}")


CellPairs = Sequence[Sequence[int | str]]  # [[n, model or vocabulary], ...]
# What the step records of a condition's value, where not the value itself: the process's
# malloc by its name (glibc, jemalloc...), as the engine gets it.
RECORDED = {catalogue.ALLOCATOR.name: native.regime_label}
# A cell's label per condition value (the deciding values, save the log-softmax's, say nothing).
LABELS = {(catalogue.LOG_SOFTMAX.name, place): f" log-softmax on {place}" for place in LOG_SOFTMAX}
LABELS |= {(catalogue.ALLOCATOR.name, native.MAPPED): ", seed vector mapped fresh",
           (catalogue.OVERLAP.name, forward.WAITED): ", forward waited on"}


def chosen_conditions(conditions: Mapping[str, Sequence[str]] | None
                      ) -> dict[str, tuple[str, ...]]:
    """Each step condition of the catalogue (:data:`stagelab.core.catalogue.CONDITIONS`) and the
    values measured, in its order: those ``conditions`` names, else its deciding value alone.
    ValueError for an unknown condition or value, a value twice, or none."""
    given = dict(conditions or {})
    unknown = sorted(set(given) - {c.name for c in catalogue.CONDITIONS})
    if unknown:
        raise ValueError(f"conditions: no step condition {unknown}; known: "
                         f"{[c.name for c in catalogue.CONDITIONS]}")
    chosen = {}
    for condition in catalogue.CONDITIONS:
        values = tuple(given.get(condition.name, (condition.decides,)))
        if (not values or len(set(values)) != len(values)
                or any(value not in condition.values for value in values)):
            raise ValueError(f"conditions: {condition.name} {list(values)!r} must name each of "
                             f"{list(condition.values)} at most once, at least one")
        chosen[condition.name] = values
    return chosen


def in_cells(value: str, values: Sequence[str], only: CellPairs | None, shape: ModelShape,
             n: int) -> bool:
    """Whether a cell of ``n`` rows on ``shape`` is measured at a condition's ``value``: the
    first of its ``values`` everywhere, the others everywhere too unless ``only`` names the
    ``[n, model or vocabulary]`` cells they are limited to (a lease's budget)."""
    if value == values[0] or only is None:
        return True
    return any(rows == n and model in (shape.model, shape.vocab) for rows, model in only)


@dataclass(frozen=True)
class StepSweep:
    """What a step sweep measures and how, fixed once (checked when built): the cells (models'
    shapes x ``rows`` x ``ks``, every arm, each step condition's values, ``conditions`` by name:
    :func:`chosen_conditions`; ``condition_cells`` limits a condition's values after its first
    to some ``[n, model]`` cells, :func:`in_cells`) and the timing (rounds, warm-up, the forward
    queued before each step, the rule's ``delta`` and caps of rounds until resolved)."""

    shapes: Sequence[ModelShape]
    rows: Sequence[int]
    ks: Sequence[int]
    logits_dtype: torch.dtype
    arms: Sequence[str] | None = None
    aa_arm: str | None = BASELINE
    sources: int = 2
    conditions: Mapping[str, Sequence[str]] | None = None
    condition_cells: Mapping[str, CellPairs] | None = None
    steps_per_call: int = sequence.DEFAULT_STEPS
    rounds: int = 12
    warmup: int = 2
    seed: int = 0
    forward_ms: float | None = None
    delta: float = 0.02
    max_rounds: int | None = None
    max_seconds: float = math.inf

    def __post_init__(self) -> None:
        chosen = chosen_conditions(self.conditions)
        unknown = sorted(set(self.condition_cells or {}) - set(chosen))
        if unknown:
            raise ValueError(f"condition_cells: no step condition {unknown}")
        arms = chosen_arms(self.arms)
        check_arms(arms, self.aa_arm)
        sequence.check_steps(self.steps_per_call)
        positive_ints(self.rows, "rows")
        positive_ints([self.sources], "sources")
        if not self.ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 0
                              for k in self.ks):
            raise ValueError(f"ks: {self.ks!r} must be a non-empty list of integers >= 0")
        for name, value in (("conditions", chosen), ("arms", tuple(arms)),
                            ("shapes", tuple(self.shapes)), ("rows", tuple(self.rows)),
                            ("ks", tuple(self.ks))):
            object.__setattr__(self, name, value)

    @property
    def chosen(self) -> dict[str, tuple[str, ...]]:
        """Each condition's values measured (every condition of the catalogue, by name)."""
        return chosen_conditions(self.conditions)

    def measured_at(self, values: Mapping[str, str], shape: ModelShape, n: int) -> bool:
        """Whether the cell of ``n`` rows on ``shape`` is measured at these condition values."""
        only = self.condition_cells or {}
        return all(in_cells(value, self.chosen[name], only.get(name), shape, n)
                   for name, value in values.items())


def _recorded(name: str, value: str) -> str:
    """What a row records of a condition's value (its column's content)."""
    return RECORDED[name](value) if name in RECORDED else value


def cells(spec: StepSweep, device: str | None = None) -> list[sweep.Cell]:
    """The sweep's cells, one per ``(n, V, K)`` and value of each step condition measured
    (:meth:`StepSweep.measured_at`), with the memory each needs (the deferred arm holds a second
    slot and a pending copy) and the steps of each timed call
    (:mod:`stagelab.measure.sequence`, column ``steps``); a K beyond the vocabulary is a cell
    recorded as skipped, with the reason. In the order of ``rows``, and for each ``n`` every
    model, the largest vocabulary first: a profile that lists its rows largest first (a
    lease's) starts its costliest cells across every model while the most time is left before
    a deadline; the order within one size is the parameters' own."""
    arms, rows = list(spec.arms or ()), list(spec.rows)
    device = device or default_device()
    itemsize = torch.empty((), dtype=spec.logits_dtype).element_size()
    every_arm = [*arms, *([aa_name(spec.aa_arm)] if spec.aa_arm else [])]
    on_cpu = torch.device(device).type == "cpu"
    deferred_slots = 2 if catalogue.DEFERRED_WAIT in arms else 0  # its second slot, its pending copy
    names = list(spec.chosen)
    out = []
    for (shape, n, k), chosen in itertools.product(
            itertools.product(spec.shapes, rows, spec.ks), itertools.product(*spec.chosen.values())):
        values = dict(zip(names, chosen))
        if not spec.measured_at(values, shape, n):
            continue
        logits_bytes, fp32_bytes = n * shape.vocab * itemsize, n * shape.vocab * 4
        label = f"n={n} V={shape.vocab} K={k}" + "".join(
            LABELS.get(pair, "") for pair in values.items())
        device_bytes = spec.sources * logits_bytes + (3 + deferred_slots) * fp32_bytes
        recorded = {catalogue.condition(name).column: _recorded(name, value)
                    for name, value in values.items()}
        out.append(sweep.Cell(
            sizes=dict(experiment=catalogue.STEP, device=device_label(device), model=shape.model,
                       rows=n, vocab=shape.vocab, k=k, **recorded, steps=spec.steps_per_call,
                       dtype=str(spec.logits_dtype).removeprefix("torch.")),
            arms=every_arm, label=label,
            words=label.replace("on device", "on the host (a CPU run)") if on_cpu else "",
            host_bytes=(3 + deferred_slots) * fp32_bytes + (device_bytes if on_cpu else 0),
            device_bytes=0 if on_cpu else device_bytes,
            invalid="" if k <= shape.vocab else
            f"K={k} exceeds the vocabulary V={shape.vocab}: no top-K to take"))
    return sorted(out, key=lambda cell: (rows.index(cell.sizes["rows"]), -cell.sizes["vocab"]))


def condition_values(spec: StepSweep, cell: sweep.Cell) -> dict[str, str]:
    """A cell's value of each step condition, by name, read back from what its sizes record."""
    found = {}
    for name, values in spec.chosen.items():
        recorded = cell.sizes[catalogue.condition(name).column]
        found[name] = next(v for v in values if _recorded(name, v) == recorded)
    return found


def _pipeline_conditions(values: Mapping[str, str]) -> tuple[str, str, str]:
    """The arguments that make a pipeline meet the conditions: where its log-softmax runs, its
    fresh vector's allocator regime, its overlap order."""
    return (values[catalogue.LOG_SOFTMAX.name], values[catalogue.ALLOCATOR.name],
            values[catalogue.OVERLAP.name])


def precision_for(arms: list[str], aa_arm: str | None, *, delta: float, max_rounds: int,
                  max_seconds: float) -> bench.Precision:
    """Rounds until resolved for the four questions: ``seed_pinned`` and the grow-only pageable
    buffer against the seed's step, ``seed_pinned`` against the grow-only pageable buffer, the
    deferred wait against ``seed_pinned``,
    each while its CI straddles the bar ``1 / (1 - delta)``, and the A/A twin against the seed's
    step (what is resolved where the others cannot run, with no GPU). A comparison whose arm was
    not timed is left out when the rounds are checked. Never stopping before the rounds a PORT
    needs (:data:`stagelab.core.design.TAIL_ROUNDS`, or the cap)."""
    reused, deferred = catalogue.REUSE_LEVER[catalogue.STEP], catalogue.DEFERRED_WAIT
    questions = tuple((b, c) for b, c in ((BASELINE, CANDIDATE), (BASELINE, reused),
                                          (reused, CANDIDATE), (CANDIDATE, deferred))
                      if b in arms and c in arms)
    twin = ((BASELINE, aa_name(aa_arm)),) if aa_arm else ()
    return bench.Precision(questions + twin or ((BASELINE, CANDIDATE),), bar=1 / (1 - delta),
                           max_rounds=max_rounds, max_seconds=max_seconds,
                           min_rounds=min(design.TAIL_ROUNDS, max_rounds))


def measure(spec: StepSweep, *, device: str | None = None, sink: RowSink | None = None,
            progress: bool = True) -> list[dict]:
    """Time every arm's whole step per cell of ``spec`` (:func:`cells`), interleaved in a
    balanced order, with an A/A twin of ``aa_arm``; schema records out (written per cell into
    ``sink``).

    Each timed call is ``steps_per_call`` consecutive decode steps, the same for every arm
    (:func:`stagelab.measure.sequence.run`: forward queued, step, next forward ...; the
    deferred arm drained at the call's end, so that it gains nothing from the idle time between
    calls); its total and its stages are recorded per step (column ``steps``).

    Each step condition's values (:data:`stagelab.core.catalogue.CONDITIONS`) are their own
    cells, recorded per row in the condition's column: where the seed arms run the log-softmax
    (``log_softmax``); the fresh vector's allocator (``regime``: the process's malloc, as the
    engine gets it, by name; ``mapped fresh``: every vector its own mapping); how each step
    meets the forward queued before it (``overlap_order``: ``queued``, the fill overlaps the
    forward; ``waited``, the device is waited on before the allocation, the other bound; on a
    CPU nothing is queued, so both measure the same step).

    ``forward_ms`` of device work is queued before each timed step (None: the cell's model's
    :func:`default_forward_ms`), so that each timed call is a decode step; it is recorded per
    cell (metric ``forward_ms``, the formula in the note). With ``max_rounds`` above ``rounds``,
    rounds are added until the decisive comparison's CI half-width is at most ``delta / 2`` or a
    cap (``max_rounds``, ``max_seconds`` per cell) is reached (:func:`precision_for`).

    Also records, per cell, the host's own rates at its size (:mod:`stagelab.measure.hostrates`,
    the cost model's inputs), taken between its rounds, and, per arm and cell, the largest
    difference of its logprobs from the fused arm's and how many ranks differ
    (``max_abs_error``, ``rank_mismatches``), so that a speed comparison is never one between
    different answers; where the one-pass arm is timed, the kernel's read rate once per size
    (:func:`read_rates_once`).
    """
    device = device or default_device()
    arms, aa_arm, seed, warmup = list(spec.arms or ()), spec.aa_arm, spec.seed, spec.warmup
    sources, forward_ms, steps_per_call = spec.sources, spec.forward_ms, spec.steps_per_call
    logits_dtype = spec.logits_dtype
    todo = cells(spec, device)
    device, arms = device or default_device(), chosen_arms(arms)
    if forward_ms is not None:
        ForwardLoad(forward_ms, device)  # refuses a bad value before anything is measured
    shape_of = {(shape.model, shape.vocab): shape for shape in spec.shapes}
    generator = torch.Generator(device=device).manual_seed(seed)
    read_sizes: set[tuple[int, ...]] = set()  # the one-pass kernel's read rate: once per size

    def prepare(cell: sweep.Cell) -> sweep.CellPlan:
        n, vocab, k = cell.sizes["rows"], cell.sizes["vocab"], cell.sizes["k"]
        where, regime, order = _pipeline_conditions(condition_values(spec, cell))
        if forward_ms is None:
            ms, how = default_forward_ms(shape_of[(cell.sizes["model"], vocab)], device, n)
        else:
            ms, how = forward_ms, "given"
        load = ForwardLoad(ms, device)
        built, unavailable = build_pipelines(arms, where, regime, order)
        if aa_arm in built:
            built[aa_name(aa_arm)] = make_pipeline(aa_arm, where, regime, order)
        elif aa_arm:
            unavailable[aa_name(aa_arm)] = unavailable[aa_arm]
        logits = bench.rotating(lambda i: (3 * torch.randn(
            n, vocab, device=device, generator=generator)).to(logits_dtype), sources)
        tokens = bench.rotating(lambda i: torch.randint(0, vocab, (n,), device=device,
                                                        generator=generator), sources)
        host_tokens = [t.cpu() for t in tokens]
        host_rates, no_rates = _host_sampler(n, vocab, k, seed, sources, logits_dtype,
                                             host_block=torch.device(device).type == "cpu")
        for scores, ids in zip(logits, tokens):  # validated once here, never inside a timed call
            lp.check_call(scores, k, ids)
            lp.check_token_ids(ids, n, vocab)

        facts: dict[tuple[str, int], dict[str, Any]] = {}  # per (arm, round): its alloc's

        def call(name: str, pipeline: Pipeline, r: int) -> dict[str, float]:
            # each step after the decode forward it follows in the engine
            stages = sequence.run(pipeline, load.queue, sequence.inputs(
                logits, tokens, host_tokens, r, steps_per_call), k)
            if isinstance(pipeline, SeedStep):
                facts[(name, r - warmup)] = pipeline.facts  # the record's round: r - warm-up
            return stages

        def annotate(record: dict) -> dict:
            if record.get("stage") == "copy":
                record["bytes"] = copied_bytes(record["arm"], n, vocab, k)
            if record.get("stage") == "alloc":
                record.update(facts.get((record["arm"], record["round"]), {}))
            return record

        clocks, pinned_before = ClockSampler(device), host_allocations(device)

        def after() -> list[dict]:
            inputs = (built, logits[0], k, tokens[0], host_tokens[0])
            return [*load.rows(how), *clocks.rows(),
                    *host_allocation_rows(device, pinned_before),
                    *sweep.guarded("agreement", agreement, *inputs),
                    *sweep.guarded("sync_debug", sync_debug, *inputs),
                    *(sweep.guarded(hostrates.ARM, host_rates.rows, HOST_RATE_REPEATS)
                      if host_rates else no_rates),
                    *read_rates_once(built, read_sizes, logits[0], k, tokens[0])]

        return sweep.CellPlan(
            calls={name: functools.partial(call, name, p) for name, p in built.items()},
            unavailable=unavailable, annotate=annotate, after=after,
            between_rounds=sweep.both(clocks.between_rounds,
                                      host_rates.every(warmup + spec.rounds, HOST_RATE_REPEATS)
                                      if host_rates else None), steps=steps_per_call,
            between_calls=told.call(cell) if (told := sweep.cell_progress()) else None)

    precision = (precision_for(arms, aa_arm, delta=spec.delta, max_rounds=spec.max_rounds,
                               max_seconds=spec.max_seconds)
                 if spec.max_rounds is not None and spec.max_rounds > spec.rounds else None)
    return sweep.run(todo, prepare, rounds=spec.rounds, warmup=warmup, seed=seed, device=device,
                     sink=sink, label="step", progress=progress, precision=precision)


def read_rates_once(built: Mapping[str, Any], measured: set[tuple[int, ...]],
                    logits: torch.Tensor, k: int, tokens: torch.Tensor) -> list[dict]:
    """The one-pass kernel's read rate on a cell's logits (:func:`stagelab.measure.onepass.
    read_rate_rows`, its figure of merit beside the step: bytes read per second and the share
    of the HBM peak), where the cell times the one-pass arm and its size was not read yet
    (``measured``: the sizes already read, the place of the log-softmax, the regime and the
    overlap order do not change it); after the cell's rounds, never inside a timed call."""
    size = (*logits.shape, k, logits.element_size())
    if catalogue.ONE_PASS not in built or size in measured:
        return []
    measured.add(size)
    try:
        return onepass.read_rate_rows(logits, k, tokens)
    except Exception as exc:  # a failed read rate costs the cell nothing else
        return [{"arm": catalogue.ONE_PASS, "metric": schema.READ_RATE, "status": "failed",
                 "note": bench.first_line(exc)}]


def _host_sampler(n: int, vocab: int, k: int, seed: int, sources: int,
                  logits_dtype: torch.dtype, host_block: bool
                  ) -> tuple[hostrates.Sampler | None, list[dict]]:
    """A cell's host-rate sampler, allocating in the step's pattern (``host_block``: its
    log-softmax output on the host, a CPU step), or None and the row saying why it could not be
    made: the host rates never cost a cell its timings."""
    try:
        return hostrates.Sampler(n, vocab, k, seed=seed, sources=sources,
                                 logits_dtype=logits_dtype, host_block=host_block), []
    except Exception as exc:
        return None, [{"arm": hostrates.ARM, "status": "failed", "note": bench.first_line(exc)}]


def agreement(pipelines: dict[str, Pipeline], logits: torch.Tensor, k: int,
              tokens: torch.Tensor, host_tokens: torch.Tensor) -> list[dict]:
    """Each arm's largest logprob difference from the fused arm's, and its rank mismatches."""
    reference, _ = DeviceStep(catalogue.FUSED).run(logits, k, tokens, host_tokens)
    rows = []
    for name, pipeline in pipelines.items():
        result, _ = pipeline.run(logits, k, tokens, host_tokens)
        error = float((result.logprobs - reference.logprobs).abs().max())
        mismatches = int((result.selected_token_ranks != reference.selected_token_ranks).sum())
        rows += [{"arm": name, "metric": "max_abs_error", "value": error},
                 {"arm": name, "metric": "rank_mismatches", "value": float(mismatches)}]
    return rows


def sync_debug(pipelines: dict[str, Pipeline], logits: torch.Tensor, k: int,
               tokens: torch.Tensor, host_tokens: torch.Tensor) -> list[dict]:
    """On CUDA, one call of each arm under ``set_sync_debug_mode("warn")``: how many
    synchronizing operations torch flags (metric ``sync_warnings``; the first texts in the note).
    The designed waits are the seed arms' copy into pageable memory and each arm's one
    synchronize (and, in the ``waited`` overlap order, one more before its host staging);
    anything more is a hidden wait."""
    if logits.device.type != "cuda":
        return [{"arm": "sync_debug", "metric": "sync_warnings", "status": "unavailable",
                 "note": "torch's sync debug mode needs a CUDA device"}]
    bare = len(stagelab.measure.device.sync_warnings(lambda: stagelab.measure.device.synchronize(logits.device)))
    rows = []
    for name, pipeline in pipelines.items():
        found = stagelab.measure.device.sync_warnings(
            functools.partial(pipeline.run, logits, k, tokens, host_tokens))
        rows.append({"arm": name, "metric": "sync_warnings", "value": float(len(found)),
                     "note": f"a bare synchronize gives {bare}; " + " | ".join(found[:3])})
    return rows

