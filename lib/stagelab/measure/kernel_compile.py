"""Compile the one-pass kernels ahead of time for a GPU that is not here, and read their cubins.

``triton.compile`` with an explicit ``GPUTarget`` needs no GPU: Triton's wheel bundles ptxas,
``cuobjdump`` and ``nvdisasm``. Each launch the measuring code makes
(:func:`stagelab.core.launches.triton_launches` and the fold's) is compiled as Triton's runtime
would specialise it (an int argument equal to 1 becomes a constant, one divisible by 16 is marked
so, every pointer 16-byte aligned, as torch allocates), and its cubin is read for: registers per
thread, spilled bytes (ptxas's local memory; 0 when nothing spills), shared memory, CTAs per SM
(from the architecture's limits), and the tile loop's SASS instructions by path
(:func:`loop_figures`: all of it, the guard's path, and the top-K block's parts: its sort
path, its per-candidate loop and the rest).

Imports the standard library and Triton only, so that it runs in a small environment holding
nothing but another Triton (the lease image's): ``python -m stagelab.measure.kernel_compile
SPECS.json OUT.jsonl`` with ``lib`` on ``PYTHONPATH``; the specs are made by
:func:`stagelab.measure.kernel_variants.launched_variants`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from stagelab.measure import sass_path

# Per-SM limits of the architectures compiled for: registers, threads, resident CTAs, shared
# memory (bytes usable by resident CTAs together), and the shared memory the runtime reserves
# per CTA (CUDA C Programming Guide, compute capabilities table).
SM_LIMITS = {
    80: dict(registers=65536, threads=2048, ctas=32, shared=167936, reserved=1024),
    90: dict(registers=65536, threads=2048, ctas=32, shared=233472, reserved=1024),
}
REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
RESOURCES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")
EXIT = re.compile(r"\bEXIT\b")


def ctas_per_sm(arch: int, registers: int, warps: int, shared: int) -> int:
    """CTAs of ``warps`` warps, ``registers`` per thread and ``shared`` bytes that one SM of
    compute capability ``arch`` (80, 90) holds at once: the least of its four limits."""
    limit = SM_LIMITS[arch]
    per_warp = math.ceil(max(registers, 1) * 32 / REGISTER_UNIT) * REGISTER_UNIT
    by_registers = limit["registers"] // (per_warp * warps)
    by_threads = limit["threads"] // (32 * warps)
    by_shared = limit["shared"] // (shared + limit["reserved"])
    return min(by_registers, by_threads, by_shared, limit["ctas"])


LOOP_FIGURES = ("loop_instructions", "guard_instructions", "count_instructions",
                "enter_instructions", "sort_instructions", "candidate_instructions",
                "pipelined_copies", "copy_bytes", "merge_instructions")
# The tile loop's paths' critical paths, [fast, slow] clocks (loop_figures).
PATH_CLOCKS = ("guard_clocks", "count_clocks", "enter_clocks", "candidate_clocks",
               "sort_clocks")
# cp.async, a copy from global into shared memory (LDGSTS), and its width in bits where it
# names one (16 and 8 bytes; else 4).
PIPELINED_COPY = re.compile(r"\bLDGSTS\b(?:\S*?\.(128|64)\b)?")


def loop_figures(sass: str, top_k: bool = True, counts: bool = True,
                 merged: bool = False) -> dict[str, Any]:
    """The tile loop's SASS instructions, by path (all 0 where there is no loop), for a walk
    with a top-K block (``top_k``) and a target's counts (``counts``) or without, and the
    merge loop of a split top-K walk (``merged``):

    * ``loop_instructions``: the outermost loop, from the earliest target of a backward
      branch to that branch;
    * ``guard_instructions``: its path without the two blocks below (every tile's work);
    * ``count_instructions``: the largest block a forward branch inside it skips outside the
      top-K block (the target's counts, skipped on a tile whose max is below the target);
    * the top-K block: the largest block a forward branch inside it skips (entered when a
      tile's max beats the least key held), in three parts:
    * ``candidate_instructions``: the largest loop inside that block (one value entering the
      top-K: ``onepass_triton._enter``'s per-candidate loop);
    * ``sort_instructions``: the largest block a forward branch inside the top-K block skips
      that does not hold that loop (the sort-and-merge path of a tile with many candidates);
    * ``enter_instructions``: the rest of the top-K block (its count of candidates, the set-up
      of either path, the least key's read);
    * ``pipelined_copies``: the loop's copies from global into shared memory (``LDGSTS``:
      Triton's software pipeline issuing the tiles ahead; 0 where its loads are plain), and
      ``copy_bytes``: the narrowest of them, in bytes (0 where there is none);
    * ``merge_instructions``: the last loop after the tile loop (``merged``: the row's last
      slice merging a group of slices' keys, ``onepass_triton._merged_slices``), else 0;
    * ``guard_clocks``, ``count_clocks``, ``enter_clocks``, ``candidate_clocks`` and
      ``sort_clocks``: each path's critical path as one warp issues it
      (:func:`stagelab.measure.sass_path.critical_path`, its first instruction's inputs
      ready), in clocks at the fast and slow ends of the assumed instruction latencies
      (:data:`stagelab.measure.sass_path.LATENCY_CLOCKS`): what a tile takes a warp that
      has its scheduler to itself, however few its instructions.

    The tile loop is the longest a backward branch closes (a cut first tile walked before it
    holds loops of its own) before the last ``EXIT`` (ptxas places a warp's divergent paths
    after it, branching back into the body) and, in a split walk, before its count of the
    row's slices (the tail's merge loop after it may be the longer: a tree over 128 slices'
    keys is)."""
    lines = [(int(address, 16), text) for address, text in SASS_LINE.findall(sass)]
    body_end = max((at for at, text in lines if EXIT.search(text)), default=math.inf)
    backward = [(target, at) for at, text in lines for target in _branch_target(text)
                if target <= at < body_end]
    arrival = next((at for at, text in lines if ARRIVAL.search(text)), math.inf)
    walks = [span for span in backward if span[1] < arrival]
    if not walks:
        return dict(dict.fromkeys(LOOP_FIGURES, 0), **{name: [0, 0] for name in PATH_CLOCKS})
    start, end = max(walks, key=lambda span: (_inside([at for at, _ in lines], span[0] - 1,
                                                      span[1] + 1), -span[0]))
    body = [at for at, _ in lines if start <= at <= end]
    skips = [(at, target) for at, text in lines if start <= at <= end
             for target in _branch_target(text) if at < target <= end]
    block = max(skips, key=lambda skip: _inside(body, *skip), default=(start, start))
    if not top_k:
        block = (start, start)
    apart = [skip for skip in skips if skip[1] <= block[0] or block[1] <= skip[0]]
    counted = max(apart, key=lambda skip: _inside(body, *skip), default=(start, start))
    if not counts:
        counted = (start, start)
    inner = [(target, at) for target, at in backward if block[0] < target <= at < block[1]]
    loop = max(inner, key=lambda span: _inside(body, span[0] - 1, span[1] + 1),
               default=(block[0], block[0] - 1))
    sort = [skip for skip in skips if block[0] <= skip[0] and skip[1] <= block[1]
            and not skip[0] < loop[0] <= loop[1] < skip[1]]
    sorted_block = max(sort, key=lambda skip: _inside(body, *skip), default=(start, start))
    candidate = _inside(body, loop[0] - 1, loop[1] + 1)
    sorting = _inside(body, *sorted_block)
    skipped, count = _inside(body, *block), _inside(body, *counted)
    widths = [int(found.group(1) or 32) // 8 for at, text in lines if start <= at <= end
              for found in [PIPELINED_COPY.search(text)] if found]
    after = [span for span in backward if span[0] > end]
    merge = max(after, default=None) if merged else None
    return dict(loop_instructions=len(body), guard_instructions=len(body) - skipped - count,
                count_instructions=count, enter_instructions=skipped - sorting - candidate,
                sort_instructions=sorting, candidate_instructions=candidate,
                pipelined_copies=len(widths), copy_bytes=min(widths, default=0),
                merge_instructions=_inside([at for at, _ in lines], merge[0] - 1, merge[1] + 1)
                if merge else 0,
                **_path_clocks([(at, text) for at, text in lines if start <= at <= end],
                               block, counted, loop, sorted_block))


def _path_clocks(body: list[tuple[int, str]], block: tuple[int, int], counted: tuple[int, int],
                 loop: tuple[int, int], sorted_block: tuple[int, int]) -> dict[str, list[int]]:
    """The clocks of each path of the tile loop's ``body`` (:data:`PATH_CLOCKS`, from the
    spans :func:`loop_figures` found: the top-K ``block`` and the ``counted`` one skipped
    between their ends, the candidate ``loop`` from its first to its last address, the
    ``sorted_block`` skipped), at each end of the assumed instruction latencies."""
    def between(span: tuple[int, int], at: int) -> bool:
        return span[0] < at < span[1]

    def within_loop(at: int) -> bool:
        return loop[0] <= at <= loop[1]

    paths = {
        "guard_clocks": lambda at: not between(block, at) and not between(counted, at),
        "count_clocks": lambda at: between(counted, at),
        "enter_clocks": lambda at: (between(block, at) and not within_loop(at)
                                    and not between(sorted_block, at)),
        "candidate_clocks": within_loop,
        "sort_clocks": lambda at: between(sorted_block, at),
    }
    return {name: [sass_path.critical_path([text for at, text in body if keep(at)], end)[1]
                   for end in sass_path.ENDS] for name, keep in paths.items()}


ARRIVAL = re.compile(r"\bATOMG\b")  # a split walk's count of its row's slices that ended
STORE = re.compile(r"\bSTG\b")
LOAD = re.compile(r"\bLDG\b")
BARRIER = re.compile(r"\bBAR\.SYNC\b")
GPU_FENCE = re.compile(r"\bMEMBAR\.\S*GPU\b")
ACQUIRE = re.compile(r"\bCCTL\.IVALL\b")  # L1 invalidated: what an acquire compiles to


def arrival_fenced(sass: str) -> bool:
    """Whether a split walk counts its slice in only after every thread's partial state is
    stored and released (a barrier, then a GPU-scope fence, between the last store before the
    count's atomic and that atomic, itself of GPU scope), acquires the count (an L1
    invalidation after the atomic, before any load) and reads the slices' states from L2
    (every global load after the atomic ``STRONG.GPU``): the order of split-K's "last
    program" pattern, which the interpreter cannot check (it runs one program at a time). A
    rule on the SASS ptxas gives today, not a proof: a correct kernel reading plainly after
    its count would fail it."""
    texts = [text for _, text in SASS_LINE.findall(sass)]
    at = next((i for i, text in enumerate(texts) if ARRIVAL.search(text)), None)
    if at is None or "STRONG.GPU" not in texts[at]:
        return False
    stored = max((i for i in range(at) if STORE.search(texts[i])), default=-1)
    between = texts[stored + 1:at]
    barrier = next((i for i, text in enumerate(between) if BARRIER.search(text)), None)
    fenced = barrier is not None and any(GPU_FENCE.search(text) for text in between[barrier:])
    after = texts[at + 1:]
    first_read = next((i for i, text in enumerate(after) if LOAD.search(text)), None)
    acquired = first_read is not None and any(ACQUIRE.search(text)
                                              for text in after[:first_read])
    return (fenced and acquired
            and all("STRONG.GPU" in text for text in after if LOAD.search(text)))


def tail_figures(sass: str) -> dict[str, Any]:
    """A split walk's tail, which its row's last slice runs after counting itself in (from the
    count's atomic to the last ``EXIT``, less the merge loop's body: that loop's later groups
    are :func:`loop_figures`' ``merge_instructions``): ``tail_reads``, the batches of global
    loads before that loop that a barrier holds apart (Triton's reductions consume what a
    batch read before their barriers, so each batch waits an L2 round trip of its own), and
    ``tail_instructions``, its SASS instructions (run once, by one program, after the walk:
    the scalars' reductions, the first group's keys merged, the row's results written); its
    critical path as one warp issues it (:func:`stagelab.measure.sass_path.critical_path`):
    ``tail_trips``, its L2 round trips (a load waiting on an earlier one with no barrier
    between counted too), and ``tail_clocks``, its clocks beside them at the fast and slow
    ends of :data:`stagelab.measure.sass_path.LATENCY_CLOCKS`; and the merge loop's body's
    (a later group's keys read and merged), ``merge_trips`` and ``merge_clocks``. All 0
    without the atomic."""
    lines = [(int(address, 16), text) for address, text in SASS_LINE.findall(sass)]
    at = next((address for address, text in lines if ARRIVAL.search(text)), None)
    if at is None:
        return dict(tail_reads=0, tail_instructions=0, tail_trips=0, tail_clocks=[0, 0],
                    merge_trips=0, merge_clocks=[0, 0])
    body_end = max((address for address, text in lines if EXIT.search(text)), default=math.inf)
    loops = [(target, address) for address, text in lines for target in _branch_target(text)
             if at < target <= address < body_end]
    loop = max(loops, default=(body_end, body_end))  # the last: loop_figures' merge loop
    tail = [text for address, text in lines
            if at < address < body_end and not loop[0] <= address <= loop[1]]
    merge = [text for address, text in lines if loop[0] <= address <= loop[1] < body_end]
    reads, fresh = 0, True
    for text in (text for address, text in lines if at < address < loop[0]):
        if BARRIER.search(text):
            fresh = True
        elif LOAD.search(text) and fresh:
            reads, fresh = reads + 1, False
    tail_paths = [sass_path.critical_path(tail, end) for end in sass_path.ENDS]
    merge_paths = [sass_path.critical_path(merge, end) for end in sass_path.ENDS]
    return dict(tail_reads=reads, tail_instructions=len(tail),
                tail_trips=tail_paths[-1][0], tail_clocks=[clocks for _, clocks in tail_paths],
                merge_trips=merge_paths[-1][0],
                merge_clocks=[clocks for _, clocks in merge_paths])


def _inside(addresses: list[int], after: int, before: int) -> int:
    """How many of ``addresses`` lie strictly between ``after`` and ``before``."""
    return sum(1 for at in addresses if after < at < before)


def _branch_target(text: str) -> list[int]:
    found = BRANCH.search(text)
    return [int(found.group(1), 16)] if found else []


KERNEL_SOURCE = Path(__file__).with_name("onepass_triton.py")
# AST fields left out of a kernel's digest: absent or always empty in the kernel's code, and
# written differently by each Python (3.12 added ``type_params``; 3.13 leaves empty ones out).
UNHASHED_FIELDS = frozenset({"type_params", "type_comment", "kind"})


@cache
def kernel_digest(path: Path = KERNEL_SOURCE) -> str:
    """What the kernels compile from: a digest of ``path``'s code, its docstrings and comments
    aside (a change of words recompiles nothing; a change of code makes every figure read from
    an earlier compile stale), and of the values of the :mod:`stagelab.core.launches`
    constants it reads (``CANDIDATE_LIMIT``, ``PIPELINE_STAGES``); the same on every Python.
    Each row carries the digest of the code it stands for: compiled from, or kept for where
    that code makes its variant the same TTIR (:func:`ttir_digest`). Not in it: the cubin
    readers here and in :mod:`~stagelab.measure.sass_path`, the compile options and the
    Triton (each row names its own)."""
    from stagelab.core import launches

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    read = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                   and isinstance(node.value, ast.Name) and node.value.id == "launches"})
    shape = json.dumps([_shape(tree), {name: repr(getattr(launches, name)) for name in read}])
    return hashlib.sha256(shape.encode()).hexdigest()[:16]


def _shape(node: object) -> object:
    """An AST as plain data, alike on every Python: each node's type and its fields with a
    value, less :data:`UNHASHED_FIELDS` (positions are not fields)."""
    if isinstance(node, ast.AST):
        return [type(node).__name__] + [
            [name, _shape(value)] for name in node._fields if name not in UNHASHED_FIELDS
            for value in [getattr(node, name, None)] if value is not None and value != []]
    if isinstance(node, list):
        return [_shape(item) for item in node]
    return repr(node)


def specialised(spec: dict[str, Any], fn: Any) -> tuple[dict, dict, dict]:
    """Triton's ``(signature, constexprs, attrs)`` for a spec's arguments to the kernel
    ``fn``, as its runtime specialises them at a launch."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    signature, constexprs, attrs = {}, dict(spec["constexprs"]), {}
    params = fn.params
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif params[index].is_constexpr and params[index].has_default:  # left at its default
            signature[name], constexprs[name] = "constexpr", params[index].default
        elif name in spec["pointers"]:
            signature[name] = "*" + spec["pointers"][name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:  # as the runtime does: not at all for an int the kernel marks do_not_specialize
            kind, mark = native_specialize_impl(BaseBackend, spec["scalars"][name], False,
                                                not params[index].do_not_specialize, True)
            signature[name] = kind
            if kind == "constexpr":
                constexprs[name] = spec["scalars"][name]
            elif mark == "D":
                attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def _source(spec: dict[str, Any]) -> Any:
    """Triton's ``ASTSource`` of a spec: its kernel as the runtime specialises it."""
    from triton.compiler import ASTSource

    from stagelab.measure import onepass_triton

    fn = getattr(onepass_triton, spec["kernel"])
    return ASTSource(fn, *specialised(spec, fn))


def _options(spec: dict[str, Any]) -> dict[str, Any]:
    """The compile options a spec's launch gives Triton: its warps and register cap."""
    return dict(num_warps=spec["num_warps"],
                **({"maxnreg": spec["max_registers"]} if spec.get("max_registers") else {}))


def ttir_digest(spec: dict[str, Any], arch: int) -> str:
    """A digest of the Triton IR (TTIR) this Triton makes of a spec for CUDA ``sm_<arch>``,
    printed without its source positions: all that the rest of a compile (TTGIR, LLVM, PTX,
    the cubin) reads besides the options, the target, the Triton build and the environment's
    knobs. So a row compiled from code whose digest is another's stands for today's code
    where this digest is the same (a change under a constexpr the variant does not set, or
    lines moved) on the same Triton, architecture and specialisation: the full check keeps it
    instead of compiling it again. Costs the front end alone (about 0.4 s of a core)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    source = _source(spec)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    options = backend.parse_options(dict(_options(spec), **source.parse_options()))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                            backend.get_module_map(), context)
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options, source.language)
    ttir = stages["ttir"](module, {})
    return hashlib.sha256(ttir.str_nodebug().encode()).hexdigest()[:16]


def _stamp(spec: dict[str, Any], arch: int) -> dict[str, Any]:
    """A spec's row before its figures: its architecture, Triton, kernel code and time."""
    import triton

    from stagelab.measure import onepass_triton

    return dict(spec, arch=arch, triton=triton.__version__,
                kernel_digest=kernel_digest(Path(onepass_triton.__file__)),
                compiled_at=datetime.now(UTC).isoformat(timespec="minutes"))


def compile_one(spec: dict[str, Any], arch: int) -> dict[str, Any]:
    """One spec compiled for CUDA ``sm_<arch>``: its figures and :func:`ttir_digest`, or
    ``compiles`` False and the error's first line."""
    import triton
    from triton.backends.compiler import GPUTarget

    found = _stamp(spec, arch)
    try:
        digest = ttir_digest(spec, arch)
        kernel = triton.compile(_source(spec), target=GPUTarget("cuda", arch, 32),
                                options=_options(spec))
    except Exception as exc:  # any compile error is a finding of the check
        message = (str(exc).strip().splitlines() or [""])[-1]
        return dict(found, compiles=False, error=f"{type(exc).__name__}: {message}"[:300])
    flags = spec["constexprs"]
    return dict(found, compiles=True, error="", ttir_digest=digest,
                **cubin_figures(kernel.asm["cubin"], arch, spec["num_warps"],
                                kernel.metadata.shared, bool(flags.get("TOPK")),
                                bool(flags.get("HAS_TARGET")),
                                bool(flags.get("TOPK") and flags.get("SPLIT")),
                                bool(flags.get("SPLIT"))))


def digest_one(spec: dict[str, Any], arch: int) -> dict[str, Any]:
    """A spec's row holding its :func:`ttir_digest` alone (``""`` where the front end
    fails: such a spec is compiled, and its error recorded)."""
    try:
        digest = ttir_digest(spec, arch)
    except Exception:  # the compile that follows records the error
        digest = ""
    return dict(_stamp(spec, arch), ttir_digest=digest)


def cubin_figures(cubin: bytes, arch: int, warps: int, dynamic_shared: int = 0,
                  top_k: bool = True, counts: bool = True, merged: bool = False,
                  split: bool = False) -> dict[str, Any]:
    """Registers, spilled (local) bytes, shared memory (the cubin's static and the launch's
    ``dynamic_shared``: Triton's buffers, its pipelined loads' among them), CTAs per SM, the
    loop's instructions of one cubin (:func:`loop_figures`) and, for a ``split`` walk,
    ``arrival_fenced`` (:func:`arrival_fenced`) and its tail's figures
    (:func:`tail_figures`), read with the ``cuobjdump`` Triton bundles."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = _cuobjdump("--dump-resource-usage", path)
        sass = _cuobjdump("-sass", path)
    found = RESOURCES.search(usage)
    if found is None:
        raise RuntimeError(f"cuobjdump gave no resource usage: {usage[:200]!r}")
    registers, stack, static, local = (int(v) for v in found.groups())
    shared = static + dynamic_shared
    return dict(registers=registers, spill_bytes=local + stack, shared_bytes=shared,
                ctas_per_sm=ctas_per_sm(arch, registers, warps, shared),
                **loop_figures(sass, top_k, counts, merged),
                **(dict(arrival_fenced=arrival_fenced(sass), **tail_figures(sass))
                   if split else {}))


def _cuobjdump(flag: str, path: Path) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return subprocess.run([str(tool), flag, str(path)], check=True, capture_output=True,
                          text=True).stdout


def _compile_job(job: tuple[dict[str, Any], int]) -> dict[str, Any]:
    return compile_one(*job)


def _digest_job(job: tuple[dict[str, Any], int]) -> dict[str, Any]:
    return digest_one(*job)


def compile_all(specs: list[dict[str, Any]], archs: tuple[int, ...], workers: int,
                out: Path, digests_only: bool = False) -> None:
    """Every spec for every architecture, ``workers`` processes at once, in the specs' order,
    each row appended to ``out`` (JSON lines) as it comes, so that a run cut short keeps what
    it compiled; with ``digests_only``, each spec's :func:`digest_one` instead."""
    jobs = [(spec, arch) for arch in archs for spec in specs]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool, out.open("a") as sink:
        for row in pool.map(_digest_job if digests_only else _compile_job, jobs):
            sink.write(json.dumps(row) + "\n")
            sink.flush()


def main(argv: list[str]) -> int:
    """``[--ttir] SPECS.json OUT.jsonl [ARCH ...]``: compile (with ``--ttir``, digest each
    spec's TTIR alone), append the rows, exit 0 (a failed compile is a row with ``compiles``
    False, for the caller to judge)."""
    digests_only = argv[:1] == ["--ttir"]
    specs_path, out_path, *archs = argv[digests_only:]
    specs = json.loads(Path(specs_path).read_text())
    workers = int(os.environ.get("STAGELAB_COMPILE_WORKERS", "2"))
    compile_all(specs, tuple(int(a) for a in archs) or (90,), workers, Path(out_path),
                digests_only)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
