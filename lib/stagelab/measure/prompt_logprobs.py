"""Prompt logprobs in chunks: exact, memory-bounded, with top-K, the copy overlapped with compute.

Position ``i`` of a prompt scores token ``prompt_token_ids[i + 1]`` from ``hidden_states[i]``, so a
prompt of ``T`` tokens has ``T - 1`` rows. Computed at once, those rows need ``[T-1, V]`` logits
(and, vLLM V1 style, a fp32 log-softmax of the same shape): gigabytes for long prompts. Here rows
go through in chunks of ``chunk_rows``; each chunk's ``[C, K+1]`` result is copied to one
preallocated host :class:`LogprobsTensors`.

Overlap: on a GPU each chunk's device-to-host copy runs on a side stream into one of two pinned
slot buffers while the next chunk computes. An event guards every host read of a slot, and a slot
is reused only after the host has read it. On a CPU there is nothing to overlap: the same
double-buffer code runs with an engine that copies at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import torch

from stagelab.core import catalogue
from stagelab.core.schema import RowSink
from stagelab.measure import bench, memory, onepass, sweep
from stagelab.measure import logprobs as lp
from stagelab.measure.device import default_device, device_label
from stagelab.measure.shapes import ModelShape, torch_dtype

METHODS = catalogue.arm_names(catalogue.PROMPT)
# Vocabulary entries per tile of the head-fused method: its extra memory is about
# chunk x tile x HEAD_TILE_TEMP_BYTES, a small share of one chunk's [C, V] logits.
HEAD_TILE = 1024
# Per element of a [C, tile] logits tile, at its largest moment (its keys formed, by the torch
# fold): the tile in the model's dtype and its fp32 copy (counted apart: none for fp32 logits),
# the int32 ordered bits (4) and the int64 keys made from them (8). Was 21 (an int64 temporary
# and a comparison counted too): probes measured 0.60-0.63x of that model, tiles 1024-4096.
HEAD_TILE_TEMP_BYTES = 12
# Columns of the product that gives the targets' logits (weight rows gathered: TARGET_COLUMNS x H).
TARGET_COLUMNS = 256
LmHead: TypeAlias = "torch.Tensor | Callable[[torch.Tensor], torch.Tensor]"


# --------------------------------------------------------------------------------- copying

class Waitable(Protocol):
    def synchronize(self) -> None: ...


class CopyEngine(Protocol):
    """Starts a copy of device results into a host slot; the returned event completes with it."""

    def launch(self, dst: lp.LogprobsTensors, src: lp.LogprobsTensors) -> Waitable: ...


class _Done:
    def synchronize(self) -> None:
        return None


class ImmediateEngine:
    """Copies at once (CPU, or a GPU without overlap): the event is already complete."""

    def launch(self, dst: lp.LogprobsTensors, src: lp.LogprobsTensors) -> Waitable:
        dst.copy_(src)
        return _Done()


class CudaStreamEngine:
    """Copies on a side stream after the compute stream's work; records an event per copy."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def launch(self, dst: lp.LogprobsTensors, src: lp.LogprobsTensors) -> Waitable:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        for tensor in src.tensors():  # keep the device results alive until the copy is done
            tensor.record_stream(self.stream)
        return event


class DoubleBufferCopier:
    """Moves each chunk's results through two host slots into the output.

    ``submit(i)`` starts chunk ``i``'s copy into slot ``i % 2``, then drains chunk ``i - 1``: waits
    on its event and only then reads its slot into the output. Slot ``i % 2`` was last used by
    chunk ``i - 2``, drained during ``submit(i - 1)``, so no slot is overwritten before it was read.
    """

    def __init__(self, engine: CopyEngine, chunk_rows: int, num_logprobs: int,
                 pinned: bool) -> None:
        self.engine = engine
        self.slots = [lp.LogprobsTensors.empty_host(chunk_rows, num_logprobs, pinned=pinned)
                      for _ in range(2)]
        self.submitted = 0
        self.pending: tuple[Waitable, lp.LogprobsTensors, lp.LogprobsTensors] | None = None

    def submit(self, result: lp.LogprobsTensors, dest: lp.LogprobsTensors) -> None:
        slot = self.slots[self.submitted % 2].rows(0, result.selected_token_ranks.shape[0])
        event = self.engine.launch(slot, result)
        self.drain()
        self.pending = (event, slot, dest)
        self.submitted += 1

    def drain(self) -> None:
        """Wait for the pending chunk's copy, then read its slot into the output."""
        if self.pending is not None:
            event, slot, dest = self.pending
            event.synchronize()
            dest.copy_(slot)
            self.pending = None


