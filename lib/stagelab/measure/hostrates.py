"""The host's own costs of the seed's step, measured apart at one cell's size: the inputs of the
cost model (:mod:`stagelab.analyse.predict_model`).

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
(``round``) with its ``seconds``, ``bytes`` the ``[n, V]`` fp32 bytes; each ``fresh_vector`` row
also says whether the vector was mapped fresh (``mapped``) and the faults its construction took
(``minor_faults``), as the step's ``alloc`` rows do, so that the probe's regime can be checked
against the step's. The C++ cycle allocates in the step's own pattern: on a GPU step
(``host_block=False``) the log-softmax output lives on the device, so no same-size host block is
alive around the vector (the copy reads a source made once); on a CPU step (``host_block=True``)
the log-softmax's new host tensor precedes the vector, as there. A step cell takes its
repeats between its rounds (:class:`Sampler`), so that they share the rounds' conditions (a
machine's load moves both alike); :func:`measure_rates` takes them in a row. Torch and the standard library
only (the measuring floor); terms that need the seed's C++ are ``unavailable`` without a compiler.
"""

from __future__ import annotations

import contextlib
import itertools
import resource
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from stagelab.core.errors import NativeUnavailable
from stagelab.measure import logprobs as lp
from stagelab.measure import native

ARM, METRIC = "host_rates", "host_rate"
TERMS = ("log_softmax", "host_softmax", "fresh_vector", "warm_fill", "copy_fresh", "copy_reused",
         "top_k", "free")
