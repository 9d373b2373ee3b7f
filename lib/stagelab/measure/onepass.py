"""Top-K, logsumexp, the target's logprob and its rank from ``[n, V]`` logits in one read.

log-softmax is monotonic per row, so everything a logprobs request needs comes from the raw
logits and one per-row logsumexp: :func:`topk_logprobs` returns the top-K logprobs (descending,
ties by lower token id), their ids, the logsumexp, and the target's logprob and rank.

The rank's tie convention is vLLM's (V1's ``batched_count_greater_than``, MRv2's
``_ranks_kernel``): the number of logits **greater than or equal to** the target's, itself
included, so a target tied with others ranks behind all of them (1 is a target above every
other logit). ``target_ties`` counts the logits equal to it, and :meth:`OnePass.rank_strict`
gives the other convention, 1 + the logits strictly greater.

Two backends give the same answer:

* ``"triton"`` (:mod:`stagelab.measure.onepass_triton`): one kernel reads each logit once,
  keeping per row a running max, the rescaled sum of exponentials and a small top-K over
  vocabulary tiles; for few rows, each row is split across programs, so that every SM has
  work, and the row's last program to end merges their partial states. It runs on a CUDA
  device, or on a CPU in Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton is
  first imported).
* ``"torch"``: the same keys in eager torch, in row blocks of bounded memory; the reference the
  tests hold the kernel to, and the fallback where Triton is absent or cannot run (said in a
  ``RuntimeWarning`` and in the result's ``backend``).

Order and ties: each logit becomes a unique int64 key, its value's bits in an order-preserving
integer form above the complement of its id, so "larger value, then lower id" is one integer
comparison and top-K is exact and deterministic on both backends (``-0.0`` counts as ``0.0``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from stagelab.core import catalogue, schema
from stagelab.core.launches import (
    Launch,
    device_slots,
    finish_launch,
    fold_launch,
    pow2_at_least,
    triton_launches,
)
from stagelab.measure import logprobs as lp

BACKENDS = ("triton", "torch")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_K = 1024  # the kernel's top-K lives in registers: 1024 int64 keys per program at most
ID_MASK = 0xFFFFFFFF
# The torch backend's temporaries per element of a row block: the fp32 values (4), their int64
# keys (8) and the int32 temporary they are formed from (4), the exponentials (4), a comparison (1).
TORCH_TEMP_BYTES = 21
TORCH_BLOCK_BYTES = 256 << 20
BAD_ROWS = "logits contain NaN, +inf, or only -inf"  # the fused path's words (logprobs.py)


@dataclass(frozen=True)
class OnePass:
    """One call's results, on the logits' device. ``values`` fp32 ``[n, k]`` (logprobs,
    descending, ties by lower id) and ``ids`` int64 ``[n, k]``; ``logsumexp`` fp32 ``[n]``;
    with targets, ``target_logprob`` fp32 ``[n]``, ``target_rank`` int64 ``[n]`` (vLLM's: the
    logits ``>=`` the target's, itself included) and ``target_ties`` int64 ``[n]`` (the logits
    equal to it, itself included), else None; ``backend``: the backend that ran."""

    values: torch.Tensor
    ids: torch.Tensor
    logsumexp: torch.Tensor
    target_logprob: torch.Tensor | None
    target_rank: torch.Tensor | None
    target_ties: torch.Tensor | None
    backend: str

    def rank_strict(self) -> torch.Tensor:
        """The other tie convention: 1 + the logits strictly greater than the target's (a tied
        target ranks ahead of the logits it ties); ``target_rank`` is vLLM's."""
        if self.target_rank is None or self.target_ties is None:
            raise ValueError("rank_strict needs the targets: call with targets=")
        return self.target_rank - self.target_ties + 1

    def into(self, out: lp.LogprobsTensors, targets: torch.Tensor) -> lp.LogprobsTensors:
        """Write these results into ``[n, K+1]`` :class:`LogprobsTensors` (column 0 the
        target, its rank vLLM's, as ``target_rank``); returns ``out``."""
        if self.target_logprob is None or self.target_rank is None:
            raise ValueError("into needs the targets: call with targets=")
        out.logprob_token_ids[:, 0] = targets
        out.logprob_token_ids[:, 1:] = self.ids
        out.logprobs[:, 0] = self.target_logprob
        out.logprobs[:, 1:] = self.values
        out.selected_token_ranks.copy_(self.target_rank)
        return out