class DirectCopier:
    """No overlap: each chunk's results are copied straight into the output, synchronously."""

    def submit(self, result: lp.LogprobsTensors, dest: lp.LogprobsTensors) -> None:
        dest.copy_(result)

    def drain(self) -> None:
        return None


# ---------------------------------------------------------------------------------- checks

def _check_prompt(hidden_states: torch.Tensor, lm_head: LmHead, prompt_token_ids: torch.Tensor,
                  validate: bool = True) -> tuple[int, int, int, torch.dtype]:
    """Shapes and types, and (``validate``) the ids' range, with one host wait; returns
    ``(T, H, V, logits dtype)``. A callable head is called on one row to learn V and the
    logits' dtype."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2:
        shape = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else None
        raise ValueError(f"hidden_states must be a 2-D [T, H] tensor, got {shape}")
    if not hidden_states.is_floating_point():
        raise TypeError(f"hidden_states must be floating point, got {hidden_states.dtype}")
    lp.check_has_data(hidden_states, "hidden_states")
    tokens, hidden = hidden_states.shape
    if tokens <= 1:
        raise ValueError(f"hidden_states: a prompt needs T >= 2 tokens to score any position, "
                         f"got T={tokens}")
    if isinstance(lm_head, torch.Tensor):
        if lm_head.dim() != 2 or lm_head.shape[1] != hidden:
            raise ValueError(f"lm_head must be a [V, {hidden}] weight to match hidden_states, "
                             f"got shape {tuple(lm_head.shape)}")
        if lm_head.dtype != hidden_states.dtype or lm_head.device != hidden_states.device:
            raise TypeError(f"lm_head is {lm_head.dtype} on {lm_head.device} but hidden_states "
                            f"is {hidden_states.dtype} on {hidden_states.device}")
        lp.check_has_data(lm_head, "lm_head")
        vocab, dtype = lm_head.shape[0], lm_head.dtype
    elif callable(lm_head):
        probe = lm_head(hidden_states[:1])
        if not isinstance(probe, torch.Tensor) or probe.dim() != 2 or probe.shape[0] != 1:
            raise ValueError("lm_head callable must map [rows, H] hidden states to [rows, V] "
                             f"logits; for one row it returned {getattr(probe, 'shape', probe)}")
        if probe.requires_grad:
            raise ValueError("lm_head callable returns logits that require grad: call "
                             "prompt_logprobs under torch.no_grad()")
        vocab, dtype = probe.shape[1], probe.dtype
    else:
        raise TypeError(f"lm_head must be a [V, H] tensor or a callable, not "
                        f"{type(lm_head).__name__}")
    if validate:
        lp.check_token_ids(prompt_token_ids, tokens, vocab, name="prompt_token_ids")
    else:
        lp.check_token_ids_shape(prompt_token_ids, tokens, name="prompt_token_ids")
    return tokens, hidden, vocab, dtype


def _check_chunk(chunk_rows: int | None) -> int | None:
    """A positive int (numpy integers too) or None; returned as a Python int or None."""
    if chunk_rows is None:
        return None
    try:
        chunk = lp.as_int(chunk_rows, "chunk_rows")
    except TypeError:
        chunk = 0
    if chunk <= 0:
        raise ValueError(f"chunk_rows must be a positive int or None (unchunked), got "
                         f"{chunk_rows!r}")
    return chunk


# ------------------------------------------------------------------------------------- main

def prompt_logprobs(hidden_states: torch.Tensor, lm_head: LmHead,
                    prompt_token_ids: torch.Tensor, num_logprobs: int,
                    chunk_rows: int | None, *, method: str = catalogue.FUSED, overlap: bool = True,
                    copy_engine: CopyEngine | None = None,
                    validate: bool = True, tile: int = HEAD_TILE) -> lp.LogprobsTensors:
    """Host ``LogprobsTensors`` of ``[T-1, K+1]``: row ``i`` scores ``prompt_token_ids[i+1]``.

    ``lm_head`` is a ``[V, H]`` weight or a callable from hidden rows to logits.
    ``chunk_rows=None`` computes every row at once (the reference). ``method="logsoftmax"``
    builds a fp32 log-softmax per chunk (vLLM V1); the fused method (``catalogue.FUSED``) uses
    :func:`stagelab.measure.logprobs.logprobs_from_logits`; ``method="head_fused"``
    (``catalogue.HEAD_FUSED``, a ``[V, H]`` weight only) never forms a chunk's ``[C, V]``
    logits: it multiplies the chunk by ``tile`` rows of the weight at a time and folds each
    ``[C, tile]`` block into running per-row statistics (:func:`_head_fused_chunk`).
    ``copy_engine`` replaces the copy mechanism
    of the overlapped path (tests inject one that delays copies). A configuration whose predicted
    peak exceeds free memory is refused before anything large is allocated.

    Host waits: the prompt's ids are checked once, before the chunk loop; each chunk flags its
    bad rows (NaN, or for ``fused`` a logsumexp that is not finite) on the device, and the flags
    are read once, after the last copy: two waits per prompt, whatever the number of chunks, so
    nothing stops the host between chunks. ``validate=False`` skips both, for inputs already
    validated.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    chunk_rows = _check_chunk(chunk_rows)
    tile = _check_tile(tile)
    if method == catalogue.HEAD_FUSED and not isinstance(lm_head, torch.Tensor):
        raise TypeError(f"lm_head must be a [V, H] weight tensor for method "
                        f"{catalogue.HEAD_FUSED!r}: it multiplies the weight one vocabulary "
                        f"tile at a time (got {type(lm_head).__name__})")
    tokens, hidden, vocab, dtype = _check_prompt(hidden_states, lm_head, prompt_token_ids,
                                                 validate)
    num_logprobs = lp.check_num_logprobs(num_logprobs, vocab)
    rows = tokens - 1
    chunk = rows if chunk_rows is None else min(chunk_rows, rows)
    device = hidden_states.device
    predicted = predicted_peak_bytes(tokens, vocab, chunk, dtype, method, num_logprobs, tile,
                                     hidden)
    try:
        memory.check_fits(predicted, memory.free_device_bytes(device) if device.type == "cuda"
                          else memory.free_host_bytes(), f"prompt logprobs, chunk_rows={chunk}")
    except memory.InsufficientMemory as exc:
        raise memory.InsufficientMemory(f"{exc}; choose a smaller chunk_rows") from None
    on_gpu = device.type == "cuda"
    out = lp.LogprobsTensors.empty_host(rows, num_logprobs, pinned=on_gpu)
    copier: DoubleBufferCopier | DirectCopier
    if overlap:
        engine = copy_engine or (CudaStreamEngine(device) if on_gpu else ImmediateEngine())
        copier = DoubleBufferCopier(engine, chunk, num_logprobs, pinned=on_gpu)
    else:
        copier = DirectCopier()
    targets = prompt_token_ids[1:].to(device=device, dtype=torch.int64)
    bad_rows = torch.zeros(rows, dtype=torch.bool, device=device)
    score = _fused_chunk if method == catalogue.FUSED else _logsoftmax_chunk
    for start in range(0, rows, chunk):
        end = min(start + chunk, rows)
        if method == catalogue.HEAD_FUSED and isinstance(lm_head, torch.Tensor):  # checked above
            result = _head_fused_chunk(hidden_states[start:end], lm_head, num_logprobs,
                                       targets[start:end], bad_rows[start:end], validate, tile)
            copier.submit(result, out.rows(start, end))
            continue
        logits = _project(hidden_states[start:end], lm_head)
        copier.submit(score(logits, num_logprobs, targets[start:end], bad_rows[start:end],
                            validate), out.rows(start, end))
        del logits  # nothing of this chunk may outlive it: the next chunk's logits reuse its memory
    copier.drain()
    if validate:
        lp.raise_bad_rows(bad_rows, BAD_ROWS[method])
    return out


