"""A roofline *model* of the one-pass kernel from its compiled cubins: never a measurement.

What the compile check read from each cubin (``data/kernel_compile.json``, written by
``scripts/kernel_compile_check.py``: CTAs per SM, the tile loop's SASS instructions and
critical paths by path)
and the launch plan (:mod:`stagelab.core.launches`: programs per row, tile,
warps) predict, per (n, V, k, dtype) on a named GPU (:data:`GPUS`: an H200 or H100 from the
sm_90 cubins, an A100 from the sm_80 ones), the share of its HBM bandwidth the kernel
can reach, from the longer of two times:

* **HBM**: the datasheet peak (a ceiling no real kernel reaches: the model's 100 % is a
  kernel at it, not one measured there);
* **each program's slice**, the longest a plan makes (its whole tiles), at the SM with the
  most programs, in waves of the programs it holds at once (the least of the cubin's CTAs per
  SM, from its registers and shared memory, the pipeline's buffers among them, and the
  programs per SM the grid gives) (:func:`slice_ns`): its first load's latency, then its
  tiles' work, unless the loads lag behind it:
  * **memory parallelism** (Little's law): a tile lands a latency after the one
    :func:`stagelab.core.launches.tiles_ahead` tiles before it (the pipelined loads of the
    next tiles are in flight while it works), so each round of that many tiles takes a
    latency and a tile's work; a slice of no more tiles than that has every load in flight
    from its start;
  * **issue**: an SM issues at most 4 warp-instructions a clock (its schedulers), shared by
    its resident warps: a tile costs a program's warps ``warps x`` the tile's instructions
    a warp, at a quarter of the SM's slots per warp, or more where a scheduler holds more
    than one warp;
  * **dependences**: a warp issues in order, each instruction waiting for what it reads, so
    a tile takes at least its critical path as one warp issues it (the compile check's
    ``*_clocks``, :func:`stagelab.measure.sass_path.critical_path`, at the fast and slow
    ends of the assumed instruction latencies), however few its instructions; a scheduler
    holding one warp (four warps an SM) hides none of it;

  a tile's instructions and clocks are its guard's, the target's counts on a tile whose max
  reaches the target (:func:`counted_share`, at :data:`TARGET_RANK`), plus the top-K's: on
  a tile whose max beats the ``k``-th key held, the block that counts its candidates (values
  above that key) and merges what the tile gives, then either the per-candidate loop once
  for each of the best ``k`` candidates, or, where that is more than
  :data:`stagelab.core.launches.CANDIDATE_LIMIT` passes, the sort path (each path's
  instructions and clocks read from the cubin: ``kernel_compile.loop_figures``).

A split row then waits its **tail** (:func:`split_tail_ns`): its last slice
fences, counts itself in, reads the slices' partial states back from L2, reduces them, merges
the first group's keys and writes the row's results, then reads and merges any later group
of slices' keys, one program after the walk; its time is its cubin's critical path as one
warp issues it in order (``tail_trips`` L2 round trips and ``tail_clocks`` beside them, a
later group's ``merge_trips`` and ``merge_clocks``: the compile check's
:func:`stagelab.measure.sass_path.critical_path`, at the fast and slow ends of its assumed
instruction latencies); the call's time is the walk's plus that tail.

The candidates are modelled for independent logits: the first tile of a slice holds no keys
(its best ``k`` are taken). A small top-K (``K_PAD`` at most
:data:`stagelab.core.launches.CANDIDATE_LIMIT`) inserts a value of its ``t``-th tile exactly
when it is among the ``k`` best of the ``t B`` so far: ``k / t`` a tile on average
(:func:`inserted_candidates`). A wider one's candidates are the values above the ``k``-th best
of the ``(t - 1) B`` before the tile, each with probability ``k / ((t - 1) B + 1)``: binomial
over its ``B`` values. (The issue's assumption; real logits' tiles are not independent, and a
row whose best values come late costs more.) A slice's ragged last tile (walked masked,
after the loop) is counted at the loop's figures; a program's set-up and its own end of walk
(its final reductions and sort, before a split slice counts itself in or an unsplit one
writes its row) not at all, nor the call's launch, nor the drain of its last stores. A tile's
critical path is one iteration's from its inputs ready, so an iteration's last results
overlapping the next one's first instructions is not credited.

The memory latency is an assumed range (:data:`LATENCY_NS`); every figure is evaluated at both
ends. Torch-free.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from stagelab.core import forward, launches, paths

COMPILE_FILE = paths.DATA_DIR / "kernel_compile.json"
LEASE_TRITON = "3.6"  # the Triton the lease image runs: its cubins are the model's input
LEASE_GPU = "H200"  # the GPU the model is of unless told another: a kind the lease lends
LATENCY_NS = (450.0, 800.0)  # assumed HBM load latency under load, ns (an input, not measured)
# Assumed L2 hit latency under load, ns, paired with LATENCY_NS's ends (an input, not
# measured): the split walk's last slice reads the other slices' states from L2.
L2_LATENCY_NS = (200.0, 400.0)
# L2 round trips of a split row's tail before it reads anything: its last slice's fence (its
# stores acknowledged) and its count (the atomic's answer). Its critical path adds the
# cubin's ``tail_trips`` (kernel_compile.tail_figures) and a later group's ``merge_trips``.
FENCE_AND_COUNT_TRIPS = 2
ISSUE_PER_CLOCK = 4  # warp-instructions an SM issues per clock (four schedulers)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # torch's: the model's
GOAL = 0.70  # issue 44's goal: the model at >= 70 % of HBM at n >= 64, V = 152,064, k <= 20
GOAL_AT_16 = 0.40  # and at >= 40 % at n = 16
MOST_INSTRUCTIONS = 2**20  # the widest budget goal_instructions looks for, a tile's per warp
# The target's rank the model assumes (vLLM's: the values at or above it, itself included):
# a sampled token within the top 20. A tile counts toward it only where its max reaches the
# target (onepass_triton._walk_tile); an input, not measured.
TARGET_RANK = 20


@dataclass(frozen=True)
class Gpu:
    """What the model needs of a GPU: its datasheet figures (HBM GB/s, SMs, boost clock GHz),
    the compute capability its cubins were compiled for, and the names CUDA gives the cards
    it stands for (less "NVIDIA ": :func:`gpu_of_device`); named as ``data/platforms.csv``
    names its platform."""

    name: str
    hbm_gbps: float
    sms: int
    clock_ghz: float
    arch: int
    devices: tuple[str, ...] = ()


# SMs and boost clocks from NVIDIA's datasheets (H100 and H200 SXM: 132 SMs at 1.98 GHz; A100,
# 40 or 80 GB: 108 at 1.41), HBM from forward's table (the first device's); an A100 is
# modelled from the sm_80 cubins.
GPUS = {gpu.name: gpu for gpu in (
    Gpu("H200", forward.peak_bandwidth_gbps("H200") or 0.0, 132, 1.98, 90, ("H200",)),
    Gpu("H100 SXM", forward.peak_bandwidth_gbps("H100 80GB HBM3") or 0.0, 132, 1.98, 90,
        ("H100 80GB HBM3",)),
    Gpu("A100 SXM", forward.peak_bandwidth_gbps("A100-SXM4-80GB") or 0.0, 108, 1.41, 80,
        ("A100-SXM4-80GB", "A100-SXM4-40GB")),
    Gpu("A100 PCIe", forward.peak_bandwidth_gbps("A100 80GB PCIe") or 0.0, 108, 1.41, 80,
        ("A100 80GB PCIe", "A100-PCIE-40GB")))}


def gpu_of_device(device_name: str | None) -> Gpu | None:
    """The modelled GPU of a CUDA device (its name as ``torch.cuda.get_device_name`` gives
    it), at that card's own datasheet HBM peak (a 40 GB A100's 1555 GB/s, not the 80 GB
    card's); None for no device or one not modelled (an exact name, never a near match: an
    H200 NVL or an H100 PCIe has other clocks or SMs)."""
    name = forward.device_key(device_name)
    for gpu in GPUS.values():
        if name in gpu.devices:
            return replace(gpu, hbm_gbps=forward.PEAK_BANDWIDTH_GBPS[name])
    return None


def gpu_named(gpu: Gpu | str) -> Gpu:
    """``gpu`` itself, or the :data:`GPUS` entry it names."""
    return GPUS[gpu] if isinstance(gpu, str) else gpu


@cache
def compiled_variants(path: Path = COMPILE_FILE) -> tuple[dict[str, Any], ...]:
    """The compile check's rows (empty where it has not been written)."""
    if not path.exists():
        return ()
    return tuple(json.loads(path.read_text())["variants"])


