"""Every kernel launch the measuring code makes at the lease's shapes, as compile specs.

The lease lends an H200 (CUDA sm_90, 132 SMs). At the shapes its profiles and the issue's
grid take (rows 1/16/64/256; vocabularies 32,000, 152,064 and 262,144, and those of the
models its profiles measure; k 0/1/5/20/64/1024;
fp32, bf16 and fp16 logits; the ``head_fused`` tiles 1024-8192 and the ragged last tile of each
vocabulary; and GPT-2's vocabulary of 50,257, whose stride leaves most rows off 16-byte
alignment, at 64 and 256 rows and a 1024 tile; rows whose first logit lies off 16 bytes,
a view's; and the row counts that give every other plan of slices up to 4000 rows at k = 0,
1, 5 and 20 of 152,064 and 50,257: :data:`SCAN_ROWS`), :func:`launched_variants` lists the
launches of :func:`stagelab.core.launches.triton_launches`,
:func:`~stagelab.core.launches.fold_launch` and
:func:`~stagelab.core.launches.finish_launch`, typed as the callers type their tensors,
once per distinct specialisation (shapes repeat specialisations): the input of
:mod:`stagelab.measure.kernel_compile`. sm_80 is compiled for an A100's launches
(:data:`ARCH_SMS`), whose plans of slices differ where its SMs do.
"""

from __future__ import annotations

import json
from typing import Any

from stagelab.core import launches

LEASE_SMS = 132  # an H200's SMs
# The SMs of the GPU each architecture is compiled for (an H200's for sm_90, an A100's for
# sm_80): a call's plan of slices depends on them (launches.device_slots), so each
# architecture's variants are its own GPU's launches.
ARCH_SMS = {90: LEASE_SMS, 80: 108}
ROWS = (1, 16, 64, 256)
ISSUE_VOCABS = (32000, 152064, 262144)  # issue 44's grid
# The vocabularies of the models profiles.json measures on a GPU (data/model_shapes.csv:
# Mistral-7B-v0.3, Llama-3.1-8B, Qwen2.5-7B, gpt-oss-20b, Gemma-3-4B; a test holds the list
# to the file): their ragged last tiles plan other slices than the issue's round sizes.
PROFILE_VOCABS = (32768, 128256, 152064, 201088, 262208)
VOCABS = tuple(dict.fromkeys(ISSUE_VOCABS + PROFILE_VOCABS))
# Rows whose stride leaves most of them unaligned (launches.leads): GPT-2's vocabulary.
UNALIGNED_VOCAB = 50257
UNALIGNED_ROWS = (64, 256)
# Rows of an aligned stride whose first logit lies off 16 bytes (a view: LEAD by its origin).
OFFSET_SHAPE = (64, 152064)
# The kernels' ints Triton does not specialise (``do_not_specialize``): one compile any value.
UNSPECIALISED = frozenset({"origin"})
KS = (0, 1, 5, 20, 64, 1024)
# Rows past the grid's, at SCAN_KS (the grid's ks that a narrow walk takes:
# launches.narrow_walk) of 152,064 and of GPT-2's unaligned 50,257: with ROWS' they give every
# row count from 1 to 4000 a cubin on an H200 and an A100 (the slices a row the plan gives
# change with the rows; a test scans them), so that the roofline model answers any such call.
# Chosen by a greedy cover of that scan.
SCAN_ROWS = (4, 7, 15, 16, 26, 65, 125, 423, 577, 951, 1321, 2269)
SCAN_VOCABS = (VOCABS[1], UNALIGNED_VOCAB)
SCAN_KS = (0, 1, 5, 20)
DTYPES = ("fp32", "bf16", "fp16")
HEAD_TILES = (1024, 2048, 4096, 8192)
HEAD_CHUNK = 256  # rows of a head_fused chunk (not a kernel argument: any count compiles alike)
# The element type behind each pointer argument, as onepass._empty, onepass._triton and
# TileFold allocate them; "logits" is the logits' (or the fold tile's) own dtype.
POINTER_TYPES = dict(
    x_ptr="logits", targets_ptr="i64", target_ptr="fp32", values_ptr="fp32", ids_ptr="i64",
    lse_ptr="fp32", target_lp_ptr="fp32", rank_ptr="i64", ties_ptr="i64", part_state_ptr="i32",
    part_keys_ptr="i64", arrivals_ptr="i32", state_m_ptr="fp32", state_s_ptr="fp32", state_keys_ptr="i64",
    state_ge_ptr="i64",
    state_eq_ptr="i64")
