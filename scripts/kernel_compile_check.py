"""Compile every launched one-pass kernel variant for the lease's GPU and an A100, no GPU here.

Each distinct specialisation the measuring code launches at the lease's shapes
(:func:`stagelab.measure.kernel_variants.launched_variants`) is compiled for CUDA sm_90 (an
H200's launches) and sm_80 (an A100's: :func:`launched_for`) by the Triton this environment
installs and by the lease image's Triton (3.6, in its own small environment under
``.cache/``, made here with uv on first use), each in its own process
(:mod:`stagelab.measure.kernel_compile`). It fails (exit 1) on any compile error or spill,
and ``--write`` writes the per-variant table (registers, spills,
shared memory, CTAs per SM, the loop's SASS instructions) with the date and the Triton
versions to ``docs/kernels.md``, and the figures to ``data/kernel_compile.json`` (the
roofline model's input, :mod:`stagelab.analyse.roofline`).

    python scripts/kernel_compile_check.py [--write] [--arch 90] [--arch 80] [--workers 2]

The slow tests (``tests/test_kernel_compile.py``) compile the representatives alone
(:func:`stagelab.measure.kernel_variants.representative_variants`) on Triton 3.6, and each
kernel's widest variants for both architectures on the installed Triton; docs/kernels.md says
how long the full check takes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEASE_TRITON = "3.6"  # the lease image's Triton (torch 2.11)
DOC = ROOT / "docs" / "kernels.md"
DATA = ROOT / "data" / "kernel_compile.json"
# How to run the check, written above the table.
RUNNING = (
    "The full check: `python scripts/kernel_compile_check.py --write` (`--arch 90` for sm_90 "
    "alone; `--rows FILE` keeps each row as it comes, so a stopped run resumes where it "
    "stopped, and compiles again a row of other kernel code: each row carries its code's "
    "`kernel_digest`) compiles on each Triton every variant launched on each architecture's GPU "
    "({launched}), but keeps a committed row where today's kernel code makes its variant the "
    "same TTIR (`ttir_digest`, printed without source positions: the rest of a compile reads "
    "the TTIR, the options, the target and the Triton build: none is kept where a Triton, "
    "LLVM or ptxas knob is set, and `--compile-all` keeps none, as after a change to the "
    "cubin readers), its `compiled_at` its compile's: some 5.5 s "
    "of two cores a compile (the 438 sm_90 compiles took 40 minutes under cpu-lock on "
    "2026-12-06; an A100's 408 sm_80 compiles some 40 minutes, over two runs, "
    "on 2026-12-07), so about {minutes} minutes in all where every variant's TTIR changed, and "
    "some 0.4 s of a core a variant to digest its TTIR. It "
    "fails on any compile error or spill, on a walk whose tile loop is not pipelined or "
    "copies less at a time than its tile allows, and on a split walk that counts its slices "
    "in unfenced or reads their states back in loads that a barrier holds apart. "
    "`make test` runs two slow tests instead: "
    "`tests/test_kernel_compile.py::test_the_representative_variants_compile_for_sm_90_on_"
    "the_lease_triton_without_spills`, one variant of each kernel, logits dtype, "
    "split or not, k-class, masked tile or not and one warp or not, on Triton 3.6 (its "
    "environment "
    "made under `.cache/` on first use), and `test_the_widest_variants_compile_for_sm_90_"
    "and_sm_80_on_the_installed_triton`, each kernel's widest top-K, split or not, on the "
    "installed Triton.")
ARCHS = (90, 80)  # sm_90 (the lease's H200) and sm_80 (an A100)
SECONDS_A_COMPILE = 5.5  # of two cores, from the full check's timing (RUNNING)
FIGURES = ("registers", "spill_bytes", "shared_bytes", "ctas_per_sm", "loop_instructions",
           "guard_instructions", "count_instructions", "enter_instructions",
           "sort_instructions", "candidate_instructions", "pipelined_copies", "copy_bytes",
           "merge_instructions", "tail_reads", "tail_instructions", "tail_trips", "tail_clocks",
           "merge_trips", "merge_clocks", "guard_clocks", "count_clocks", "enter_clocks",
           "candidate_clocks", "sort_clocks")


def uv() -> str:
    """The uv that made this environment (setup_venv installs it beside Python), else PATH's."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if not found:
        raise RuntimeError("uv is needed to make the lease Triton's environment (make setup)")
    return found


