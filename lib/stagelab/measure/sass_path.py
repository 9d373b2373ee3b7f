"""The critical path of a straight run of SASS, as one warp issues it: L2 round trips and clocks.

A split row's tail (its last slice's code after counting itself in) is run once, by one program,
after every walk has ended: its time is the length of its chain of dependences, not its count of
instructions. A warp issues in order, at most one instruction a clock, and an instruction waits
until the registers and predicates it reads are ready; a result is ready a latency after its
instruction issues (:data:`LATENCY_CLOCKS`, by kind of instruction). A global load's result is
ready one L2 round trip after it issues (the tail reads what other programs wrote, past L1). So
a load that ptxas places after an instruction waiting on an earlier load waits for that load
too, barrier or not, which a count of barrier-separated batches cannot see.

Time is a pair, (L2 round trips, clocks), ordered by its round trips first: a path with one
round trip more is taken as the longer whatever the clocks beside it, which holds where an L2
round trip outlasts the clocks any path spends between two of them (a few hundred here; an L2
round trip under load some 400-800 clocks at an H200's boost clock: on today's tails a plain
sum at a round trip of 400 clocks differs by at most 2 %, at 600 and 800 not at all). The
caller prices a round trip (:mod:`stagelab.analyse.roofline`).

Further simplifications, each named: one warp stands for the program's warps (they run the
same code, one a scheduler); a barrier costs its latency once every earlier instruction has
issued; both sides of a forward branch are walked one after the other (a predicated run of
code costs its issue slots either way); a store, branch or fence yields nothing to wait on; a
register written twice is ready at its last write, the second writer waiting for a pending
variable-latency first. Standard library only, like :mod:`stagelab.measure.kernel_compile`,
which reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Assumed clocks from an instruction's issue to its result, (fast, slow) ends, by kind: a
# dependent ALU step, the special-function unit (exp2, log2), a warp shuffle, a shared-memory
# load, a barrier (all warps arrived) and a special register read. Inputs, not measured here:
# of the order published microbenchmarks of Volta to Hopper report, widened at the slow end.
LATENCY_CLOCKS = {"alu": (4, 6), "special_function": (15, 25), "shuffle": (23, 33),
                  "shared": (23, 33), "barrier": (20, 40), "special_register": (20, 30)}
ENDS = (0, 1)  # LATENCY_CLOCKS' fast and slow ends
KINDS = (("MUFU", "special_function"), ("SHFL", "shuffle"), ("LDS", "shared"),
         ("BAR", "barrier"), ("S2R", "special_register"), ("S2UR", "special_register"))
# What waits an L2 round trip: a global load, and an atomic's answer.
GLOBAL = re.compile(r"^(LDG|ATOMG)\b")
# The kinds whose result a later writer of the same register waits for (the hardware's
# scoreboards: variable latencies); a fixed-latency ALU result needs no wait to be overwritten.
SCOREBOARDED = frozenset({"global", "special_function", "shuffle", "shared",
                          "special_register"})
# Opcodes (before their first ".") whose operands are all read: stores, reductions to memory,
# copies into shared memory, control, fences, cache control. A wide store reads its data as a
# pair or four.
NO_RESULT = frozenset({"ST", "STG", "STS", "STL", "RED", "REDG", "LDGSTS", "LDGDEPBAR", "BAR",
                       "EXIT", "BRA", "BSYNC", "BSSY", "MEMBAR", "ERRBAR", "CGAERRBAR", "CCTL",
                       "NOP", "WARPSYNC", "DEPBAR", "FENCE"})
# Whose first operand is a predicate written with a register after it (SHFL's in-bounds flag,
# an atomic's).
PREDICATE_THEN_REGISTER = frozenset({"SHFL", "LOP3", "ATOMG", "ATOM", "ATOMS"})
# Predicates a register result may carry beside it (a carry out, VOTE's any): at most these many.
CARRIED = {"IADD3": 2, "UIADD3": 2, "LEA": 1, "ULEA": 1, "VOTE": 1, "VOTEU": 1}
PREDICATES = tuple(f"P{number}" for number in range(7))  # PR: P2R reads, R2P writes them
REGISTER = re.compile(r"\b(U?)(R|P)(\d+)(\.64)?\b")
PREDICATE = re.compile(r"^U?P(\d|T)$")
GUARD = re.compile(r"^@!?(U?P\d|U?PT)\s+")


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: its opcode, the registers and predicates it writes and reads."""

    opcode: str
    writes: tuple[str, ...]
    reads: tuple[str, ...]