BAD_ROWS = {catalogue.FUSED: "logits contain NaN, +inf, or only -inf",
            catalogue.HEAD_FUSED: "logits contain NaN, +inf, or only -inf",
            "logsoftmax": "logprobs contain NaN"}


def _check_tile(tile: int) -> int:
    """A positive int (numpy integers too): the head-fused method's vocabulary tile."""
    try:
        value = lp.as_int(tile, "tile")
    except TypeError:
        value = 0
    if value <= 0:
        raise ValueError(f"tile must be a positive int, got {tile!r}")
    return value


def _project(hidden_rows: torch.Tensor, lm_head: LmHead) -> torch.Tensor:
    return hidden_rows @ lm_head.T if isinstance(lm_head, torch.Tensor) else lm_head(hidden_rows)


def _fused_chunk(logits: torch.Tensor, num_logprobs: int, targets: torch.Tensor,
                 bad_rows: torch.Tensor, validate: bool) -> lp.LogprobsTensors:
    """One chunk of the fused path, its temporaries within a share of the chunk's logits
    (:func:`stagelab.measure.logprobs.bounded_budget`); flags its bad rows into ``bad_rows`` (no host
    wait)."""
    rows, vocab = logits.shape
    result, lse = lp.fused_unchecked(logits, num_logprobs, targets,
                                     lp.bounded_budget(rows, vocab, logits.element_size()))
    if validate:
        torch.logical_not(torch.isfinite(lse), out=bad_rows)
    return result