# Each kernel's pointer arguments (in its own order; checked against the kernels by the test).
STEP_POINTERS = ("x_ptr", "targets_ptr", "values_ptr", "ids_ptr", "lse_ptr", "target_lp_ptr",
                 "rank_ptr", "ties_ptr", "part_state_ptr", "part_keys_ptr", "arrivals_ptr")
KERNEL_POINTERS = dict(
    onepass_kernel=STEP_POINTERS,
    fold_kernel=("x_ptr", "target_ptr", "state_m_ptr", "state_s_ptr", "state_keys_ptr",
                 "state_ge_ptr", "state_eq_ptr"),
    finish_kernel=("target_ptr", "values_ptr", "ids_ptr", "lse_ptr", "target_lp_ptr",
                   "rank_ptr", "ties_ptr", "state_m_ptr", "state_s_ptr", "state_keys_ptr",
                   "state_ge_ptr", "state_eq_ptr"))


def spec_of(launch: launches.Launch, dtype: str) -> dict[str, Any]:
    """A compile spec: the launch's kernel, ints, constexprs, warps and register cap, its
    pointers typed."""
    pointers = {name: dtype if POINTER_TYPES[name] == "logits" else POINTER_TYPES[name]
                for name in KERNEL_POINTERS[launch.kernel]}
    return dict(kernel=launch.kernel, scalars=dict(launch.scalars),
                constexprs=dict(launch.constexprs), pointers=pointers,
                num_warps=launch.num_warps, max_registers=launch.max_registers)


def specialisation(spec: dict[str, Any]) -> str:
    """What Triton compiles a spec to: the kernel, pointer types, constexprs, warps, register
    cap, and each int as Triton's runtime sees it (1, divisible by 16, or neither)."""
    ints = {name: 1 if value == 1 else ("D" if value % 16 == 0 else "")
            for name, value in spec["scalars"].items() if name not in UNSPECIALISED}
    return json.dumps([spec["kernel"], spec["pointers"], spec["constexprs"], ints,
                       spec["num_warps"], spec.get("max_registers")], sort_keys=True)


def step_launches(sms: int = LEASE_SMS) -> list[tuple[str, launches.Launch]]:
    """``(where, launch)`` of every one-pass call at the grid's shapes (with targets), at
    :data:`OFFSET_SHAPE` for rows whose first logit lies one past a 16-byte boundary, and at
    :data:`SCAN_ROWS` for the other plans of slices up to 4000 rows."""
    shapes = ([(rows, vocab, 0, KS) for rows in ROWS for vocab in VOCABS]
              + [(rows, UNALIGNED_VOCAB, 0, KS) for rows in UNALIGNED_ROWS]
              + [(*OFFSET_SHAPE, 1, KS)]
              + [(rows, vocab, 0, SCAN_KS) for rows in SCAN_ROWS for vocab in SCAN_VOCABS])
    found = []
    for rows, vocab, origin, ks in shapes:
        for k in ks:
            for launch in launches.triton_launches(rows, vocab, k, True, None, None,
                                                  launches.device_slots(sms, k),
                                                  origin=origin):
                where = f"n={rows} V={vocab} k={k}" + (f" origin={origin}" if origin else "")
                found.append((where, launch))
    return found


