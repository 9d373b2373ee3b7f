"""The one-pass kernels compile for the lease's GPU (CUDA sm_90) with no GPU here.

The slow test compiles one representative of each kind of launched variant with the lease
image's Triton (3.6, in its own environment under ``.cache/``, made on first use by
``scripts/kernel_compile_check.py``), and fails on any compile error or spill; a second
compiles each kernel's widest variants for sm_90 and sm_80 on the installed Triton. The full
check (every variant, both Tritons, both architectures) is the script. The fast tests hold
the parts to known answers: the specs type every pointer the kernels take, the variants
cover the grid once per specialisation, and the cubin readers count what they should on
hand-written SASS.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stagelab.analyse import roofline
from stagelab.core import launches, paths
from stagelab.measure import kernel_compile, kernel_variants, onepass, sass_path

SPEC = importlib.util.spec_from_file_location(
    "kernel_compile_check", paths.REPO_ROOT / "scripts" / "kernel_compile_check.py")
check = sys.modules.setdefault(SPEC.name, importlib.util.module_from_spec(SPEC))
SPEC.loader.exec_module(check)

NEEDS_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="Triton is not installed (the test extra installs it)")


@NEEDS_TRITON
def test_the_specs_type_every_pointer_each_kernel_takes():
    """Before: a kernel argument renamed in onepass_triton would have gone untyped here."""
    from stagelab.measure import onepass_triton

    for name, pointers in kernel_variants.KERNEL_POINTERS.items():
        taken = [a for a in getattr(onepass_triton, name).arg_names if a.endswith("_ptr")]
        assert tuple(taken) == pointers, name


@pytest.mark.parametrize("sms", sorted(kernel_variants.ARCH_SMS.values()))
def test_the_variants_cover_the_grid_once_per_specialisation(sms):
    """On each architecture's GPU (an H200's 132 SMs, an A100's 108)."""
    variants = kernel_variants.launched_variants(sms)
    keys = [kernel_variants.specialisation(v) for v in variants]
    assert len(keys) == len(set(keys))
    assert {v["kernel"] for v in variants} == set(kernel_variants.KERNEL_POINTERS)
    first = [v for v in variants if v["kernel"] == "onepass_kernel"]
    assert {v["pointers"]["x_ptr"] for v in first} == {"fp32", "bf16", "fp16"}
    assert {v["constexprs"]["K_PAD"] for v in first} == {2, 8, 32, 64, 1024}
    assert {v["constexprs"]["SPLIT"] for v in first} == {True, False}
    shapes = len(kernel_variants.DTYPES) * (
        len(kernel_variants.KS) * (len(kernel_variants.ROWS) * len(kernel_variants.VOCABS)
                                   + len(kernel_variants.UNALIGNED_ROWS) + 1)  # OFFSET_SHAPE
        + len(kernel_variants.SCAN_ROWS) * len(kernel_variants.SCAN_VOCABS)
        * len(kernel_variants.SCAN_KS))
    assert sum(v["shapes"] for v in first) == shapes
    narrow = [v for v in first if v["num_warps"] == 1]  # the narrow plan's: K_PAD <= 32
    # up to 256 on an H200 (16 rows of 297 tiles in 2112 slots: 132 slices), 128 on an A100
    assert {v["constexprs"]["SLICES"] for v in narrow} == {2 ** e for e in range(9 if sms == 132
                                                                              else 8)}
    assert {v["constexprs"]["K_PAD"] for v in narrow} == {2, 8, 32}
    assert {v["constexprs"]["K_PAD"] for v in first if v["num_warps"] > 1} == {2, 8, 32, 64, 1024}
    unaligned = [v for v in variants if v["constexprs"].get("LEAD")]
    assert {v["kernel"] for v in unaligned} == {"onepass_kernel", "fold_kernel"}
    offset = [v for v in unaligned if "origin=1" in v["where"]]
    assert len(offset) == len(kernel_variants.DTYPES) * len(kernel_variants.KS)
    assert all(str(kernel_variants.UNALIGNED_VOCAB) in v["where"]
               for v in unaligned if v not in offset)


def test_the_variants_hold_every_vocabulary_a_profile_names():
    """Before: Gemma-3-4B's 262,208 (a 129th tile) planned 256 slices a row at n = 1, a
    variant never compiled. Every model a profile of profiles.json names (a model of
    data/model_shapes.csv, not a bare size) has its vocabulary compiled for."""
    from stagelab.run import params

    named = {vocab for profile in json.loads(paths.PROFILES_FILE.read_text())["profiles"]
             .values() for notebook in profile.get("notebooks", {}).values()
             for name in ("models", "decisive_models", "model")
             for item in _as_list(notebook.get(name)) if isinstance(item, str)
             for vocab in [params.model_vocabs()[item]]}
    assert named and named <= set(kernel_variants.VOCABS)
    assert 262208 in named


def _as_list(value: object) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [] if value is None else [value]


def test_an_int_of_one_and_a_multiple_of_16_specialise_apart():
    launch = launches.finish_launch(4, 1, True)
    base = kernel_variants.spec_of(launch, "fp32")
    assert kernel_variants.specialisation(base) != kernel_variants.specialisation(
        dict(base, scalars=dict(k=16)))
    assert kernel_variants.specialisation(dict(base, scalars=dict(k=32))) == (
        kernel_variants.specialisation(dict(base, scalars=dict(k=16))))


def test_a_top_k_walk_is_compiled_and_launched_with_its_register_cap():
    """Before: with the keys formed behind the guard, ptxas chose 128 registers for the split
    walk at K_PAD 32 and 1024 and spilled 8-16 bytes (Triton 3.6), and 32 bytes for the 8-warp
    walk at K_PAD 1024 (Triton 3.9); the cap lets it take more."""
    split = launches.triton_launches(1, 32000, 20, True, None, None, 264)[0]
    assert split.constexprs["SPLIT"] and split.max_registers == launches.TOP_K_REGISTERS
    assert launches.triton_launches(1, 32000, 0, True, None, None, 264)[0].max_registers is None
    wide = launches.fold_launch(4, 1024, 0, 1024, True)
    assert wide.num_warps == 8 and wide.max_registers == launches.TOP_K_REGISTERS
    spec = kernel_variants.spec_of(split, "fp32")
    assert spec["max_registers"] == launches.TOP_K_REGISTERS
    assert kernel_variants.specialisation(spec) != kernel_variants.specialisation(
        dict(spec, max_registers=None))


@pytest.mark.parametrize("arch, registers, warps, shared, ctas", [
    (90, 39, 4, 1024, 12),   # 39 registers: 5 units of 256 a warp, 16 CTAs by threads
    (90, 128, 4, 1024, 4),   # 16 KiB of registers per CTA
    (90, 140, 4, 1024, 3),   # rounded to 144
    (90, 32, 1, 0, 32),      # the CTA limit
    (90, 32, 4, 100_000, 2),  # shared memory: 233,472 // 101,024
    (80, 32, 4, 100_000, 1),  # sm_80 holds less
])
def test_ctas_per_sm_is_the_least_of_the_limits(arch, registers, warps, shared, ctas):
    assert kernel_compile.ctas_per_sm(arch, registers, warps, shared) == ctas


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_CTAID.X ;
        /*0020*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0030*/                   FMNMX R4, R2, R4, !PT ;
        /*0040*/               @P0 BRA 0x100 ;
        /*0050*/                   ISETP.GT.AND P1, PT, R5, 0x10, PT ;
        /*0060*/               @P1 BRA 0xa0 ;
        /*0070*/                   IMAD R5, R5, R6, RZ ;
        /*0080*/                   IMAD R5, R5, R6, RZ ;
        /*0090*/                   BRA 0xe0 ;
        /*00a0*/                   IMAD R5, R5, R6, RZ ;
        /*00b0*/                   ISETP.GT.AND P2, PT, R5, R7, PT ;
        /*00c0*/                   VIMNMX R5, R5, R7, PT ;
        /*00d0*/               @P2 BRA 0xb0 ;
        /*00e0*/                   LOP3.LUT R7, R7, 0x1, RZ, 0xc0, !PT ;
        /*00f0*/                   IMAD R5, R5, R6, RZ ;
        /*0100*/                   IADD3 R7, R7, 0x1, RZ ;
        /*0110*/               @P3 BRA 0x20 ;
        /*0120*/                   EXIT ;
        /*0130*/                   BRA 0x130;