NATIVE_TERMS = ("fresh_vector", "copy_fresh", "top_k", "free")
_FAULTS_OF = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
T = TypeVar("T")


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for the duration (the seed's fill and loops are single-threaded)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _timed(call: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def _rotation(sources: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
    """The next source on each call, in turn (as the step's rounds rotate theirs, so that no
    call finds its input in the cache the previous one left)."""
    calls = itertools.count()
    return lambda: sources[next(calls) % len(sources)]


Probe = Callable[[], dict[str, float]]


def _torch_probes(logits: list[torch.Tensor], staged: list[torch.Tensor]) -> list[Probe]:
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

    return [softmaxes, fills]


def _native_probe(logits: list[torch.Tensor], staged_sources: list[torch.Tensor], k: int,
                  targets: torch.Tensor, host_block: bool,
                  regimes: list[dict[str, object]]) -> Probe:
    """The seed's C++ terms in the step's order and with its allocations (with ``host_block``,
    a new log-softmax output on the host first, as a CPU step makes; without, the copy's source
    made once, as a GPU step's device tensor is), then a fresh vector, the copy into it, the
    top-K, the free, so that the allocator meets the regime it meets in the step; no forward,
    no wait, no other arm between them. Each vector's ``mapped`` and minor faults go to
    ``regimes``, read outside the timed construction."""
    rows, vocab = logits[0].shape
    pick, pick_staged = _rotation(logits), _rotation(staged_sources)
    out = lp.LogprobsTensors.empty_host(rows, k)

    def use(vector: native.SeedVector, staged: torch.Tensor) -> tuple[float, float]:
        host = vector.tensor.view(rows, vocab)  # gone with this call, before the free
        copied, _ = _timed(lambda: host.copy_(staged))
        top_k, _ = _timed(lambda: native.gather_logprobs(host, targets, k, *out.tensors()))
        return copied, top_k

    def cycle() -> dict[str, float]:
        found: dict[str, float] = {}
        if host_block:
            scores = pick()
            found["log_softmax"], staged = _timed(
                lambda: torch.log_softmax(scores, dim=-1, dtype=torch.float32))
        else:
            staged = pick_staged()
        faults = resource.getrusage(_FAULTS_OF).ru_minflt
        made, vector = _timed(lambda: native.seed_vector(rows * vocab))
        regimes.append({"minor_faults": resource.getrusage(_FAULTS_OF).ru_minflt - faults,
                        "mapped": vector.mapped})
        copied, top_k = use(vector, staged)
        freed, _ = _timed(vector.free)
        return {**found, "fresh_vector": made, "copy_fresh": copied, "top_k": top_k,
                "free": freed}

    return cycle


def _check(rows: int, vocab: int, k: int, **positive: int) -> None:
    for name, value in (("rows", rows), ("vocab", vocab), *positive.items()):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= vocab:
        raise ValueError(f"k must be an integer in [0, vocab={vocab}], got {k!r}")


class Sampler:
    """The host rates of one ``[rows, vocab]`` cell, one call of every term at a time.

    Its inputs are made once: ``sources`` logits of ``logits_dtype`` (the step's, for the
    log-softmax), read in turn as the step's rounds read theirs, and fp32 copies for the rest,
    as the seed stages them. The first ``warmup`` calls are not kept. The seed's C++ terms are
    left out, with the reason, where it cannot be built. ``host_block``: whether the step it
    stands for has its log-softmax output on the host, alive around the vector (a CPU step);
    False for a GPU step (module docstring).
    """

    def __init__(self, rows: int, vocab: int, k: int, *, seed: int = 0, sources: int = 2,
                 logits_dtype: torch.dtype = torch.float32, warmup: int = 1,
                 host_block: bool = False) -> None:
        _check(rows, vocab, k, sources=sources)
        generator = torch.Generator().manual_seed(seed)
        logits = [(3 * torch.randn(rows, vocab, generator=generator)).to(logits_dtype)
                  for _ in range(sources)]
        targets = torch.randint(0, vocab, (rows,), generator=generator)
        staged = [torch.log_softmax(scores, dim=-1, dtype=torch.float32) for scores in logits]
        self.nbytes, self.warmup, self.calls = rows * vocab * 4, warmup, 0
        self.host_block = host_block
        self.probes = _torch_probes(logits, staged)
        self.unavailable = ""
        self.regimes: list[dict[str, object]] = []  # per C++ cycle: its vector's mapped, faults
        try:
            native.require()
            self.probes.append(_native_probe(logits, staged, k, targets, host_block,
                                             self.regimes))
        except NativeUnavailable as exc:
            self.unavailable = str(exc)
        self.seconds: dict[str, list[float]] = {}
        self.failed = ""  # why a call between rounds raised: no more are taken

    @property
    def kept(self) -> int:
        """Calls kept so far (past the warm-up)."""
        return max(0, self.calls - self.warmup)

    def sample(self) -> None:
        """One call of every term (the C++ cycle's log-softmax is the one kept)."""
        found: dict[str, float] = {}
        for probe in self.probes:
            found.update(probe())
        if self.calls < self.warmup:
            self.regimes.clear()  # kept in step with the kept calls
        else:
            for term, seconds in found.items():
                self.seconds.setdefault(term, []).append(seconds)
        self.calls += 1

    def every(self, rounds: int, repeats: int) -> Callable[[], None]:
        """A between-rounds hook: one call every few rounds, spread over the cell's first
        ``rounds`` (warm-up included), until ``repeats`` are kept."""
        stride = max(1, rounds // (repeats + self.warmup))
        rounds_seen = itertools.count()

        def hook() -> None:
            if next(rounds_seen) % stride or self.kept >= repeats or self.failed:
                return
            try:
                self.sample()
            except Exception as exc:  # the host rates must never cost the rounds their timings
                self.failed = f"{type(exc).__name__}: {exc}"
        return hook

    def rows(self, repeats: int) -> list[dict]:
        """Schema rows, one per kept call and term, after topping up to ``repeats`` calls;
        RuntimeError where a call between the rounds raised."""
        if self.failed:
            raise RuntimeError(f"host rates failed between rounds: {self.failed}")
        while self.kept < repeats:
            self.sample()
        out = []
        for term in TERMS:
            row = {"arm": ARM, "stage": term, "metric": METRIC, "bytes": self.nbytes,
                   "timer": "perf_counter"}
            if term not in self.seconds:
                out.append({**row, "status": "unavailable", "note": self.unavailable})
                continue
            pattern = ("the log-softmax output on the host around the vector, as a CPU step"
                       if self.host_block else "no same-size host block around the vector, as "
                       "a GPU step")
            out += [{**row, "round": i, "seconds": value,
                     **(self.regimes[i] if term == "fresh_vector" else {}),
                     "note": f"after {self.warmup} warm-up; {pattern}"}
                    for i, value in enumerate(self.seconds[term])]
        return out


def measure_rates(rows: int, vocab: int, k: int, *, repeats: int = 5, warmup: int = 1,
                  seed: int = 0, sources: int = 2,
                  logits_dtype: torch.dtype = torch.float32,
                  host_block: bool = False) -> list[dict]:
    """Every term's seconds at ``[rows, vocab]`` with top-``k``, ``repeats`` calls in a row
    after ``warmup``, as schema rows (arm ``host_rates``, metric ``host_rate``): see
    :class:`Sampler`."""
    _check(rows, vocab, k, repeats=repeats)
    return Sampler(rows, vocab, k, seed=seed, sources=sources, logits_dtype=logits_dtype,
                   warmup=warmup, host_block=host_block).rows(repeats)
