"""Per-position logprobs with the semantics of vLLM V1's sampler, three ways.

A :class:`LogprobsTensors` row holds, in column 0, the selected (or prompt target) token and its
logprob, then the top-K tokens in descending order; ``selected_token_ranks`` is the 1-based rank of
the target: the number of vocabulary entries whose logprob is ``>=`` the target's (ties count
against the target).

* :func:`compute_logprobs` + :func:`gather_logprobs`: vLLM V1 on the device (a fp32 ``[N, V]``
  log-softmax, then top-K and the target).
* :func:`gather_logprobs_host`: the seed engine's host path, per row, after the ``[N, V]``
  logprobs were copied to the host: ``backend="native"`` is the seed's C++ loop (iota, a
  ``std::partial_sort`` by descending value, a count for the rank; :mod:`stagelab.measure.native`),
  ``backend="numpy"`` the same with numpy (argpartition of the top K, then a sort of those K).
* :func:`logprobs_from_logits`: the fused path. log-softmax is monotonic per row, so top-K, the
  target and its rank are taken on raw logits, and only the selected logprobs are formed as
  ``logit - logsumexp`` in fp32. It works through row blocks, so its extra memory is one block's,
  never a fp32 ``[N, V]`` tensor.

Tie order: every path gives the same values and ranks, and the same ids up to their order among
tied values, which is each backend's own: ``torch.topk``'s (unspecified); numpy's (which of the ids
tied at the K-th value are kept is ``argpartition``'s choice, and tied ids then appear in
descending id order, from the reversed stable sort); native's (``std::partial_sort``'s heap
selection with a strict ``>`` comparator, as in the engine: unspecified, but deterministic for
one build).
"""

from __future__ import annotations

import functools
import operator
import sys
from dataclasses import dataclass
from typing import Any, SupportsIndex

import torch

from stagelab.core.errors import ExtraUnavailable
from stagelab.measure import native
from stagelab.measure.device import require_cuda

# The fused path's temporaries per block element: the rank's bool comparison and the int64 its
# sum casts to (1 + 8 bytes, measured on CPU), which outweighs logsumexp's fp32 upcast and exp.
BLOCK_TEMP_BYTES = 9
# A block's temporaries may take this many bytes, or this fraction of a larger batch's logits:
# a decode batch that fits is one block (one launch per operation, not one per row, which left
# the fused arm launch-bound on a GPU at n <= 64 in bf16), and a huge batch stays bounded.
BLOCK_BUDGET_BYTES = 256 << 20
BLOCK_EXTRA_FRACTION = 0.10
HOST_BACKENDS = ("numpy", "native")


@dataclass
class LogprobsTensors:
    """``logprob_token_ids`` int32 ``[N, K+1]``, ``logprobs`` fp32 ``[N, K+1]``,
    ``selected_token_ranks`` int32 ``[N]`` (vLLM's rank: the logprobs ``>=`` the target's, itself
    included); column 0 is the selected/target token."""

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor

    @classmethod
    def empty(cls, num_positions: int, num_logprobs: int, device: torch.device | str = "cpu",
              pinned: bool = False) -> LogprobsTensors:
        """Uninitialized tensors for ``num_positions`` rows of ``num_logprobs`` top-K each."""
        if num_positions < 0 or num_logprobs < 0:
            raise ValueError(f"num_positions ({num_positions}) and num_logprobs "
                             f"({num_logprobs}) must be >= 0")
        if pinned:
            require_cuda("LogprobsTensors.empty_host(pinned=True)")
        shape = (num_positions, num_logprobs + 1)
        return cls(torch.empty(shape, dtype=torch.int32, device=device, pin_memory=pinned),
                   torch.empty(shape, dtype=torch.float32, device=device, pin_memory=pinned),
                   torch.empty(num_positions, dtype=torch.int32, device=device,
                               pin_memory=pinned))

    @classmethod
    def empty_host(cls, num_positions: int, num_logprobs: int,
                   pinned: bool = False) -> LogprobsTensors:
        """Host tensors, pinned on request (raises PinnedMemoryUnavailable without CUDA)."""
        return cls.empty(num_positions, num_logprobs, "cpu", pinned)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.logprob_token_ids, self.logprobs, self.selected_token_ranks

    def rows(self, start: int, end: int) -> LogprobsTensors:
        """A view of rows ``start:end``."""
        return LogprobsTensors(*(t[start:end] for t in self.tensors()))

    def copy_(self, other: LogprobsTensors, non_blocking: bool = False) -> LogprobsTensors:
        """Copy ``other`` into these tensors (any devices), returning self."""
        for dst, src in zip(self.tensors(), other.tensors()):
            dst.copy_(src, non_blocking=non_blocking)
        return self

    def to_host(self) -> LogprobsTensors:
        """A fresh host copy (synchronous)."""
        return LogprobsTensors(*(t.to("cpu") for t in self.tensors()))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