"""


def path(sass: str, addresses: list[int]) -> list[int]:
    """The clocks, at each end of the assumed latencies, of the critical path of the lines of
    ``sass`` at ``addresses``, in address order: what a path's figure should be."""
    texts = [text for at, text in kernel_compile.SASS_LINE.findall(sass)
             if int(at, 16) in addresses]
    assert len(texts) == len(addresses)
    return [sass_path.critical_path(texts, end)[1] for end in sass_path.ENDS]


def instruction_figures(figures: dict) -> dict:
    """``loop_figures``' counts, its paths' clocks aside."""
    return {name: figures[name] for name in kernel_compile.LOOP_FIGURES}


def test_the_loop_s_paths_are_counted_from_sass():
    """The loop runs 0x20-0x110 (16 instructions); the guard's branch skips the top-K block
    (0x50-0xf0: 11); inside it the sort path (0x70-0x90: 3, skipped toward the candidates)
    and the per-candidate loop (0xb0-0xd0: 3); the block's other 5 are its entry's. Each
    path's clocks are the critical path of its own lines alone."""
    figures = kernel_compile.loop_figures(SASS)
    assert instruction_figures(figures) == dict(
        loop_instructions=16, guard_instructions=5, count_instructions=0,
        enter_instructions=5, sort_instructions=3, candidate_instructions=3,
        pipelined_copies=0, copy_bytes=0, merge_instructions=0)
    assert figures["guard_clocks"] == path(SASS, [0x20, 0x30, 0x40, 0x100, 0x110])
    assert figures["enter_clocks"] == path(SASS, [0x50, 0x60, 0xa0, 0xe0, 0xf0])
    assert figures["sort_clocks"] == path(SASS, [0x70, 0x80, 0x90])
    assert figures["candidate_clocks"] == path(SASS, [0xb0, 0xc0, 0xd0])
    assert figures["count_clocks"] == [0, 0]
    # two dependent IMADs (R5), the second issued as the first's result is ready (4 or 6
    # clocks), its own ready as late again; the branch beside them waits for nothing
    assert figures["sort_clocks"] == [4 + 4, 6 + 6] != figures["enter_clocks"]
    assert kernel_compile.loop_figures("/*0000*/ EXIT ;") == dict(
        dict.fromkeys(kernel_compile.LOOP_FIGURES, 0),
        **dict.fromkeys(kernel_compile.PATH_CLOCKS, [0, 0]))


def test_a_loop_without_a_top_k_block_is_all_guard():
    """No forward branch inside the loop (a walk without a top-K): every path figure 0."""
    plain = "\n".join(line for line in SASS.splitlines()
                      if not any(f"/*{at:04x}*/" in line for at in range(0x40, 0x100, 0x10)))
    figures = kernel_compile.loop_figures(plain)
    assert instruction_figures(figures) == dict(
        loop_instructions=4, guard_instructions=4, count_instructions=0, enter_instructions=0,
        sort_instructions=0, candidate_instructions=0, pipelined_copies=0, copy_bytes=0,
        merge_instructions=0)
    assert figures["guard_clocks"] == path(plain, [0x20, 0x30, 0x100, 0x110])
    assert all(figures[name] == [0, 0] for name in kernel_compile.PATH_CLOCKS[1:])


MERGED = SASS.replace("""        /*0120*/                   EXIT ;""", """        /*0120*/               @P4 EXIT ;
        /*0130*/                   IMAD R5, R5, R6, RZ ;
        /*0140*/                   ISETP.GT.AND P2, PT, R5, R7, PT ;
        /*0150*/               @P2 BRA 0x140 ;
        /*0160*/                   LDG.E.64.STRONG.GPU R8, desc[UR4][R2.64] ;
        /*0170*/                   IMAD R5, R5, R8, RZ ;
        /*0180*/               @P5 BRA 0x160 ;
        /*0190*/                   EXIT ;""").replace("        /*0130*/                   BRA 0x130;\n", "")


def test_a_split_walk_s_merge_is_the_last_loop_after_the_tile_loop():
    """After the tile loop (0x20-0x110) and the programs that are not their row's last
    leave (0x120), a masked tile's candidate loop (0x140-0x150) and the merge loop
    (0x160-0x180: 3 instructions), the last before the final EXIT; counted only for a split
    top-K walk, and the tile loop's figures unchanged."""
    merged = kernel_compile.loop_figures(MERGED, merged=True)
    assert merged["merge_instructions"] == 3
    assert dict(merged, merge_instructions=0) == kernel_compile.loop_figures(SASS)
    assert kernel_compile.loop_figures(MERGED)["merge_instructions"] == 0


COUNTED = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R2.64] ;
        /*0020*/               @!P0 BRA 0x50 ;
        /*0030*/                   FSETP.GE.AND P2, PT, R2, R9, PT ;
        /*0040*/                   VIADD R8, R8, 0x1 ;
        /*0050*/               @!P1 BRA 0x90 ;
        /*0060*/                   IMAD R5, R5, R6, RZ ;
        /*0070*/               @P2 BRA 0x60 ;
        /*0080*/                   IMAD R5, R5, R6, RZ ;
        /*0090*/                   FMNMX R4, R2, R4, !PT ;
        /*00a0*/               @P3 BRA 0x10 ;
        /*00b0*/                   EXIT ;
"""


ARRIVING = """
        /*0000*/                   STG.E desc[UR4][R2.64], R5 ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0020*/               @P5 MEMBAR.ALL.GPU ;
        /*0030*/               @P5 ATOMG.E.ADD.STRONG.GPU PT, R13, desc[UR4][R20.64], R13 ;
        /*0038*/               @P5 CCTL.IVALL ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/              @!P5 LDG.E.STRONG.GPU R17, desc[UR4][R18.64] ;
        /*0060*/                   EXIT ;
"""


def test_a_split_walk_counts_in_after_a_barrier_and_a_fence_and_reads_from_l2():
    """The pattern of split-K's last program: every thread's stores, a barrier, a GPU fence,
    the count's GPU-scope atomic, an L1 invalidation, then strong (L2) reads. Without the
    barrier, or the fence (or with it before the barrier), or the invalidation, with a
    CTA-scope atomic, or a read that may hit a stale L1, it fails; so does a walk with no
    atomic at all, and a split row without the figure."""
    assert kernel_compile.arrival_fenced(ARRIVING)
    barrier = "/*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;"
    fence = "/*0020*/               @P5 MEMBAR.ALL.GPU ;"
    for broken in (ARRIVING.replace(barrier, "/*0010*/ NOP ;"),
                   ARRIVING.replace("MEMBAR.ALL.GPU", "NOP"),
                   ARRIVING.replace(barrier, "/*0010*/ MEMBAR.ALL.GPU ;").replace(
                       fence, "/*0020*/ BAR.SYNC.DEFER_BLOCKING 0x0 ;"),
                   ARRIVING.replace("CCTL.IVALL", "NOP"),
                   ARRIVING.replace("ATOMG.E.ADD.STRONG.GPU", "ATOMG.E.ADD.STRONG.SM"),
                   ARRIVING.replace("LDG.E.STRONG.GPU", "LDG.E"), SASS):
        assert not kernel_compile.arrival_fenced(broken)
    row = dict(triton="3.6.0", arch=90, kernel="onepass_kernel", where="fp32 n=1",
               compiles=True, error="", spill_bytes=0, loop_instructions=0, pipelined_copies=0,
               constexprs=dict(SPLIT=True))
    assert "unfenced" in check.failures([dict(row, arrival_fenced=False)])[0]
    assert "unfenced" in check.failures([row])[0]
    assert check.failures([dict(row, arrival_fenced=True)]) == []
    assert check.failures([dict(row, constexprs=dict(SPLIT=False))]) == []


TAIL = """
        /*0000*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R2.64] ;
        /*0010*/               @P0 BRA 0x0 ;
        /*0020*/               @P5 ATOMG.E.ADD.STRONG.GPU PT, R13, desc[UR4][R20.64], R13 ;
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0040*/               @P4 EXIT ;
        /*0050*/              @!P5 LDG.E.STRONG.GPU R17, desc[UR4][R18.64] ;
        /*0060*/              @!P5 LDG.E.64.STRONG.GPU R22, desc[UR4][R18.64+0x400] ;
        /*0070*/                   FMNMX R4, R17, R4, !PT ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/                   LDG.E.STRONG.GPU R19, desc[UR4][R18.64+0x200] ;
        /*00a0*/                   FADD R4, R19, R4 ;
        /*00b0*/                   LDG.E.64.STRONG.GPU R8, desc[UR4][R2.64] ;
        /*00c0*/                   IMAD R5, R5, R8, RZ ;
        /*00d0*/               @P2 BRA 0xb0 ;
        /*00e0*/                   MUFU.LG2 R4, R4 ;
        /*00f0*/                   STG.E desc[UR4][R6.64], R4 ;
        /*0100*/                   EXIT ;
        /*0110*/                   LDG.E.STRONG.GPU R9, desc[UR4][R2.64] ;
        /*0120*/                   BRA 0x70 ;