def _head_fused_chunk(hidden_rows: torch.Tensor, weight: torch.Tensor, num_logprobs: int,
                      targets: torch.Tensor, bad_rows: torch.Tensor, validate: bool,
                      tile: int) -> lp.LogprobsTensors:
    """One chunk without its ``[C, V]`` logits: ``tile`` vocabulary rows of the weight at a
    time, each ``[C, tile]`` block folded into per-row running statistics (max, rescaled sum,
    the best K as :mod:`stagelab.measure.onepass` keys, the logits above and equal to the
    target's) by a :class:`stagelab.measure.onepass.TileFold`: on a GPU the one-pass kernel's
    state merge, on a CPU torch (:func:`stagelab.measure.onepass.fold_backend`). The targets'
    logits come first, from a product of the same shape as a tile's (:func:`_target_logits`),
    so that the counts compare like with like."""
    rows, vocab = hidden_rows.shape[0], weight.shape[0]
    device = hidden_rows.device
    target = _target_logits(hidden_rows, weight, targets, min(tile, vocab, TARGET_COLUMNS))
    fold = onepass.TileFold(rows, num_logprobs, target[:, 0], device,
                            onepass.fold_backend(device))
    for start in range(0, vocab, tile):
        fold.add(hidden_rows @ weight[start:start + tile].T, start)
    found = fold.finish()
    if validate:
        torch.logical_not(torch.isfinite(found.logsumexp), out=bad_rows)
    return found.into(lp.LogprobsTensors.empty(rows, num_logprobs, device), targets)


def _target_logits(hidden_rows: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   width: int) -> torch.Tensor:
    """fp32 ``[C, 1]``: each row's logit of its target, from products of the chunk with
    ``width`` gathered weight rows (the targets', padded): a product as wide as a tile's (up to
    :data:`TARGET_COLUMNS`), because a narrower one (a dot product for one row, or a few
    columns) may take another BLAS path and round the target's logit differently from the tile
    that holds it (7 columns did here; 64 and more matched)."""
    found = torch.empty(targets.numel(), dtype=torch.float32, device=hidden_rows.device)
    for start in range(0, targets.numel(), width):
        picked = targets[start:start + width]
        index = torch.cat([picked, picked.new_zeros(width - picked.numel())])
        product = hidden_rows[start:start + width] @ weight[index].T
        found[start:start + width] = product.diagonal()[:picked.numel()].float()
    return found[:, None]


def _logsoftmax_chunk(logits: torch.Tensor, num_logprobs: int, targets: torch.Tensor,
                      bad_rows: torch.Tensor, validate: bool) -> lp.LogprobsTensors:
    """One chunk of vLLM V1's path; flags its NaN rows into ``bad_rows`` (no host wait)."""
    logprobs = lp.compute_logprobs(logits)
    if validate:
        bad_rows.copy_(lp.nan_rows(logprobs))
    return lp.gather_unchecked(logprobs, num_logprobs, targets)