def _registers(operand: str, width: int = 1) -> list[str]:
    """The registers an operand names: a ``.64`` one's pair, and ``width`` consecutive ones
    from a register of a wide result."""
    names = []
    for uniform, kind, number, pair in REGISTER.findall(operand):
        span = max(width, 2 if pair else 1) if kind == "R" else 1
        names += [f"{uniform}{kind}{int(number) + step}" for step in range(span)]
    return names


def instruction(text: str) -> Instruction:
    """One line of SASS (``cuobjdump -sass``, without its address and ``;``) parsed: its
    results are its leading operands (a register and the predicates it carries,
    :data:`CARRIED`; or up to two predicates, and the register after them for
    :data:`PREDICATE_THEN_REGISTER`), wide ones as pairs or fours; its guard predicate and
    the rest are read (a wide store's data, a ``.WIDE`` multiply's addend as pairs or fours)."""
    text = text.strip()
    reads: list[str] = []
    guard = GUARD.match(text)
    if guard:
        reads.append(guard.group(1))
        text = text[guard.end():]
    opcode, _, rest = text.partition(" ")
    root = opcode.split(".")[0]
    operands = [operand.strip() for operand in rest.split(",")] if rest.strip() else []
    width = 4 if ".128" in opcode else 2 if ".64" in opcode or ".WIDE" in opcode else 1
    if root == "CS2R":
        width = 1 if ".32" in opcode else 2
    last = _registers(operands[-1], width) if operands else []
    if root in NO_RESULT or not operands:
        reads += [r for op in operands[:-1] for r in _registers(op)]
        return Instruction(opcode, (), tuple(reads + last))
    if root == "R2P":
        return Instruction(opcode, PREDICATES, tuple(reads + _registers(operands[1])))
    if PREDICATE.match(operands[0]):
        results = 1
        while results < min(len(operands), 2) and PREDICATE.match(operands[results]):
            results += 1
        if root in PREDICATE_THEN_REGISTER and results < len(operands):
            results += 1
    else:
        carried = 0
        while (carried < CARRIED.get(root, 0) and 1 + carried < len(operands)
               and PREDICATE.match(operands[1 + carried])):
            carried += 1
        results = 1 + carried
    writes = [r for op in operands[:results] for r in _registers(op, width)]
    sources = operands[results:]
    wide_addend = ".WIDE" in opcode and len(sources) > 0
    reads += [r for op in (sources[:-1] if wide_addend else sources) for r in _registers(op)]
    if wide_addend:
        reads += last
    if "PR" in sources:
        reads += PREDICATES
    return Instruction(opcode, tuple(writes), tuple(reads))


def kind_of(opcode: str) -> str:
    """The kind of ``opcode`` whose latency it takes: ``global`` (:data:`GLOBAL`), one of
    :data:`LATENCY_CLOCKS`' (:data:`KINDS`), else ``alu``."""
    if GLOBAL.match(opcode):
        return "global"
    return next((kind for prefix, kind in KINDS if opcode.startswith(prefix)), "alu")


def latency(opcode: str, end: int) -> int:
    """Clocks from issue to result of ``opcode`` at ``end`` of :data:`LATENCY_CLOCKS` (0 for
    a global load: its round trip is counted apart)."""
    kind = kind_of(opcode)
    return 0 if kind == "global" else LATENCY_CLOCKS[kind][end]


def critical_path(texts: list[str], end: int) -> tuple[int, int]:
    """(L2 round trips, clocks) from the first instruction of ``texts`` (a straight run of
    SASS lines, in address order) issuing to the last result ready or last issue, at
    ``end`` of :data:`LATENCY_CLOCKS`; (0, 0) for none. An instruction waits for what it
    reads, and for a pending variable-latency result it overwrites (:data:`SCOREBOARDED`)."""
    ready: dict[str, tuple[int, int]] = {}
    pending: dict[str, tuple[int, int]] = {}  # scoreboarded results, by register
    issue, finish = (0, -1), (0, 0)
    for text in texts:
        found = instruction(text)
        issue = max([(issue[0], issue[1] + 1)]
                    + [ready.get(name, (0, 0)) for name in found.reads]
                    + [pending.get(name, (0, 0)) for name in found.writes])
        kind = kind_of(found.opcode)
        trips = 1 if kind == "global" else 0
        done = (issue[0] + trips, issue[1] + latency(found.opcode, end))
        for name in found.writes:
            ready[name] = done
            if kind in SCOREBOARDED:
                pending[name] = done
            else:
                pending.pop(name, None)
        if kind == "barrier":
            issue = done  # the next instruction issues once every warp has arrived
        finish = max(finish, done if found.writes else issue)
    return finish if texts else (0, 0)