"""


def test_a_split_walk_s_tail_counts_its_reads_a_barrier_holds_apart():
    """After the count's atomic (0x20), to the last EXIT (0x100), less the merge loop
    (0xb0-0xd0): two loads issued together (one round trip), a barrier, a third load (a
    second): 2 reads in 10 instructions, the row's results written after the loop among
    them; the tile loop before the atomic and a divergent path after the EXIT, branching
    back into the tail, are neither the merge loop nor the tail. Without the loop the tail
    is all 12; with the barrier gone, the loads are one batch; without the atomic there is
    no tail."""
    figures = kernel_compile.tail_figures(TAIL)
    assert (figures["tail_reads"], figures["tail_instructions"]) == (2, 10)
    looped = "        /*00d0*/               @P2 BRA 0xb0 ;\n"
    unlooped = kernel_compile.tail_figures(TAIL.replace(looped, ""))
    assert (unlooped["tail_reads"], unlooped["tail_instructions"]) == (2, 12)
    assert unlooped["merge_trips"] == 0 and unlooped["merge_clocks"] == [0, 0]
    one_batch = TAIL.replace("/*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0",
                             "/*0080*/                   NOP")
    assert kernel_compile.tail_figures(one_batch)["tail_reads"] == 1
    assert kernel_compile.tail_figures(SASS) == dict(
        tail_reads=0, tail_instructions=0, tail_trips=0, tail_clocks=[0, 0], merge_trips=0,
        merge_clocks=[0, 0])


def test_a_split_walk_s_tail_path_counts_every_round_trip_it_waits_in_turn():
    """The tail's critical path, one warp issuing in order (sass_path's latencies, fast and
    slow ends: a barrier 20/40 clocks, an ALU step 4/6, MUFU 15/25): barrier, EXIT, two loads
    (issued at 42), FMNMX waits for the first (a trip), barrier to 83, the third load at 84,
    FADD waits for it (a second trip) to 90, MUFU to 115, the store issues then: 2 trips and
    115 clocks (63 fast). Without the barrier the third load still waits behind FMNMX, which
    waits for the first: 2 trips where ``tail_reads`` sees 1 batch. Issued before FMNMX, it
    rides the first trip. The merge loop's body: a load, then one ALU step on it."""
    figures = kernel_compile.tail_figures(TAIL)
    assert (figures["tail_trips"], figures["tail_clocks"]) == (2, [63, 115])
    assert (figures["merge_trips"], figures["merge_clocks"]) == (1, [4, 6])
    one_batch = TAIL.replace("/*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0",
                             "/*0080*/                   NOP")
    assert kernel_compile.tail_figures(one_batch)["tail_trips"] == 2
    third, first = "LDG.E.STRONG.GPU R19, desc[UR4][R18.64+0x200]", "FMNMX R4, R17, R4, !PT"
    hoisted = one_batch.replace(first, "THIRD").replace(third, first).replace("THIRD", third)
    assert kernel_compile.tail_figures(hoisted)["tail_trips"] == 1


    row = dict(triton="3.6.0", arch=90, kernel="onepass_kernel", where="fp32 n=1",
               compiles=True, error="", spill_bytes=0, loop_instructions=0, pipelined_copies=0,
               constexprs=dict(SPLIT=True), arrival_fenced=True)
    assert "in 2 batches of loads" in check.failures([dict(row, tail_reads=2)])[0]
    assert check.failures([dict(row, tail_reads=1)]) == []


def test_the_target_s_counts_skipped_below_it_are_a_block_of_their_own():
    """The loop runs 0x10-0xa0 (10 instructions, one pipelined copy); the top-K block
    0x60-0x80 (3, the largest skipped; its per-candidate loop 0x60-0x70), the counts' block
    0x30-0x40 (2, the largest apart from it). Without a top-K the largest skipped block is
    the counts'; without a target there is none."""
    figures = kernel_compile.loop_figures(COUNTED)
    assert instruction_figures(figures) == dict(
        loop_instructions=10, guard_instructions=5, count_instructions=2,
        enter_instructions=1, sort_instructions=0, candidate_instructions=2,
        pipelined_copies=1, copy_bytes=16, merge_instructions=0)
    assert figures["count_clocks"] == path(COUNTED, [0x30, 0x40])
    assert figures["guard_clocks"] == path(COUNTED, [0x10, 0x20, 0x50, 0x90, 0xa0])
    assert kernel_compile.loop_figures(COUNTED, counts=False)["guard_instructions"] == 7
    plain = kernel_compile.loop_figures(COUNTED, top_k=False)
    assert (plain["guard_instructions"], plain["count_instructions"],
            plain["enter_instructions"]) == (7, 3, 0)


def test_a_failed_or_spilling_variant_fails_the_check():
    row = dict(triton="3.6.0", arch=90, kernel="onepass_kernel", where="fp32 n=1",
               compiles=True, error="", spill_bytes=0, loop_instructions=0,
               pipelined_copies=0)
    assert check.failures([row]) == []
    assert "8 bytes spilled" in check.failures([dict(row, spill_bytes=8)])[0]
    assert "TypeError" in check.failures([dict(row, compiles=False, error="TypeError: x")])[0]
    walk = dict(row, loop_instructions=200, pipelined_copies=4, constexprs=dict(BLOCK=2048),
                pointers=dict(x_ptr="bf16"), num_warps=4)
    assert check.failures([walk]) == []
    assert "not pipelined" in check.failures([dict(walk, pipelined_copies=0)])[0]
    assert check.failures([dict(walk, kernel="finish_kernel", pipelined_copies=0)]) == []
    # 32 bytes of a bf16 tile a thread, copied 4 at a time: fails; 16 at a time passes
    assert "copies 4 bytes at a time" in check.failures([dict(walk, copy_bytes=4)])[0]
    assert check.failures([dict(walk, copy_bytes=16)]) == []
    narrow = dict(walk, constexprs=dict(BLOCK=128), pointers=dict(x_ptr="fp32"))  # 4 B each
    assert check.failures([dict(narrow, copy_bytes=4)]) == []
    assert "copies 4 bytes" in check.failures([dict(narrow, constexprs=dict(BLOCK=256),
                                                    copy_bytes=4)])[0]  # 8 a thread
    tiny = dict(walk, pipelined_copies=0, constexprs=dict(BLOCK=128))  # 2 bytes a thread
    assert check.failures([tiny]) == []
    assert check.failures([dict(tiny, pointers=dict(x_ptr="fp32"))]) != []


def test_the_tile_loop_is_the_longest_a_backward_branch_closes():
    """A cut first tile walked before the loop holds a loop of its own (0x10-0x20), earlier
    than the tile loop (0x40-0x70): the longer is the tile loop; a divergent path placed
    after the EXIT branching back (0xa0 to 0x10) is no loop."""
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IMAD R5, R5, R6, RZ ;
        /*0020*/               @P2 BRA 0x10 ;
        /*0030*/                   MOV R1, c[0x0][0x28] ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R2.64] ;
        /*0050*/                   FMNMX R4, R2, R4, !PT ;
        /*0060*/                   FMNMX R4, R2, R4, !PT ;
        /*0070*/               @P3 BRA 0x40 ;
        /*0080*/                   EXIT ;
        /*0090*/                   SHFL.BFLY PT, R21, R166, 0x1, 0x1f ;
        /*00a0*/                   BRA 0x10 ;