def figures_of(launch: launches.Launch, dtype: str, arch: int, triton: str = LEASE_TRITON,
               variants: tuple[dict[str, Any], ...] | None = None) -> dict[str, Any]:
    """The compiled figures of ``launch`` on logits of ``dtype`` (a compile check row of its
    constexprs, warps and register cap: the same constexprs on other warps are another
    cubin)."""
    for row in compiled_variants() if variants is None else variants:
        if (row["kernel"] == launch.kernel and row["arch"] == arch and row["compiles"]
                and row["triton"].startswith(triton + ".")
                and row["pointers"].get("x_ptr") == dtype
                and row["constexprs"] == dict(launch.constexprs)
                and row["num_warps"] == launch.num_warps
                and row.get("max_registers") == launch.max_registers):
            return row
    cap = ("ptxas's own registers" if launch.max_registers is None
           else f"at most {launch.max_registers} registers")
    raise LookupError(f"no compiled {launch.kernel} {dict(launch.constexprs)} {dtype} on "
                      f"{launch.num_warps} warps, {cap}, for sm_{arch} on Triton {triton}: "
                      "run scripts/kernel_compile_check.py --write")


def tile_candidates(block: int, k: int, tile: int,
                    limit: int = launches.CANDIDATE_LIMIT) -> tuple[float, float, float]:
    """For a slice's ``tile``-th tile (1: the first) of ``block`` independent logits: the
    probability that some value is above the ``k``-th best before it (the top-K block is
    entered), that the tile sorts (more than ``limit`` passes to make), and the expected
    passes of the per-candidate loop. The first tile holds no key: its ``k`` best are all to
    take. A small top-K (``K_PAD <= limit``) inserts values one by one
    (:func:`inserted_candidates`); a wider one takes the best ``k`` of the candidates above
    the ``k``-th best before the tile, where at most ``limit``."""
    if tile < 1 or block < 1 or k < 1:
        raise ValueError(f"tile, block and k must be >= 1, got {tile}, {block}, {k}")
    if launches.pow2_at_least(max(k, 2)) <= limit:
        return inserted_candidates(block, k, tile)
    if tile == 1:
        return (1.0, 0.0, float(k)) if k <= limit else (1.0, 1.0, 0.0)
    p = min(1.0, k / ((tile - 1) * block + 1))
    pmf = [math.comb(block, j) * p ** j * (1 - p) ** (block - j)
           for j in range(min(limit, block) + 1)]
    more = 1.0 - sum(pmf)  # more than ``limit`` candidates: ``k`` passes, or the sort path
    passes = sum(min(j, k) * pmf[j] for j in range(1, len(pmf)))
    return (1.0 - pmf[0], more, passes) if k > limit else (1.0 - pmf[0], 0.0, passes + k * more)


