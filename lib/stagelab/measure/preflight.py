"""Preflight: can this machine produce the staging evidence? Checked in seconds, before a lease
of GPU time is spent on a run that cannot succeed.

Each check ends ``go`` (passed), ``no-go`` (blocks the evidence), ``info`` (a fact worth keeping)
or ``unavailable`` (cannot be read here, and does not block). The decision is ``go`` when no check
says ``no-go``. Blocking: CUDA itself, a pinned allocation with a copy, CUDA-event timing that
agrees with the host clock on a synchronous copy, and enough free memory for the profile's largest
cell. Not blocking, but said: whether Triton's first launch can build its launcher (a C
compiler, ``Python.h``, ``libcuda.so.1``). Everything is written to ``preflight.json``.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import stagelab.measure.device
from stagelab.core import catalogue, paths, records, untrusted
from stagelab.core.errors import UserError
from stagelab.core.outcomes import EXIT_NO_GO, GO, NO_GO
from stagelab.core.outcomes import EXIT_OK as EXIT_GO

if TYPE_CHECKING:
    from stagelab.measure.bench import Timer

INFO, UNAVAILABLE = "info", "unavailable"
CUDA_CHECK, PINNED_CHECK = "cuda", "pinned_copy"  # the checks' names, as the table shows them
PROBE_BYTES = 64 << 20  # copies long enough (milliseconds) for both clocks to resolve them
STEP_NOTEBOOK = catalogue.notebook_of(catalogue.DECISIVE_EXPERIMENT).name  # needs the native build
MEMORY_MARGIN = 0.9  # the share of free memory a cell may use (as memory.check_fits)
CPU_STILL_RUNS = ("what can still run here: the CPU arms of every notebook (pageable staging, the "
                  "whole step, prompt logprobs) and the verdict, which stays INCONCLUSIVE for "
                  "staging; the pinned arms are recorded unavailable")


@dataclass
class Check:
    """One line of the preflight table, with the numbers behind it in ``data``."""

    name: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CellNeed:
    """The memory the largest cell of one notebook needs, on the device and on the host."""

    notebook: str
    cell: str
    device_bytes: int
    host_bytes: int


# ------------------------------------------------------------------------- profile's largest cell

def notebook_cells(notebook: str, p: dict[str, Any], device: str) -> list[Any]:
    """The sweep cells a notebook would measure with parameters ``p`` (none for a notebook that
    does not allocate by size): the same cells, with the same memory needs, the run will check."""
    from stagelab.measure import experiments

    return experiments.notebook_cells(notebook, p, device)


def largest_cells(parameters: dict[str, dict[str, Any]],
                  device: str | None = None) -> list[CellNeed]:
    """The largest cell of every notebook that allocates by size, in the profile's order."""
    from stagelab.measure.device import default_device

    needs = []
    for name, params in parameters.items():
        found = notebook_cells(name, params, device or default_device())
        if found:
            cell = max(found, key=lambda c: c.host_bytes + c.device_bytes)
            needs.append(CellNeed(name, cell.label, cell.device_bytes, cell.host_bytes))
    return needs


# ------------------------------------------------------------------------------------- checks