def predicted_peak_bytes(tokens: int, vocab: int, chunk: int | None, dtype: torch.dtype,
                         method: str, num_logprobs: int = 0, tile: int = HEAD_TILE,
                         hidden: int = 0) -> int:
    """Analytic peak of :func:`prompt_logprobs`' working memory beyond its inputs, in bytes.

    Per chunk of ``chunk`` rows (``None``: all ``tokens - 1`` rows) the logits ``C x V`` in
    ``dtype``, and:

    * ``logsoftmax``: the fp32 log-softmax (4 bytes per element), then at the larger of two
      moments either the fp32 upcast of half-precision logits (4) or the rank's comparison, a
      bool (1) whose sum casts it to int64 (8): ``C x V x (4 + max(upcast, 9))``;
    * ``fused``: the same temporaries for one block of :func:`stagelab.measure.logprobs.block_rows` rows
      within :func:`stagelab.measure.logprobs.bounded_budget` of the chunk: ``B x V x max(4 + upcast, 9)``;
    * ``head_fused``: no ``[C, V]`` logits; one ``[C, tile]`` block in ``dtype``, its fp32
      upcast and its temporaries (:data:`HEAD_TILE_TEMP_BYTES`), the running and the tile's
      top-K keys (each twice over: merged, and sorted), the targets' product and their gathered
      weight rows (``hidden`` wide; 0 leaves it out).

    Plus the results: the chunk's device results, the host output ``(T-1) x (K+1)`` and two host
    slots; and the bad-row flags, one bool per row.
    """
    rows = tokens - 1
    chunk = rows if chunk is None else min(chunk, rows)
    itemsize = torch.empty((), dtype=dtype).element_size()
    upcast = 0 if dtype == torch.float32 else 4
    result_row = (num_logprobs + 1) * 8 + 4
    if method == catalogue.HEAD_FUSED:
        width, columns = min(tile, vocab), min(tile, vocab, TARGET_COLUMNS)
        working = (chunk * width * (itemsize + upcast + HEAD_TILE_TEMP_BYTES)
                   + chunk * 4 * num_logprobs * 8 + columns * (chunk + hidden) * itemsize)
        return working + result_row * (chunk + rows + 2 * chunk) + rows
    if method == "logsoftmax":
        working = chunk * vocab * (4 + max(upcast, lp.BLOCK_TEMP_BYTES))
    elif method == catalogue.FUSED:
        block = lp.block_rows(chunk, vocab, itemsize, lp.bounded_budget(chunk, vocab, itemsize))
        working = block * vocab * max(4 + upcast, lp.BLOCK_TEMP_BYTES)
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    flags = rows
    return (chunk * vocab * itemsize + working + result_row * (chunk + rows + 2 * chunk)
            + flags)


# ------------------------------------------------------------------------------ measurement