"""
    figures = kernel_compile.loop_figures(sass, top_k=False, counts=False)
    assert figures["loop_instructions"] == 4 and figures["pipelined_copies"] == 1


def test_the_tile_loop_lies_before_a_split_walk_counts_itself_in():
    """Before: a split walk's merge loop after its count (ATOMG), longer than its tile loop
    (a tree over 128 slices' keys on Triton 3.6), was read as the tile loop, and the check
    failed it as not pipelined. The tile loop is the longest before the count; the merge
    loop is still the last after it."""
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R2.64] ;
        /*0020*/                   FMNMX R4, R2, R4, !PT ;
        /*0030*/               @P3 BRA 0x10 ;
        /*0040*/                   ATOMG.E.ADD.STRONG.GPU PT, R9, desc[UR4][R6.64], R8 ;
        /*0050*/                   LDG.E.64.STRONG.GPU R10, desc[UR4][R6.64] ;
        /*0060*/                   IMNMX R4, R10, R4, !PT ;
        /*0070*/                   IMNMX R4, R10, R4, !PT ;
        /*0080*/                   IMNMX R4, R10, R4, !PT ;
        /*0090*/               @P4 BRA 0x50 ;
        /*00a0*/                   EXIT ;
"""
    figures = kernel_compile.loop_figures(sass, top_k=False, counts=False, merged=True)
    assert figures["loop_instructions"] == 3 and figures["pipelined_copies"] == 1
    assert figures["merge_instructions"] == 5


def test_the_fold_walks_a_wide_tile_in_tiles_of_at_most_fold_tile():
    """Before: a ``head_fused`` tile of 1280 logits made a 2048-wide fold tile, which spilled
    8 bytes (K_PAD 2) and 16 (K_PAD 1024) on Triton 3.6 for sm_90: the check allowed them."""
    widths = {launches.fold_launch(4, width, 0, k, True).constexprs["BLOCK"]
              for width in (1280, 2048, 8192) for k in (0, 1, 20)}
    assert widths == {launches.FOLD_TILE}
    assert launches.fold_launch(4, 300, 0, 5, True).constexprs["BLOCK"] == 512
    assert launches.fold_launch(4, 8192, 0, 1024, True).constexprs["BLOCK"] == 1024
    folds = [v for v in kernel_variants.launched_variants() if v["kernel"] == "fold_kernel"]
    assert max(v["constexprs"]["BLOCK"] for v in folds) == launches.FOLD_TILE
    assert not hasattr(check, "KNOWN_SPILLS")


def test_the_representatives_stand_for_every_kind():
    launched = kernel_variants.launched_variants()
    chosen = kernel_variants.representative_variants()
    keys = [kernel_variants.representative_key(v) for v in chosen]
    assert len(keys) == len(set(keys))
    assert set(keys) == {kernel_variants.representative_key(v) for v in launched}
    assert {k for _, _, _, k, *_ in keys} == {"none", "narrow", "wide"}
    assert {lead for *_, lead, _, _ in keys} == {True, False}
    assert {group for *_, group, _ in keys} == {"", "one", "two", "more"}  # _group_best's paths
    assert {one_warp for *_, one_warp in keys} == {True, False}  # launches.narrow_walk's
    assert len(chosen) < len(launched) / 2


def test_the_tests_the_table_names_exist():
    """The table tells a reader which slow tests stand in for the full check: each exists."""
    named = re.findall(r"`(?:tests/test_kernel_compile.py::)?(test_\w+)`", check.RUNNING)
    assert len(named) == 2 and all(callable(globals().get(name)) for name in named)


def test_the_table_counts_each_triton_and_architecture_apart():
    """Before: sm_80 rows beside sm_90 ones read "246 of 123 launched variants"."""
    rows = [dict(triton="3.6.0", arch=arch) for arch in (90, 80) for _ in range(3)]
    assert check.compiled_counts(rows + [dict(triton="3.9.0", arch=90)], {90: 3, 80: 4}) == (
        "Triton 3.6.0 sm_90: 3 of 3, Triton 3.6.0 sm_80: 3 of 4, Triton 3.9.0 sm_90: 1 of 3")


def test_each_architecture_compiles_the_launches_of_its_own_gpu(tmp_path, monkeypatch):
    """sm_80 is compiled for an A100's plans (108 SMs), sm_90 for an H200's (132): their
    slices differ, so each has variants the other lacks. The table keeps each
    architecture's own, in its order, labelled with its own plan's shapes (a row kept from a
    run of the H200's plan is relabelled). Before: sm_80 compiled the H200's launches, 21 of an
    A100's missing."""
    h200, a100 = check.launched_for(90), check.launched_for(80)
    key = kernel_variants.specialisation
    assert {key(v) for v in a100} - {key(v) for v in h200}
    assert {key(v) for v in h200} - {key(v) for v in a100}
    asked = []
    monkeypatch.setattr(check, "triton_python", lambda version: tmp_path / "python")
    monkeypatch.setattr(check, "compile_with", lambda python, specs, archs, workers, out,
                        earlier: asked.append((archs, len(specs))) or [])
    check.run_check((90, 80), 1, installed=False)
    assert asked == [((90,), len(h200)), ((80,), len(a100))]
    only_h200 = next(v for v in h200 if key(v) not in {key(a) for a in a100})
    only_a100 = next(v for v in a100 if key(v) not in {key(h) for h in h200})
    shared = next(v for v in a100 if key(v) in {key(h) for h in h200}
                  and (v["where"], v["shapes"]) != next((h["where"], h["shapes"])
                                                        for h in h200 if key(h) == key(v)))
    as_h200 = next(h for h in h200 if key(h) == key(shared))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(dict(spec, triton="3.6.0", arch=arch,
                                            kernel_digest=kernel_compile.kernel_digest()))
                            + "\n" for spec, arch in ((only_h200, 90), (only_h200, 80),
                                                      (only_a100, 80), (as_h200, 80))))
    kept = check.current_rows(rows)
    assert [(row["arch"], key(row)) for row in kept] == sorted(
        [(90, key(only_h200)), (80, key(only_a100)), (80, key(shared))],
        key=lambda pair: (-pair[0], [key(v) for v in (h200 if pair[0] == 90 else a100)].index(
            pair[1])))
    relabelled = next(row for row in kept if key(row) == key(shared))
    assert (relabelled["where"], relabelled["shapes"]) == (shared["where"], shared["shapes"])


def test_a_failure_to_make_the_lease_triton_environment_says_so(tmp_path, monkeypatch):
    """Before: a failed uv surfaced as a bare CalledProcessError (or SystemExit for no uv)."""
    monkeypatch.setattr(check, "uv", lambda: "false")
    with pytest.raises(RuntimeError, match="could not make Triton 3.6's environment"):
        check.triton_python("3.6", tmp_path)
    assert not (tmp_path / "triton-3.6" / ".complete").exists()


def test_the_committed_figures_hold_every_launched_variant_on_each_triton_and_arch():
    """The roofline reads the lease's Triton's figures (sm_90 for an H200, sm_80 for an
    A100): on both Tritons, the committed file holds exactly the variants launched on each
    architecture's GPU, in launch order and labelled with that plan's shapes, each compiled
    from today's kernel code (a kernel changed without the check run again fails here); none
    failed or spilled, and the table names its date and versions. Before: 43 of 144 variants were
    missing and two spilled; then sm_80 was not compiled at all."""
    data = json.loads(check.DATA.read_text())
    assert check.failures(data["variants"]) == []
    tritons = {row["triton"] for row in data["variants"]}
    assert {row["arch"] for row in data["variants"]} == set(check.ARCHS)
    assert len(tritons) == 2 and any(t.startswith(check.LEASE_TRITON + ".") for t in tritons)
    for triton in tritons:
        for arch in check.ARCHS:
            listed = [row for row in data["variants"]
                      if (row["triton"], row["arch"]) == (triton, arch)]
            assert [kernel_variants.specialisation(row) for row in listed] == [
                kernel_variants.specialisation(v) for v in check.launched_for(arch)]
            assert [(row["where"], row["shapes"]) for row in listed] == [
                (v["where"], v["shapes"]) for v in check.launched_for(arch)]
    assert {row["kernel_digest"] for row in data["variants"]} == {kernel_compile.kernel_digest()}
    text = check.DOC.read_text()
    assert data["written"][:10] in text
    assert all(row["triton"] in text for row in data["variants"])
    assert all(f"on an {gpu} (a model" in text for gpu in check.MODELLED)