def _gib(nbytes: int | None) -> str:
    return "unknown" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def check_cuda() -> Check:
    """CUDA is visible to torch: the pinned arms and the decision need it."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return Check(CUDA_CHECK, GO, f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}",
                     {"device": name, "count": torch.cuda.device_count(),
                      "torch": torch.__version__, "cuda_build": torch.version.cuda})
    build = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return Check(CUDA_CHECK, NO_GO, f"no CUDA device (torch {torch.__version__}, {build}): the "
                 "pinned arms and the staging decision cannot be measured",
                 {"torch": torch.__version__, "cuda_build": torch.version.cuda})


def check_pinned() -> Check:
    """A pinned allocation, a device-to-host copy into it, and the bytes arrived."""
    src = torch.randint(0, 256, (PROBE_BYTES,), dtype=torch.uint8, device="cuda")
    dst = torch.empty(PROBE_BYTES, dtype=torch.uint8, pin_memory=True)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    head = slice(0, 1 << 20)
    same = bool(torch.equal(dst[head].to("cuda"), src[head]))
    ok = dst.is_pinned() and same
    return Check(PINNED_CHECK, GO if ok else NO_GO,
                 f"{_gib(PROBE_BYTES)} pinned, copied into: "
                 f"{'bytes match' if same else 'MISMATCH'}",
                 {"bytes": PROBE_BYTES, "is_pinned": dst.is_pinned(), "bytes_match": same})


def check_host_register() -> Check:
    """``cudaHostRegister`` then ``cudaHostUnregister`` of a fresh pageable buffer. Only the
    :data:`~stagelab.core.catalogue.PIN_PER_CALL` arm (the cost of pinning per step) needs it,
    so a failure does not block: that arm is then recorded as failed, and the decision's arms
    still run."""
    cudart = torch.cuda.cudart()
    buffer = torch.empty(PROBE_BYTES, dtype=torch.uint8)
    start = time.perf_counter()
    registered = int(cudart.cudaHostRegister(buffer.data_ptr(), PROBE_BYTES, 0))
    register_s = time.perf_counter() - start
    unregistered = int(cudart.cudaHostUnregister(buffer.data_ptr())) if registered == 0 else None
    ok = registered == 0 and unregistered == 0
    return Check("host_register", GO if ok else UNAVAILABLE,
                 f"register {registered}, unregister {unregistered} (0 is success); "
                 f"registering {_gib(PROBE_BYTES)} took {register_s * 1e3:.1f} ms"
                 + ("" if ok else f"; the {catalogue.PIN_PER_CALL} arm will fail, the decision "
                                  "does not need it"),
                 {"register_status": registered, "unregister_status": unregistered,
                  "register_s": register_s})


def _event_and_host(timer: Timer, call: Callable[[], object]) -> tuple[float, float]:
    """One call's event and host seconds (a CUDA timer reads both)."""
    event_s, host_s, _ = timer.time(call)
    if host_s is None:
        raise RuntimeError("the timer read no host clock: it is not a CUDA timer")
    return event_s, host_s