def make_inputs(tokens: int, vocab: int, hidden: int, dtype: torch.dtype, seed: int = 0,
                device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random hidden states ``[T, H]``, an lm_head weight ``[V, H]`` and prompt ids ``[T]``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    scale = hidden ** -0.5
    hidden_states = torch.randn(tokens, hidden, device=device, generator=generator).to(dtype)
    weight = (3 * scale * torch.randn(vocab, hidden, device=device, generator=generator)).to(dtype)
    ids = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    return hidden_states, weight, ids


def memory_probe(sizes: Mapping[str, Any], method: str, chunk: int | None, overlap: bool,
                 tile: int = HEAD_TILE, seed: int = 0, device: str = "cpu"
                 ) -> Callable[[], object]:
    """For :func:`stagelab.measure.memory.measure_peak`: build the inputs of a prompt of
    ``sizes`` (``tokens``, ``vocab``, ``hidden``, ``dtype`` by name, ``k``), return the call of
    one configuration to measure."""
    hidden_states, weight, ids = make_inputs(sizes["tokens"], sizes["vocab"], sizes["hidden"],
                                             torch_dtype(sizes["dtype"]), seed, device)
    return lambda: prompt_logprobs(hidden_states, weight, ids, sizes["k"], chunk, method=method,
                                   overlap=overlap, tile=tile)


def agreement_records(result: lp.LogprobsTensors, reference: lp.LogprobsTensors) -> list[dict]:
    """How far a chunked result is from the unchunked one of the same method."""
    same_ids = result.logprob_token_ids == reference.logprob_token_ids
    return [
        {"metric": "max_abs_error",
         "value": float((result.logprobs - reference.logprobs).abs().max())},
        {"metric": "id_mismatches", "value": float((~same_ids).sum())},
        {"metric": "rank_mismatches", "value": float(
            (result.selected_token_ranks != reference.selected_token_ranks).sum())},
        {"metric": "bitwise_equal", "value": float(
            torch.equal(result.logprobs, reference.logprobs) and bool(same_ids.all())
            and torch.equal(result.selected_token_ranks, reference.selected_token_ranks))},
    ]


def check_measure_parameters(tokens: int, vocab: int, chunks: list[int], k: int,
                             methods: list[str], overlaps: list[bool],
                             tiles: list[int] | None = None) -> None:
    """Every parameter of :func:`measure`, checked before anything is allocated."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2:
        raise ValueError(f"tokens: a prompt needs T >= 2 tokens to score any position, got "
                         f"{tokens!r}")
    for name, values in (("methods", methods), ("overlaps", overlaps), ("chunks", chunks)):
        if not values:
            raise ValueError(f"{name} is empty")
    for method in methods:
        if method not in METHODS:
            raise ValueError(f"methods: unknown method {method!r}; valid: {', '.join(METHODS)}")
    for overlap in overlaps:
        if not isinstance(overlap, bool):
            raise ValueError(f"overlaps: {overlap!r} is not true or false")
    for chunk in chunks:
        _check_chunk(chunk)
    if tiles is not None and not tiles:
        raise ValueError("tiles is empty")
    for tile in tiles or []:
        _check_tile(tile)
    lp.check_num_logprobs(k, vocab)


Config = tuple[str, int, bool, "int | None"]  # (method, chunk, overlap, tile: head_fused only)


def configurations(rows: int, chunks: list[int], methods: list[str], overlaps: list[bool],
                   tiles: list[int] | None = None) -> dict[str, Config]:
    """Every ``(method, chunk, overlap, tile)`` to run, by a key naming it; the unchunked
    reference of each method first, and a chunk of ``rows`` or more counted as unchunked.

    The tile is the head-fused method's alone (None for the others; ``tiles`` None: the
    default :data:`HEAD_TILE`). Its first tile runs as the other methods do; each further tile
    at the chunks shorter than the prompt, with the first overlap only (where no chunk is
    shorter, unchunked): a tile changes the products, overlap only each chunk's ``[C, K+1]``
    copy, and the tiles are compared at a chunk. Each tile's unchunked reference is computed
    for the exactness checks all the same (:func:`measure`), untimed."""
    chunked = [c for c in dict.fromkeys(chunks) if c < rows]
    swept = list(dict.fromkeys(overlaps))
    found: dict[str, Config] = {}
    for method in methods:
        tiled = method == catalogue.HEAD_FUSED
        for index, tile in enumerate(dict.fromkeys(tiles or [HEAD_TILE]) if tiled else [None]):
            for chunk in [rows, *chunked] if index == 0 else (chunked or [rows]):
                for overlap in swept if index == 0 else swept[:1]:
                    key = f"{catalogue.prompt_arm(method, overlap)}@{chunk}"
                    found[key if tile is None else f"{key}/tile{tile}"] = (method, chunk,
                                                                           overlap, tile)
    return found


def probed(configs: dict[str, Config], overlaps: list[bool]) -> list[str]:
    """The configurations whose peak memory is measured: those with the first overlap (overlap
    changes only two small host slots), one per ``(method, chunk, tile)``."""
    return [key for key, (_, _, overlap, _) in configs.items() if overlap == overlaps[0]]


@dataclass(frozen=True)
class PromptSweep:
    """What a prompt-logprob sweep measures and how, fixed once (checked when built,
    :func:`check_measure_parameters`): one prompt of ``tokens`` on ``shape``'s vocabulary with
    ``hidden`` states, every ``(method, chunk, overlap, tile)`` configuration
    (:func:`configurations`; ``tiles``: the head-fused method's, None: its default), ``rounds``
    timed after ``warmup`` in an order seeded by ``seed``, and each configuration's peak memory
    where ``measure_memory``."""

    tokens: int
    shape: ModelShape
    hidden: int
    chunks: Sequence[int]
    dtype: torch.dtype
    k: int
    methods: Sequence[str]
    overlaps: Sequence[bool]
    tiles: Sequence[int] | None = None
    rounds: int = 3
    warmup: int = 1
    seed: int = 0
    measure_memory: bool = True

    def __post_init__(self) -> None:
        check_measure_parameters(self.tokens, self.shape.vocab, list(self.chunks), self.k,
                                 list(self.methods), list(self.overlaps),
                                 None if self.tiles is None else list(self.tiles))

    def configurations(self) -> dict[str, Config]:
        """Every configuration to run, by key (:func:`configurations`)."""
        return configurations(self.tokens - 1, list(self.chunks), list(self.methods),
                              list(self.overlaps), None if self.tiles is None else list(self.tiles))


def prompt_cell(spec: PromptSweep, device: str | None = None) -> sweep.Cell:
    """The sweep's one cell (one prompt; the configurations are its arms), with the memory its
    largest configuration needs: the inputs and the predicted peak."""
    device = device or default_device()
    configs = spec.configurations()
    tokens, shape, hidden, dtype = spec.tokens, spec.shape, spec.hidden, spec.dtype
    itemsize = torch.empty((), dtype=dtype).element_size()
    inputs_bytes = (tokens + shape.vocab) * hidden * itemsize
    peak = max(predicted_peak_bytes(tokens=tokens, vocab=shape.vocab, chunk=c, dtype=dtype,
                                    method=m, num_logprobs=spec.k, tile=t or HEAD_TILE,
                                    hidden=hidden)
               for m, c, _, t in configs.values())
    on_cpu = torch.device(device).type == "cpu"
    return sweep.Cell(
        sizes=dict(experiment=catalogue.PROMPT, device=device_label(device), model=shape.model,
                   rows=tokens - 1, vocab=shape.vocab, hidden=hidden, k=spec.k,
                   dtype=str(dtype).removeprefix("torch.")),
        arms=list(configs), label=f"T={tokens} V={shape.vocab} H={hidden}",
        host_bytes=inputs_bytes + peak if on_cpu else 0,
        device_bytes=0 if on_cpu else inputs_bytes + peak)


def memory_plan(spec: PromptSweep, device: str | None = None) -> str:
    """What :func:`measure` of ``spec`` needs in memory at its largest configuration, against
    what is free now, in Markdown: said before the notebook's cell allocates anything."""
    device = device or default_device()
    return sweep.memory_plan(prompt_cell(spec, device), device)


def measure(spec: PromptSweep, *, device: str | None = None, sink: RowSink | None = None,
            progress: bool = True) -> list[dict]:
    """Time, measure and check every ``(method, chunk, overlap, tile)`` configuration of one
    prompt (:func:`configurations`; ``tiles``: the head-fused method's, a row's ``tile``).

    The configurations are the arms of one sweep cell, interleaved. The unchunked configuration of
    each method (and tile) always runs as the reference; a chunk of ``T - 1`` rows or more is
    unchunked and runs once. Exactness is checked on each configuration's result from its last
    timed round, against the unchunked result of the same method and tile.
    Memory is measured in a fresh process per ``(method, chunk)`` for the first of ``overlaps``
    (see :mod:`stagelab.measure.memory`): a process costs seconds, and overlap changes only two small host
    slots. The probes run after the timing, so they never load a timed call; on a CPU side by
    side where cores and free memory allow (:func:`probe_parallelism`).
    """
    device = device or default_device()
    cell = prompt_cell(spec, device)
    tokens, shape, hidden, dtype, k = spec.tokens, spec.shape, spec.hidden, spec.dtype, spec.k
    seed, overlaps = spec.seed, list(spec.overlaps)
    rows = tokens - 1
    configs = spec.configurations()

    def prepare(_cell: sweep.Cell) -> sweep.CellPlan:
        hidden_states, weight, ids = make_inputs(tokens, shape.vocab, hidden, dtype, seed, device)
        lp.check_token_ids(ids, tokens, shape.vocab, "prompt_token_ids")  # once, not when timed
        last: dict[Config, lp.LogprobsTensors] = {}

        def run(config: Config) -> lp.LogprobsTensors:
            method, chunk, overlap, tile = config
            last.pop(config, None)  # freed before the call, as when nothing was kept
            last[config] = prompt_logprobs(hidden_states, weight, ids, k, chunk, method=method,
                                           overlap=overlap, validate=False,
                                           tile=tile or HEAD_TILE)
            return last[config]

        def result(config: Config) -> lp.LogprobsTensors:
            """The configuration's result from its last timed round (computed where none)."""
            return last[config] if config in last else run(config)

        def after() -> list[dict]:
            families = dict.fromkeys((m, t) for m, _, _, t in configs.values())
            references = {(m, t): result((m, rows, False, t)) for m, t in families}
            records = []
            for key, (method, chunk, overlap, tile) in configs.items():
                found = agreement_records(result((method, chunk, overlap, tile)),
                                          references[(method, tile)])
                found.append({"metric": "predicted_peak_bytes", "bytes": predicted_peak_bytes(
                    tokens=tokens, vocab=shape.vocab, chunk=chunk, dtype=dtype, method=method,
                    num_logprobs=k, tile=tile or HEAD_TILE, hidden=hidden)})
                records += [annotate({"arm": key, **record}) for record in found]
            measured = probed(configs, overlaps) if spec.measure_memory else []
            sizes = dict(tokens=tokens, vocab=shape.vocab, hidden=hidden, k=k,
                         dtype=str(dtype).removeprefix("torch."))
            probes = [dict(sizes=sizes, method=configs[key][0], chunk=configs[key][1],
                           overlap=configs[key][2], tile=configs[key][3] or HEAD_TILE,
                           seed=seed, device=device) for key in measured]
            parallel = probe_parallelism(device, cell.host_bytes, len(probes))
            told = sweep.cell_progress()
            probed_so_far = (None if told is None else lambda done, total: told.say(
                cell, f"memory probe {done}/{total} done"))
            for key, found in zip(measured, _memory_records(probes, parallel, probed_so_far)):
                records += [annotate({"arm": key, **record}) for record in found]
            return records

        def timed(config: Config) -> bench.ArmCall:
            return lambda _round: run(config)

        told = sweep.cell_progress()  # a line now and then: one cell of many configurations
        return sweep.CellPlan(calls={key: timed(c) for key, c in configs.items()},
                              annotate=annotate, after=after,
                              between_calls=told.call(_cell) if told else None)

    def annotate(record: dict) -> dict:
        if record["arm"] not in configs:  # a record of the sweep itself (the order's seed)
            return record
        method, chunk, overlap, tile = configs[record["arm"]]
        return {**record, "arm": catalogue.prompt_arm(method, overlap), "chunk": chunk,
                "overlap": overlap, "tile": tile}

    return sweep.run([cell], prepare, rounds=spec.rounds, warmup=spec.warmup, seed=seed,
                     device=device, sink=sink, label="prompt logprobs", progress=progress)


# A probe process's own footprint beside the cell's inputs and peak: the interpreter and torch.
PROBE_PROCESS_BYTES = 512 * 2**20


def probe_parallelism(device: str, cell_host_bytes: int, probes: int) -> int:
    """How many memory probes may run side by side: on a CPU, one per usable core and no more
    than fit in free host memory (each holds the cell's inputs and peak plus its own process);
    on a GPU one, since the probes would share the device."""
    if probes < 2 or torch.device(device).type != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    free = memory.free_host_bytes()
    fitting = probes if free is None else int(0.9 * free) // (cell_host_bytes + PROBE_PROCESS_BYTES)
    return max(1, min(probes, cores or 1, fitting))


def _memory_records(configs: list[dict], parallel: int,
                    finished: Callable[[int, int], None] | None = None) -> list[list[dict]]:
    """Each configuration's memory records, from probe processes ``parallel`` at a time
    (``finished``: told as each probe ends)."""
    peaks = memory.measure_peaks(memory_probe, configs, parallel, finished=finished)
    return [_peak_records(peak) for peak in peaks]


def _peak_records(peak: dict) -> list[dict]:
    note = "" if peak["hwm_reset"] else "VmHWM could not be reset: includes set-up"
    rows = [{"metric": "peak_host_bytes", "bytes": peak["host_extra_bytes"], "note": note},
            {"metric": "pinned_bytes_held", "bytes": peak["pinned_host_bytes"]}]
    if peak["device_extra_bytes"] is not None:
        rows.append({"metric": "peak_device_bytes", "bytes": peak["device_extra_bytes"]})
    return rows