def test_a_group_s_keys_merged_as_a_tree_hold_the_figures_merge_tree_quotes():
    """What merge_tree's words quote, in the committed cubins (Triton 3.6, sm_90, fp32): the
    one-warp walk at n = 64, k = 5 (32 slices of 8 keys) waits on 2 L2 round trips and
    1009 clocks (slow end) in its tail and 2326 in a later group's merge; at n = 256, k = 20
    (8 slices of 32 keys) 1 and 1511. Every variant the lease's Triton compiles with a tree
    waits on one round trip in a later group's merge, for either architecture."""
    rows = tuple(json.loads(check.DATA.read_text())["variants"])
    words = " ".join(launches.merge_tree.__doc__.split())

    def quoted(n: int, k: int) -> dict:
        launch = launches.triton_launches(n, 152064, k, True, None, None, 132)[0]
        assert launch.constexprs["MERGE_TREE"] is True
        return roofline.figures_of(launch, "fp32", 90, variants=rows)

    five, twenty = quoted(64, 5), quoted(256, 20)
    assert (five["tail_trips"], five["tail_clocks"][1], five["merge_clocks"][1]) == (2, 1009,
                                                                                   2326)
    assert (twenty["tail_trips"], twenty["tail_clocks"][1]) == (1, 1511)
    assert "against 2 and 1009" in words and "against 1 and 2326" in words
    assert "against 1 and 1511" in words
    trees = [row for row in rows if row["constexprs"].get("MERGE_TREE")]
    assert {(row["triton"], row["arch"]) for row in trees} == {
        (row["triton"], row["arch"]) for row in rows}
    lease = [row for row in trees if row["triton"].startswith(check.LEASE_TRITON + ".")]
    assert {row["arch"] for row in lease} == set(check.ARCHS)
    assert {row["merge_trips"] for row in lease} == {1}


@NEEDS_TRITON
def test_the_committed_figures_are_the_installed_triton_s():
    """Beside the lease's 3.6, the committed figures are those of the Triton this checkout
    installs (the test extra's range takes the newest): a newer release installed here
    leaves them another Triton's, and the full check must run again."""
    from importlib.metadata import version

    installed = version("triton")
    compiled = {row["triton"] for row in json.loads(check.DATA.read_text())["variants"]}
    assert installed in compiled, (
        f"data/kernel_compile.json holds Triton {sorted(compiled)}, not the installed "
        f"{installed}: run scripts/kernel_compile_check.py --write")


@pytest.mark.slow
@NEEDS_TRITON
def test_the_representative_variants_compile_for_sm_90_on_the_lease_triton_without_spills():
    """The lease's Triton (its environment made here on first use) compiles for sm_90 one
    variant of each (kernel, logits dtype, split or not, k-class: no top-K / K_PAD up to 64 /
    K_PAD 1024, fold tile masked or not, one warp or four and more): the first launched of
    each, by
    ``kernel_variants.representative_variants``. None fails or spills. The installed Triton
    and the other variants: ``scripts/kernel_compile_check.py``.

    Before: every top-K variant failed to compile on Triton 3.6 (``tl.flip(other)``: 3.6's
    flip compares ``dim`` before resolving None), which no interpreter test could see."""
    specs = kernel_variants.representative_variants()
    started = datetime.now(UTC).isoformat(timespec="minutes")
    found = check.run_check((90,), workers=2, specs=specs, installed=False, earlier=[])
    assert check.failures(found) == []
    assert min(row["compiled_at"] for row in found) >= started  # compiled, none kept
    assert {row["triton"].rsplit(".", 1)[0] for row in found} == {check.LEASE_TRITON}
    assert len(found) == len(specs)
    assert {row["num_warps"] == 1 for row in found} == {True, False}


@pytest.mark.slow
@NEEDS_TRITON
def test_the_widest_variants_compile_for_sm_90_and_sm_80_on_the_installed_triton():
    """The installed Triton (the one a user's machine runs) compiles, for each architecture,
    the widest top-K (the most registers) of each kernel, split or not, that its GPU
    launches: none fails or spills. The full check compiles every variant on both Tritons
    for both."""
    found, asked = [], []
    started = datetime.now(UTC).isoformat(timespec="minutes")
    for arch, sms in kernel_variants.ARCH_SMS.items():
        widest: dict[tuple[str, bool], dict] = {}
        for spec in kernel_variants.representative_variants(sms):
            kind = (spec["kernel"], bool(spec["constexprs"].get("SPLIT")))
            held = widest.get(kind)
            if held is None or (spec["constexprs"].get("K_PAD", 0)
                                > held["constexprs"].get("K_PAD", 0)):
                widest[kind] = spec
        asked += [(kind, arch) for kind in widest]
        found += check.compile_with(Path(sys.executable), list(widest.values()), (arch,),
                                    workers=2, earlier=[])
    assert check.failures(found) == []
    assert min(row["compiled_at"] for row in found) >= started  # compiled, none kept
    assert sorted(((row["kernel"], bool(row["constexprs"].get("SPLIT"))), row["arch"])
                  for row in found) == sorted(asked)
    assert {row["constexprs"].get("K_PAD") for row in found} >= {1024}


LEASE = importlib.util.spec_from_file_location(
    "lease_kernel_check", paths.REPO_ROOT / "scripts" / "lease_kernel_check.py")
lease = sys.modules.setdefault(LEASE.name, importlib.util.module_from_spec(LEASE))
LEASE.loader.exec_module(lease)


@pytest.mark.slow  # the interpreter runs every program in Python: minutes on two cores
@NEEDS_TRITON
def test_the_lease_kernel_check_prints_one_ok_line_in_the_interpreter(tmp_path):
    """The lease's first command, rehearsed on a CPU in Triton's interpreter (small shapes)."""
    import os
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(paths.REPO_ROOT / "lib"))
    done = subprocess.run([sys.executable, str(paths.REPO_ROOT / "scripts" /
                                                "lease_kernel_check.py"), "--device", "cpu",
                           "--small"], capture_output=True, text=True, env=env, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) == 1 and lines[0].startswith("kernel check: ok 3/3 shapes")


def test_the_lease_kernel_check_names_what_differs():
    import torch

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 2, 3])
    want = onepass.topk_logprobs(logits, 4, targets, backend="torch")
    assert lease.compare(want, want) == []
    ids = want.ids.clone()
    ids[0, 0] += 1
    off = want.values + 1e-3
    wrong = lease.compare(onepass.OnePass(off, ids, want.logsumexp, want.target_logprob,
                                          want.target_rank, want.target_ties, "triton"), want)
    assert wrong[0] == "ids" and wrong[1].startswith("values (max diff 1.00e-03")
    assert lease.main(["--device", "cuda"]) == (0 if torch.cuda.is_available() else 1)