def inserted_candidates(block: int, k: int, tile: int) -> tuple[float, float, float]:
    """:func:`tile_candidates` for a small top-K, whose tile puts its values, the highest
    first, in the place of the least key held while one is above it
    (``onepass_triton._insert_each``): a value is put there exactly when it is among the
    ``k`` best of its tile and every tile before, which for ``t = tile`` tiles of independent
    logits is a uniformly random ``k`` of the ``t B``: the tile is entered unless all ``k``
    lie before it (probability ``C((t - 1) B, k) / C(t B, k)``), and it inserts ``k / t``
    values on average (``k`` on the first). It never sorts."""
    if tile == 1:
        return 1.0, 0.0, float(k)
    before, seen = (tile - 1) * block, tile * block
    none = math.prod((before - i) / (seen - i) for i in range(k))
    return 1.0 - none, 0.0, k / tile


def counted_share(block: int, vocab: int, rank: int = TARGET_RANK) -> float:
    """The probability that a tile of ``block`` of a row's ``vocab`` independent logits holds
    one of the ``rank`` values at or above the target's (then it counts them): one minus
    ``C(vocab - block, rank) / C(vocab, rank)``."""
    if not 1 <= rank <= vocab or block < 1:
        raise ValueError(f"rank must be in [1, vocab] and block >= 1, got {rank}, {block}")
    return 1.0 - math.prod(max(0, vocab - block - i) / (vocab - i) for i in range(rank))


