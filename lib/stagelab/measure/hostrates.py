"""The host's own costs of the seed's step, measured apart at one cell's size: the inputs of the
cost model (:mod:`stagelab.analyse.predict`).

Each term is timed alone, repeated (every repeat kept), at the very ``n x V`` of a step cell, so
that the allocator regime (glibc's mmap threshold moves with what was freed before) and the cache
sizes are those the step meets:

============== ============================================================================
term           what is timed (host clock, one thread of the seed's C++ where it is C++)
============== ============================================================================
log_softmax    ``torch.log_softmax`` of fp32 ``[n, V]`` into a new tensor: the device stage of
               a step on a CPU (on a GPU the platform table gives it instead); timed in the
               C++ terms' cycle where those run, so that its allocation precedes the vector's
host_softmax   the in-place host log-softmax of the seed's copy of the logits (``sub_`` of a
               logsumexp): the stage ``host_softmax`` when the log-softmax runs on the host
fresh_vector   ``new std::vector<float>(n * V)`` (value-initialised: every page faulted in and
               zeroed): the seed's ``alloc`` stage
warm_fill      zeroing the same bytes already faulted in, on one thread: the fill alone, so that
               ``fresh_vector - warm_fill`` is the page faults' share
copy_fresh     copying ``[n, V]`` into the vector just made (the seed's ``copy`` on a CPU)
copy_reused    copying ``[n, V]`` into one reused buffer (the reuse lever's ``copy`` on a CPU)
top_k          the seed's C++ GatherLogprobs (partial sort per row, rank count) on ``[n, V]``
free           the vector's destructor (large blocks go back to the OS)
============== ============================================================================

Rows: arm ``host_rates``, ``stage`` the term, metric ``host_rate``, one row per repeat
(``round``) with its ``seconds``, ``bytes`` the ``[n, V]`` fp32 bytes. Torch and the standard library
only (the measuring floor); terms that need the seed's C++ are ``unavailable`` without a compiler.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator

import torch

from stagelab.core.errors import NativeUnavailable
from stagelab.measure import logprobs as lp
from stagelab.measure import native

ARM, METRIC = "host_rates", "host_rate"
TERMS = ("log_softmax", "host_softmax", "fresh_vector", "warm_fill", "copy_fresh", "copy_reused",
         "top_k", "free")
NATIVE_TERMS = ("fresh_vector", "copy_fresh", "top_k", "free")


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for the duration (the seed's fill and loops are single-threaded)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _samples(call: Callable[[], dict[str, float]], repeats: int,
             warmup: int) -> dict[str, list[float]]:
    """Each named part's seconds over ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    timed = [call() for _ in range(repeats)]
    return {name: [t[name] for t in timed] for name in timed[0]}


def _timed(call: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def _rotation(sources: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
    """The next source on each call, in turn (as the step's rounds rotate theirs, so that no
    call finds its input in the cache the previous one left)."""
    calls = itertools.count()
    return lambda: sources[next(calls) % len(sources)]


def _torch_terms(logits: list[torch.Tensor], staged: list[torch.Tensor], repeats: int,
                 warmup: int) -> dict[str, list[float]]:
    """The terms that need torch alone: the log-softmax of the ``logits``, and on fp32
    ``staged`` copies the host log-softmax, the warm fill and the reused copy."""
    numel = staged[0].numel()
    reused = torch.empty_like(staged[0])
    next_logits, next_staged = _rotation(logits), _rotation(staged)
    reused.fill_(1.0)  # faulted in once, as a grow-only buffer is after its first step

    def softmaxes() -> dict[str, float]:
        scores = next_logits()
        device_like, _ = _timed(lambda: torch.log_softmax(scores, dim=-1, dtype=torch.float32))
        reused.copy_(next_staged())
        host, _ = _timed(lambda: reused.sub_(torch.logsumexp(reused, dim=-1, keepdim=True)))
        return {"log_softmax": device_like, "host_softmax": host}

    def fills() -> dict[str, float]:
        with one_thread():
            fill, _ = _timed(lambda: reused.view(numel).zero_())
        source = next_staged()
        copy, _ = _timed(lambda: reused.copy_(source))
        return {"warm_fill": fill, "copy_reused": copy}

    return {**_samples(softmaxes, repeats, warmup),
            **_samples(fills, repeats, warmup)}


def _native_terms(sources: list[torch.Tensor], k: int, targets: torch.Tensor, repeats: int,
                  warmup: int) -> dict[str, list[float]]:
    """The seed's C++ terms in the step's order and with its allocations (a new log-softmax
    output, then a fresh vector, the copy into it, the top-K, the free), so that the allocator
    meets the regime it meets in the step; no forward, no wait, no other arm between them."""
    rows, vocab = sources[0].shape
    pick = _rotation(sources)
    out = lp.LogprobsTensors.empty_host(rows, k)

    def use(vector: native.SeedVector, staged: torch.Tensor) -> tuple[float, float]:
        host = vector.tensor.view(rows, vocab)  # gone with this call, before the free
        copied, _ = _timed(lambda: host.copy_(staged))
        top_k, _ = _timed(lambda: native.gather_logprobs(host, targets, k, *out.tensors()))
        return copied, top_k

    def cycle() -> dict[str, float]:
        logits = pick()
        softmax, staged = _timed(lambda: torch.log_softmax(logits, dim=-1, dtype=torch.float32))
        made, vector = _timed(lambda: native.seed_vector(rows * vocab))
        copied, top_k = use(vector, staged)
        freed, _ = _timed(vector.free)
        return {"log_softmax": softmax, "fresh_vector": made, "copy_fresh": copied,
                "top_k": top_k, "free": freed}

    return _samples(cycle, repeats, warmup)


def measure_rates(rows: int, vocab: int, k: int, *, repeats: int = 5, warmup: int = 1,
                  seed: int = 0, sources: int = 2,
                  logits_dtype: torch.dtype = torch.float32) -> list[dict]:
    """Every term's seconds, one row per repeat, at ``[rows, vocab]`` fp32 with top-``k``, as
    schema rows (arm ``host_rates``, metric ``host_rate``), each call reading the next of ``sources``
    inputs in turn, as the step's rounds do (logits of ``logits_dtype``, the step's, for the
    log-softmax; fp32 for the rest, as the seed stages them); the seed's C++ terms ``unavailable`` (with the
    reason) where it cannot be built."""
    for name, value in (("rows", rows), ("vocab", vocab), ("repeats", repeats),
                        ("sources", sources)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= vocab:
        raise ValueError(f"k must be an integer in [0, vocab={vocab}], got {k!r}")
    generator = torch.Generator().manual_seed(seed)
    logits = [(3 * torch.randn(rows, vocab, generator=generator)).to(logits_dtype)
              for _ in range(sources)]
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    nbytes = rows * vocab * 4
    staged = [torch.log_softmax(scores, dim=-1, dtype=torch.float32) for scores in logits]
    seconds = _torch_terms(logits, staged, repeats, warmup)
    unavailable = ""
    try:
        native.require()
        seconds.update(_native_terms(logits, k, targets, repeats, warmup))
    except NativeUnavailable as exc:
        unavailable = str(exc)
    rows_out = []
    for term in TERMS:
        row = {"arm": ARM, "stage": term, "metric": METRIC, "bytes": nbytes,
               "timer": "perf_counter"}
        if term not in seconds:
            rows_out.append({**row, "status": "unavailable", "note": unavailable})
            continue
        rows_out += [{**row, "round": i, "seconds": value, "note": f"after {warmup} warm-up"}
                     for i, value in enumerate(seconds[term])]
    return rows_out
