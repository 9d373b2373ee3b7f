"""Compile the one-pass kernels ahead of time for a GPU that is not here, and read their cubins.

``triton.compile`` with an explicit ``GPUTarget`` needs no GPU: Triton's wheel bundles ptxas,
``cuobjdump`` and ``nvdisasm``. Each launch the measuring code makes
(:func:`stagelab.core.launches.triton_launches` and the fold's) is compiled as Triton's runtime
would specialise it (an int argument equal to 1 becomes a constant, one divisible by 16 is marked
so, every pointer 16-byte aligned, as torch allocates), and its cubin is read for: registers per
thread, spilled bytes (ptxas's local memory; 0 when nothing spills), shared memory, CTAs per SM
(from the architecture's limits), and the tile loop's SASS instructions (all of it, and the
guard's path: the loop without the largest block it branches over, the top-K's merge).

Imports the standard library and Triton only, so that it runs in a small environment holding
nothing but another Triton (the lease image's): ``python -m stagelab.measure.kernel_compile
SPECS.json OUT.jsonl`` with ``lib`` on ``PYTHONPATH``; the specs are made by
:func:`stagelab.measure.kernel_variants.launched_variants`.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

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


def ctas_per_sm(arch: int, registers: int, warps: int, shared: int) -> int:
    """CTAs of ``warps`` warps, ``registers`` per thread and ``shared`` bytes that one SM of
    compute capability ``arch`` (80, 90) holds at once: the least of its four limits."""
    limit = SM_LIMITS[arch]
    per_warp = math.ceil(max(registers, 1) * 32 / REGISTER_UNIT) * REGISTER_UNIT
    by_registers = limit["registers"] // (per_warp * warps)
    by_threads = limit["threads"] // (32 * warps)
    by_shared = limit["shared"] // (shared + limit["reserved"])
    return min(by_registers, by_threads, by_shared, limit["ctas"])


def loop_instructions(sass: str) -> tuple[int, int]:
    """``(loop, guard)``: the SASS instructions of the outermost loop (the span from the
    earliest target of a backward branch to that branch) and of its path without the largest
    block a forward branch inside it skips (0, 0 where there is no loop)."""
    lines = [(int(address, 16), text) for address, text in SASS_LINE.findall(sass)]
    backward = [(target, at) for at, text in lines for target in _branch_target(text)
                if target <= at]
    if not backward:
        return 0, 0
    start, end = min(backward)
    body = [(at, text) for at, text in lines if start <= at <= end]
    skipped = [sum(1 for a, _ in body if at < a < target) for at, text in body
               for target in _branch_target(text) if at < target <= end]
    return len(body), len(body) - max(skipped, default=0)


def _branch_target(text: str) -> list[int]:
    found = BRANCH.search(text)
    return [int(found.group(1), 16)] if found else []


def specialised(spec: dict[str, Any], arg_names: list[str]) -> tuple[dict, dict, dict]:
    """Triton's ``(signature, constexprs, attrs)`` for a spec's arguments, as its runtime
    specialises them at a launch."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    signature, constexprs, attrs = {}, dict(spec["constexprs"]), {}
    for index, name in enumerate(arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in spec["pointers"]:
            signature[name] = "*" + spec["pointers"][name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            kind, mark = native_specialize_impl(BaseBackend, spec["scalars"][name], False,
                                                True, True)
            signature[name] = kind
            if kind == "constexpr":
                constexprs[name] = spec["scalars"][name]
            elif mark == "D":
                attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def compile_one(spec: dict[str, Any], arch: int) -> dict[str, Any]:
    """One spec compiled for CUDA ``sm_<arch>``: its figures, or ``compiles`` False and the
    error's first line."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from stagelab.measure import onepass_triton

    fn = getattr(onepass_triton, spec["kernel"])
    found: dict[str, Any] = dict(spec, arch=arch, triton=triton.__version__)
    try:
        signature, constexprs, attrs = specialised(spec, fn.arg_names)
        options = dict(num_warps=spec["num_warps"])
        if spec.get("max_registers"):
            options["maxnreg"] = spec["max_registers"]
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs),
                                target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as exc:  # any compile error is a finding of the check
        message = (str(exc).strip().splitlines() or [""])[-1]
        return dict(found, compiles=False, error=f"{type(exc).__name__}: {message}"[:300])
    return dict(found, compiles=True, error="", **cubin_figures(kernel.asm["cubin"], arch,
                                                                spec["num_warps"]))


def cubin_figures(cubin: bytes, arch: int, warps: int) -> dict[str, int]:
    """Registers, spilled (local) bytes, shared memory, CTAs per SM and the loop's
    instructions of one cubin, read with the ``cuobjdump`` Triton bundles."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = _cuobjdump("--dump-resource-usage", path)
        sass = _cuobjdump("-sass", path)
    found = RESOURCES.search(usage)
    if found is None:
        raise RuntimeError(f"cuobjdump gave no resource usage: {usage[:200]!r}")
    registers, stack, shared, local = (int(v) for v in found.groups())
    loop, guard = loop_instructions(sass)
    return dict(registers=registers, spill_bytes=local + stack, shared_bytes=shared,
                ctas_per_sm=ctas_per_sm(arch, registers, warps, shared),
                loop_instructions=loop, guard_instructions=guard)


def _cuobjdump(flag: str, path: Path) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return subprocess.run([str(tool), flag, str(path)], check=True, capture_output=True,
                          text=True).stdout


def _compile_job(job: tuple[dict[str, Any], int]) -> dict[str, Any]:
    return compile_one(*job)


def compile_all(specs: list[dict[str, Any]], archs: tuple[int, ...], workers: int,
                out: Path) -> None:
    """Every spec for every architecture, ``workers`` processes at once, in the specs' order,
    each row appended to ``out`` (JSON lines) as it comes, so that a run cut short keeps what
    it compiled."""
    jobs = [(spec, arch) for arch in archs for spec in specs]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool, out.open("a") as sink:
        for row in pool.map(_compile_job, jobs):
            sink.write(json.dumps(row) + "\n")
            sink.flush()


def main(argv: list[str]) -> int:
    """``SPECS.json OUT.jsonl [ARCH ...]``: compile, append the figures, exit 0 (a failed
    compile is a row with ``compiles`` False, for the caller to judge)."""
    specs_path, out_path, *archs = argv
    specs = json.loads(Path(specs_path).read_text())
    workers = int(os.environ.get("STAGELAB_COMPILE_WORKERS", "2"))
    compile_all(specs, tuple(int(a) for a in archs) or (90,), workers, Path(out_path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