# ------------------------------------------------------------------------------------ checks

def check_arguments(logits: torch.Tensor, k: int, targets: torch.Tensor | None, backend: str,
                    tile: int | None, splits: int | None) -> tuple[int, int, int]:
    """Every argument of :func:`topk_logprobs` that needs no look at the data, before anything
    is allocated: ``(n, V, k)``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    rows, vocab = lp.check_scores(logits, "logits")
    if logits.dtype not in DTYPES:
        raise TypeError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    if vocab > 2**31 - 1:
        raise ValueError(f"logits: a vocabulary of {vocab} does not fit the kernel's int32 ids")
    k = lp.as_int(k, "k")
    if not 0 <= k <= min(vocab, MAX_K):
        raise ValueError(f"k must be in [0, {min(vocab, MAX_K)}] (at most the vocabulary and "
                         f"{MAX_K}), got {k}")
    if targets is not None:
        lp.check_token_ids_shape(targets, rows, "targets")
    for name, value in (("tile", tile), ("splits", splits)):
        if value is not None and (lp.as_int(value, name) < 1):
            raise ValueError(f"{name} must be a positive int or None, got {value}")
    if tile is not None and tile & (tile - 1):
        raise ValueError(f"tile must be a power of two, got {tile}")
    return rows, vocab, k


# ------------------------------------------------------------------------------------- main

def topk_logprobs(logits: torch.Tensor, k: int, targets: torch.Tensor | None = None, *,
                  backend: str = "triton", validate: bool = True, tile: int | None = None,
                  splits: int | None = None) -> OnePass:
    """Top-``k`` logprobs, logsumexp and (with ``targets``, one id per row) the target's logprob
    and rank of fp32/bf16/fp16 ``[n, V]`` logits, in one read, with fp32 accumulation.

    ``-inf`` logits are allowed (a row needs one finite logit). With ``validate``, targets out
    of ``[0, V)`` are refused before anything runs, and rows whose logsumexp is not finite (NaN,
    +inf, or only -inf) raise afterwards, naming the rows, as the fused path does (one host read
    each); ``validate=False`` skips both. ``tile`` (a power of two) and ``splits`` (slices per
    row, at most the row's tiles and :data:`stagelab.core.launches.MAX_SLICES`) tune the
    Triton kernel (None: chosen from the device); the torch backend ignores them.
    """
    rows, vocab, k = check_arguments(logits, k, targets, backend, tile, splits)
    if targets is not None and validate:
        lp.check_token_ids(targets, rows, vocab, "targets")
    ran, why = resolve_backend(backend, logits.device)
    if why:
        warnings.warn(f"topk_logprobs: the triton backend cannot run here ({why}); "
                      "ran the torch backend", RuntimeWarning, stacklevel=2)
    device_targets = None if targets is None else kernel_targets(targets, logits.device)
    if ran == "triton":
        result = _triton(logits, k, device_targets, tile, splits)
    else:
        result = _torch(logits, k, device_targets)
    if validate:
        lp.raise_bad_rows(~torch.isfinite(result.logsumexp), BAD_ROWS)
    return result


def resolve_backend(backend: str, device: torch.device) -> tuple[str, str]:
    """The backend that will run for ``backend`` on ``device`` and, where that is not the one
    asked for, why."""
    if backend == "torch":
        return "torch", ""
    module = triton_module()
    if module is None:
        return "torch", "Triton is not installed"
    if device.type != "cuda" and not interpreted(module):
        return "torch", (f"Triton compiles for CUDA devices and the logits are on {device.type}"
                         "; its interpreter runs on a CPU with TRITON_INTERPRET=1, set before "
                         "Triton is imported")
    return "triton", ""


@functools.cache
def _import_kernels() -> ModuleType:
    from stagelab.measure import onepass_triton

    return onepass_triton


def triton_module() -> ModuleType | None:
    """The kernels' module, or None where Triton is not installed (imported on first use)."""
    module = _import_kernels()
    return module if module.triton is not None else None


def interpreted(module: ModuleType) -> bool:
    """Whether the kernels were built for Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return type(module.onepass_kernel).__name__ == "InterpretedFunction"


# ------------------------------------------------------------------------------------- torch

def _torch(logits: torch.Tensor, k: int, targets: torch.Tensor | None,
           budget_bytes: float = TORCH_BLOCK_BYTES) -> OnePass:
    """The torch backend: the kernel's keys in eager torch, a block of rows at a time."""
    rows, vocab = logits.shape
    device = logits.device
    out = _empty(rows, k, targets is not None, device, "torch")
    low = ID_MASK - torch.arange(vocab, device=device, dtype=torch.int64)
    step = max(1, min(rows, int(budget_bytes // (vocab * TORCH_TEMP_BYTES))))
    for start in range(0, rows, step):
        block = slice(start, start + step)
        x = logits[block].float() + 0.0  # a fresh fp32 copy; -0.0 + 0.0 is 0.0
        out.logsumexp[block] = torch.logsumexp(x, dim=1)
        if targets is not None:
            _torch_target(x, targets[block], out, block)
        if k:
            out.values[block], out.ids[block] = _torch_top_k(x, k, low)
        del x
    out.values.sub_(out.logsumexp[:, None])
    return out


def _torch_top_k(x: torch.Tensor, k: int, low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``k`` values and ids of fp32 rows, ties by lower id: ``torch.topk`` on the values
    where no tie touches the top K (one more comparison pass), the keys only for the rows where
    one does (a tie inside the top K, or at its K-th value). On a device, where finding those
    rows would make the host wait, the keys for every row."""
    if x.device.type != "cpu":
        top = torch.topk(_torch_keys(x, low), k, dim=1).values
        ids = ID_MASK - (top & ID_MASK)
        return x.gather(1, ids), ids
    values, ids = torch.topk(x, k, dim=1)
    tied = (x >= values[:, -1:]).sum(dim=1) != k
    tied |= (values[:, 1:] == values[:, :-1]).any(dim=1)
    rows = torch.nonzero(tied).flatten()
    if rows.numel():
        top = torch.topk(_torch_keys(x[rows], low), k, dim=1).values
        ids[rows] = ID_MASK - (top & ID_MASK)
        values[rows] = x[rows].gather(1, ids[rows])
    return values, ids


def _torch_keys(x: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The kernel's keys of fp32 ``x`` (``-0.0`` already made ``0.0``) in torch."""
    bits = x.view(torch.int32)
    ordered = (bits >> 31).bitwise_and_(0x7FFFFFFF).bitwise_xor_(bits)  # negatives: flipped
    keys = ordered.to(torch.int64)
    del ordered  # an int32 temporary: at most 4 + 8 bytes per element beside x at once
    return keys.bitwise_left_shift_(32).add_(low)


def decode_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 values and int64 ids of keys made by :func:`_torch_keys`."""
    ids = ID_MASK - (keys & ID_MASK)
    ordered = keys >> 32
    ordered = ordered ^ ((ordered >> 63) & 0x7FFFFFFF)
    return ordered.to(torch.int32).view(torch.float32), ids


def _torch_target(x: torch.Tensor, targets: torch.Tensor, out: OnePass, block: slice) -> None:
    target = x.gather(1, targets[:, None])
    assert out.target_logprob is not None and out.target_rank is not None
    assert out.target_ties is not None
    out.target_logprob[block] = target[:, 0] - out.logsumexp[block]
    out.target_rank[block] = (x >= target).sum(1)
    out.target_ties[block] = (x == target).sum(1)


def _empty(rows: int, k: int, with_targets: bool, device: torch.device, backend: str) -> OnePass:
    def vector(dtype: torch.dtype) -> torch.Tensor | None:
        return torch.empty(rows, dtype=dtype, device=device) if with_targets else None

    return OnePass(values=torch.empty(rows, k, dtype=torch.float32, device=device),
                   ids=torch.empty(rows, k, dtype=torch.int64, device=device),
                   logsumexp=torch.empty(rows, dtype=torch.float32, device=device),
                   target_logprob=vector(torch.float32), target_rank=vector(torch.int64),
                   target_ties=vector(torch.int64), backend=backend)


# ------------------------------------------------------------------------------------ triton

def program_slots(device: torch.device, k: int) -> int:
    """Programs the device runs at once for the split plan of a top-``k`` call: on a CUDA
    device :func:`stagelab.core.launches.device_slots` of its SMs, one per core in the
    interpreter."""
    if device.type == "cuda":
        return device_slots(torch.cuda.get_device_properties(device).multi_processor_count, k)
    return os.cpu_count() or 1


def kernel_targets(targets: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``targets`` as the kernel reads them: int64 on ``device``, one after another (it reads
    row ``i``'s at ``targets_ptr + i``: a strided view, ``tokens[::2]``, would give it other
    rows' tokens), from a 16-byte boundary (the compile check's specialisation: a shifted
    view, ``tokens[1:]``, would compile another); copied only where they are not."""
    moved = targets.to(device, torch.int64).contiguous()
    return moved if moved.data_ptr() % 16 == 0 else moved.clone()


def aligned_logits(logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``logits`` as the kernels take them: a view from the 16-byte boundary at or before its
    first element, and how many elements that lies before it (0 for a tensor torch
    allocated). The kernels' pipelined copies and the compile check both rest on a 16-byte
    aligned pointer; a view that starts off it (a slice of rows of an odd vocabulary, say) is
    widened back to the boundary within its own storage, or, where its storage holds nothing
    that far back, copied (said in a ``RuntimeWarning``)."""
    size = logits.element_size()
    if logits.data_ptr() % 16 == 0:
        return logits, 0
    origin = logits.data_ptr() % 16 // size
    if logits.data_ptr() % size == 0 and logits.storage_offset() >= origin:
        return logits.as_strided(logits.shape, logits.stride(),
                                 logits.storage_offset() - origin), origin
    warnings.warn(f"logits at {logits.data_ptr():#x} lie off 16 bytes with nothing of their "
                  "storage before them to widen a view to: the kernel reads a copy",
                  RuntimeWarning, stacklevel=4)
    return logits.clone(memory_format=torch.contiguous_format), 0


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """``device`` made current for Triton's launches (they run on the current device's current
    stream, the one :func:`arrival_counts` keys its buffer by); nothing on a CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def run_launches(launches: list[Launch], pointers: dict[str, torch.Tensor],
                 device: torch.device) -> None:
    """Run ``launches`` on ``device``; where one raises, the device's arrival counts are
    dropped (:func:`forget_arrival_counts`): a count left part-way would give the next call's
    rows a wrong merge, silently."""
    try:
        with on_device(device):
            for launch in launches:
                run_launch(launch, pointers)
    except BaseException:
        forget_arrival_counts(device)
        raise


def run_launch(launch: Launch, pointers: dict[str, torch.Tensor]) -> None:
    """Run ``launch`` with its pointer arguments taken by name from ``pointers``; a split
    launch whose ``SLICES`` is below its slices a row is refused (its rows' last slices would
    leave some slices' scalars out, silently)."""
    slices = launch.constexprs.get("SLICES")
    if slices is not None and slices < launch.grid[-1]:
        raise ValueError(f"launch: SLICES {slices} is below its {launch.grid[-1]} slices a "
                         "row (launches.triton_launches sets it)")
    kernel = getattr(_import_kernels(), launch.kernel)
    bound = {name: pointers[name] for name in kernel.arg_names if name.endswith("_ptr")}
    options = {} if launch.max_registers is None else dict(maxnreg=launch.max_registers)
    kernel[launch.grid](**bound, **launch.scalars, **launch.constexprs,
                        num_warps=launch.num_warps, **options)


def result_pointers(out: OnePass) -> dict[str, torch.Tensor]:
    """The results' pointer arguments of the kernels, by name (a target's result without
    targets: the logsumexp, which the kernel then leaves alone)."""
    dummy = out.logsumexp
    return dict(values_ptr=out.values, ids_ptr=out.ids, lse_ptr=out.logsumexp,
                target_lp_ptr=out.target_logprob if out.target_logprob is not None else dummy,
                rank_ptr=out.target_rank if out.target_rank is not None else dummy,
                ties_ptr=out.target_ties if out.target_ties is not None else dummy)


def _partial_pointers(first: Launch, rows: int, device: torch.device
                      ) -> dict[str, torch.Tensor]:
    """The split variant's partial states (per row and slice: a record of four int32, the
    max's and sum's bits and the two counts, and the keys) and its rows' arrival counts
    (:func:`arrival_counts`), by pointer name; one-element stand-ins where the row is not
    split. The counts are int32: a row holds fewer than 2**31 logits (its ids are int32)."""
    parts, k_pad = first.grid[1], int(first.constexprs["K_PAD"])
    found = {}
    for name, dtype, width in (("state", torch.int32, 4), ("keys", torch.int64, k_pad)):
        size = rows * parts * width if parts > 1 else 1
        found[f"part_{name}_ptr"] = torch.empty(size, dtype=dtype, device=device)
    found["arrivals_ptr"] = arrival_counts(rows if parts > 1 else 1, device)
    return found


_ARRIVALS: dict[tuple[str, int], torch.Tensor] = {}
ARRIVAL_ROWS = 1024  # a persistent buffer's least length: most split calls' rows are fewer (a
# four-warp plan splits fewer rows than the device's 264 program slots on an H200); a call of
# more split rows (a narrow plan's, launches.narrow_walk: k = 1 splits even 10,000 rows in 3)
# grows it once to its rows


def arrival_counts(rows: int, device: torch.device) -> torch.Tensor:
    """At least ``rows`` int32 zeros on ``device``: per row, the split kernel's count of its
    slices that have ended. The kernel leaves them zeros (the row's last slice sets its count
    back), so on a CUDA device one buffer per device and stream serves every call, in stream
    order, with no fill a call (grown, a new zeroed buffer, where more rows come). Fresh zeros
    every call where that does not hold: in Triton's interpreter (a CPU), whose grid can stop
    between two programs (Ctrl-C), and under CUDA graph capture, where a graph must own its
    counts (graphs captured on one stream would share a buffer, and keep a grown one's old
    address)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.zeros(max(rows, 1), dtype=torch.int32, device=device)
    key = _arrivals_key(device)
    held = _ARRIVALS.get(key)
    if held is None or held.numel() < rows:
        held = _ARRIVALS[key] = torch.zeros(max(rows, ARRIVAL_ROWS), dtype=torch.int32,
                                            device=device)
    return held


def arrival_counts_left() -> list[str]:
    """The persistent arrival counts (device and stream) holding a nonzero count: none once
    every call's kernel has ended (the lease kernel check asks, after a synchronize)."""
    return [f"{device} stream {stream:#x}" for (device, stream), held in _ARRIVALS.items()
            if bool(held.any())]


def forget_arrival_counts(device: torch.device) -> None:
    """Drop ``device``'s persistent arrival counts on its current stream: the next call
    makes fresh zeros."""
    if device.type == "cuda":
        _ARRIVALS.pop(_arrivals_key(device), None)


def _arrivals_key(device: torch.device) -> tuple[str, int]:
    index = torch.cuda.current_device() if device.index is None else device.index
    return f"cuda:{index}", torch.cuda.current_stream(index).cuda_stream


def _triton(logits: torch.Tensor, k: int, targets: torch.Tensor | None, tile: int | None,
            splits: int | None) -> OnePass:
    """The Triton backend: one kernel."""
    rows, vocab = logits.shape
    device = logits.device
    if rows == 0:
        return _empty(0, k, targets is not None, device, "triton")
    if logits.stride(1) != 1:
        logits = logits.contiguous()  # the kernel reads rows of consecutive logits
    logits, origin = aligned_logits(logits)
    launches = triton_launches(rows, vocab, k, targets is not None, tile, splits,
                               program_slots(device, k), logits.stride(0), origin)
    out = _empty(rows, k, targets is not None, device, "triton")
    pointers = dict(result_pointers(out), x_ptr=logits,
                    targets_ptr=targets if targets is not None else out.logsumexp)
    with on_device(device):
        pointers.update(_partial_pointers(launches[0], rows, device))
    run_launches(launches, pointers, device)
    return out


# ------------------------------------------------------------- a vocabulary tile at a time

KEY_FLOOR = -(2**63)  # below every real key: the running top-K's empty slots


def fold_backend(device: torch.device) -> str:
    """The backend :class:`TileFold` takes on ``device`` by default: the kernels' state merge
    on a CUDA device where Triton is installed, else torch (on a CPU even with the interpreter,
    which runs every program in Python; tests ask for it by name)."""
    return "triton" if device.type == "cuda" and triton_module() is not None else "torch"


class TileFold:
    """Per-row running statistics of logits that arrive one vocabulary tile at a time (the
    ``head_fused`` prompt method: the lm_head's product, a ``[C, tile]`` block at a time):
    max, rescaled sum of exponentials, the best ``k`` keys, and the logits at or above and
    equal to each row's target logit. :meth:`add` folds a tile in, :meth:`finish` gives the
    :class:`OnePass` of the whole vocabulary; what is held between tiles is ``O(rows x k)``.

    ``"triton"`` folds each tile with the one-pass kernel's state and its split variant's merge
    (:func:`stagelab.measure.onepass_triton.fold_kernel`), reading the tile once in its own
    dtype; ``"torch"`` does the same in eager torch (a fp32 copy of the tile, its keys), the
    CPU path and the fallback where Triton is absent. ``target_logits``: fp32 ``[rows]``."""

    def __init__(self, rows: int, k: int, target_logits: torch.Tensor | None,
                 device: torch.device, backend: str = "torch") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "triton" and resolve_backend("triton", device)[0] != "triton":
            raise RuntimeError(f"TileFold: the triton backend cannot run here "
                               f"({resolve_backend('triton', device)[1]})")
        self.rows, self.k, self.backend, self.device = rows, k, backend, device
        # contiguous: fold_kernel reads row i's target at target_ptr + i
        self.target = (None if target_logits is None
                       else target_logits.float().reshape(rows).contiguous())
        self.k_pad = pow2_at_least(max(k, 2))
        self.peak = torch.full((rows,), float("-inf"), device=device)
        self.total = torch.zeros(rows, device=device)
        self.at_least = torch.zeros(rows, dtype=torch.int64, device=device)
        self.ties = torch.zeros_like(self.at_least)
        width = self.k_pad if backend == "triton" else 0
        self.best = torch.full((rows, width), KEY_FLOOR, dtype=torch.int64, device=device)

    def add(self, logits: torch.Tensor, first_id: int) -> None:
        """Fold ``[rows, width]`` logits of tokens ``first_id ..`` in (fp32, bf16 or fp16;
        the torch backend may overwrite them: pass a tile's own tensor)."""
        if logits.dim() != 2 or logits.shape[0] != self.rows:
            raise ValueError(f"logits must be [{self.rows}, width], got {tuple(logits.shape)}")
        if self.backend == "triton":
            self._add_triton(logits, first_id)
        else:
            self._add_torch(logits, first_id)

    def _add_torch(self, logits: torch.Tensor, first_id: int) -> None:
        x = logits.float()
        x.add_(0.0)  # -0.0 counts as 0.0 (x is this tile's own tensor, or its fp32 copy)
        new_peak = torch.maximum(self.peak, x.amax(dim=1))
        safe = torch.where(torch.isinf(new_peak) & (new_peak < 0), 0.0, new_peak)
        self.total = (self.total * torch.exp(self.peak - safe)
                      + (x - safe[:, None]).exp_().sum(dim=1))
        self.peak = new_peak
        if self.target is not None:
            self.at_least += (x >= self.target[:, None]).sum(dim=1)
            self.ties += (x == self.target[:, None]).sum(dim=1)
        if self.k:
            low = ID_MASK - torch.arange(first_id, first_id + x.shape[1], device=x.device)
            keys = _torch_keys(x, low)
            top = torch.topk(keys, min(self.k, keys.shape[1]), dim=1).values
            del keys
            merged = torch.cat([self.best, top], dim=1)
            self.best = torch.topk(merged, min(self.k, merged.shape[1]), dim=1).values
        del x

    def _add_triton(self, logits: torch.Tensor, first_id: int) -> None:
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        logits, origin = aligned_logits(logits)
        launch = fold_launch(self.rows, logits.shape[1], first_id, self.k,
                             self.target is not None, logits.stride(0), origin)
        run_launches([launch], dict(x_ptr=logits, **self._state_pointers()), self.device)

    def _state_pointers(self) -> dict[str, torch.Tensor]:
        """The running state's pointer arguments of the fold and finish kernels, by name."""
        return dict(target_ptr=self.target if self.target is not None else self.total,
                    state_m_ptr=self.peak, state_s_ptr=self.total, state_keys_ptr=self.best,
                    state_ge_ptr=self.at_least, state_eq_ptr=self.ties)

    def finish(self) -> OnePass:
        """The results over every tile folded in (logprobs, as :func:`topk_logprobs` gives)."""
        out = _empty(self.rows, self.k, self.target is not None, self.device, self.backend)
        if self.backend == "triton" and self.rows:
            run_launches([finish_launch(self.rows, self.k, self.target is not None)],
                         dict(result_pointers(out), **self._state_pointers()), self.device)
            return out
        out.logsumexp.copy_(self.peak + torch.log(self.total))
        if self.target is not None:
            assert out.target_logprob is not None and out.target_rank is not None
            assert out.target_ties is not None
            out.target_logprob.copy_(self.target - out.logsumexp)
            out.target_rank.copy_(self.at_least)
            out.target_ties.copy_(self.ties)
        if self.k:
            values, ids = decode_keys(self.best)
            out.values.copy_(values - out.logsumexp[:, None])
            out.ids.copy_(ids)
        return out


# ------------------------------------------------------------------------------ read rate

L2_FALLBACK_BYTES = 64 << 20  # where torch does not say the L2's size


def read_rates(rows: int, vocab: int, k: int, dtype: torch.dtype, *, repeats: int = 50,
               warmup: int = 5, seed: int = 0, device: str | None = None) -> list[dict]:
    """:func:`read_rates_of` on fresh logits ``[rows, vocab]`` in ``dtype`` and targets."""
    from stagelab.measure.device import default_device

    where = torch.device(device or default_device())
    generator = torch.Generator(device=where).manual_seed(seed)
    logits = (3 * torch.randn(rows, vocab, device=where, generator=generator)).to(dtype)
    targets = torch.randint(0, vocab, (rows,), device=where, generator=generator)
    return read_rates_of(logits, k, targets, repeats=repeats, warmup=warmup)


def read_rates_of(logits: torch.Tensor, k: int, targets: torch.Tensor, *, repeats: int,
                  warmup: int) -> list[dict]:
    """The kernel alone on ``logits``: bytes of logits read per second, median of ``repeats``
    calls, with the L2 warm (the same logits every call) and cold (on a GPU, a buffer twice the
    L2's size read between calls; on a CPU, a fresh copy of the logits per call, so that no
    call reads what the last one cached), and where the GPU's datasheet HBM peak is known, the
    share of it (``hbm_share``). CUDA events time a GPU call, behind a sleep kernel that keeps
    the host's launches out of the interval, its outputs allocated before it
    (:func:`time_calls`); the host clock times a CPU one (the torch backend: no HBM, and the
    share is None, said in ``note``)."""
    from stagelab.core import forward

    where = logits.device
    backend, why = resolve_backend("triton", where)
    peak, gpu = None, ""
    if where.type == "cuda":
        gpu = torch.cuda.get_device_name(where)
        peak = forward.peak_bandwidth_gbps(gpu)
    rows, vocab = logits.shape
    found = []
    for l2 in ("warm", "cold"):
        seconds = _median_call_seconds(logits, k, targets, backend, l2, repeats, warmup)
        gbps = logits.numel() * logits.element_size() / seconds / 1e9
        note = why or ("" if peak else f"the HBM peak of {gpu or 'a CPU'} is not known here")
        found.append(dict(rows=rows, vocab=vocab, k=k,
                          dtype=str(logits.dtype).removeprefix("torch."), device=where.type,
                          backend=backend, l2=l2, seconds=seconds, read_gbps=gbps,
                          hbm_peak_gbps=peak, hbm_share=gbps / peak if peak else None,
                          note=note))
    return found


def read_rate_rows(logits: torch.Tensor, k: int, targets: torch.Tensor, *,
                   repeats: int | None = None) -> list[dict]:
    """:func:`read_rates_of` as rows of the step's table (outside its timed calls, once per
    size): arm ``onepass``, metric ``read_rate``, stage ``l2_warm`` or ``l2_cold``,
    ``seconds`` the median call, ``bytes`` the logits read, ``value`` the share of the HBM
    peak (missing where it is not known), the backend and the peak in the note. ``repeats``
    defaults to 20 on a GPU and 3 on a CPU, where the torch backend takes a large share of a
    second."""
    count = repeats or (20 if logits.device.type == "cuda" else 3)
    rows = []
    for found in read_rates_of(logits, k, targets, repeats=count, warmup=min(count, 5)):
        peak = (f"HBM peak {found['hbm_peak_gbps']:g} GB/s" if found["hbm_peak_gbps"] else "")
        rows.append({"arm": catalogue.ONE_PASS, "stage": f"l2_{found['l2']}", "metric": schema.READ_RATE,
                     "seconds": found["seconds"],
                     "bytes": logits.numel() * logits.element_size(),
                     "value": found["hbm_share"],
                     "note": "; ".join(part for part in (
                         f"backend {found['backend']}, median of {count} calls", peak,
                         found["note"]) if part)})
    return rows


SLEEP_CYCLES = 4_000_000  # about 2 ms of an SM's clock: longer than the host takes to launch


def prepare_call(logits: torch.Tensor, k: int, targets: torch.Tensor, backend: str
                 ) -> Callable[[torch.Tensor], None]:
    """A call of the kernel on logits shaped and placed as ``logits``, everything it writes
    allocated here, once: on the Triton backend the call only takes its arrival counts
    (:func:`arrival_counts`, as :func:`topk_logprobs` does) and launches; the torch backend
    allocates its own temporaries, as it does in use."""
    if backend != "triton":
        def eager(source: torch.Tensor) -> None:
            _torch(source, k, targets)

        return eager
    rows, vocab = logits.shape
    device = logits.device
    planned, origin = aligned_logits(logits)
    launches = triton_launches(rows, vocab, k, True, None, None, program_slots(device, k),
                               planned.stride(0), origin)
    out = _empty(rows, k, True, device, "triton")
    with on_device(device):
        pointers = dict(result_pointers(out), targets_ptr=targets,
                        **_partial_pointers(launches[0], rows, device))
    split = launches[0].grid[1] > 1

    def call(source: torch.Tensor) -> None:
        x, at = aligned_logits(source)
        if at != origin or x.stride() != planned.stride():
            raise ValueError(f"source must lie as the prepared logits do (origin {origin}, "
                             f"strides {planned.stride()}), got origin {at}, {x.stride()}")
        pointers["x_ptr"] = x
        with on_device(device):
            pointers["arrivals_ptr"] = arrival_counts(rows if split else 1, device)
        run_launches(launches, pointers, device)

    return call


class DeviceClock:
    """CUDA events around a call, the device held by a sleep kernel queued before the start
    event, so that the host's launches sit behind it and outside the interval."""

    def __init__(self) -> None:
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        torch.cuda._sleep(SLEEP_CYCLES)
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1e3


class HostClock:
    """The host's clock around a call (a CPU's kernel runs on the host)."""

    def start(self) -> None:
        self.began = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self.began


def l2_flush(device: torch.device) -> Callable[[], None]:
    """Evict the logits from a GPU's L2 by reading a buffer twice its size (read, not
    written: a written buffer leaves dirty lines whose write-back would land in the next
    timed interval)."""
    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    buffer = torch.ones(2 * (size or L2_FALLBACK_BYTES) // 4, dtype=torch.float32,
                        device=device)
    sink = torch.empty((), dtype=torch.float32, device=device)

    def flush() -> None:
        torch.sum(buffer, dim=0, out=sink)

    return flush


def _median_call_seconds(logits: torch.Tensor, k: int, targets: torch.Tensor, backend: str,
                         l2: str, repeats: int, warmup: int) -> float:
    """The median seconds of one kernel call (``l2``: "warm" or "cold"), its outputs
    allocated before any interval (:func:`prepare_call`)."""
    cuda = logits.device.type == "cuda"
    call = prepare_call(logits, k, targets, backend)
    clock: DeviceClock | HostClock = DeviceClock() if cuda else HostClock()
    return statistics.median(time_calls(call, clock, _before_call(logits, l2), repeats,
                                        warmup))


def _before_call(logits: torch.Tensor, l2: str) -> Callable[[], torch.Tensor]:
    """What runs before each timed call and gives it its logits: nothing (L2 warm), an L2
    flush (cold, GPU), or a fresh copy (cold, CPU: so that no call reads the last one's
    cache)."""
    if l2 == "warm":
        return lambda: logits
    if logits.device.type != "cuda":
        return logits.clone
    flush = l2_flush(logits.device)

    def flushed() -> torch.Tensor:
        flush()
        return logits

    return flushed


def time_calls(call: Callable[[torch.Tensor], None], clock: DeviceClock | HostClock,
               before: Callable[[], torch.Tensor], repeats: int, warmup: int) -> list[float]:
    """Seconds of ``repeats`` calls after ``warmup``: ``before`` (the L2 flush, or a fresh
    copy) gives each call its logits, outside the interval, then ``clock`` times the call
    alone."""
    times = []
    for index in range(warmup + repeats):
        source = before()
        clock.start()
        call(source)
        seconds = clock.stop()
        if index >= warmup:
            times.append(seconds)
    return times