def triton_python(version: str, cache: Path = ROOT / ".cache") -> Path:
    """The Python of a small environment holding Triton ``version`` alone (made on first use)."""
    folder = cache / f"triton-{version}"
    python = folder / "bin" / "python"
    if not (folder / ".complete").exists():
        for command in ([uv(), "venv", "--quiet", "--allow-existing", "--python",
                         sys.executable, str(folder)],
                        [uv(), "pip", "install", "--quiet", "--python", str(python),
                         f"triton=={version}.*"]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"could not make Triton {version}'s environment in {folder}:"
                                   f" {' '.join(command)} exited {done.returncode}: "
                                   f"{done.stderr.strip()[-2000:]}")
        (folder / ".complete").touch()
    return python


def compile_with(python: Path, specs: list[dict], archs: tuple[int, ...], workers: int,
                 cache: Path = ROOT / ".cache", out: Path | None = None,
                 earlier: list[dict] | None = None) -> list[dict]:
    """The figures of every spec for every architecture, compiled by ``python``'s Triton
    (appended to ``out`` as JSON lines as they come, where given; a row already there is
    kept only where it was compiled from today's kernel code: ``kernel_digest``). A row of
    ``earlier`` (None: the committed figures, :func:`committed_rows`) is kept in place of a
    compile where today's code makes the same TTIR of its variant (:func:`_kept`)."""
    from stagelab.measure.kernel_compile import kernel_digest
    from stagelab.measure.kernel_variants import specialisation

    with tempfile.TemporaryDirectory() as folder:
        specs_path = Path(folder) / "specs.json"
        out_path = out or Path(folder) / "out.jsonl"
        version = subprocess.run([str(python), "-c", "import triton; print(triton.__version__)"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        done = {(row["arch"], specialisation(row)): row for row in _lines(out_path)
                if row["triton"] == version and row["arch"] in archs
                and row.get("kernel_digest") == kernel_digest()}
        wanted = {(arch, specialisation(spec)) for spec in specs for arch in archs}
        start = len(_lines(out_path))
        env = dict(os.environ, PYTHONPATH=str(ROOT / "lib"), STAGELAB_COMPILE_WORKERS=str(workers),
                   TRITON_CACHE_DIR=str(cache / "triton-compile" / version),
                   TRITON_DEFAULT_FP_FUSION="1")
        env.pop("TRITON_INTERPRET", None)
        before = committed_rows() if earlier is None else earlier
        for arch in archs:  # only what a stopped run left for each architecture
            missing = [spec for spec in specs if (arch, specialisation(spec)) not in done]
            missing = _kept(python, missing, arch, version, before, out_path, env, folder)
            if missing:
                specs_path.write_text(json.dumps(missing))
                subprocess.run([str(python), "-m", "stagelab.measure.kernel_compile",
                                str(specs_path), str(out_path), str(arch)], check=True, env=env)
        kept = [row for key, row in done.items() if key in wanted]
        return in_spec_order(kept + _lines(out_path)[start:], {arch: specs for arch in archs})


def _kept(python: Path, missing: list[dict], arch: int, version: str, earlier: list[dict],
          out: Path, env: dict[str, str], folder: str) -> list[dict]:
    """The specs of ``missing`` still to compile for ``sm_<arch>`` on Triton ``version``.
    Each that an earlier row of that Triton and architecture compiled without fault, and
    whose TTIR today's code makes alike (``kernel_compile.ttir_digest``, printed without
    source positions; or, for a row of today's code digested before rows carried it, any),
    is kept: that row, of today's ``kernel_digest`` and with its TTIR's digest, appended to
    ``out``. Its figures are what compiling again would give: the rest of a compile reads the
    TTIR, the options (the specialisation's warps and register cap), the target and the
    Triton build (its version, ptxas among its files), and the environment's knobs, so no row
    is kept where one is set (:func:`compile_knobs`). Its ``compiled_at`` stays its
    compile's. The cubin readers (``kernel_compile.cubin_figures``, ``sass_path``) are not
    keyed: after a change to them, run with no rows to keep (``--compile-all``)."""
    from stagelab.measure.kernel_compile import kernel_digest
    from stagelab.measure.kernel_variants import specialisation

    prior = {specialisation(row): row for row in earlier
             if (row["triton"], row["arch"]) == (version, arch) and row["compiles"]
             and not _problem(row)} if not compile_knobs(env) else {}
    candidates = [spec for spec in missing if specialisation(spec) in prior]
    if not candidates:
        return missing
    specs_path, digests_path = Path(folder) / "digest-specs.json", Path(folder) / "digests.jsonl"
    specs_path.write_text(json.dumps(candidates))
    digests_path.unlink(missing_ok=True)
    subprocess.run([str(python), "-m", "stagelab.measure.kernel_compile", "--ttir",
                    str(specs_path), str(digests_path), str(arch)], check=True, env=env)
    today, same = kernel_digest(), set()
    with out.open("a") as sink:
        for row in _lines(digests_path):
            key, digest = specialisation(row), row["ttir_digest"]
            old = prior[key]
            if digest and old.get("ttir_digest", digest if old["kernel_digest"] == today
                                  else None) == digest:
                sink.write(json.dumps(dict(old, kernel_digest=today, ttir_digest=digest)) + "\n")
                same.add(key)
    return [spec for spec in missing if specialisation(spec) not in same]


# Environment variables the check sets itself, or that leave a compile's output alone.
OWN_KNOBS = frozenset({"TRITON_CACHE_DIR", "TRITON_DEFAULT_FP_FUSION", "TRITON_INTERPRET"})


def compile_knobs(env: dict[str, str]) -> list[str]:
    """The variables of ``env`` that may change what Triton, LLVM or ptxas make of a TTIR
    (``TRITON_*``, ``PTXAS*``, ``DISABLE_*``, ``MLIR_*``, ``LLVM_*``, less
    :data:`OWN_KNOBS`): with any set, no row is kept, for none records them."""
    return sorted(name for name in env if name.startswith(
        ("TRITON_", "PTXAS", "DISABLE_", "MLIR_", "LLVM_")) and name not in OWN_KNOBS)


def committed_rows() -> list[dict]:
    """The committed figures' rows (none where there are none), each with its
    ``compiled_at``: a row written before rows carried it takes its table's time, by which it
    had been compiled."""
    if not DATA.exists():
        return []
    data = json.loads(DATA.read_text())
    return [dict(row, compiled_at=row.get("compiled_at") or data["written"])
            for row in data["variants"]]


def in_spec_order(rows: list[dict], specs: dict[int, list[dict]]) -> list[dict]:
    """The last of ``rows`` for each variant ``specs`` lists for its architecture, in that
    order (architecture by architecture), each labelled with its spec's first shape and count
    of shapes where the spec has them: a row kept from a run whose plan differed (another
    GPU's slices) carries that plan's."""
    from stagelab.measure.kernel_variants import specialisation

    latest = {(row["arch"], specialisation(row)): row for row in rows}
    return [dict(latest[key], **{name: spec[name] for name in ("where", "shapes")
                                 if name in spec})
            for arch, listed in specs.items() for spec in listed
            for key in [(arch, specialisation(spec))] if key in latest]


def launched_for(arch: int) -> list[dict]:
    """The variants launched on the GPU ``arch`` is compiled for (its own SMs' plans:
    ``kernel_variants.ARCH_SMS``)."""
    sys.path.insert(0, str(ROOT / "lib"))
    from stagelab.measure import kernel_variants

    return kernel_variants.launched_variants(kernel_variants.ARCH_SMS[arch])


def current_rows(path: Path) -> list[dict]:
    """The rows of ``path`` that compiled today's kernel code (``kernel_digest``) for a
    variant launched today on its architecture's GPU (the last of each, labelled as launched
    today: :func:`in_spec_order`), the lease's Triton first, then sm_90 before sm_80."""
    sys.path.insert(0, str(ROOT / "lib"))
    from stagelab.measure.kernel_compile import kernel_digest

    rows = [row for row in _lines(path) if row.get("kernel_digest") == kernel_digest()]
    tritons = sorted({row["triton"] for row in rows},
                     key=lambda triton: not triton.startswith(LEASE_TRITON + "."))
    archs = [arch for arch in ARCHS if any(row["arch"] == arch for row in rows)]
    return [row for triton in tritons
            for row in in_spec_order([r for r in rows if r["triton"] == triton],
                                     {arch: launched_for(arch) for arch in archs})]


def _lines(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (none where it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


WALKS = ("onepass_kernel", "fold_kernel")  # the kernels whose tile loop must be pipelined
ELEMENT_BYTES = dict(fp32=4, bf16=2, fp16=2)
COPY_BYTES = 4  # cp.async's smallest copy a thread makes
WIDEST_COPY = 16  # and its widest


def thread_bytes(row: dict) -> int:
    """The bytes of a walk's tile that fall to each of its threads."""
    tile_bytes = row["constexprs"]["BLOCK"] * ELEMENT_BYTES[row["pointers"]["x_ptr"]]
    return tile_bytes // (32 * row["num_warps"])


def pipelinable(row: dict) -> bool:
    """Whether a walk's tile gives each thread at least one copy's bytes (a fold of a 128-wide
    tile of 16-bit logits on 4 warps gives 2: nothing for Triton's pipeline to copy)."""
    return thread_bytes(row) >= COPY_BYTES


def failures(found: list[dict]) -> list[str]:
    """One line per variant that did not compile, spilled, walks its tiles without the
    pipeline's copies (plain loads: nothing in flight while a tile is worked) or with copies
    narrower than its tile allows, or, split, counts its slices in unfenced or reads their
    states back in batches of loads that a barrier holds apart."""
    return [f"Triton {r['triton']} sm_{r['arch']} {r['kernel']} {r['where']}: " + problem
            for r in found for problem in [_problem(r)] if problem]


def _problem(row: dict) -> str:
    """What is wrong with one compile check row, or ``""``."""
    if not row["compiles"]:
        return row["error"]
    if row["spill_bytes"]:
        return f"{row['spill_bytes']} bytes spilled"
    if row.get("constexprs", {}).get("SPLIT") and not row.get("arrival_fenced"):
        return ("its slices count in unfenced, or its row's last slice reads their states "
                "past L2 (kernel_compile.arrival_fenced)")
    if row.get("constexprs", {}).get("SPLIT") and row.get("tail_reads", 1) > 1:
        return (f"its row's last slice reads the slices' states in {row['tail_reads']} "
                "batches of loads a barrier holds apart, where one would do "
                "(kernel_compile.tail_figures)")
    if row["kernel"] not in WALKS or not row["loop_instructions"] or not pipelinable(row):
        return ""
    if not row["pipelined_copies"]:
        return "its tile loop is not pipelined (no LDGSTS)"
    widest = min(WIDEST_COPY, thread_bytes(row))
    if row.get("copy_bytes", widest) < widest:
        return (f"its tile loop copies {row['copy_bytes']} bytes at a time where its tile "
                f"gives each thread {thread_bytes(row)} (copies of {widest} possible)")
    return ""


def unfinished(found: list[dict]) -> list[str]:
    """Why ``found`` cannot be the table: no row (of today's kernel code, from rows), or a
    (Triton, architecture) that compiled only some of the variants its GPU launches."""
    if not found:
        return ["no rows compiled from today's kernel code (kernel_digest): compile them"]
    from stagelab.measure.kernel_variants import specialisation

    short = []
    for triton, arch in dict.fromkeys((r["triton"], r["arch"]) for r in found):
        have = {specialisation(r) for r in found if (r["triton"], r["arch"]) == (triton, arch)}
        missing = [spec for spec in launched_for(arch) if specialisation(spec) not in have]
        if missing:
            short.append(f"Triton {triton} sm_{arch}: {len(missing)} launched variants not "
                         f"compiled, e.g. {missing[0]['kernel']} {missing[0]['where']}")
    return short


def variant_label(row: dict) -> str:
    """A variant's constexprs and warps in a few words."""
    flags = row["constexprs"]
    words = [f"BLOCK {flags['BLOCK']}" if "BLOCK" in flags else "",
             "rows unaligned" if flags.get("LEAD") else "",
             f"K_PAD {flags['K_PAD']}" if flags.get("TOPK") else "no top-K",
             "split" if flags.get("SPLIT") else "", f"{row['num_warps']} warps",
             f"at most {row['max_registers']} registers" if row.get("max_registers") else ""]
    return ", ".join(word for word in words if word)


def compiled_counts(found: list[dict], launched: dict[int, int]) -> str:
    """How many of the variants launched on each architecture's GPU (``launched``, by
    architecture) each (Triton, architecture) compiled, in words."""
    pairs = sorted({(r["triton"], r["arch"]) for r in found}, key=lambda p: (p[0], -p[1]))
    return ", ".join(f"Triton {triton} sm_{arch}: "
                     f"{sum((r['triton'], r['arch']) == (triton, arch) for r in found)} of "
                     f"{launched[arch]}" for triton, arch in pairs)


def cell(figure: object) -> str:
    """A figure as the table shows it: a (fast, slow) pair as ``fast-slow``."""
    return "-".join(str(end) for end in figure) if isinstance(figure, list) else str(figure)


MODELLED = ("H200", "A100 SXM")  # the GPUs the table models (roofline.GPUS), an architecture each
GOAL_GPU = "H200"  # the GPU issue 44's goal is set on


def model_table(found: list[dict]) -> list[str]:
    """The roofline model (``stagelab.analyse.roofline``) at the goal's shapes on each GPU of
    :data:`MODELLED` from ``found``'s lease-Triton rows of its architecture, with its inputs:
    markdown lines (none for a GPU whose rows lack a variant the model reads)."""
    return [line for gpu_name in MODELLED for line in _model_section(found, gpu_name)]


def _model_section(found: list[dict], gpu_name: str) -> list[str]:
    """:func:`model_table`'s lines for one GPU; for :data:`GOAL_GPU`, each cell's goal and
    the tile instructions that would meet it (:func:`stagelab.analyse.roofline.goal_instructions`),
    and how many goal cells the model meets."""
    from stagelab.analyse import roofline

    arch = roofline.GPUS[gpu_name].arch
    lease = tuple(r for r in found if r["triton"].startswith(LEASE_TRITON + ".")
                  and r["arch"] == arch)
    try:
        rows = roofline.grid(gpu_name, variants=lease)
    except LookupError:
        return []
    goals = gpu_name == GOAL_GPU
    lines = ["", f"## The roofline model from these cubins on an {gpu_name} (a model, never a "
             "measurement)", "",
             f"`stagelab.analyse.roofline` on an {gpu_name} (V = 152,064), from the Triton "
             f"{LEASE_TRITON} sm_{arch} rows above; latency {min(roofline.LATENCY_NS):g}-"
             f"{max(roofline.LATENCY_NS):g} ns assumed (and for a split row's last slice, "
             "which fences, counts itself in, reads the slices' states back and merges them "
             "after the walk, its `tail`: its fence and count and its critical path's L2 "
             "round trips (`trips` above, and a later group of slices' keys its `merge trips`) "
             f"{min(roofline.L2_LATENCY_NS):g}-{max(roofline.L2_LATENCY_NS):g} ns each, and "
             "its path's clocks (`tail clocks` above, and `merge clocks` a later group) at "
             "the boost clock, the fast ends paired); candidates for independent logits; "
             f"the target at rank {roofline.TARGET_RANK} (a tile counts toward it where it "
             "holds one of the values at or above it: `counted`; the last column lets every "
             "tile count, the rank not assumed); each program's slice (the longest) at "
             "the SM with the most programs, in waves of those it holds at once: its first "
             "load's latency, then each tile's work, the longer of its warps' share of the "
             "SM's issue (4 a clock) and its critical path as one warp issues it (`tile "
             "clocks`, slow end; a scheduler holding one warp hides none of it), unless its "
             "loads lag (a latency and a tile's work each round of the tiles loaded ahead); "
             "100 % is the datasheet's peak, which no kernel reaches."
             + (_goal_words(rows) if goals else
             f" Its latencies, memory's and instructions', are the {GOAL_GPU}'s assumptions, "
             "not its own (an A100's far L2 hits take longer): a first screen."),
             "", "| n | k | dtype | programs | warps | resident/SM | tiles/slice "
             "| tile instructions | tile clocks (slow) "
             "| counted | entered | sorted | passes/tile | instructions/logit | bound at 800 ns "
             "| walk ns at 800 ns | tail trips, clocks (slow), instructions "
             "| tail ns at 800 ns "
             "| model % (800-450 ns) | model % at 800 ns, every tile counting |"
             + (" goal % | tile instructions at the goal |" if goals else ""),
             "|---" * (22 if goals else 20) + "|"]
    for r in rows:
        lines.append(f"| {r['rows']} | {r['k']} | {r['dtype']} | {r['programs']} | "
                     f"{r['warps']} | {r['resident_per_sm']} | {r['tiles_per_slice']} | "
                     f"{r['tile_instructions']} | {r['tile_clocks']} | "
                     f"{r['counted_share']} | {r['entered_share']} | "
                     f"{r['sorted_share']} | "
                     f"{r['candidates_per_tile']} | {r['instructions_per_logit']} | "
                     f"{r['bound']} | {r['walk_ns']:.0f} | "
                     f"{r['tail_trips']}, {r['tail_clocks']}, {r['tail_instructions']} | "
                     f"{r['tail_ns']:.0f} | "
                     f"{100 * r['model_low']:.0f}-{100 * r['model_high']:.0f} | "
                     f"{100 * r['model_low_counting_all']:.0f} |"
                     + (_goal_cells(r, lease) if goals else ""))
    return lines


def _goal_words(rows: list[dict]) -> str:
    """The goal, and how many of its cells the model meets at the slow ends."""
    from stagelab.analyse import roofline

    cells = [r for r in rows if roofline.goal_share(r["rows"]) is not None]
    met = sum(bool(roofline.meets_goal(r)) for r in cells)
    every = sum(bool(roofline.meets_goal(dict(r, model_low=r["model_low_counting_all"])))
                for r in cells)
    return (f" Goal (issue 44): >= {100 * roofline.GOAL:.0f} % at n >= 64, k <= 20; >= "
            f"{100 * roofline.GOAL_AT_16:.0f} % at n = 16: the model meets it at {met} of "
            f"{len(cells)} cells at the slow ends with the target at rank "
            f"{roofline.TARGET_RANK}, at {every} with every tile counting. `tile instructions "
            "at the goal`: the most a tile may cost each warp, on average (its critical path "
            "scaled with them), for the model to meet it at the slow ends, "
            "the rest (CTAs, plan, tail) as compiled (`stagelab.analyse.roofline."
            "goal_instructions`); `none` where no walk meets it: the tail and the memory "
            "latency alone miss it.")


def _goal_cells(r: dict, lease: tuple[dict, ...]) -> str:
    """A model row's goal and the tile instructions that would meet it."""
    from stagelab.analyse import roofline

    goal = roofline.goal_share(r["rows"])
    if goal is None:
        return " | |"
    budget = roofline.goal_instructions(r["rows"], r["vocab"], r["k"], r["dtype"], GOAL_GPU,
                                        lease)
    return f" {100 * goal:.0f} | {'none' if budget is None else budget} |"


def compiled_span(found: list[dict], when: datetime) -> str:
    """By when ``found``'s rows were compiled, in words: the latest ``compiled_at`` (``when``
    for a row without; a row kept from an earlier run, :func:`_kept`, keeps its compile's)."""
    return f"none after {max(_compiled_at(r, when) for r in found):%Y-%m-%d %H:%M} UTC"


def _compiled_at(row: dict, when: datetime) -> datetime:
    return datetime.fromisoformat(row["compiled_at"]) if row.get("compiled_at") else when


def table(found: list[dict], when: datetime) -> str:
    """The per-variant markdown table, with its date and the Triton versions."""
    versions = sorted({r["triton"] for r in found})
    launched = {arch: len(launched_for(arch)) for arch in sorted({r["arch"] for r in found},
                                                                  reverse=True)}
    counts = compiled_counts(found, launched)
    gpus = {90: "an H200", 80: "an A100"}
    lines = ["<!-- written by scripts/kernel_compile_check.py --write; never by hand -->",
             "# The one-pass kernels compiled for "
             + " and ".join(f"{gpus[arch]} (sm_{arch})" for arch in launched),
             "",
             f"Written {when:%Y-%m-%d %H:%M} UTC from cubins compiled ahead of time (no GPU) "
             f"by Triton {' and '.join(versions)}, {compiled_span(found, when)}: "
             f"{len(found)} compilations ({counts} launched "
             f"variants), {len(failures(found))} failed or spilled. Figures read from each cubin with "
             "the cuobjdump Triton bundles; CTAs per SM from the architecture's limits; "
             "shared: the cubin's static and Triton's dynamic (the pipelined loads' buffers); "
             "loop: the tile loop's SASS instructions, guard: its path without the target's "
             "counts and the top-K block, count: the counts' block (skipped on a tile whose "
             "max is below the target), enter: the top-K block's count of candidates and "
             "set-up, sort: its "
             "sort-and-merge path, candidate: its loop's instructions a candidate, copies: "
             "the tile loop's pipelined copies into shared memory (LDGSTS; a walk without "
             "them fails the check), copy B: the narrowest of them (a walk copying less than "
             "min(16, its tile's bytes a thread) at a time fails), merge: a split top-K "
             "walk's loop merging a later group of slices' keys, run by each row's last slice "
             "(`kernel_compile.loop_figures`), reads: the batches of loads, a barrier holding "
             "them apart, in which that slice reads the slices' states after counting itself "
             "in (a split walk reading in more than one fails), tail: its instructions after the "
             "count, that loop's body aside (`kernel_compile.tail_figures`); trips and tail "
             "clocks: that tail's critical path as one warp issues it in order, its L2 round "
             "trips (a load issued behind one waiting on another counted too) and its clocks "
             "beside them at the fast and slow ends of the assumed instruction latencies "
             "(`stagelab.measure.sass_path`), merge trips and clocks: the merge loop's "
             "body's; guard, count, enter, candidate and sort clocks: each of those paths' "
             "critical path as one warp issues it, at the fast and slow ends of the same "
             "assumed latencies (what a tile takes a warp that has its scheduler to itself). "
             "Registers and "
             "CTAs bound how many bytes an SM keeps in flight (`stagelab.analyse.roofline`).",
             "",
             RUNNING.format(launched=", ".join(f"{count} on {gpus[arch]} for sm_{arch}"
                                               for arch, count in launched.items()),
                            minutes=round(2 * sum(launched.values()) * SECONDS_A_COMPILE / 60)),
             "",
             "| Triton | arch | kernel | variant | first shape | shapes | compiles | registers "
             "| spilled B | shared B | CTAs/SM | loop | guard | count | enter | sort | candidate "
             "| copies | copy B | merge | reads | tail | trips | tail clocks | merge trips "
             "| merge clocks | guard clocks | count clocks | enter clocks | candidate clocks "
             "| sort clocks |",
             "|---" * (7 + len(FIGURES)) + "|"]
    for r in found:
        figures = [cell(r.get(name, "")) for name in FIGURES]
        lines.append(f"| {r['triton']} | sm_{r['arch']} | {r['kernel']} | {variant_label(r)} "
                     f"| {r['where']} | {r['shapes']} | {'yes' if r['compiles'] else 'NO'} | "
                     + " | ".join(figures) + " |")
    return "\n".join(lines + model_table(found)) + "\n"


def run_check(archs: tuple[int, ...], workers: int, out: Path | None = None,
              specs: list[dict] | None = None, installed: bool = True,
              earlier: list[dict] | None = None) -> list[dict]:
    """``specs`` (where None, the variants launched on each architecture's GPU:
    :func:`launched_for`) compiled for each architecture by the lease's Triton, then by the
    installed one where ``installed`` (rows appended to ``out`` as they come, where given),
    keeping rows of ``earlier`` whose TTIR is alike (None: the committed rows; ``[]``:
    compile every spec, as the slow tests do: :func:`compile_with`)."""
    pythons = [triton_python(LEASE_TRITON)] + ([Path(sys.executable)] if installed else [])
    found = []
    for python in pythons:
        for arch in archs:
            found += compile_with(python, launched_for(arch) if specs is None else specs,
                                  (arch,), workers, out=out, earlier=earlier)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, action="append", choices=ARCHS,
                        help="an architecture to compile for (repeatable; default: both)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--write", action="store_true",
                        help=f"write {DOC.relative_to(ROOT)} and {DATA.relative_to(ROOT)}")
    parser.add_argument("--rows", type=Path, help="append each row here as it comes (JSON "
                        "lines); with --from-rows, write the table from such a file instead")
    parser.add_argument("--from-rows", action="store_true")
    parser.add_argument("--compile-all", action="store_true",
                        help="keep no committed row, its TTIR alike or not (after a change "
                        "to the cubin readers)")
    args = parser.parse_args(argv)
    found = (current_rows(args.rows) if args.from_rows and args.rows
             else run_check(tuple(args.arch or ARCHS), args.workers, args.rows,
                            earlier=[] if args.compile_all else None))
    short = unfinished(found)
    if short:  # nothing written: a table short of variants would stand for a full one
        print("\n".join(short))
        return 1
    if args.write:  # dated when compiled: a table rendered from rows takes their file's time
        when = (datetime.fromtimestamp(args.rows.stat().st_mtime, UTC)
                if args.from_rows and args.rows else datetime.now(UTC))
        DOC.write_text(table(found, when))
        DATA.write_text(json.dumps({"written": when.isoformat(timespec="seconds"),
                                    "variants": found}, indent=1) + "\n")
    bad = failures(found)
    print(f"{len(found)} compilations, {len(bad)} failed or spilled")
    print("\n".join(bad[:20]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
