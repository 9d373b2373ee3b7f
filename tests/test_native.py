"""The seed's native host path: its build (cached, atomic, honest when it fails), its zeroed
std::vector destination and its host gather, which must equal the numpy backend."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from stagelab.core.errors import NativeUnavailable
from stagelab.measure import logprobs as lp
from stagelab.measure import native

LIB = Path(native.__file__).parents[2]


def status_in_new_process(env: dict[str, str]) -> tuple[bool, str]:
    """``native.status()`` in a fresh interpreter (the in-process result is cached)."""
    code = "import json; from stagelab.measure import native; print(json.dumps(native.status()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(LIB), **env})
    return tuple(json.loads(done.stdout))


def test_the_build_works_here():
    available, where = native.status()
    assert available, where
    assert Path(where).is_file() and Path(where).with_suffix(".log").is_file()
    assert "-O3 -std=c++17 -shared -fPIC" in Path(where).with_suffix(".log").read_text()
    native.require()


def test_seed_vector_is_zeroed_and_aliased_by_its_tensor():
    with native.seed_vector(1000) as vector:
        tensor = vector.tensor
        assert tensor.dtype == torch.float32 and tensor.shape == (1000,)
        assert torch.count_nonzero(tensor) == 0
        # the vector's own memory, not a copy: same address, and a write through it is seen
        assert tensor.data_ptr() == vector.address
        ctypes.c_float.from_address(vector.address + 4 * 999).value = 3.5
        assert tensor[999] == 3.5


OPENED: list[str] = []  # files opened while a test below listens (an audit hook, once set)
IGNORED: set[threading.Thread] = set()  # the threads it does not hear: those running before
LISTENING: list[bool] = []


def _opened(event: str, args: tuple) -> None:
    if LISTENING and event in ("open", "os.open") and threading.current_thread() not in IGNORED:
        OPENED.append(str(args[0]))


def opened_files(call) -> list[str]:
    """Every file ``call`` opens, by Python's audit events (``open`` covers ``builtins.open``,
    ``io.open``, ``Path.read_text`` and ``os.open``), in its thread and any thread started
    while it runs, until that thread ends; not in the threads already running (before: another test's leaked load
    sampler, reading /proc every 2 s, failed this audit in CI)."""
    if not getattr(opened_files, "hooked", False):
        sys.addaudithook(_opened)
        opened_files.hooked = True
    OPENED.clear()
    IGNORED.clear()
    IGNORED.update(set(threading.enumerate()) - {threading.current_thread()})  # not idents:
    # an ended thread's ident can pass to the next one started
    LISTENING.append(True)
    try:
        call()
        for thread in set(threading.enumerate()) - IGNORED - {threading.current_thread()}:
            thread.join(5)  # one started during the call is heard until it ends
    finally:
        LISTENING.clear()
    return list(OPENED)


def test_the_file_audit_hears_threads_started_during_the_call_not_those_before_it(tmp_path):
    """A thread running before the call (another test's, left behind) opens a file during
    it, unheard; the call's own open and that of a thread started during it, after the call
    returns, are heard."""
    path = tmp_path / "seen"
    path.write_text("x")
    go, done = threading.Event(), threading.Event()

    def elsewhere() -> None:
        go.wait(5)
        path.read_text()
        done.set()

    running = threading.Thread(target=elsewhere)
    running.start()

    def call() -> None:
        go.set()
        assert done.wait(5)
        path.read_text()
        threading.Timer(0.2, path.read_text).start()  # opens after the call has returned

    assert opened_files(call) == [str(path)] * 2
    running.join()


def test_fresh_seed_vectors_open_no_file():
    """Before: every ``SeedVector`` read and scanned ``/proc/self/maps`` to learn the
    process's malloc, 2.2 ms inside the seed's timed ``alloc`` stage; it is learnt once per
    process now, and ``mapped`` is read only when asked, after the construction."""
    native.require()  # the library is built and loaded once, when an arm is built
    native.process_allocator()  # learnt once, before any timed stage

    def make_and_free() -> None:
        for regime in (native.MALLOC, native.MAPPED):
            for numel in (1000, 3 * 2 ** 20):
                vector = native.seed_vector(numel, regime)
                assert vector.mapped in (True, False, None)
                vector.free()

    assert opened_files(make_and_free) == []
    assert opened_files(lambda: native.process_allocator()) == []
    assert native.process_allocator(maps="libtcmalloc_minimal.so.4") == "tcmalloc"


def test_mapped_is_read_after_the_construction_and_refused_after_free(monkeypatch):
    reads = []
    monkeypatch.setattr(native, "_mapped", lambda vector, regime: reads.append(regime) or True)
    vector = native.seed_vector(1000, native.MAPPED)
    assert reads == []  # nothing but the allocation when the vector is made
    assert vector.mapped is True and vector.mapped is True and reads == [native.MAPPED]
    fresh = native.seed_vector(1000)
    fresh.free()
    with pytest.raises(RuntimeError, match="before it"):
        _ = fresh.mapped


def test_free_is_idempotent_and_the_tensor_is_gone_after_it():
    vector = native.seed_vector(16)
    assert vector.numel == 16
    vector.free()
    vector.free()
    with pytest.raises(RuntimeError, match="after free"):
        _ = vector.tensor
    assert native.seed_vector(0).tensor.numel() == 0


def test_the_vector_lives_as_long_as_its_tensor_and_no_longer(monkeypatch):
    library, freed = native.library(), []
    original = library.sl_vector_free
    monkeypatch.setattr(library, "sl_vector_free", lambda handle, regime: (
        freed.append(handle), original(handle, regime)))
    vector = native.seed_vector(10)
    tensor = vector.tensor
    del vector
    gc.collect()
    assert freed == [] and tensor.sum() == 0  # not freed under a live tensor
    del tensor
    assert len(freed) == 1  # deleted (its destructor run) once both are gone, without a GC pass
    native.seed_vector(10).free()
    assert len(freed) == 2


def test_seed_vector_bad_sizes():
    with pytest.raises(ValueError, match="numel must be >= 0"):
        native.seed_vector(-1)
    with pytest.raises(TypeError):
        native.seed_vector(2.5)


def gather_both(logprobs: torch.Tensor, k: int, tokens: torch.Tensor):
    return (lp.gather_logprobs_host(logprobs, k, tokens, backend="numpy"),
            lp.gather_logprobs_host(logprobs, k, tokens, backend="native"))


def assert_same_up_to_tie_order(ours: lp.LogprobsTensors, reference: lp.LogprobsTensors,
                                logprobs: torch.Tensor) -> None:
    """Values and ranks exactly; ids distinct per row and pointing at exactly those values."""
    assert torch.equal(ours.logprobs, reference.logprobs)
    assert torch.equal(ours.selected_token_ranks, reference.selected_token_ranks)
    assert torch.equal(ours.logprob_token_ids[:, 0], reference.logprob_token_ids[:, 0])
    ids = ours.logprob_token_ids[:, 1:].long()
    assert torch.equal(logprobs.gather(1, ids), ours.logprobs[:, 1:])
    for row in ids:
        assert len(set(row.tolist())) == row.numel()


@pytest.mark.parametrize("n, vocab, k", [(1, 7, 3), (17, 1001, 5), (4, 50, 0), (3, 64, 64),
                                         (8, 4099, 20)])
def test_native_equals_numpy_on_random_data(n, vocab, k):
    generator = torch.Generator().manual_seed(n)
    logprobs = torch.log_softmax(3 * torch.randn(n, vocab, generator=generator), dim=-1)
    tokens = torch.randint(0, vocab, (n,), generator=generator)
    numpy_result, native_result = gather_both(logprobs, k, tokens)
    assert_same_up_to_tie_order(native_result, numpy_result, logprobs)
    assert torch.equal(native_result.logprob_token_ids, numpy_result.logprob_token_ids)


@pytest.mark.parametrize("k", [0, 3, 10, 40])
def test_native_equals_numpy_with_ties_and_minus_inf(k):
    generator = torch.Generator().manual_seed(7)
    logprobs = torch.randint(-4, 0, (6, 40), generator=generator).float()  # many ties
    logprobs[:, ::5] = float("-inf")
    logprobs[5] = float("-inf")
    tokens = torch.tensor([0, 1, 2, 3, 4, 5])  # targets at -inf (rank V) and on ties
    numpy_result, native_result = gather_both(logprobs, k, tokens)
    assert_same_up_to_tie_order(native_result, numpy_result, logprobs)
    assert native_result.selected_token_ranks[0] == 40 == native_result.selected_token_ranks[5]


def test_the_tie_check_catches_a_wrong_id():
    logprobs = torch.tensor([[0.0, -1.0, -1.0, -2.0]])
    numpy_result, native_result = gather_both(logprobs, 2, torch.tensor([3]))
    native_result.logprob_token_ids[0, 2] = 3  # points at -2.0, not -1.0
    with pytest.raises(AssertionError):
        assert_same_up_to_tie_order(native_result, numpy_result, logprobs)


def test_native_gather_refuses_bad_input_naming_the_parameter():
    logprobs, tokens = torch.zeros(4, 8), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="logprobs must be a contiguous float32.*float64"):
        lp.gather_logprobs_host(logprobs.double(), 1, tokens, backend="native")
    with pytest.raises(ValueError, match="logprobs must be a contiguous float32.*not contiguous"):
        lp.gather_logprobs_host(torch.zeros(8, 4).T, 1, tokens, backend="native")
    with pytest.raises(ValueError, match="backend must be one of.*'cuda'"):
        lp.gather_logprobs_host(logprobs, 1, tokens, backend="cuda")
    # ids outside the vocabulary are refused even with validate=False, by the host gather and
    # (should a caller reach it directly) by the C loop itself
    with pytest.raises(ValueError, match=r"token_ids out of range \[0, 8\): rows \[2\] hold \[9\]"):
        lp.gather_logprobs_host(logprobs, 1, torch.tensor([0, 1, 9, 2]), backend="native",
                                validate=False)
    out = lp.LogprobsTensors.empty_host(4, 1)
    with pytest.raises(ValueError, match=r"token_ids out of range \[0, 8\): row 2 holds -1"):
        native.gather_logprobs(logprobs, torch.tensor([0, 1, -1, 2]), 1, *out.tensors())


def test_native_unavailable_is_raised_with_the_reason(monkeypatch):
    monkeypatch.setattr(native, "status", lambda: (False, "no C++ compiler: test"))
    with pytest.raises(NativeUnavailable, match=r"no C\+\+ compiler: test"):
        lp.gather_logprobs_host(torch.zeros(2, 3), 1, torch.zeros(2, dtype=torch.int64),
                                backend="native")
    with pytest.raises(NativeUnavailable, match=r"no C\+\+ compiler: test"):
        native.seed_vector(4)


def test_a_broken_compiler_gives_its_first_error_line(tmp_path):
    compiler = tmp_path / "broken-cxx"
    compiler.write_text("#!/bin/sh\necho 'fatal error: this compiler is broken' >&2\n"
                        "echo 'second line' >&2\nexit 1\n")
    compiler.chmod(0o755)
    cache = tmp_path / "cache"
    available, reason = status_in_new_process({"CXX": str(compiler), "STAGELAB_CACHE": str(cache)})
    assert not available
    assert reason.endswith("fatal error: this compiler is broken")
    assert not list(cache.glob("*.so")), "no library (and no temporary) may be left behind"


def test_a_missing_compiler_is_named(tmp_path):
    available, reason = status_in_new_process({"CXX": str(tmp_path / "nope"),
                                               "STAGELAB_CACHE": str(tmp_path)})
    assert not available and reason.startswith("no C++ compiler") and "nope" in reason


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_the_build_is_cached_between_processes(tmp_path):
    env = {"STAGELAB_CACHE": str(tmp_path)}
    assert status_in_new_process(env)[0]
    [library] = tmp_path.glob("*.so")
    built = library.stat().st_mtime_ns
    available, where = status_in_new_process(env)
    assert available and Path(where) == library and library.stat().st_mtime_ns == built
    assert not list(tmp_path.glob("*.tmp*"))


@pytest.mark.slow
def test_concurrent_first_builds_all_load_a_whole_library(tmp_path):
    code = ("import json; from stagelab.measure import native; "
            "print(json.dumps([native.status(), native.seed_vector(4).tensor.tolist()]))")
    env = {**os.environ, "PYTHONPATH": str(LIB), "STAGELAB_CACHE": str(tmp_path)}
    runs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=env) for _ in range(3)]
    results = [json.loads(run.communicate()[0]) for run in runs]
    assert all(status[0] for status, _ in results) and all(z == [0.0] * 4 for _, z in results)
    assert len(list(tmp_path.glob("*.so"))) == 1 and not list(tmp_path.glob("*.tmp*"))


# ------------------------------------------------------------- a cached library is checked first

def _cached_library(cache: Path) -> Path:
    assert status_in_new_process({"STAGELAB_CACHE": str(cache)})[0]
    [library] = cache.glob("*.so")
    return library


def _restamp(library: Path) -> None:
    """Stamp a damaged library as if it had been built so: only the probe load can catch it."""
    import hashlib
    library.with_suffix(".json").write_text(json.dumps({
        "size": library.stat().st_size, "sha256": hashlib.sha256(library.read_bytes()).hexdigest()}))


@pytest.mark.slow
def test_a_truncated_library_is_caught_by_the_probe_and_rebuilt(tmp_path):
    # Before: a truncated .so killed the process with SIGBUS (preflight exited 135, silently).
    library = _cached_library(tmp_path)
    whole = library.read_bytes()
    library.write_bytes(whole[:len(whole) // 2])
    assert "size" in native.verified(library)
    _restamp(library)
    assert native.probe(library) is not None  # the child process died or refused, not this one
    available, where = status_in_new_process({"STAGELAB_CACHE": str(tmp_path)})
    assert available and Path(where) == library and library.read_bytes() == whole
    assert native.verified(library) is None


@pytest.mark.slow
def test_a_garbage_library_is_rebuilt_not_trusted_for_good(tmp_path):
    # Before: a garbage .so disabled the native path for good.
    library = _cached_library(tmp_path)
    library.write_bytes(b"\x7fELF garbage" * 100)
    _restamp(library)
    assert "does not load" in native.verified(library)
    available, where = status_in_new_process({"STAGELAB_CACHE": str(tmp_path)})
    assert available and Path(where) == library and native.verified(library) is None


def test_an_empty_successful_build_is_never_cached(tmp_path):
    # Before: a compiler that exits 0 without writing a library had its 0-byte file cached.
    compiler = tmp_path / "lazy-cxx"
    compiler.write_text("#!/bin/sh\nexit 0\n")
    compiler.chmod(0o755)
    cache = tmp_path / "cache"
    available, reason = status_in_new_process({"CXX": str(compiler), "STAGELAB_CACHE": str(cache)})
    assert not available and "unusable library" in reason
    assert not list(cache.iterdir())


def test_an_unwritable_cache_falls_back_to_the_next_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("a cache path that is a file")
    second = tmp_path / "second"
    monkeypatch.setattr(native, "cache_dirs", lambda: [blocker / "cache", second])
    library = native.build(native.find_compiler())
    assert library.parent == second and native.verified(library) is None
    monkeypatch.setattr(native, "cache_dirs", lambda: [blocker / "one", blocker / "two"])
    with pytest.raises(NativeUnavailable, match="no cache folder can take the native build: "
                       rf"{blocker / 'one'} \(.+\); {blocker / 'two'} \(.+\)"):
        native.build(native.find_compiler())


def test_the_default_cache_folders_end_in_the_repository_and_the_temp_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("STAGELAB_CACHE", str(tmp_path))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(native.tempfile, "tempdir", None)
    assert native.cache_dirs() == [tmp_path, LIB.parent / ".cache" / "stagelab",
                                   tmp_path / "tmp" / f"stagelab-{os.getuid()}"]


def test_the_build_stamp_digest_needs_no_python_3_11(tmp_path, monkeypatch):
    import hashlib

    from stagelab.measure import native

    library = tmp_path / "lib.so"
    library.write_bytes(b"x" * (3 << 20) + b"tail")
    expected = hashlib.sha256(library.read_bytes()).hexdigest()
    monkeypatch.delattr(hashlib, "file_digest", raising=False)  # as on Python 3.10
    assert native._digest(library) == expected


# ------------------------------------------------------------------ the allocator's regime

REGIME_PROBE = """
import json, resource, sys
from stagelab.measure import native
numel, regime, numpy_first, interleave = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", \\
    sys.argv[4] == "1"
if numpy_first:  # numpy imported, and a 30 MB block freed: glibc's threshold moves to it
    import numpy
    block = numpy.ones(30 * 2 ** 20 // 8)
    del block
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
out = []
for step in range(6):
    if interleave:  # another arm between steps: a torch tensor of the same size, freed
        native.torch.ones(numel).sum()
    before = faults()
    vector = native.seed_vector(numel, regime)
    out.append({"faults": faults() - before, "mapped": vector.mapped})
    vector.free()
print(json.dumps(out[1:]))  # the first step pays the library's own first use
"""


def _steps(numel, regime, numpy_first=False, interleave=False):
    done = subprocess.run([sys.executable, "-c", REGIME_PROBE, str(numel), regime,
                           str(int(numpy_first)), str(int(interleave))],
                          capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow  # make check's fast lane leaves it to make test
@pytest.mark.skipif(native.process_allocator() != "glibc", reason="glibc's regimes")
def test_a_vector_mapped_fresh_faults_in_every_page_whatever_ran_before():
    numel = 10 * 2 ** 20 // 4  # 10 MiB: below glibc's largest threshold
    pages = numel * 4 // resource.getpagesize()
    settings = [dict(), dict(numpy_first=True), dict(interleave=True),
                dict(numpy_first=True, interleave=True)]
    seen = [_steps(numel, native.MAPPED, **s) for s in settings]
    for steps in seen:
        assert all(step["mapped"] is True for step in steps)
        # every step faults its pages in (huge pages, where the kernel uses them, fault fewer)
        assert all(pages / 512 <= step["faults"] <= pages + 64 for step in steps)
    counts = {step["faults"] for steps in seen for step in steps}
    assert max(counts) - min(counts) <= 64  # the same with numpy imported or arms between


@pytest.mark.slow  # make check's fast lane leaves it to make test
@pytest.mark.skipif(native.process_allocator() != "glibc", reason="glibc's regimes")
def test_glibcs_own_regime_is_recorded_as_it_happened():
    numel = 10 * 2 ** 20 // 4  # below 32 MiB: glibc's threshold rises to it once it is freed
    settings = [dict(), dict(numpy_first=True), dict(interleave=True)]
    small = [_steps(numel, native.MALLOC, **s) for s in settings]
    for steps in small:  # in the steady state the heap is reused, whatever ran before
        assert [step["mapped"] for step in steps] == [False] * 5
        assert all(step["faults"] < 64 for step in steps[1:])
    # ... but its first steps depend on the process's history: the heap grows (faults) unless
    # a block freed earlier (numpy's) already raised the threshold: hence warm-up, and the record
    assert small[0][0]["faults"] > numel * 4 // resource.getpagesize() // 2
    assert small[1][0]["faults"] < 64
    large = _steps(40 * 2 ** 20 // 4, native.MALLOC)  # above 32 MiB: mapped fresh every step
    assert [step["mapped"] for step in large] == [True] * 5
    assert all(step["faults"] >= 40 * 2 ** 20 // resource.getpagesize() // 512 for step in large)


def test_regimes_say_which_allocators_this_process_can_take():
    listed = native.regimes(maps="")
    assert [r["regime"] for r in listed] == ["glibc", "glibc, mapped fresh", "jemalloc",
                                             "tcmalloc"]
    assert [r["available"] for r in listed] == [True, True, False, False]
    assert "LD_PRELOAD" in listed[2]["note"] or "not installed" in listed[2]["note"]
    preloaded = native.regimes(maps="7f00 r-xp /usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert preloaded[0]["regime"] == "jemalloc" and preloaded[0]["available"]
    assert [r["regime"] for r in preloaded[2:]] == ["tcmalloc"]
    with pytest.raises(ValueError, match="regime must be one of"):
        native.seed_vector(10, "jemalloc")