def fold_launches() -> list[tuple[str, launches.Launch]]:
    """``(where, launch)`` of every ``head_fused`` fold and finish at the grid's tiles: each
    full tile, and the ragged last one of each vocabulary."""
    shapes = ([(vocab, tile) for vocab in VOCABS for tile in HEAD_TILES]
              + [(UNALIGNED_VOCAB, HEAD_TILES[0])])
    found = []
    for vocab, tile in shapes:
        for k in KS:
            widths = {tile, vocab % tile or tile}
            for width in sorted(widths):
                found.append((f"V={vocab} tile={tile} width={width} k={k}",
                              launches.fold_launch(HEAD_CHUNK, width, vocab - width, k, True)))
            found.append((f"V={vocab} tile={tile} k={k}",
                          launches.fold_launch(HEAD_CHUNK, tile, 0, k, True)))
            found.append((f"k={k}", launches.finish_launch(HEAD_CHUNK, k, True)))
    return found


def launched_variants(sms: int = LEASE_SMS) -> list[dict[str, Any]]:
    """One compile spec per distinct specialisation of every launch at the grid's shapes, with
    ``where``: the first shape that makes it and ``shapes``: how many do."""
    variants: dict[str, dict[str, Any]] = {}
    for dtype in DTYPES:
        for where, launch in step_launches(sms) + fold_launches():
            spec = spec_of(launch, dtype)
            key = specialisation(spec)
            if key in variants:
                variants[key]["shapes"] += 1
            else:
                variants[key] = dict(spec, where=f"{dtype} {where}", shapes=1)
    order = list(KERNEL_POINTERS)  # the step's kernels first: the roofline reads them
    return sorted(variants.values(), key=lambda spec: order.index(spec["kernel"]))


def k_class(spec: dict[str, Any]) -> str:
    """How a spec's top-K shapes its code: none, the merge network at most 64 wide, or the
    1024-wide one (the registers' worst case)."""
    flags = spec["constexprs"]
    if not flags["TOPK"]:
        return "none"
    return "wide" if flags["K_PAD"] >= 1024 else "narrow"


def group_class(spec: dict[str, Any]) -> str:
    """How a split top-K walk's last slice merges a group of slices' keys
    (``onepass_triton._group_best``): one list alone, two merged, or more sorted; "" for any
    other walk."""
    flags = spec["constexprs"]
    if not (flags.get("SPLIT") and flags.get("TOPK")):
        return ""
    return {1: "one", 2: "two"}.get(flags["GROUP"], "more")


def representative_key(spec: dict[str, Any]) -> tuple[str, str, bool, str, bool, bool, str,
                                                      bool]:
    """What a representative stands for: the kernel, the logits' dtype, split or not, the
    k-class (:func:`k_class`), whether a fold's tile is masked (its width short of BLOCK), a
    split walk's group class (:func:`group_class`) and whether it runs on one warp (a narrow
    walk's reductions are shuffles alone: ``launches.narrow_walk``); a walk of rows that may
    start off alignment (``LEAD``: a cut first tile) by its kernel, k-class, warps and
    whether its logits are 16-bit alone (the cut tile is the same code whatever the rest)."""
    flags, ints = spec["constexprs"], spec["scalars"]
    dtype = spec["pointers"].get("x_ptr", "")
    one_warp = spec["num_warps"] == 1
    if flags.get("LEAD"):
        return (spec["kernel"], "16-bit" if dtype != "fp32" else dtype, False, k_class(spec),
                False, True, "", one_warp)
    masked = "width" in ints and ints["width"] < flags["BLOCK"]
    return (spec["kernel"], dtype, bool(flags.get("SPLIT")), k_class(spec), masked, False,
            group_class(spec), one_warp)


def representative_variants(sms: int = LEASE_SMS) -> list[dict[str, Any]]:
    """The first launched variant (in :func:`launched_variants`' order) of each distinct
    :func:`representative_key`: a compile check that sees every kind of code the kernels
    generate in a fraction of the full list's time."""
    chosen: dict[tuple[str, str, bool, str, bool, bool, str, bool], dict[str, Any]] = {}
    for spec in launched_variants(sms):
        chosen.setdefault(representative_key(spec), spec)
    return list(chosen.values())
