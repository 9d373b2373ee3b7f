"""Predicted seconds per sweep cell, from a stated basis: how ``stagelab measure`` keeps a
deadline, and how a profile's measuring time is estimated before a lease (``--estimate``).

Every cell is predicted as ``(warm-up + rounds + extra calls) x one round + set-up``, a round
being one call of each arm. The per-call costs are a few rates, stated once in :data:`BASIS`
with where each comes from; the measured folder records each cell's prediction beside its
measured time, so the first lease on a machine calibrates them. Standard library only: the
measuring floor imports it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stagelab.core import catalogue, design, forward


@dataclass(frozen=True)
class Basis:
    """Per-call rates of one kind of machine (seconds, or bytes per second)."""

    fresh_bytes_per_s: float  # a fresh value-initialised host buffer: fill, copy into, free
    reused_bytes_per_s: float  # a copy into a reused pageable host buffer
    pinned_bytes_per_s: float  # a copy into pinned host memory (0: no pinned memory here)
    native_topk_s_per_element: float  # the seed's C++ host top-K, per element of [n, V]
    numpy_topk_s_per_element: float  # the numpy host top-K, per element of [n, V]
    device_pass_s_per_element: float  # one pass over [n, V] on the device (log-softmax, top-K)
    matmul_flops_per_s: float  # the prompt's projection onto the vocabulary
    call_overhead_s: float  # launch, bookkeeping, the one synchronize
    input_s_per_element: float  # making a random input tensor
    memory_probe_s: float  # one memory probe: a fresh process importing torch
    cell_overhead_s: float  # preparing a cell's arms, its checks, collecting garbage
    device_memory_bytes_per_s: float  # a decode forward reads the weights once (0: no device)


# Measured on this suite's 2-core CPU VM (2026-11-30, quiet; see data/reference/README.md): the
# native top-K 0.22 ms per row at V = 152k and 0.49 ms at V = 262k (1.9 ns per element taken,
# the larger), numpy 0.39 and 0.74 ms (2.8 ns); a fresh zero-filled vector copied into and freed
# 1.5 GB/s; a copy into a reused buffer 3.5x faster (about 5 GB/s); the fp32 log-softmax 23.5 ms
# at 64 x 152k (2.4 ns per element). On a GPU node the host-side rates are taken as measured
# here (its host is likely faster), pinned D2H at ~50 GB/s (published H100/H200 figures),
# device passes at ~3 TB/s of HBM read once, and pageable D2H no faster than ~5 GB/s. A memory
# probe (a fresh process importing torch) and a cell's preparation are this VM's typical times.
# The decode forward queued before each step: core.forward's model at H200's 4.8 TB/s.
BASIS: dict[str, Basis] = {
    "cpu": Basis(fresh_bytes_per_s=1.5e9, reused_bytes_per_s=5e9, pinned_bytes_per_s=0.0,
                 native_topk_s_per_element=1.9e-9, numpy_topk_s_per_element=2.8e-9,
                 device_pass_s_per_element=2.4e-9, matmul_flops_per_s=5e10,
                 call_overhead_s=50e-6, input_s_per_element=10e-9, memory_probe_s=3.0,
                 cell_overhead_s=0.2, device_memory_bytes_per_s=0.0),
    "cuda": Basis(fresh_bytes_per_s=1.5e9, reused_bytes_per_s=5e9, pinned_bytes_per_s=50e9,
                  native_topk_s_per_element=1.9e-9, numpy_topk_s_per_element=2.8e-9,
                  device_pass_s_per_element=4 / 3e12, matmul_flops_per_s=2e14,
                  call_overhead_s=100e-6, input_s_per_element=1e-11, memory_probe_s=5.0,
                  cell_overhead_s=0.5, device_memory_bytes_per_s=4.8e12),
}
# A step cell's after-phase, besides its rounds: the fused reference once, then three calls
# of each arm (the agreement pass and the sync-debug pass, whose count runs each arm twice).
STEP_AFTER_CALLS_PER_ARM = 3
# Rows a cell writes per arm and round (the total and one per stage the catalogue names for the
# arm), per arm once (checks, memory) and per cell once, an upper bound read from this suite's
# tables (2026-12-01), and the bytes of one row: about 545 B as plain JSON on
# a GPU; in a gzip member of a cell's rows 29 B measured on 16,800 step rows shaped as a GPU
# writes them (random 17-digit timings; 2026-12-01): 32 B with a tenth more. (This CPU's small
# cells, a few dozen rows per member, took 35-40 B; the large cells that fill a file do not.)
ROWS_PER_ARM_ONCE = 6
ROWS_PER_CELL_ONCE = 4
STEP_HOST_RATE_ROWS = 8 * 5  # a step cell's host rates: eight terms, five kept repeats each
ROW_BYTES = {"plain": 600, "gzip": 32}


# Calls of the host-rate microbenchmark per step cell (stagelab.measure.hostrates: one warm-up
# and five repeats, of its torch terms and of its C++ cycle alike).
HOST_RATES_CALLS = 6


def host_rates_s(n: int, vocab: int) -> float:
    """The host-rate microbenchmark of one step cell, run on the host (the CPU basis): per call
    four passes over ``[n, V]`` (two log-softmaxes and the host one), three copies into warm
    memory (fill, reused copy, the copy into the fresh vector), a fresh vector and the C++
    top-K."""
    host, elements = BASIS["cpu"], n * vocab
    per_call = (4 * elements * host.device_pass_s_per_element
                + elements * host.native_topk_s_per_element
                + 3 * 4 * elements / host.reused_bytes_per_s
                + 4 * elements / host.fresh_bytes_per_s)
    return HOST_RATES_CALLS * per_call


def default_forward_s(model: str, rows: int, kind: str) -> float:
    """One decode forward of ``rows`` sequences of a model of ``data/model_shapes.csv``
    (:func:`stagelab.core.forward.forward_ms` at the basis's bandwidth); 0 on a CPU or for a model
    the table lacks."""
    rate = BASIS[kind].device_memory_bytes_per_s
    if not rate or model not in forward.model_table():
        return 0.0
    return forward.forward_ms(forward.model_dims(model), rows, peak_gbps=rate / 1e9) / 1e3


def device_kind(device: str) -> str:
    """``cuda`` for a CUDA device label or name, else ``cpu``."""
    return "cuda" if str(device).startswith("cuda") else "cpu"


def _copy_s(entry: catalogue.Arm, nbytes: int, basis: Basis) -> float:
    """One copy of ``nbytes`` into the arm's host buffer: pinned (a reused pageable buffer's
    rate where this kind of machine has no pinned memory), reused, or fresh per call."""
    if entry.buffer == catalogue.PINNED and basis.pinned_bytes_per_s:
        return nbytes / basis.pinned_bytes_per_s
    if entry.buffer in (catalogue.PINNED, catalogue.REUSED):
        return nbytes / basis.reused_bytes_per_s
    return nbytes / basis.fresh_bytes_per_s


def _staging_call_s(arm: str, nbytes: int, basis: Basis) -> float:
    return _copy_s(catalogue.arm(catalogue.STAGING, arm), nbytes, basis) + basis.call_overhead_s


def _step_call_s(arm: str, n: int, vocab: int, basis: Basis) -> float:
    entry, elements = catalogue.arm(catalogue.STEP, arm), n * vocab
    device_pass = elements * basis.device_pass_s_per_element
    if not entry.stages_whole_logprobs:  # the top-K on the device: two passes, a tiny copy
        return 2 * device_pass + basis.call_overhead_s
    per_element = (basis.numpy_topk_s_per_element
                   if entry.host_top_k == catalogue.NUMPY_TOP_K_BACKEND
                   else basis.native_topk_s_per_element)
    return (device_pass + _copy_s(entry, 4 * elements, basis) + elements * per_element
            + basis.call_overhead_s)


def _prompt_call_s(sizes: Mapping[str, Any], basis: Basis) -> float:
    rows, vocab, hidden = sizes["rows"], sizes["vocab"], sizes.get("hidden") or 0
    matmul = 2 * rows * vocab * hidden / basis.matmul_flops_per_s
    return matmul + 2 * rows * vocab * basis.device_pass_s_per_element + basis.call_overhead_s


def cell_seconds(sizes: Mapping[str, Any], arms: Sequence[str], *, rounds: int, warmup: int,
                 kind: str, sources: int = 2, memory_probes: int = 0, forward_s: float = 0.0,
                 max_rounds: int | None = None, max_seconds: float = math.inf) -> float:
    """Predicted seconds of one sweep cell on a machine of ``kind`` (``cpu`` or ``cuda``).

    ``sizes`` are the cell's schema fields (``experiment``, ``rows``, ``vocab``, ``bytes``, a
    step cell's ``steps`` per timed call: its calls cost that many steps each...),
    ``arms`` every arm it times (twins included), ``memory_probes`` the fresh processes it
    starts to measure peaks, ``forward_s`` the device work queued before each step call. With
    ``max_rounds`` (rounds until resolved) the timing is the most it may take: up to
    ``max_rounds`` rounds, stopped at ``max_seconds`` once ``rounds`` are done.
    """
    basis = BASIS[kind]
    experiment, n, vocab = sizes["experiment"], sizes["rows"], sizes["vocab"]
    extra, after_s, host_rates = 0, 0.0, 0.0
    if experiment == catalogue.STAGING:
        per_round = sum(_staging_call_s(arm, sizes["bytes"], basis) for arm in arms)
    elif experiment == catalogue.STEP:
        one_step = sum(_step_call_s(arm, n, vocab, basis) + forward_s for arm in arms)
        per_round = sizes.get("steps", 1) * one_step  # each call a sequence of steps
        after_s = (_step_call_s(catalogue.FUSED, n, vocab, basis)
                   + STEP_AFTER_CALLS_PER_ARM * one_step)  # the checks run single steps
        host_rates = host_rates_s(n, vocab)
    elif experiment == catalogue.PROMPT:
        per_round = len(arms) * _prompt_call_s(sizes, basis)
        extra = 2  # the reference and the checked call of each configuration
    else:
        raise ValueError(f"no prediction for experiment {experiment!r}")
    timing = rounds * per_round
    if max_rounds is not None and max_rounds > rounds:
        timing = min(max_rounds * per_round, max(timing, max_seconds))
    setup = sources * n * vocab * basis.input_s_per_element
    return ((warmup + extra) * per_round + after_s + timing + setup
            + memory_probes * basis.memory_probe_s + host_rates + basis.cell_overhead_s)


def _rows_per_round(experiment: str, arm: str) -> int:
    """The total and one row per stage the catalogue names for ``arm`` (a configuration such
    as the prompt's ``fused+overlap@512`` times its total alone)."""
    try:
        return 1 + len(catalogue.arm(experiment, arm).stages)
    except ValueError:
        return 1


def cell_rows(experiment: str, arms: Sequence[str], rounds: int) -> int:
    """The most rows one cell of ``experiment`` writes when it runs ``rounds`` rounds (the
    round cap, for rounds until resolved): the size a rows file is predicted from."""
    per_round = sum(_rows_per_round(experiment, arm) for arm in arms)
    once = ROWS_PER_CELL_ONCE + (STEP_HOST_RATE_ROWS if experiment == catalogue.STEP else 0)
    return rounds * per_round + len(arms) * ROWS_PER_ARM_ONCE + once


def format_round_cap(notebook: str, *, rounds: int, max_rounds: int, max_seconds: float,
                     floor_s: float, cap_s: float, cells: int) -> str:
    """The ``--estimate`` line of rounds until resolved: the rounds every decisive cell runs,
    the cap it may run to while a question's CI straddles its bar, and what the cells take at
    each (``floor_s`` at ``rounds``, ``cap_s`` at the cap: the table counts the cap)."""
    seconds = "" if math.isinf(max_seconds) else f" or {max_seconds:g} s of timing"
    return (f"{notebook}: rounds until resolved: {rounds} rounds per cell (a PORT needs "
            f"{design.TAIL_ROUNDS}), more while a "
            f"question's CI straddles its bar, up to {max_rounds} rounds{seconds} per cell; "
            f"its {cells} cells take {floor_s:.1f} s at {rounds} rounds and at most "
            f"{cap_s:.1f} s at the cap (the table counts the cap)")