def walk_costs(row: dict[str, Any], tiles: int, block: int, k: int,
               counted: float = 1.0, end: int = 1) -> dict[str, float]:
    """The mean SASS instructions a tile costs each warp, and the mean clocks of its
    critical path as one warp issues it (``clocks``: each path's, the compile check's
    ``*_clocks`` at ``end`` of its assumed instruction latencies, 0 the fast, 1 the slow),
    over a slice of ``tiles`` tiles of a top-``k`` walk (the compile check's ``row``) whose
    tiles count toward the target with probability ``counted`` (:func:`counted_share`),
    with the mean share of tiles that enter the top-K block, that sort, and the mean
    candidates a tile takes one by one."""
    guard = float(row["guard_instructions"]) + counted * row.get("count_instructions", 0)
    clocks = float(row["guard_clocks"][end]) + counted * row["count_clocks"][end]
    if k == 0:
        return dict(instructions=guard, clocks=clocks, entered=0.0, sorted=0.0,
                    candidates=0.0)
    shares = [tile_candidates(block, k, t) for t in range(1, tiles + 1)]
    entered, sorting, candidates = (sum(column) / tiles for column in zip(*shares))
    cost = (guard + entered * row["enter_instructions"] + sorting * row["sort_instructions"]
            + candidates * row["candidate_instructions"])
    clocks += (entered * row["enter_clocks"][end] + sorting * row["sort_clocks"][end]
               + candidates * row["candidate_clocks"][end])
    return dict(instructions=cost, clocks=clocks, entered=entered, sorted=sorting,
                candidates=candidates)


def slice_ns(latency_ns: float, issue_ns: float, path_ns: float, ahead: int,
             tiles: int) -> tuple[float, str]:
    """A program's time over a slice of ``tiles`` tiles, and what binds it: each tile's work
    takes the longer of its warps' share of their schedulers' issue (``issue_ns``) and its
    critical path as one warp issues it (``path_ns``: ``dependences``); where ``ahead``
    tiles' loads are in flight from the start and each tile worked issues the load of the
    one ``ahead`` after it, the program waits its first load, then works its tiles unless
    the loads lag (``memory parallelism``: each of the tiles past the first ``ahead`` lands a
    latency after the one ``ahead`` before it is worked: each round of ``ahead`` tiles a
    latency and a tile's work, the last round's other tiles' work after it), within a
    round's work (``ahead x work``) of the pipeline's own steps; a short slice whose first
    wait outlasts its work is bound by it.
    Where nothing is loaded ahead, each tile waits its own load, then is worked. A tie of
    issue and path is named issue."""
    work = max(issue_ns, path_ns)
    working = "dependences" if path_ns > issue_ns else "issue"
    if ahead < 1:
        return tiles * (latency_ns + work), ("memory parallelism" if latency_ns > work
                                             else working)
    rounds = math.ceil(tiles / ahead)
    lagging = rounds * (latency_ns + work) + (tiles - (rounds - 1) * ahead - 1) * work
    worked = latency_ns + tiles * work  # the same as lagging in one round, but for rounding
    return max(worked, lagging), ("memory parallelism"
                                  if lagging > worked * (1 + 1e-9) or latency_ns > tiles * work
                                  else working)


