"""The launches of the one-pass kernels (:mod:`stagelab.measure.onepass_triton`) as plain data.

How many programs, which tile, which ``tl.constexpr`` flags and how many warps a call makes is
integer arithmetic on its shape; written once here (standard library only), it is what
:mod:`stagelab.measure.onepass` launches, what the compile check compiles
(:mod:`stagelab.measure.kernel_variants`) and what the roofline model reads
(:mod:`stagelab.analyse.roofline`), so that the three cannot drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

DEFAULT_TILE = 2048  # vocabulary entries per tile of the kernel (a power of two)
# The widest tile of the fold kernel (a power of two): its 2048-wide tile spilled registers on
# Triton 3.6 for sm_90 (8 bytes at K_PAD 2 and 16 at K_PAD 1024, fp32 logits); a wider
# ``head_fused`` tile is walked in tiles of this width (docs/kernels.md).
FOLD_TILE = 1024


def pow2_at_least(value: int) -> int:
    """The smallest power of two ``>= value`` (1 for 0)."""
    return 1 << max(0, value - 1).bit_length()


def programs_per_sm(k: int) -> int:
    """Programs of the four-warp one-pass walk a split plan aims at per SM (a call whose tile
    or slices are given, or whose top-K is wider than :data:`NARROW_K_PAD`; any other call
    walks in :func:`narrow_programs_per_sm` one-warp programs an SM: :func:`narrow_walk`): 2
    without a top-K (two programs of :data:`PIPELINE_STAGES` keep 2 (bf16) to 4 (fp32) times
    the bytes in flight Little's law asks at 800 ns, and two CTAs of the pipeline's shared
    memory fit an SM of sm_80 and sm_90, where the compile check's fp32 walk fits 3 on sm_90
    and 2 on sm_80; the roofline model finds such walks bound by their tiles' critical paths
    instead, which two programs an SM halve); 1 with one: :func:`top_k_splits` weighs the
    slices' top-K work against the SMs they fill."""
    return 1 if k else 2


def device_slots(sms: int, k: int) -> int:
    """The ``slots`` of :func:`launch_plan` on a GPU of ``sms`` SMs for a top-``k`` call."""
    return programs_per_sm(k) * sms


