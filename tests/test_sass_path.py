"""The critical path of SASS as one warp issues it (stagelab.measure.sass_path)."""

import pytest

from stagelab.measure import sass_path


@pytest.mark.parametrize(("text", "writes", "reads"), [
    ("@P1 LDG.E.64.STRONG.GPU R16, desc[UR14][R12.64+0x100]", ("R16", "R17"),
     ("P1", "UR14", "R12", "R13")),
    ("LDG.E.128.STRONG.GPU R24, desc[UR14][R46.64]", ("R24", "R25", "R26", "R27"),
     ("UR14", "R46", "R47")),
    ("SHFL.BFLY PT, R4, R16, 0x10, 0x1f", ("R4",), ("R16",)),  # its flag, then its result
    ("LOP3.LUT P0, R3, R2, 0x3, RZ, 0xc0, !PT", ("P0", "R3"), ("R2",)),
    ("ISETP.GE.U32.AND P1, PT, R45, R68, PT", ("P1",), ("R45", "R68")),
    ("IADD3 R12, P3, P4, R25, R32, R26", ("R12", "P3", "P4"), ("R25", "R32", "R26")),
    ("IMAD.WIDE.U32 R6, R45, 0x4, R12", ("R6", "R7"), ("R45", "R12", "R13")),  # its addend
    ("IADD3.X R13, RZ, R33, R28, P3, P4", ("R13",), ("R33", "R28", "P3", "P4")),  # carries in
    ("FSETP.NEU.AND P3, PT, R31.reuse, -INF , PT", ("P3",), ("R31",)),
    ("HSETP2.BF16_V2.NE.AND P5, P6, R77, -INF , -INF , PT", ("P5", "P6"), ("R77",)),
    ("PLOP3.LUT P1, PT, PT, PT, UP0, 0x80, 0x0", ("P1",), ("UP0",)),
    ("VOTE.ANY R5, PT, P0", ("R5",), ("P0",)),
    ("P2R R16, PR, RZ, 0x40", ("R16",), tuple(f"P{n}" for n in range(7))),
    ("R2P PR, R2, 0x7f", tuple(f"P{n}" for n in range(7)), ("R2",)),
    ("CS2R R4, SRZ", ("R4", "R5"), ()),
    ("@P1 ATOMG.E.ADD.STRONG.GPU PT, R7, desc[UR14][R4.64], R7", ("R7",),
     ("P1", "UR14", "R4", "R5", "R7")),
    ("STS.64 [R16], R20", (), ("R16", "R20", "R21")),  # a wide store reads its data's pair
    ("UIADD3.X UR28, UR7, UR23, URZ, UP1, !UPT", ("UR28",), ("UR7", "UR23", "UP1")),
    ("@!P0 STG.E desc[UR14][R6.64], R32", (), ("P0", "UR14", "R6", "R7", "R32")),
    ("@P1 EXIT", (), ("P1",)),
    ("REDUX.SUM.S32 UR4, R76", ("UR4",), ("R76",)),  # a warp's reduction has a result
    ("LDGSTS.E.BYPASS.128 [R91+0x800], desc[UR14][R94.64], !P5", (),
     ("R91", "UR14", "R94", "R95", "P5")),
])
def test_an_instruction_writes_its_leading_operands_and_reads_the_rest(text, writes, reads):
    found = sass_path.instruction(text)
    assert (found.writes, found.reads) == (writes, reads)


def test_a_warp_issues_in_order_and_waits_for_what_it_reads():
    """Three independent ALU steps issue a clock apart; one reading the last waits its
    latency; a shuffle's result is ready 23/33 clocks after it issues."""
    alu, shuffle = (sass_path.LATENCY_CLOCKS[kind] for kind in ("alu", "shuffle"))
    independent = ["IADD3 R1, R2, R3, RZ", "IADD3 R4, R2, R3, RZ", "IADD3 R5, R2, R3, RZ"]
    for end in sass_path.ENDS:
        assert sass_path.critical_path(independent, end) == (0, 2 + alu[end])
        chained = independent + ["FADD R6, R5, R1", "SHFL.BFLY PT, R7, R6, 0x1, 0x1f"]
        assert sass_path.critical_path(chained, end) == (0, 2 + 2 * alu[end] + shuffle[end])
    assert sass_path.critical_path([], 1) == (0, 0)


def test_loads_issued_together_share_a_round_trip_and_a_dependent_one_waits_its_own():
    """Two loads, then a step on both: one trip. A load whose address is read from another
    (a pointer chase) or that follows a step waiting on one: two. A round trip outweighs any
    clocks beside it."""
    together = ["LDG.E R2, desc[UR4][R8.64]", "LDG.E R3, desc[UR4][R10.64]",
                "FADD R4, R2, R3"]
    chased = ["LDG.E.64 R2, desc[UR4][R8.64]", "LDG.E R4, desc[UR4][R2.64]"]
    behind = ["LDG.E R2, desc[UR4][R8.64]", "FADD R4, R2, R2", "LDG.E R5, desc[UR4][R10.64]",
              "FADD R6, R5, R4"]
    assert sass_path.critical_path(together, 1)[0] == 1
    assert sass_path.critical_path(chased, 1)[0] == 2
    assert sass_path.critical_path(behind, 1)[0] == 2
    slow_alu = ["FADD R1, R1, R1"] * 200
    assert sass_path.critical_path(chased, 0) > sass_path.critical_path(together + slow_alu, 0)


def test_a_chain_through_a_special_register_shared_memory_and_an_overwritten_result():
    """S2R, then a shared load at its address, then a step on what it read: 20 + 23 + 4
    clocks fast, 30 + 33 + 6 slow. A result overwritten while its MUFU is pending waits for
    it (the scoreboard), and a reader of the register takes the later write: 15 + 4 + 4,
    25 + 6 + 6."""
    chain = ["S2R R1, SR_TID.X", "LDS R2, [R1]", "FADD R3, R2, R2"]
    assert [sass_path.critical_path(chain, end) for end in sass_path.ENDS] == [
        (0, 20 + 23 + 4), (0, 30 + 33 + 6)]
    rewritten = ["MUFU.EX2 R1, R2", "FADD R1, R3, R3", "FADD R4, R1, R1"]
    assert [sass_path.critical_path(rewritten, end) for end in sass_path.ENDS] == [
        (0, 15 + 4 + 4), (0, 25 + 6 + 6)]


def test_an_atomic_s_answer_waits_a_round_trip():
    """A step on an atomic's answer waits an L2 round trip, as one on a load does."""
    counted = ["ATOMG.E.ADD.STRONG.GPU PT, R7, desc[UR4][R4.64], R7", "IADD3 R8, R7, 1, RZ"]
    assert sass_path.critical_path(counted, 1) == (1, 6)