# ------------------------------------------------------------------------------------ checks

def check_has_data(tensor: torch.Tensor, name: str) -> None:
    """Refuse meta tensors (a shape, no data) and tensors that require grad (logprobs here are
    measured, never differentiated), naming the parameter."""
    if tensor.is_meta:
        raise ValueError(f"{name} is a meta tensor: it has a shape but no data to compute with")
    if tensor.requires_grad:
        raise ValueError(f"{name} requires grad: logprobs here are measured, not "
                         f"differentiated; pass {name}.detach() or run under torch.no_grad()")


def check_scores(scores: torch.Tensor, name: str = "logits") -> tuple[int, int]:
    """A 2-D floating ``[rows, vocab]`` tensor with data and at least one column; returns its
    shape."""
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(scores).__name__}")
    if scores.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, vocab], got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {scores.dtype}")
    check_has_data(scores, name)
    rows, vocab = scores.shape
    if vocab == 0:
        raise ValueError(f"{name} has an empty vocabulary dimension")
    return rows, vocab


def as_int(value: object, name: str) -> int:
    """``value`` as a Python int: ints and numpy integers, never bools or floats."""
    numpy = sys.modules.get("numpy")  # a numpy bool exists only where numpy was imported
    if (isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_))
            or not isinstance(value, SupportsIndex)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return operator.index(value)


def check_num_logprobs(num_logprobs: int, vocab: int) -> int:
    """``0 <= K <= V``; returns K as a Python int (numpy integers are accepted)."""
    num_logprobs = as_int(num_logprobs, "num_logprobs")
    if not 0 <= num_logprobs <= vocab:
        raise ValueError(f"num_logprobs must be in [0, {vocab}] (the vocabulary), "
                         f"got {num_logprobs}")
    return num_logprobs


def check_token_ids_shape(token_ids: torch.Tensor, rows: int, name: str = "token_ids") -> None:
    """An integer 1-D tensor of ``rows`` ids, with data (no look at the values: no host wait)."""
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(token_ids).__name__}")
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {token_ids.dtype}")
    if token_ids.dim() != 1 or token_ids.numel() != rows:
        raise ValueError(f"{name} must be 1-D with {rows} entries (one per row), got shape "
                         f"{tuple(token_ids.shape)}")
    check_has_data(token_ids, name)