def split_tail_ns(parts: int, group: int, row: dict[str, Any], top_k: bool,
                  l2_latency_ns: float, clock_ghz: float, end: int) -> float:
    """The tail of a row split in ``parts`` slices, after its walk, from the compile check's
    ``row`` of its cubin: its last slice's :data:`FENCE_AND_COUNT_TRIPS` L2 round trips,
    then its critical path (``tail_trips`` round trips and ``tail_clocks[end]``: ``end`` 0
    the fast, 1 the slow end of the latencies the check assumed); then, with a top-K, each
    later group of ``group`` slices' keys read and merged (``merge_trips`` and
    ``merge_clocks[end]``) before the next is read; 0 unsplit."""
    if parts < 2:
        return 0.0
    later = math.ceil(parts / group) - 1 if top_k else 0
    trips = FENCE_AND_COUNT_TRIPS + row["tail_trips"] + later * row["merge_trips"]
    clocks = row["tail_clocks"][end] + later * row["merge_clocks"][end]
    return trips * l2_latency_ns + clocks / clock_ghz


@dataclass(frozen=True)
class Latencies:
    """The latencies a prediction assumes (inputs, never measured): an HBM load's under load,
    an L2 hit's (a split row's tail: :func:`split_tail_ns`), and which end of the tail's
    assumed instruction latencies its clocks are read at (``end``: 0 the fast, 1 the slow;
    the compile check's ``tail_clocks`` pairs)."""

    memory_ns: float
    l2_ns: float = max(L2_LATENCY_NS)
    end: int = 1


SLOW = Latencies(max(LATENCY_NS), max(L2_LATENCY_NS), 1)  # the model's low share
FAST = Latencies(min(LATENCY_NS), min(L2_LATENCY_NS), 0)  # and its high one