def check_event_timing(rounds: int = 5) -> Check:
    """CUDA events against the host clock on a pageable (synchronous) device-to-host copy."""
    from stagelab.measure.bench import CLOCK_SLACK_FRACTION, CLOCK_SLACK_S, Timer, clocks_agree

    src = torch.empty(PROBE_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty(PROBE_BYTES, dtype=torch.uint8)
    timer = Timer("cuda")
    timer.time(lambda: dst.copy_(src))  # warm-up: first-touch of the pageable pages
    pairs = [_event_and_host(timer, lambda: dst.copy_(src)) for _ in range(rounds)]
    agree = sum(clocks_agree(event, host) for event, host in pairs)
    event_s = statistics.median(e for e, _ in pairs)
    host_s = statistics.median(h for _, h in pairs)
    return Check("event_timing", GO if agree == rounds else NO_GO,
                 f"{agree}/{rounds} copies agree (event {event_s * 1e3:.2f} ms, host "
                 f"{host_s * 1e3:.2f} ms, medians; tolerance {CLOCK_SLACK_S * 1e3:.1f} ms + "
                 f"{CLOCK_SLACK_FRACTION:.0%})",
                 {"event_s": [e for e, _ in pairs], "host_s": [h for _, h in pairs],
                  "slack_s": CLOCK_SLACK_S, "slack_fraction": CLOCK_SLACK_FRACTION})


def check_nvml() -> Check:
    """Driver, PCIe maximum and current generation and width, and one throughput read."""
    import pynvml

    from stagelab.measure.hardware import nvml_handle, nvml_info

    info = nvml_info(0)
    pynvml.nvmlInit()
    try:
        handle = nvml_handle(pynvml, 0)
        info["pcie_tx_kb_per_s"] = pynvml.nvmlDeviceGetPcieThroughput(
            handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        info["pcie_rx_kb_per_s"] = pynvml.nvmlDeviceGetPcieThroughput(
            handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    finally:
        pynvml.nvmlShutdown()
    return Check("nvml", GO,
                 f"driver {info['driver']}, PCIe gen {info['pcie_current_generation']}/"
                 f"{info['pcie_max_generation']} x{info['pcie_current_width']}/"
                 f"x{info['pcie_max_width']} (current/max; idle links downtrain), throughput "
                 f"tx {info['pcie_tx_kb_per_s']} rx {info['pcie_rx_kb_per_s']} KB/s", info)


def triton_launch_missing(which: Callable[[str], str | None] = shutil.which,
                          python_h: Path | None = None,
                          load: Callable[[str], object] = ctypes.CDLL) -> list[str]:
    """What Triton's first launch on a node needs and this machine lacks: a C compiler
    (``$CC``, clang or gcc: Triton builds its launcher), ``Python.h`` (the launcher is a Python
    extension) and ``libcuda.so.1`` (the driver, which it links)."""
    missing = []
    if not (os.environ.get("CC") or which("clang") or which("gcc")):
        missing.append("a C compiler (CC, clang or gcc)")
    header = python_h or Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        missing.append(f"Python.h (not at {header}: the python3-dev package)")
    try:
        load("libcuda.so.1")
    except OSError:
        missing.append("libcuda.so.1 (the NVIDIA driver's library)")
    return missing


def check_triton_launch() -> Check:
    """Triton's first launch can build its launcher here (the one-pass and head_fused arms'
    kernels); where it cannot, those arms fail on a GPU, which does not block the decision."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return Check("triton_launch", INFO, "Triton is not installed: the one-pass kernels run "
                     "their torch backend", {"missing": []})
    missing = triton_launch_missing()
    if missing:
        return Check("triton_launch", UNAVAILABLE, f"missing {'; '.join(missing)}: Triton's "
                     f"first launch would fail, and the one-pass and {catalogue.HEAD_FUSED} "
                     "arms with it", {"missing": missing})
    return Check("triton_launch", GO, "a C compiler, Python.h and libcuda.so.1 found",
                 {"missing": []})


def check_memory(needs: list[CellNeed], on_gpu: bool) -> Check:
    """Free host and device memory against the largest cell of the profile (without a device,
    the device's tensors live on the host too)."""
    from stagelab.measure.memory import free_device_bytes, free_host_bytes

    if not needs:
        return Check("memory", INFO, "the profile has no notebook that allocates by size")
    host_of = (lambda c: c.host_bytes) if on_gpu else (lambda c: c.host_bytes + c.device_bytes)
    sides = [("host", max(needs, key=host_of), host_of, free_host_bytes())]
    if on_gpu:
        torch.cuda.empty_cache()  # the probes' cached blocks are not the run's to lose
        sides.append(("device", max(needs, key=lambda c: c.device_bytes),
                      lambda c: c.device_bytes, free_device_bytes("cuda")))
    parts, short = [], False
    for side, cell, need_of, free in sides:
        fits = free is None or need_of(cell) <= MEMORY_MARGIN * free
        short = short or not fits
        parts.append(f"{side}: {cell.notebook} {cell.cell} needs {_gib(need_of(cell))}, "
                     f"{_gib(free)} free{'' if fits else ' (DOES NOT FIT)'}")
    return Check("memory", NO_GO if short else GO, "; ".join(parts),
                 {"cells": [asdict(c) for c in needs], "margin": MEMORY_MARGIN,
                  **{f"free_{side}_bytes": free for side, _, _, free in sides}})


def check_native(decisive: bool = False) -> Check:
    """The seed's native C++ host path builds here. Without it its arms are recorded
    unavailable; where the profile holds the step A/B (``decisive``) that is a no-go, since the
    decisive arms (the seed's step, fresh vector against pinned scratch) need it."""
    from stagelab.measure import native

    ok, reason = native.status()
    if ok:
        return Check("native", GO, reason, {"ok": ok, "reason": reason})
    if decisive:
        return Check("native", NO_GO, f"{reason}: the step A/B's decisive arms "
                     f"({', '.join(catalogue.decisive_arms()[:2])}) need the native build, so "
                     "this profile cannot decide here",
                     {"ok": ok, "reason": reason})
    return Check("native", UNAVAILABLE, f"{reason}: the native arms will be recorded unavailable",
                 {"ok": ok, "reason": reason})


def check_cpu_features() -> Check:
    """torch's CPU capability and, where numpy is importable, its SIMD extensions (host-side
    arms depend on them)."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        import numpy as np
    except ImportError:
        return Check("cpu_features", INFO, f"torch {capability}; numpy is not installed",
                     {"torch_cpu_capability": capability, "numpy": None})
    simd = np.show_config(mode="dicts").get("SIMD Extensions", {})
    return Check("cpu_features", INFO,
                 f"torch {capability}; numpy baseline {', '.join(simd.get('baseline', []))}, "
                 f"found {', '.join(simd.get('found', []))}",
                 {"torch_cpu_capability": capability, "numpy_simd": simd,
                  "numpy": np.__version__})


def device_path_calls(rows: int = 16, vocab: int = 32768, k: int = 5, tokens: int = 257,
                      hidden: int = 256, chunk: int = 64) -> dict[str, Callable[[], object]]:
    """One small call of each measured device path, on CUDA."""
    from stagelab.measure import logprobs as lp
    from stagelab.measure.prompt_logprobs import make_inputs, prompt_logprobs

    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(rows, vocab, device="cuda", generator=generator).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (rows,), device="cuda", generator=generator)
    states, weight, prompt = make_inputs(tokens, vocab, hidden, torch.bfloat16, device="cuda")
    return {
        "logprobs_from_logits": lambda: lp.logprobs_from_logits(logits, k, ids),
        "gather_logprobs(compute_logprobs)": lambda: lp.gather_logprobs(
            lp.compute_logprobs(logits), k, ids),
        "prompt_logprobs": lambda: prompt_logprobs(states, weight, prompt, k, chunk,
                                                   method=catalogue.FUSED, overlap=True),
    }


def check_sync_debug() -> list[Check]:
    """Count hidden host synchronisations of each device path (issue 13); recorded, not blocking."""
    checks = []
    for name, call in device_path_calls().items():
        texts = stagelab.measure.device.sync_warnings(call)
        checks.append(Check(f"sync:{name}", INFO, f"{len(texts)} sync warnings in one call",
                            {"count": len(texts), "warnings": texts}))
    return checks


def _guarded(name: str, check: Callable[[], Check | list[Check]], blocking: bool) -> list[Check]:
    """Run a check; an exception becomes its row (``no-go`` if it blocks), never a crash."""
    try:
        result = check()
    except Exception as exc:  # a broken check is a finding, recorded with its cause
        first = (str(exc).strip().splitlines() or [""])[0]
        return [Check(name, NO_GO if blocking else UNAVAILABLE, f"{type(exc).__name__}: {first}")]
    return result if isinstance(result, list) else [result]


def run_checks(parameters: dict[str, dict[str, Any]]) -> list[Check]:
    """Every check, in table order; ``parameters`` (each notebook's effective parameters, see
    :func:`stagelab.run.profiles.profile_parameters`) size the memory check."""
    checks = _guarded(CUDA_CHECK, check_cuda, blocking=True)
    on_gpu = checks[0].status == GO
    gpu_checks = [(PINNED_CHECK, check_pinned, True),
                  ("host_register", check_host_register, False),
                  ("event_timing", check_event_timing, True)]
    for name, check, blocking in gpu_checks:
        checks += (_guarded(name, check, blocking) if on_gpu
                   else [Check(name, UNAVAILABLE, "needs a CUDA device")])
    checks += _guarded("nvml", check_nvml, blocking=False)
    checks += _guarded("triton_launch", check_triton_launch, blocking=False)
    checks += _guarded("memory", lambda: check_memory(largest_cells(parameters), on_gpu),
                       blocking=False)
    decisive = STEP_NOTEBOOK in parameters
    checks += _guarded("native", lambda: check_native(decisive), blocking=decisive)
    checks += _guarded("cpu_features", check_cpu_features, blocking=False)
    checks += (_guarded("sync_debug", check_sync_debug, blocking=False) if on_gpu else [
        Check("sync_debug", UNAVAILABLE, "torch.cuda.set_sync_debug_mode needs a CUDA device; "
              "on CPU the tests' sync counter stands in")])
    return checks


def decisive_blockers(parameters: dict[str, dict[str, Any]]) -> list[str]:
    """``name: detail`` of each no-go check that stops the decisive arms from running here
    (CUDA, and the native build where the profile holds the step A/B): the part of the preflight
    that ``stagelab run`` asks before running a profile meant to decide."""
    checks = _guarded(CUDA_CHECK, check_cuda, blocking=True)
    decisive = STEP_NOTEBOOK in parameters
    checks += _guarded("native", lambda: check_native(decisive), blocking=decisive)
    return blocking_reasons(checks)


# ------------------------------------------------------------------------------------ outcome

def blocking_reasons(checks: list[Check]) -> list[str]:
    """``name: detail`` of every no-go check."""
    return [f"{c.name}: {c.detail}" for c in checks if c.status == NO_GO]


# The checks whose no-go makes every profile's decisive arms impossible: a pinned copy from a
# CUDA device is what the staging question is about. Not passed by ``--force``. Spelled by the
# names the checks carry (a name here that no check has would let its failure pass).
DECISIVE_CHECKS = (CUDA_CHECK, PINNED_CHECK)


def decisive_reasons(checks: list[Check]) -> list[str]:
    """``name: detail`` of every no-go check of :data:`DECISIVE_CHECKS`."""
    return [f"{c.name}: {c.detail}" for c in checks
            if c.status == NO_GO and c.name in DECISIVE_CHECKS]


def format_table(checks: list[Check]) -> str:
    """The preflight table: check, status, detail."""
    width = max(len("check"), *(len(c.name) for c in checks))
    lines = [f"{'check':{width}}  {'status':11}  detail", f"{'-' * width}  {'-' * 11}  {'-' * 6}"]
    lines += [f"{c.name:{width}}  {c.status:11}  {c.detail}" for c in checks]
    return "\n".join(lines)


def resolve_out(out: Path | None) -> Path:
    """Where preflight.json goes: ``out`` (a ``.json`` file or a folder), by default
    ``papermill_runs/preflight.json``. UserError, before any check runs, if it cannot be written."""
    path = Path(out) if out is not None else paths.RUNS_DIR / "preflight.json"
    if path.suffix != ".json":
        path = path / "preflight.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {path.parent}: cannot create the folder ({exc.strerror})") from exc
    if not os.access(path.parent, os.W_OK):
        raise UserError(f"--out {path.parent}: the folder is not writable")
    check_replaceable(path)
    return path


PREFLIGHT_KEYS = frozenset({"decision", "exit_status", "blocking", "checks", "profile"})


def check_replaceable(path: Path) -> None:
    """UserError unless ``path`` lies outside every run folder and is new or an earlier
    ``preflight.json``: a run's manifest (or any other JSON file) is never overwritten."""
    if path.is_symlink() or path.is_dir():
        raise UserError(f"--out {path}: is a {'link' if path.is_symlink() else 'folder'}; "
                        "name a new .json file or a folder")
    if records.enclosing_run(path) is not None:
        raise UserError(f"--out {path}: lies in a run folder, whose record is never written "
                        "by another command; name another file")
    if not path.exists():
        return
    try:
        earlier = untrusted.load_json(path)
    except (OSError, UserError):
        earlier = None
    if not isinstance(earlier, dict) or not PREFLIGHT_KEYS <= set(earlier):
        raise UserError(f"--out {path}: exists and is not an earlier preflight.json; name a "
                        "new file")


def write_report(path: Path, profile: str, checks: list[Check], elapsed_s: float) -> Path:
    """Write ``preflight.json`` atomically: decision, blocking reasons and every check."""
    blocking = blocking_reasons(checks)
    payload = {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "profile": profile,
        "decision": NO_GO if blocking else GO,
        "exit_status": EXIT_NO_GO if blocking else EXIT_GO,
        "blocking": blocking,
        "elapsed_s": round(elapsed_s, 2),
        "checks": [asdict(c) for c in checks],
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def preflight(profile: str, parameters: dict[str, dict[str, Any]],
              out: Path | None = None) -> int:
    """Run every check against a profile's plan (each notebook's effective parameters, see
    :func:`stagelab.run.profiles.profile_parameters`), print the table and the decision, write
    preflight.json; 0 go, 3 no-go."""
    started = time.perf_counter()
    path = resolve_out(out)
    checks = run_checks(parameters)
    write_report(path, profile, checks, time.perf_counter() - started)
    print(format_table(checks))
    blocking = blocking_reasons(checks)
    for reason in blocking:
        print(f"blocking: {reason}", file=sys.stderr)
    if not any(c.name == "cuda" and c.status == GO for c in checks):
        print(CPU_STILL_RUNS, file=sys.stderr)
    print(f"preflight: {'NO-GO (exit 3)' if blocking else 'GO'} after "
          f"{time.perf_counter() - started:.1f} s; written {path}")
    return EXIT_NO_GO if blocking else EXIT_GO