def test_the_lease_kernel_check_says_which_call_raised_and_why_in_one_line(monkeypatch):
    """Before: an exception without a message ended the check in an IndexError traceback, a
    Triton compile error printed only its location (its cause is its last line), and any
    raise stopped every other shape and call. Now each call that raises is named, with its
    plan, its exception's type and last line, and the others are still checked."""
    assert lease.reason(AssertionError()) == "AssertionError"
    assert lease.reason(RuntimeError("at 1:4:\n  x = tl.flip(y)\n\nTypeError: '<=' no")) == (
        "RuntimeError: TypeError: '<=' no")
    real = onepass.topk_logprobs

    def failing(logits, k, targets, backend="torch", **tuning):
        if backend == "triton" and tuning.get("splits"):
            raise RuntimeError("at 1:4:\nout of resources")
        return real(logits, k, targets, backend="torch")

    monkeypatch.setattr(onepass, "topk_logprobs", failing)
    monkeypatch.setattr(lease, "folded", lambda *args: (_ for _ in ()).throw(ValueError()))
    line = lease.check_shape(3, 500, 5, "float32", "cpu")
    assert line.startswith("n=3 V=500 k=5 float32 ")
    assert f"split {lease.SPLITS} [grid (3, " in line
    assert "raised RuntimeError: out of resources" in line
    assert "plan [grid" in line and "the triton backend did not run" in line
    assert line.endswith("fold raised ValueError")
    assert lease.plan(1, 0, 5, {}, "cpu") == (
        "plan refused: ValueError: vocab must be >= 1, got 0")
    monkeypatch.setattr(lease, "compare", lambda *results: (_ for _ in ()).throw(
        RuntimeError("CUDA error: an illegal memory access was encountered")))
    line = lease.check_shape(3, 500, 5, "float32", "cpu")
    assert line.count("raised RuntimeError: CUDA error: an illegal memory access") == 2
    monkeypatch.setattr(lease, "check_shape", lambda *shape: 1 / 0)
    assert lease.checked((2, 10, 1, "float32"), "cpu") == (
        "n=2 V=10 k=1 float32 raised ZeroDivisionError: division by zero")


def test_the_lease_kernel_check_fails_on_an_arrival_count_left_behind(monkeypatch, capsys):
    """Every shape agrees, but a persistent arrival count is nonzero after the calls: the
    check fails and names where."""
    monkeypatch.setattr(lease, "check_shape", lambda *shape: "n=1 ok")
    monkeypatch.setattr(onepass, "arrival_counts_left", lambda: ["cuda:0 stream 0x7"])
    assert lease.main(["--device", "cpu"]) == 1
    line = capsys.readouterr().out
    assert line.startswith("kernel check: FAILED")
    assert "left nonzero on cuda:0 stream 0x7" in line
    monkeypatch.setattr(onepass, "arrival_counts_left", lambda: [])
    assert lease.main(["--device", "cpu"]) == 0


COMPARE = importlib.util.spec_from_file_location(
    "compare_narrow_plan", paths.REPO_ROOT / "scripts" / "compare_narrow_plan.py")
compare_plans = sys.modules.setdefault(COMPARE.name, importlib.util.module_from_spec(COMPARE))
COMPARE.loader.exec_module(compare_plans)


def test_the_plan_comparison_takes_the_four_warp_launch_the_narrow_plan_replaces():
    """The four-warp specs are the launches a call at those rows makes with the tile given
    (the narrow plan's own condition leaves them four-warp), 2048-wide, one a dtype; the
    narrow ones, the tile left to the plan."""
    specs = compare_plans.plan_specs((256, 1000), (0, 20), 132, "four-warp")
    assert [spec["where"] for spec in specs] == [
        f"four-warp {dtype} n={n} k={k}" for k in (0, 20) for n in (256, 1000)
        for dtype in ("fp32", "bf16")]
    assert {(spec["num_warps"], spec["constexprs"]["BLOCK"]) for spec in specs} == {(4, 2048)}
    narrow = compare_plans.plan_specs((1, 256), (20,), 132, "narrow")  # at any rows
    assert [(spec["where"], spec["num_warps"]) for spec in narrow] == [
        ("narrow fp32 n=1 k=20", 1), ("narrow bf16 n=1 k=20", 1),
        ("narrow fp32 n=256 k=20", 1), ("narrow bf16 n=256 k=20", 1)]
    for k in (0, 20):
        narrow = launches.triton_launches(256, 152064, k, True, None, None, 132)[0]
        assert (narrow.num_warps, narrow.constexprs["BLOCK"]) == (1, 512)


@pytest.mark.slow
@NEEDS_TRITON
def test_the_narrow_plan_is_above_the_four_warp_one_where_its_words_say(capsys):
    """What narrow_walk's words quote, compiled again on the lease's Triton: of the 24 cells
    of n = 16 to 1000, k = 0, 5 and 20, fp32 and bf16, the model puts the narrow plan below
    the four-warp one at the slow ends at two and at the fast ends at five, by 2.7 points at
    most; below 16 rows it loses with a top-K at the fast ends, but at k = 20 for fp32
    (level); the figures it quotes; and the four-warp tile's guard and candidate clocks it
    sets the one-warp tile's against."""
    assert compare_plans.main([]) == 0
    cells = {}
    number = r"(\d+\.\d)"
    for line in capsys.readouterr().out.splitlines():
        found = re.fullmatch(rf"  k=(\d+) n=(\d+) (\w+): narrow {number}-{number}, "
                             rf"four-warp {number}-{number}", line)
        if found:
            k, n, dtype, *shares = found.groups()
            cells[int(k), int(n), dtype] = tuple(map(float, shares))
    assert len(cells) == 36
    batch = {cell: shares for cell, shares in cells.items() if cell[1] >= 16}
    below = {cell for cell, (low, _, wide_low, _) in batch.items() if low < wide_low}
    assert below == {(0, 256, "fp32"), (0, 1000, "fp32")}
    fast = [wide_high - high for _, high, _, wide_high in batch.values() if high < wide_high]
    assert len(fast) == 5 and max(fast) <= 2.7 + 1e-9  # printed to a tenth
    losing = [(5, "fp32"), (5, "bf16"), (20, "bf16")]
    assert all(cells[k, 4, dtype][1] < cells[k, 4, dtype][3] for k, dtype in losing)
    quoted = {(0, 64, "fp32"): (83.3, 76.5), (0, 64, "bf16"): (71.5, 42.1),
              (5, 64, "fp32"): (66.1, 25.2), (5, 64, "bf16"): (38.1, 14.4),
              (20, 64, "fp32"): (23.4, 10.7), (20, 64, "bf16"): (14.7, 7.1),
              (5, 256, "fp32"): (93.9, 66.9), (5, 256, "bf16"): (70.9, 37.2),
              (20, 256, "fp32"): (66.0, 32.5), (20, 256, "bf16"): (39.5, 20.9),
              (0, 256, "fp32"): (95.4, 95.8), (0, 1000, "fp32"): (98.9, 100.0),
              (5, 4, "fp32"): (4.6, 5.1), (5, 4, "bf16"): (2.7, 3.2),
              (20, 4, "bf16"): (0.9, 1.0), (20, 4, "fp32"): (1.5, 1.4)}
    assert {cell: cells[cell][0::2] for cell in quoted} == quoted
    assert cells[20, 4, "fp32"][1] == cells[20, 4, "fp32"][3] == 2.1  # level, fast ends
    four_warp = [json.loads(line) for line in compare_plans.KEPT.read_text().splitlines()]
    wide = [row for row in four_warp if row["where"] == "four-warp fp32 n=64 k=20"][-1]
    assert (wide["guard_clocks"], wide["candidate_clocks"]) == ([505, 739], [801, 1212])


def goal_rows(sms: int, arch: int) -> list[dict]:
    """Hand-made lease-Triton rows of ``arch`` for every goal shape's launch on ``sms`` SMs."""
    rows = []
    for n in (1, 16, 64, 256):
        for k in (0, 5, 20):
            first = launches.triton_launches(n, 152064, k, True, None, None,
                                             launches.device_slots(sms, k))[0]
            rows += [dict(kernel=first.kernel, arch=arch, compiles=True, triton="3.6.0",
                          pointers=dict(x_ptr=dtype), constexprs=dict(first.constexprs),
                          num_warps=first.num_warps, max_registers=first.max_registers,
                          ctas_per_sm=2, registers=200, loop_instructions=4000,
                          guard_instructions=230, enter_instructions=250,
                          sort_instructions=3000, candidate_instructions=130,
                          merge_instructions=200, tail_reads=1, tail_instructions=150,
                          tail_trips=1, tail_clocks=[400, 600], merge_trips=1,
                          merge_clocks=[500, 700], guard_clocks=[600, 900],
                          count_clocks=[0, 0], enter_clocks=[500, 700],
                          sort_clocks=[9000, 12000], candidate_clocks=[400, 600])
                 for dtype in ("fp32", "bf16")]
    return rows