def out_of_range(token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """A bool tensor flagging ids outside ``[0, vocab)``, on their device (no host wait)."""
    return (token_ids < 0) | (token_ids >= vocab)


def raise_bad_token_ids(bad: torch.Tensor, token_ids: torch.Tensor, vocab: int,
                        name: str = "token_ids") -> None:
    """Raise naming the rows flagged in ``bad`` and the ids they hold, if any (one host wait)."""
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten()[:8]
        raise ValueError(f"{name} out of range [0, {vocab}): rows {rows.tolist()} hold "
                         f"{token_ids[rows.to(token_ids.device)].tolist()}")


def check_token_ids(token_ids: torch.Tensor, rows: int, vocab: int,
                    name: str = "token_ids") -> None:
    """An integer 1-D tensor of ``rows`` ids, each in ``[0, vocab)``: one host wait."""
    check_token_ids_shape(token_ids, rows, name)
    raise_bad_token_ids(out_of_range(token_ids, vocab), token_ids, vocab, name)


def raise_bad_rows(bad: torch.Tensor, what: str) -> None:
    """Raise naming the rows flagged in a boolean ``[rows]`` tensor, if any."""
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten()
        shown = rows[:8].tolist()
        more = f" and {len(rows) - 8} more" if len(rows) > 8 else ""
        raise ValueError(f"{what}: rows {shown}{more}")


def raise_flagged(bad_ids: torch.Tensor, token_ids: torch.Tensor, vocab: int,
                  bad_rows: torch.Tensor, what: str) -> None:
    """One host read of both device flags; where either is set, the named error (ids first)."""
    if bool(bad_ids.any() | bad_rows.any()):
        raise_bad_token_ids(bad_ids, token_ids, vocab)
        raise_bad_rows(bad_rows, what)


def check_call(scores: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
               name: str = "logits") -> tuple[int, int, int]:
    """The checks that need no host wait, before anything is allocated: ``(rows, V, K)``."""
    rows, vocab = check_scores(scores, name)
    num_logprobs = check_num_logprobs(num_logprobs, vocab)
    check_token_ids_shape(token_ids, rows)
    return rows, vocab, num_logprobs


def device_targets(token_ids: torch.Tensor, device: torch.device, vocab: int,
                   validate: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """int64 targets on ``device`` and, when validating, the flag of ids out of range; those
    are clamped into the vocabulary so that no gather reads outside it before the flag is read."""
    targets = token_ids.to(device=device, dtype=torch.int64)
    if not validate:
        return targets, None
    return targets.clamp(0, vocab - 1), out_of_range(targets, vocab)


# ------------------------------------------------------------------------------------ device

def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-softmax over the last dimension (vLLM V1's ``compute_logprobs``)."""
    check_scores(logits)
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def staged_for_copy(logits: torch.Tensor, log_softmax: str) -> torch.Tensor:
    """What the seed's step copies to the host: fp32 logprobs where the log-softmax runs on the
    device (``log_softmax == "device"``), else the logits upcast to fp32 for the host's own."""
    if log_softmax == "device":
        return torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    return logits.float()


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor, *,
                    validate: bool = True) -> LogprobsTensors:
    """Top-K, the target and its rank from ``[N, V]`` logprobs, on the tensors' device.

    Bad ids and NaN rows are flagged on the device and read once at the end (one host wait,
    where a caller reads the results anyway); ``validate=False`` skips them for callers that
    validated their data already."""
    _, vocab, num_logprobs = check_call(logprobs, num_logprobs, token_ids, "logprobs")
    targets, bad_ids = device_targets(token_ids, logprobs.device, vocab, validate)
    out = gather_unchecked(logprobs, num_logprobs, targets)
    if bad_ids is not None:  # validating
        raise_flagged(bad_ids, token_ids, vocab, nan_rows(logprobs), "logprobs contain NaN")
    return out


def nan_rows(logprobs: torch.Tensor) -> torch.Tensor:
    """A bool ``[rows]`` device flag of the rows holding a NaN (no host wait)."""
    return torch.isnan(logprobs.amax(dim=-1))


def gather_unchecked(logprobs: torch.Tensor, num_logprobs: int,
                     targets: torch.Tensor) -> LogprobsTensors:
    """:func:`gather_logprobs` on int64 ``targets`` on the logprobs' device, all in range."""
    targets = targets.unsqueeze(-1)
    top_values, top_ids = torch.topk(logprobs, num_logprobs, dim=-1)
    target_values = logprobs.gather(-1, targets)
    ranks = (logprobs >= target_values).sum(-1)
    return LogprobsTensors(torch.cat([targets, top_ids], dim=1).to(torch.int32),
                           torch.cat([target_values, top_values], dim=1).to(torch.float32),
                           ranks.to(torch.int32))


def block_budget(rows: int, vocab: int, itemsize: int) -> float:
    """The default budget of a block's temporaries: :data:`BLOCK_BUDGET_BYTES`, or
    :data:`BLOCK_EXTRA_FRACTION` of the logits' bytes where that is more."""
    return max(BLOCK_BUDGET_BYTES, bounded_budget(rows, vocab, itemsize))


def bounded_budget(rows: int, vocab: int, itemsize: int) -> float:
    """A budget of :data:`BLOCK_EXTRA_FRACTION` of the logits' bytes: the fused path's
    temporaries stay within that share (prompt logprobs' memory bound)."""
    return BLOCK_EXTRA_FRACTION * rows * vocab * itemsize


def block_rows(rows: int, vocab: int, itemsize: int, budget_bytes: float | None = None) -> int:
    """Rows per block of the fused path: the most whose temporaries (:data:`BLOCK_TEMP_BYTES`
    per element) fit ``budget_bytes`` (default :func:`block_budget`), at least one."""
    if budget_bytes is None:
        budget_bytes = block_budget(rows, vocab, itemsize)
    return max(1, min(rows, int(budget_bytes // (vocab * BLOCK_TEMP_BYTES))))


def logprobs_from_logits(logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor, *,
                         validate: bool = True,
                         budget_bytes: float | None = None) -> LogprobsTensors:
    """The fused path: the same result as ``gather_logprobs(compute_logprobs(logits), ...)``
    without a fp32 ``[N, V]`` tensor; logprobs are ``logit - logsumexp`` formed in fp32.

    Bad ids and rows whose logsumexp is not finite (NaN, +inf, or only -inf) are flagged on
    the device and read once at the end: one host wait per call, none with ``validate=False``.
    Rows are processed in blocks whose temporaries fit ``budget_bytes`` (:func:`block_rows`)."""
    _, vocab, num_logprobs = check_call(logits, num_logprobs, token_ids)
    targets, bad_ids = device_targets(token_ids, logits.device, vocab, validate)
    out, lse = fused_unchecked(logits, num_logprobs, targets, budget_bytes)
    if bad_ids is not None:  # validating
        raise_flagged(bad_ids, token_ids, vocab, ~torch.isfinite(lse),
                      "logits contain NaN, +inf, or only -inf")
    return out


def fused_unchecked(logits: torch.Tensor, num_logprobs: int, targets: torch.Tensor,
                    budget_bytes: float | None = None) -> tuple[LogprobsTensors, torch.Tensor]:
    """:func:`logprobs_from_logits` on int64 ``targets`` on the logits' device, all in range;
    returns the result and each row's logsumexp (not finite: a bad row)."""
    rows = logits.shape[0]
    device = logits.device
    out = LogprobsTensors.empty(rows, num_logprobs, device)
    lse = torch.empty(rows, dtype=torch.float32, device=device)
    step = block_rows(rows, logits.shape[1], logits.element_size(), budget_bytes)
    for start in range(0, rows, step):
        block = logits[start:start + step]
        target = block.gather(1, targets[start:start + step, None])
        out.selected_token_ranks[start:start + step] = (block >= target).sum(1)
        out.logprobs[start:start + step, 0] = target[:, 0]
        if num_logprobs:
            values, ids = torch.topk(block, num_logprobs, dim=1)
            out.logprobs[start:start + step, 1:] = values
            out.logprob_token_ids[start:start + step, 1:] = ids
        lse[start:start + step] = torch.logsumexp(block.float(), dim=1)
    out.logprob_token_ids[:, 0] = targets
    out.logprobs.sub_(lse[:, None])
    return out, lse


# -------------------------------------------------------------------------------------- host

def gather_logprobs_host(logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor, *,
                         backend: str = "numpy", validate: bool = True) -> LogprobsTensors:
    """The seed engine's host gather on ``[N, V]`` host logprobs; same result as
    :func:`gather_logprobs`. ``backend="numpy"``: per row, argpartition of the top K then a sort
    of those K, and a count for the rank. ``backend="native"``: the seed's C++ loop
    (:mod:`stagelab.measure.native`; contiguous fp32 input only, raises NativeUnavailable where it could
    not be built). Ids outside the vocabulary are always refused (a cheap host check, no wait);
    ``validate=False`` skips the NaN scan, a full pass over the data, for callers that
    validated their data already."""
    if backend not in HOST_BACKENDS:
        raise ValueError(f"backend must be one of {HOST_BACKENDS}, got {backend!r}")
    rows, vocab, num_logprobs = check_call(logprobs, num_logprobs, token_ids, "logprobs")
    if logprobs.device.type != "cpu":
        raise ValueError(f"logprobs must be on the host for gather_logprobs_host, got "
                         f"{logprobs.device}")
    if backend == "native":
        if logprobs.dtype != torch.float32 or not logprobs.is_contiguous():
            raise ValueError(f"logprobs must be a contiguous float32 tensor for the native "
                             f"backend, got {logprobs.dtype}"
                             f"{'' if logprobs.is_contiguous() else ', not contiguous'}")
        native.require()
    targets = token_ids.to("cpu", torch.int64).contiguous()
    np = numpy_or_none()
    if np is None:
        _check_host_torch(logprobs, targets, vocab, backend, validate)
    else:
        _check_host_numpy(np, logprobs, targets, vocab, validate)
    out = LogprobsTensors.empty_host(rows, num_logprobs)
    if backend == "native":
        native.gather_logprobs(logprobs, targets, num_logprobs, *out.tensors())
    else:
        values = logprobs.numpy() if logprobs.dtype == torch.float32 else logprobs.float().numpy()
        _gather_numpy(np, values, num_logprobs, targets.numpy(),
                      *(t.numpy() for t in out.tensors()))
    return out


@functools.cache
def numpy_or_none() -> Any:
    """numpy where it is importable; None on a node with torch alone (asked once)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def require_numpy() -> None:
    """Raise :class:`ExtraUnavailable` where numpy is not importable (its arm is unavailable)."""
    if numpy_or_none() is None:
        raise ExtraUnavailable("numpy is not installed here: the numpy host top-K cannot run")


def _check_host_numpy(np: Any, logprobs: torch.Tensor, targets: torch.Tensor, vocab: int,
                      validate: bool) -> None:
    """Ids in range and, with ``validate``, no NaN row: checked in numpy, so the SyncCounter sees
    no wait (host data needs none)."""
    ids = targets.numpy()
    bad_ids = (ids < 0) | (ids >= vocab)
    if bad_ids.any():
        raise_bad_token_ids(torch.from_numpy(bad_ids), targets, vocab)
    if validate:
        values = logprobs.numpy() if logprobs.dtype == torch.float32 else logprobs.float().numpy()
        nan = np.isnan(values.max(axis=1))
        if nan.any():
            raise_bad_rows(torch.from_numpy(nan), "logprobs contain NaN")


def _check_host_torch(logprobs: torch.Tensor, targets: torch.Tensor, vocab: int, backend: str,
                      validate: bool) -> None:
    """The same checks in torch, where numpy is missing (the host data needs no wait either)."""
    if backend == "numpy":
        require_numpy()
    raise_bad_token_ids(out_of_range(targets, vocab), targets, vocab)
    if validate:
        raise_bad_rows(torch.isnan(logprobs.float().amax(dim=1)), "logprobs contain NaN")


def _gather_numpy(np: Any, values: Any, k: int, targets: Any, ids: Any, out: Any,
                  ranks: Any) -> None:
    vocab = values.shape[1]
    for i in range(values.shape[0]):
        row = values[i]
        target = row[targets[i]]
        ranks[i] = np.count_nonzero(row >= target)
        ids[i, 0], out[i, 0] = targets[i], target
        if k:
            top = np.argpartition(row, vocab - k)[vocab - k:] if k < vocab else np.arange(vocab)
            top = top[np.argsort(row[top], kind="stable")[::-1]]
            ids[i, 1:], out[i, 1:] = top, row[top]