def predict(rows: int, vocab: int, k: int, dtype: str, gpu: Gpu, latencies: Latencies,
            variants: tuple[dict[str, Any], ...] | None = None,
            target_rank: int | None = TARGET_RANK,
            tile_instructions: float | None = None) -> dict[str, Any]:
    """The model's share of ``gpu``'s HBM for one call at ``latencies`` (:func:`predict_range`
    pairs :data:`SLOW` and :data:`FAST`), with its inputs, for a target of ``target_rank``
    (None: every tile counts toward it, the worst case); a tile's mean instructions
    ``tile_instructions`` in place of the cubin's where given, its critical path scaled with
    them (what a kernel would need: :func:`goal_instructions`)."""
    latency_ns, end = latencies.memory_ns, latencies.end
    first = launches.triton_launches(rows, vocab, k, True, None, None,
                                     launches.device_slots(gpu.sms, k))[0]
    row = figures_of(first, dtype, gpu.arch, variants=variants)
    block, warps = int(first.constexprs["BLOCK"]), first.num_warps
    programs = first.grid[0] * first.grid[1]
    active = min(gpu.sms, programs)
    on_busiest = math.ceil(programs / active)  # the programs of the SM with the most
    resident = min(row["ctas_per_sm"], on_busiest)
    waves = math.ceil(on_busiest / resident)
    tiles = math.ceil(first.scalars["span"] / block)  # a whole slice's: the longest
    counted = 1.0 if target_rank is None else counted_share(block, vocab, target_rank)
    costs = walk_costs(row, tiles, block, k, counted, end)
    per_tile = costs["instructions"] if tile_instructions is None else tile_instructions
    path_clocks = costs["clocks"] * per_tile / costs["instructions"]  # at the cubin's ratio
    sharing = max(1.0, resident * warps / ISSUE_PER_CLOCK)  # warps a scheduler issues for
    ahead = launches.tiles_ahead()
    program_ns, bound = slice_ns(latency_ns, sharing * per_tile / gpu.clock_ghz,
                                 path_clocks / gpu.clock_ghz, ahead, tiles)
    total_bytes = rows * vocab * DTYPE_BYTES[dtype]
    walk_ns = max(total_bytes / gpu.hbm_gbps, waves * program_ns)  # bytes / (GB/s) is ns
    if walk_ns == total_bytes / gpu.hbm_gbps:
        bound = "hbm"
    tail_ns = split_tail_ns(first.grid[1], int(first.constexprs["GROUP"]), row, k > 0,
                            latencies.l2_ns, gpu.clock_ghz, end)
    rate = total_bytes / (walk_ns + tail_ns)
    if tail_ns > walk_ns:
        bound = "tail"  # a split row's tail outlasts its walk
    tile_bytes = block * DTYPE_BYTES[dtype]
    return dict(rows=rows, vocab=vocab, k=k, dtype=dtype, gpu=gpu.name, latency_ns=latency_ns,
                programs=programs, warps=warps, waves=waves,
                resident_per_sm=resident, scheduler_warps=round(sharing, 2),
                ctas_per_sm=row["ctas_per_sm"],
                registers=row["registers"],
                bytes_in_flight_per_sm=resident * tile_bytes * max(1, min(ahead, tiles)),
                tiles_per_slice=tiles, tile_instructions=round(per_tile, 1),
                tile_clocks=round(path_clocks, 1),
                counted_share=round(counted, 3),
                entered_share=round(costs["entered"], 3),
                sorted_share=round(costs["sorted"], 3),
                candidates_per_tile=round(costs["candidates"], 3),
                instructions_per_logit=round(per_tile * warps * 32 / block, 1),
                tail_trips=row["tail_trips"] if tail_ns else 0,
                tail_clocks=row["tail_clocks"][end] if tail_ns else 0,
                tail_instructions=row["tail_instructions"] if tail_ns else 0,
                walk_ns=round(walk_ns, 1), tail_ns=round(tail_ns, 1),
                model_gbps=round(rate, 1), model_hbm_share=rate / gpu.hbm_gbps,
                bound=bound, triton=row["triton"])


def predict_range(rows: int, vocab: int, k: int, dtype: str,
                  gpu: Gpu | str = LEASE_GPU,
                  variants: tuple[dict[str, Any], ...] | None = None) -> dict[str, Any]:
    """:func:`predict` at both ends of :data:`LATENCY_NS` (paired with those of
    :data:`L2_LATENCY_NS` and of the tail's instruction latencies) on ``gpu`` (a
    :data:`GPUS` name, or a :class:`Gpu`: :func:`gpu_of_device`'s): the slow end's inputs,
    and the model's share of HBM as ``model_low`` (the slow ends) and ``model_high``, with
    ``model_low_counting_all``: the longer latency's where every tile counts toward the
    target (its rank not assumed)."""
    gpu = gpu_named(gpu)
    slow, fast = (predict(rows, vocab, k, dtype, gpu, ends, variants) for ends in (SLOW, FAST))
    worst = predict(rows, vocab, k, dtype, gpu, SLOW, variants, target_rank=None)
    return dict(slow, model_low=slow["model_hbm_share"], model_high=fast["model_hbm_share"],
                model_low_counting_all=worst["model_hbm_share"],
                latency_ns=f"{min(LATENCY_NS):g}-{max(LATENCY_NS):g}",
                l2_latency_ns=f"{min(L2_LATENCY_NS):g}-{max(L2_LATENCY_NS):g}",
                note="a model from the cubins (never a measurement)")


def goal_share(rows: int) -> float | None:
    """Issue 44's goal for a call of ``rows`` rows (which the issue sets at k <= 20, the
    model table's ks): :data:`GOAL` of HBM from 64 rows, :data:`GOAL_AT_16` at 16 (and, in
    this reading, up to 63); None below 16 (no goal)."""
    return GOAL if rows >= 64 else GOAL_AT_16 if rows >= 16 else None