def test_the_table_shows_the_model_at_the_goal_s_shapes_with_its_inputs():
    """Every goal shape (n 1/16/64/256, k 0/5/20, fp32 and bf16) as a row of the model's
    inputs and share, from the lease Triton's sm_90 rows alone; nothing without them."""
    rows = goal_rows(132, 90)
    lines = check.model_table(rows)
    body = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert len(body) == 4 * 3 * 2 and "never a measurement" in lines[1]
    assert "an H200" in lines[1] and sum("Goal (issue 44)" in line for line in lines) == 1
    assert check.model_table([dict(row, triton="3.9.0") for row in rows]) == []


def test_the_h200_table_gives_each_goal_cell_its_goal_and_instruction_budget():
    """Each H200 row with a goal (n >= 16) shows it and the tile instructions that would meet
    it (roofline.goal_instructions on the same rows, ``none`` where no walk does); n = 1 has
    neither; the words count the goal cells the model meets at the slow ends, at the target's
    assumed rank and with every tile counting."""
    rows = goal_rows(132, 90)
    lines = check.model_table(rows)
    body = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines
            if line.startswith("| ") and line[2].isdigit()]
    assert all(len(cells) == 22 for cells in body)
    met = every = 0
    for cells in body:
        n, k, dtype = int(cells[0]), int(cells[1]), cells[2]
        goal = roofline.goal_share(n)
        if goal is None:
            assert n == 1 and cells[20:] == ["", ""]
            continue
        budget = roofline.goal_instructions(n, 152064, k, dtype, "H200", tuple(rows))
        first = launches.triton_launches(n, 152064, k, True, None, None,
                                         launches.device_slots(132, k))[0]
        assert cells[4] == str(first.num_warps)
        assert cells[20] == f"{100 * goal:.0f}"
        assert cells[21] == ("none" if budget is None else str(budget))
        found = roofline.predict_range(n, 152064, k, dtype, "H200", tuple(rows))
        assert cells[8] == str(found["tile_clocks"])
        met += found["model_low"] >= goal
        every += found["model_low_counting_all"] >= goal
    assert sum(f"meets it at {met} of 18 cells" in line for line in lines) == 1
    assert sum(f"at {every} with every tile counting" in line for line in lines) == 1


def test_the_table_models_an_a100_from_the_sm_80_rows_alone():
    """An A100 (108 SMs) is modelled from sm_80 rows of its own launches, without the goal's
    words (set on an H200); sm_90 rows alone give it no section."""
    rows = goal_rows(roofline.GPUS["A100 SXM"].sms, 80)
    lines = check.model_table(rows)
    assert "an A100 SXM" in lines[1] and not any("Goal" in line for line in lines)
    assert len([line for line in lines if line.startswith("| ") and line[2].isdigit()]) == 24
    assert not any("A100" in line for line in check.model_table([dict(row, arch=90)
                                                                 for row in rows]))


def test_the_kernel_digest_follows_the_code_not_its_words(tmp_path, monkeypatch):
    """A docstring (the module's or a function's) or a comment changed leaves the digest
    (nothing to recompile); a changed constant, statement or launches constant the kernel
    reads changes it (every figure compiled before is stale)."""
    source = kernel_compile.KERNEL_SOURCE.read_text()
    digest = kernel_compile.kernel_digest()
    for before, after in (('"""The one-pass kernel in Triton', '"""Reworded'),
                          ('"""fp32 values as int32 that order', '"""Reworded'),
                          ("# The key of a padding lane", "# Reworded")):
        worded = tmp_path / "worded.py"
        assert before in source
        worded.write_text(source.replace(before, after, 1))
        assert kernel_compile.kernel_digest(worded) == digest
    for before, after in (("STAGES = tl.constexpr(launches.PIPELINE_STAGES)",
                           "STAGES = tl.constexpr(launches.PIPELINE_STAGES + 1)"),
                          ("x = x + 0.0", "x = x + 1.0")):
        changed = tmp_path / "changed.py"
        assert before in source
        changed.write_text(source.replace(before, after, 1))
        assert kernel_compile.kernel_digest(changed) != digest
    monkeypatch.setattr(launches, "PIPELINE_STAGES", launches.PIPELINE_STAGES + 1)
    kernel_compile.kernel_digest.cache_clear()
    try:
        assert kernel_compile.kernel_digest() != digest
    finally:
        monkeypatch.undo()
        kernel_compile.kernel_digest.cache_clear()
    assert kernel_compile.kernel_digest() == digest


def test_the_kernel_digest_is_the_same_on_every_python_here():
    """Before: an ``ast.dump`` digest differed on 3.11, 3.12 (``type_params``) and 3.13
    (empty fields left out), so a run on another Python called every row stale."""
    import os
    import subprocess

    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    others = sorted(str(python) for python in root.glob("3.1[1-9]*/bin/python"))
    if not others:
        pytest.skip("no other Python 3.11+ here to compare with")
    code = "from stagelab.measure import kernel_compile as k; print(k.kernel_digest())"
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib"))
    digests = {python: subprocess.run([python, "-c", code], capture_output=True, text=True,
                                      env=env, check=True).stdout.strip() for python in others}
    assert set(digests.values()) == {kernel_compile.kernel_digest()}, digests


@NEEDS_TRITON
def test_a_compile_stamps_its_row_with_the_kernel_digest():
    """Even a failed one (a spec short of an int: no compile is tried)."""
    spec = kernel_variants.spec_of(launches.finish_launch(4, 5, True), "fp32")
    found = kernel_compile.compile_one(dict(spec, scalars={}), 90)
    assert not found["compiles"] and found["kernel_digest"] == kernel_compile.kernel_digest()


def test_an_unfinished_table_is_refused_and_not_written(tmp_path, monkeypatch):
    """A table rendered from rows none of which is of today's kernel code, or short of a
    launched variant, is not written and the check fails. Before: it wrote an empty table
    and exited 0."""
    monkeypatch.setattr(check, "ROOT", tmp_path)  # the help names its files from the root
    monkeypatch.setattr(check, "DOC", tmp_path / "kernels.md")
    monkeypatch.setattr(check, "DATA", tmp_path / "kernel_compile.json")
    spec = check.launched_for(90)[0]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(dict(spec, triton="3.6.0", arch=90, compiles=True,
                                    spill_bytes=0, kernel_digest="an-older-kernel")) + "\n")
    assert check.main(["--write", "--rows", str(rows), "--from-rows"]) == 1
    assert not check.DOC.exists() and not check.DATA.exists()
    short = check.unfinished([dict(spec, triton="3.6.0", arch=90)])
    assert len(short) == 1 and f"{len(check.launched_for(90)) - 1} launched variants" in short[0]


def test_a_table_from_rows_leaves_out_rows_of_other_kernel_code(tmp_path):
    spec = check.launched_for(90)[0]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(dict(spec, triton="3.6.0", arch=90, kernel_digest=d))
                            + "\n" for d in (kernel_compile.kernel_digest(), "an-older-kernel")))
    assert check.current_rows(rows) == [dict(spec, triton="3.6.0", arch=90,
                                             kernel_digest=kernel_compile.kernel_digest())]
    rows.write_text(json.dumps(dict(spec, triton="3.6.0", arch=90)) + "\n")
    assert check.current_rows(rows) == []


def test_a_stopped_run_resumes_each_architecture_apart(tmp_path, monkeypatch):
    """Before: rows were matched by specialisation alone, so a file holding a variant's sm_90
    row skipped its sm_80 compile, and a resumed two-architecture run kept one row of each. A
    row compiled from other kernel code (``kernel_digest``) is compiled again, not kept."""
    import subprocess
    import types

    specs = [kernel_variants.spec_of(launches.finish_launch(4, k, True), "fp32") for k in (1, 5)]
    out = tmp_path / "rows.jsonl"
    today = kernel_compile.kernel_digest()
    out.write_text(json.dumps(dict(specs[0], triton="9.9", arch=90, kernel_digest=today))
                   + "\n" + json.dumps(dict(specs[1], triton="9.9", arch=80,
                                             kernel_digest="an-older-kernel")) + "\n")
    calls = []

    def run(command, **kwargs):
        if "-c" in command:
            return types.SimpleNamespace(stdout="9.9\n")
        wanted = json.loads(open(command[-3]).read())
        calls.append((int(command[-1]), [s["scalars"]["k"] for s in wanted]))
        with out.open("a") as sink:
            for spec in wanted:
                sink.write(json.dumps(dict(spec, triton="9.9", arch=int(command[-1]))) + "\n")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(check.subprocess, "run", run)
    found = check.compile_with(tmp_path / "python", specs, (90, 80), 1, tmp_path, out)
    assert calls == [(90, [5]), (80, [1, 5])]
    assert sorted((row["arch"], row["scalars"]["k"]) for row in found) == [
        (80, 1), (80, 5), (90, 1), (90, 5)]