def default_splits(rows: int, tiles: int, slots: int) -> int:
    """Slices per row without a top-K, never more than its tiles: of the most whose programs
    fit ``slots`` and the fewest that fill them, the one whose waves of ``slots`` programs
    times the tiles of a slice are the fewer (the fewer slices of equals): rounding up fills
    a slot a row count leaves idle (n = 64, 2112 slots: 33 slices, not 32 and 64 idle), but
    not where it starts a wave (n = 1651: one slice, not two in two waves); 1 once the rows
    alone fill the device."""
    rows = max(rows, 1)
    fit, fill = (max(1, min(tiles, parts)) for parts in (slots // rows, math.ceil(slots / rows)))
    return min((fit, fill), key=lambda parts: (math.ceil(rows * parts / slots)
                                               * math.ceil(tiles / parts), parts))


# The most slices a row is split into: the row's last slice reads every slice's scalars at once
# (onepass_triton._merged_slices: a record a slice, the slices padded to a power of two:
# SLICES).
MAX_SLICES = 256
COLUMN_LIMIT = 2**31 - 1  # the kernel's columns are int32: a slice's end must fit
# The most tiles a slice spans: a lane counts the target's ties in the high 16 bits of an
# int32 (onepass_triton._walk_tile), one a tile at most, and a slice whose row starts off
# alignment walks one tile more (its cut first), so 2**15 - 2 keeps them positive.
MAX_SLICE_TILES = 2**15 - 2
# The most keys the row's last slice reads at once from the slices' partial states: a group of
# MERGED_KEYS // K_PAD slices (merge_group), whose best K_PAD it merges into the row's.
MERGED_KEYS = 256
# A split row's tail after its walk, in the split plan's heuristic, in tiles of a walk (about
# 225 ns each: a tile's 8 KiB of fp32 at an H200's 4.8 TB/s over its 132 SMs): its last
# slice's fence, count and read (three L2 round trips, 200-400 ns each: MERGE_FIXED_TILES),
# and for each group of slices, the first included, its keys merged by that lone program
# (an L2 read for a later group; the compile check's Triton 3.6 sm_90 cubins give its tail's
# critical path 513-2662 clocks at the slow end, 0.3-1.3 us, and a later group's merge
# 262-3334, up to 1.7 us: MERGED_GROUP_TILES a group, 3.6 us, errs long). Assumptions for
# the plan, not figures read from a cubin (the roofline model reads its tail from the cubin:
# stagelab.analyse.roofline.split_tail_ns).
MERGE_FIXED_TILES = 8
MERGED_GROUP_TILES = 16


def merge_group(k_pad: int, parts: int) -> int:
    """Slices whose keys the row's last slice reads at once (``GROUP``: a power of two): as
    many as :data:`MERGED_KEYS` allows, and no more than the row's ``parts`` need."""
    return max(1, min(MERGED_KEYS // k_pad, pow2_at_least(parts)))


KEY_BYTES = 8  # a top-K key: an int64 of the value's ordered bits and its id
LANE_LOAD_BYTES = 16  # the widest load a lane issues


def merge_tree(k_pad: int, group: int, warps: int) -> bool:
    """Whether a split row's last slice merges a group of slices' keys as a tree, the odd
    slices' read in reverse (``MERGE_TREE``: onepass_triton._group_best), in place of
    ``tl.topk``, which sorts again each list its slice wrote sorted: a group of more than two
    whose ``group x k_pad`` keys take each lane of ``warps`` warps more than one load of
    :data:`LANE_LOAD_BYTES`, where ptxas issued ``tl.topk``'s loads one after another. Only
    one-warp walks meet it (a group holds at most :data:`MERGED_KEYS` keys: one such load
    a lane of four warps): K_PAD 2 in groups of 64 and 128, 4 of 32 and 64, 8 of 16 and 32,
    16 of 8 and 16, 32 of 4 and 8 (the compile check's shapes give K_PAD 2, 8 and 32).
    Compile check, Triton 3.6, sm_90, fp32, the critical path (L2 round trips, slow-end
    clocks) with ``tl.topk`` (its keys read first, each raised to their least: the rows
    committed before) against the tree, 2026-12-07: n = 64, k = 5 (32 slices of 8 keys) the
    tail 2 and 3273 against 2 and 1009, a later group's merge 1 and 4386 against 1 and 2326;
    n = 256, k = 20 (8 slices of 32 keys), the tail 2 and 1255 against 1 and 1511 (a round
    trip fewer for 256 clocks more). On Triton 3.9, 8 slices of 32 keys wait 2 round trips
    in a later group's merge against 1 (ptxas issues some loads after the first merge
    stage), for 2397 clocks against 8398. The reversed addresses are not contiguous: the
    tree reads its keys 8 bytes a load, ``tl.topk`` 16. A group of one or two slices is
    merged, never sorted."""
    return group > 2 and group * k_pad * KEY_BYTES > LANE_LOAD_BYTES * 32 * warps


@cache  # a scan of every slice count: once a shape, not on every call
def top_k_splits(rows: int, tiles: int, k: int, slots: int) -> int:
    """Slices per row of a top-``k`` call on ``slots`` programs at once (one an SM, or a
    narrow walk's :func:`narrow_programs_per_sm`: :func:`narrow_walk`): the count whose
    busiest SM has the least work, the fewest of equals. An SM's work is its
    programs (``ceil(rows x slices / slots)``) times a slice's: its tiles plus its top-K's
    insertions, ``k (1 + ln T)`` for ``T`` tiles of independent logits (``k`` on its first,
    about ``k / t`` on its ``t``-th: ``stagelab.analyse.roofline.inserted_candidates``), an
    insertion costing about a tile (the compile check's Triton 3.6 sm_90 cubins, K_PAD 2 to
    32: a candidate's loop 70-175 SASS instructions, a tile's guard 144-167); then the row's
    last slice merges the slices' keys, a group at a time (:func:`merge_group`): a tail of
    :data:`MERGE_FIXED_TILES` and :data:`MERGED_GROUP_TILES` a group. A heuristic of the
    plan, not the roofline model: it ignores latency, and a wide top-K's sort path."""
    def busiest(parts: int) -> float:
        span = math.ceil(tiles / parts)
        walk = math.ceil(rows * parts / max(slots, 1)) * (span + k * (1 + math.log(span)))
        groups = math.ceil(parts / merge_group(pow2_at_least(max(k, 2)), parts))
        return walk + (MERGE_FIXED_TILES + MERGED_GROUP_TILES * groups if parts > 1 else 0)

    return min(range(1, min(max(tiles, 1), MAX_SLICES) + 1),
               key=lambda parts: (busiest(parts), parts))


def launch_plan(rows: int, vocab: int, k: int, tile: int | None, splits: int | None,
                slots: int) -> tuple[int, int, int, int]:
    """``(BLOCK, K_PAD, slices per row, span of a slice)`` on a device running ``slots``
    four-warp programs at once (:func:`device_slots`; a narrow walk plans
    :func:`narrow_programs_per_sm` one-warp programs for each SM those slots stand for:
    :func:`narrow_walk`): no slice is empty, and no row has more than :data:`MAX_SLICES`; a
    slice of more than :data:`MAX_SLICE_TILES` tiles is refused (``ValueError``), as is a
    plan whose last slice would end past :data:`COLUMN_LIMIT` (the kernel's int32 columns) or
    a vocabulary of no logit; a planned count of slices grows to keep each within
    :data:`MAX_SLICE_TILES`; ``K_PAD`` is at least 2 (Triton's sort and merge need a
    dimension to work along)."""
    if vocab < 1:
        raise ValueError(f"vocab must be >= 1, got {vocab}")
    k_pad = pow2_at_least(max(k, 2))
    if narrow_walk(rows, vocab, k, tile, splits):
        tile, slots = NARROW_TILE, narrow_programs_per_sm(k) * slots // programs_per_sm(k)
    block = max(tile or DEFAULT_TILE, k_pad)
    tiles = math.ceil(vocab / block)
    planned = top_k_splits(rows, tiles, k, slots) if k else default_splits(rows, tiles, slots)
    parts = min(tiles, splits or max(planned, math.ceil(tiles / MAX_SLICE_TILES)), MAX_SLICES)
    span = math.ceil(tiles / parts) * block
    if span // block > MAX_SLICE_TILES:
        raise ValueError(f"vocab {vocab} in {parts} slices of {span // block} tiles of "
                         f"{block}: at most {MAX_SLICE_TILES} tiles a slice (the kernel's per-lane "
                         "counts); pass a wider tile or more splits")
    slices = math.ceil(vocab / span)
    if slices * span > COLUMN_LIMIT:
        raise ValueError(f"vocab {vocab} in {slices} slices of {span} logits: the last would "
                         f"end at column {slices * span}, past {COLUMN_LIMIT} (the kernel's "
                         "int32 columns)")
    return block, k_pad, slices, span


# The widest top-K (K_PAD) whose tile puts its values one by one in the place of the least key
# held (onepass_triton._insert_each: no merge a tile); and, for a wider one, the most passes a
# tile's per-candidate loop makes (onepass_triton._enter: one a value it takes, the best k of
# those above the k-th key held), a tile with more to take sorting its top K_PAD and merging
# it. The roofline model weighs the paths by this limit.
CANDIDATE_LIMIT = 32

# A narrow walk (narrow_walk): one warp a program, tiles of NARROW_TILE (16 logits a lane, as a
# 4-warp program's 2048: one warp's 1024-wide tiles spilled 8-120 bytes at n = 256 in a
# compile check run not kept, on Triton 3.6 for sm_80 and 3.9 for sm_90), for a top-K padded
# to NARROW_K_PAD or less.
NARROW_TILE = 512
NARROW_K_PAD = 32
NARROW_LEAST_ROWS = 16  # fewer rows (decode) keep the four-warp plan: narrow_walk


def narrow_programs_per_sm(k: int) -> int:
    """One-warp programs a narrow walk's plan aims at per SM (:func:`narrow_walk`), from the
    compile check's cubins (Triton 3.6, sm_90): 12 with a top-K, three warps for each of the
    SM's four schedulers (137-195 registers: 10 to 14 CTAs an SM); 16 without (71-112
    registers: 18 to 25 CTAs of 16-bit logits an SM, 14 of fp32, its pipeline's shared
    memory the bound). Chosen on 2026-12-07 from 12, 14, 16 and 20 without a top-K under the
    roofline model (H200, V = 152,064, slow ends, in a run not kept): 16 is above 12 and 14
    for bf16 (n = 64: 71.5 % against 60.2 and 66.9; n = 256: 91.2 against 85.4 and 91.2)
    and within 0.2 points of them for fp32 (n = 64: 83.3 against 83.5); 20 falls at n = 16
    (fp32: 41.2 against 55.0). An A100's sm_80 top-K cubins fit 9 or 10: its twelve run in
    two waves."""
    return 12 if k else 16


def narrow_walk(rows: int, vocab: int, k: int, tile: int | None, splits: int | None) -> bool:
    """Whether a top-``k`` call (``k`` 0: none) of ``rows`` rows of ``vocab`` logits walks in
    one-warp programs of :data:`NARROW_TILE`-wide tiles, :func:`narrow_programs_per_sm` an
    SM: a call of at least :data:`NARROW_LEAST_ROWS` rows that leaves the tile and the slices
    to the plan, with a top-K padded to at most :data:`NARROW_K_PAD` (``k <= 32``), whose
    row fits one slice of such tiles (:data:`MAX_SLICE_TILES`). One warp reduces a tile with
    shuffles alone, where four also exchange through shared memory behind barriers: a
    shorter critical path a tile and a candidate (the compile check's ``guard_clocks`` and
    ``candidate_clocks``, Triton 3.6 sm_90, fp32 K_PAD 32: 355-513 and 467-669 clocks in one
    warp against 505-739 and 801-1212 in four); and twelve or sixteen such programs an SM
    give each scheduler three or four warps to issue from, where a four-warp top-K walk
    holds two programs an SM (its 162-211 registers at K_PAD 2 to 32; three at some of
    K_PAD 2) and the split plan gives it one. The roofline model
    (:mod:`stagelab.analyse.roofline`) finds both walks bound by their tiles' critical
    paths, which more warps a scheduler hide.

    Chosen on 2026-12-07 under that model, both plans' cubins compiled
    (``scripts/compare_narrow_plan.py`` prints the comparison again; H200, V = 152,064, slow
    ends, % of HBM), in place of four one-warp programs an SM at ``17 <= k <= 32`` for rows
    that fill the SMs. Against the four-warp plan (a tile given) at n = 16 to 1000, its split
    rows merging a group's keys as a tree where they take a lane more than one load
    (:func:`merge_tree`; 2026-12-08): n = 64, k = 0: fp32 83.3 against 76.5, bf16 71.5
    against 42.1; k = 5: 66.1 and 38.1 against 25.2 and 14.4; k = 20: 23.4 and 14.7 against
    10.7 and 7.1; n = 256, k = 5: 93.9 and 70.9 against 66.9 and 37.2; k = 20: 66.0 and 39.5
    against 32.5 and 20.9. It is below at two of those 24 cells (k = 0 fp32 at n = 256,
    95.4 against 95.8, and n = 1000, 98.9 against 100), and at five at the fast ends, by 2.7
    points at most. Below :data:`NARROW_LEAST_ROWS` rows it loses with a top-K at k = 5
    (n = 4, fp32: 4.6 against 5.1, bf16 2.7 against 3.2) and at k = 20 for bf16 (0.9
    against 1.0), is level at k = 20 for fp32 (1.5 against 1.4; 2.1 both at the fast ends),
    and loses at n = 1 without: decode keeps the four-warp plan."""
    return (tile is None and splits is None and rows >= NARROW_LEAST_ROWS
            and pow2_at_least(max(k, 2)) <= NARROW_K_PAD
            and math.ceil(vocab / NARROW_TILE) <= MAX_SLICE_TILES)


# The stages of the walk's tile loop (``tl.range``'s ``num_stages``: Triton's software
# pipeline copies each tile into shared memory ``PIPELINE_STAGES - 1`` tiles ahead of the one
# walked, on sm_80 and sm_90). Eight keep 28 KiB of bf16 (56 of fp32) in flight for one
# program: Little's law at an H200's 4.8 TB/s and 800 ns asks about 28 KiB an SM. Its shared
# memory (a tile a stage) bounds the programs an SM holds (the compile check reads it).
PIPELINE_STAGES = 8


def tiles_ahead() -> int:
    """Tiles whose loads are in flight while the walk works one (the roofline model's)."""
    return PIPELINE_STAGES - 1


# Logits of 16 bits a 16-byte copy holds: a row stride not a multiple of it leaves some rows'
# first logits off the 16-byte alignment the pipeline's copies need (:func:`leads`).
ALIGNED_LOGITS = 8


def leads(stride_row: int) -> bool:
    """Whether a kernel must walk rows ``stride_row`` logits apart from a 16-byte aligned
    address before each row's first logit, its first tile cut there (``LEAD``:
    onepass_triton._row_start); a stride that keeps every row aligned for 16-bit logits (and
    so for fp32) needs not."""
    return stride_row % ALIGNED_LOGITS != 0


WIDE_TOP_K = 1024  # from this padded top-K on, a program takes 8 warps


def warps_for(block: int, k_pad: int, split: bool = False) -> int:
    """Warps per program of a kernel walking ``block``-wide tiles with a ``k_pad`` top-K: 8
    for wide tiles, and for the widest top-K unless its row is split. Measured by the compile
    check (Triton 3.6, sm_90, fp32 logits, ``docs/kernels.md``): the unsplit kernel spilled 8
    bytes on 4 warps and none on 8, the split one none on 4 and 8 on 8."""
    return 8 if block >= 4096 or (k_pad >= WIDE_TOP_K and not split) else 4


TOP_K_REGISTERS = 255  # the register cap ptxas is given for a top-K walk (its most)


def registers_for(top_k: bool, warps: int) -> int | None:
    """The register cap (``maxnreg``) of a kernel walking ``warps``-warp tiles, None for
    ptxas's own choice. Measured by the compile check (sm_90): with the top-K's keys formed
    behind the guard, ptxas chose 128 registers and spilled 8-16 bytes for the split 4-warp
    walk at K_PAD 32 and 1024 on Triton 3.6; with per-lane sums and counts and the
    per-candidate top-K, a cap of 168 spilled 24 bytes (fp32, K_PAD 32) and 120 (bf16,
    K_PAD 1024) on Triton 3.6. At 255 a 4-warp walk keeps 2 CTAs an SM; the split plan gives
    a top-K call one (:func:`programs_per_sm`)."""
    return TOP_K_REGISTERS if top_k else None


@dataclass(frozen=True)
class Launch:
    """One launch of a kernel of :mod:`stagelab.measure.onepass_triton`, as Triton
    specialises it: the kernel's name, its grid, its integer arguments by name, its
    ``tl.constexpr`` ones, its warps and its register cap (None: ptxas's choice). Pointer
    arguments are not held: the caller binds them (:func:`stagelab.measure.onepass.run_launch`),
    and the compile check types them (:mod:`stagelab.measure.kernel_variants`)."""

    kernel: str
    grid: tuple[int, ...]
    scalars: dict[str, int]
    constexprs: dict[str, int | bool]
    num_warps: int
    max_registers: int | None = None


def triton_launches(rows: int, vocab: int, k: int, with_targets: bool, tile: int | None,
                    splits: int | None, slots: int, stride_row: int | None = None,
                    origin: int = 0) -> list[Launch]:
    """The launches :func:`stagelab.measure.onepass.topk_logprobs` makes for ``[rows, vocab]``
    logits whose rows are ``stride_row`` apart (None: contiguous), the first ``origin``
    logits past a 16-byte boundary (:func:`stagelab.measure.onepass.aligned_logits`): the
    one-pass kernel alone, whose split variant's last slice of each row merges the row's
    slices."""
    stride_row = vocab if stride_row is None else stride_row
    block, k_pad, parts, span = launch_plan(rows, vocab, k, tile, splits, slots)
    warps = 1 if narrow_walk(rows, vocab, k, tile, splits) else warps_for(block, k_pad, parts > 1)
    group = merge_group(k_pad, parts)
    # MERGE_TREE only where set (the kernel's default is False): the variants it leaves keep
    # their specialisation, and so their compiled rows (scripts/kernel_compile_check.py).
    tree = k > 0 and parts > 1 and merge_tree(k_pad, group, warps)
    return [Launch("onepass_kernel", (rows, parts),
                   dict(stride_row=stride_row, origin=origin, vocab=vocab, k=k, span=span),
                   dict(BLOCK=block, SPLIT=parts > 1, LEAD=leads(stride_row) or origin > 0,
                        K_PAD=k_pad, TOPK=k > 0, HAS_TARGET=with_targets, GROUP=group,
                        SLICES=pow2_at_least(parts), **({"MERGE_TREE": True} if tree
                                                       else {})),
                   warps, registers_for(k > 0, warps))]


def fold_launch(rows: int, width: int, first_id: int, k: int, with_targets: bool,
                stride_row: int | None = None, origin: int = 0) -> Launch:
    """The launch :meth:`stagelab.measure.onepass.TileFold.add` makes for a ``[rows, width]``
    tile whose rows are ``stride_row`` apart (None: contiguous), ``origin`` logits past a
    16-byte boundary: its kernel walks it in tiles of at most :data:`FOLD_TILE` (or
    ``K_PAD``, where wider)."""
    k_pad = pow2_at_least(max(k, 2))
    block = max(k_pad, min(pow2_at_least(width), FOLD_TILE))
    stride_row = width if stride_row is None else stride_row
    warps = warps_for(block, k_pad)
    return Launch("fold_kernel", (rows,),
                  dict(stride_row=stride_row, origin=origin, width=width, first_id=first_id,
                       k=k),
                  dict(BLOCK=block, K_PAD=k_pad, TOPK=k > 0, HAS_TARGET=with_targets,
                       LEAD=leads(stride_row) or origin > 0), warps,
                  registers_for(k > 0, warps))


def finish_launch(rows: int, k: int, with_targets: bool) -> Launch:
    """The launch :meth:`stagelab.measure.onepass.TileFold.finish` makes."""
    return Launch("finish_kernel", (rows,), dict(k=k),
                  dict(K_PAD=pow2_at_least(max(k, 2)), TOPK=k > 0, HAS_TARGET=with_targets), 4)