def meets_goal(found: dict[str, Any]) -> bool | None:
    """Whether a :func:`predict_range` result meets its goal at the slow ends (its unrounded
    ``model_low``); None where its row count has no goal."""
    goal = goal_share(found["rows"])
    return None if goal is None else found["model_low"] >= goal


def goal_instructions(rows: int, vocab: int, k: int, dtype: str,
                      gpu: Gpu | str = LEASE_GPU,
                      variants: tuple[dict[str, Any], ...] | None = None) -> float | None:
    """The most instructions a tile may cost each warp (the mean over a slice, as
    ``tile_instructions``, its critical path at the cubin's clocks an instruction) for the
    model to meet the goal (:func:`goal_share`) at the slow ends, all else the cubin's (its
    CTAs, its tail): a budget to set a kernel's design
    against, in tenths of an instruction; None where no walk meets it (the tail and the
    memory latency alone miss it) or there is no goal. The share falls as a tile costs more:
    found by bisection, between a tenth of an instruction and :data:`MOST_INSTRUCTIONS`
    (``ValueError`` where even that meets it)."""
    goal = goal_share(rows)
    gpu = gpu_named(gpu)

    def meets(tenths: int) -> bool:
        return predict(rows, vocab, k, dtype, gpu, SLOW, variants,
                       tile_instructions=tenths / 10)["model_hbm_share"] >= goal

    low, high = 1, 10 * MOST_INSTRUCTIONS  # tenths: low meets the goal, high does not
    if goal is None or not meets(low):
        return None
    if meets(high):
        raise ValueError(f"n={rows} V={vocab} k={k} {dtype}: the goal is met even at "
                         f"{MOST_INSTRUCTIONS} instructions a tile, the bisection's end")
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low / 10


def grid(gpu_name: str = LEASE_GPU, rows: tuple[int, ...] = (1, 16, 64, 256),
         vocab: int = 152064, ks: tuple[int, ...] = (0, 5, 20),
         dtypes: tuple[str, ...] = ("fp32", "bf16"),
         variants: tuple[dict[str, Any], ...] | None = None) -> list[dict[str, Any]]:
    """:func:`predict_range` over the goal's shapes."""
    return [predict_range(n, vocab, k, dtype, gpu_name, variants)
            for dtype in dtypes for k in ks for n in rows]


def percent_range(rows: int, vocab: int, k: int, dtype: str,
                  gpu: Gpu | str = LEASE_GPU) -> str:
    """The model's share of ``gpu``'s HBM (:func:`predict_range`'s) as ``"low-high %"``
    (``dtype`` torch's name or the model's), or why there is none."""
    try:
        found = predict_range(rows, vocab, k, DTYPE_NAMES.get(dtype, dtype), gpu)
    except (LookupError, KeyError) as exc:
        return f"no model ({exc})"[:120]
    return f"{100 * found['model_low']:.0f}-{100 * found['model_high']:.0f} %"


def one_pass_words(gpu_name: str, cells: list[tuple[int, int, int]]) -> str:
    """One line for ``stagelab predict``: the one-pass kernel's modelled share of HBM on
    ``gpu_name`` at each ``(n, V, k)``, fp32 and bf16 logits; empty for a GPU not modelled."""
    if gpu_name not in GPUS or not compiled_variants():
        return ""
    parts = [f"n={n} V={vocab} k={k}: fp32 {percent_range(n, vocab, k, 'fp32', gpu_name)}, "
             f"bf16 {percent_range(n, vocab, k, 'bf16', gpu_name)}"
             for n, vocab, k in dict.fromkeys(cells)]
    return (f"  one-pass kernel, a model from its Triton {LEASE_TRITON} cubins (not measured; "
            f"latency {min(LATENCY_NS):g}-{max(LATENCY_NS):g} ns, L2 "
            f"{min(L2_LATENCY_NS):g}-{max(L2_LATENCY_NS):g} ns and instruction latencies "
            f"assumed), share of HBM: "
            + "; ".join(parts))