DIGESTS = """
import importlib.util, json, sys
import stagelab.measure as measure
from stagelab.measure import kernel_compile
rows, source = json.loads(sys.argv[1]), sys.argv[2]
if source:  # the kernels as another file of them defines them
    found = importlib.util.spec_from_file_location("onepass_elsewhere", source)
    measure.onepass_triton = importlib.util.module_from_spec(found)
    found.loader.exec_module(measure.onepass_triton)
print(json.dumps([kernel_compile.ttir_digest(row, row["arch"]) for row in rows]))
"""


def ttir_digests(rows: list[dict], source: Path | None = None) -> list[str]:
    """``kernel_compile.ttir_digest`` of each row's variant for its architecture, compiled by
    the installed Triton (not its interpreter, which the tests run: it makes no TTIR), of the
    kernels of ``source`` where given."""
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib"))
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", DIGESTS, json.dumps(rows), str(source or "")],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@NEEDS_TRITON
def test_the_ttir_digest_ignores_where_the_code_sits_but_not_what_it_does(tmp_path):
    """The full check keeps a committed row where today's code makes its variant the same
    TTIR: lines moved leave the digest (the same cubin but for its line table), a changed
    constant the variant reads changes it. Its kernel code's digest changes with the
    constant."""
    spec = dict(check.launched_for(90)[0], arch=90)  # a one-pass walk: logits times LOG2E
    source = kernel_compile.KERNEL_SOURCE.read_text()
    before = "LOG2E = tl.constexpr(1.4426950408889634)"
    assert before in source
    moved, changed = tmp_path / "moved.py", tmp_path / "changed.py"
    moved.write_text("# moved\n" * 7 + source)
    changed.write_text(source.replace(before, "LOG2E = tl.constexpr(1.5)"))
    today, = ttir_digests([spec])
    assert ttir_digests([spec], moved) == [today]
    assert ttir_digests([spec], changed) != [today]
    assert kernel_compile.kernel_digest(changed) != kernel_compile.kernel_digest()


def test_a_committed_row_is_kept_where_today_s_code_makes_its_ttir_alike(tmp_path,
                                                                          monkeypatch):
    """Of the variants with an earlier row: the one whose TTIR today's code makes alike is
    kept (today's ``kernel_digest``, its own ``compiled_at``); another TTIR (even on a row of
    today's code), an earlier row that failed, and one of another Triton are compiled. A row
    of today's code without a TTIR digest (figures of before the digest) is kept and given
    one. A front end that fails, or a Triton or ptxas knob set, keeps nothing."""
    import subprocess
    import types

    specs = [kernel_variants.spec_of(launches.finish_launch(4, k, True), "fp32")
             for k in (1, 2, 5, 20, 64, 1024)]
    today = kernel_compile.kernel_digest()
    old = dict(triton="9.9", arch=90, compiles=True, error="", spill_bytes=0,
               kernel_digest="an-older-kernel", compiled_at="2026-01-02T03:04+00:00")
    earlier = [dict(specs[0], **old, ttir_digest="same"),
               dict(specs[1], **dict(old, kernel_digest=today), ttir_digest="before"),
               dict(specs[2], **old, ttir_digest="before"),
               dict(specs[3], **dict(old, compiles=False, error="boom"), ttir_digest="same"),
               dict(specs[4], **dict(old, triton="9.8"), ttir_digest="same"),
               dict(specs[5], **dict(old, kernel_digest=today))]
    calls = []

    def run(command, **kwargs):
        if "-c" in command:
            return types.SimpleNamespace(stdout="9.9\n")
        wanted = json.loads(open(command[-3]).read())
        calls.append(("--ttir" in command, [s["scalars"]["k"] for s in wanted]))
        with open(command[-2], "a") as sink:
            for spec in wanted:  # the front end fails at k = 1 where the test says so
                digest = "" if spec["scalars"]["k"] == failing else "same"
                sink.write(json.dumps(dict(spec, triton="9.9", arch=90, ttir_digest=digest,
                                           kernel_digest=today, compiled_at="now")) + "\n")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(check.subprocess, "run", run)
    failing = None
    out = tmp_path / "rows.jsonl"
    found = check.compile_with(tmp_path / "python", specs, (90,), 1, tmp_path, out, earlier)
    assert calls == [(True, [1, 2, 5, 1024]), (False, [2, 5, 20, 64])]
    by_k = {row["scalars"]["k"]: row for row in found}
    assert {k: row["compiled_at"] for k, row in by_k.items()} == {
        1: "2026-01-02T03:04+00:00", 2: "now", 5: "now", 20: "now", 64: "now",
        1024: "2026-01-02T03:04+00:00"}
    assert {row["kernel_digest"] for row in found} == {today}
    assert by_k[1024]["ttir_digest"] == "same"
    assert len(check._lines(out)) == 6  # kept rows are in the rows file: a resumed run has them
    failing, calls[:] = 1, []  # a front end that fails keeps nothing: the compile says why
    check.compile_with(tmp_path / "python", specs[:1], (90,), 1, tmp_path,
                       tmp_path / "failing.jsonl", earlier)
    assert calls == [(True, [1]), (False, [1])]
    calls[:] = []  # a knob that may change a compile's output: nothing kept, nothing digested
    monkeypatch.setenv("PTXAS_OPTIONS", "-O0")
    check.compile_with(tmp_path / "python", specs[:1], (90,), 1, tmp_path,
                       tmp_path / "knob.jsonl", earlier)
    assert calls == [(False, [1])]


@NEEDS_TRITON
def test_the_committed_rows_carry_the_ttir_today_s_code_makes():
    """The first committed row of each kernel, architecture, split or not and reading its
    keys as a tree or not, on the installed Triton, holds the TTIR digest its variant has today:
    the key on which a later check keeps rows."""
    import triton

    data = json.loads(check.DATA.read_text())["variants"]
    firsts = {}
    for row in data:
        if row["triton"] == triton.__version__:
            flags = row["constexprs"]
            firsts.setdefault((row["kernel"], row["arch"], bool(flags.get("SPLIT")),
                               bool(flags.get("MERGE_TREE"))), row)
    assert len(firsts) == 10  # the one-pass walk split with a tree, split, or neither
    assert ttir_digests(list(firsts.values())) == [row["ttir_digest"] for row in firsts.values()]
    assert all(row.get("ttir_digest") and row.get("compiled_at") for row in data)


def test_a_table_written_from_rows_is_dated_when_they_were_compiled(tmp_path, monkeypatch):
    """Re-rendering the docs from a rows file compiles nothing: the table and the data carry
    the rows file's time, not the time of the rendering."""
    import os

    committed = json.loads((paths.REPO_ROOT / "data" / "kernel_compile.json").read_text())
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in committed["variants"]))
    os.utime(rows, (1_700_000_000, 1_700_000_000))  # 2023-11-14 22:13 UTC
    monkeypatch.setattr(check, "ROOT", tmp_path)  # the help names its files from the root
    monkeypatch.setattr(check, "DOC", tmp_path / "kernels.md")
    monkeypatch.setattr(check, "DATA", tmp_path / "kernel_compile.json")
    check.main(["--write", "--rows", str(rows), "--from-rows"])
    assert json.loads(check.DATA.read_text())["written"] == "2023-11-14T22:13:20+00:00"
    assert "Written 2023-11-14 22:13 UTC" in check.DOC.read_text()


def test_the_committed_doc_is_the_table_of_the_committed_figures():
    """docs/kernels.md is rendered from data/kernel_compile.json by today's code (the
    variants' figures, the model and its goal budgets): an edit of either, or of the model,
    without rendering again fails here."""
    committed = json.loads((paths.REPO_ROOT / "data" / "kernel_compile.json").read_text())
    when = datetime.fromisoformat(committed["written"])
    assert check.table(committed["variants"], when) == check.DOC.read_text()
