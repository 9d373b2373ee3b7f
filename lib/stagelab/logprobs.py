"""Per-position logprobs with the semantics of vLLM V1's sampler, three ways.

A :class:`LogprobsTensors` row holds, in column 0, the selected (or prompt target) token and its
logprob, then the top-K tokens in descending order; ``selected_token_ranks`` is the 1-based rank of
the target: the number of vocabulary entries whose logprob is ``>=`` the target's (ties count
against the target).

* :func:`compute_logprobs` + :func:`gather_logprobs`: vLLM V1 on the device (a fp32 ``[N, V]``
  log-softmax, then top-K and the target).
* :func:`gather_logprobs_host`: the seed engine's host path, per row with numpy (argpartition of
  the top K, then a sort of those K), after the ``[N, V]`` logprobs were copied to the host.
* :func:`logprobs_from_logits`: the fused path. log-softmax is monotonic per row, so top-K, the
  target and its rank are taken on raw logits, and only the selected logprobs are formed as
  ``logit - logsumexp`` in fp32. It works through row blocks, so its extra memory is one block's,
  never a fp32 ``[N, V]`` tensor.

Tie order: among equal values the order of top-K ids is the backend's (``torch.topk`` or numpy's
``argpartition``) and is not specified; values, ranks and the set of tied ids are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from stagelab.device import require_cuda

# The fused path's temporaries per block element: the rank's bool comparison and the int64 its
# sum casts to (1 + 8 bytes, measured on CPU), which outweighs logsumexp's fp32 upcast and exp.
BLOCK_TEMP_BYTES = 9
# Blocks are sized so that those temporaries stay within this fraction of the logits' bytes.
BLOCK_EXTRA_FRACTION = 0.10


@dataclass
class LogprobsTensors:
    """``logprob_token_ids`` int32 ``[N, K+1]``, ``logprobs`` fp32 ``[N, K+1]``,
    ``selected_token_ranks`` int32 ``[N]``; column 0 is the selected/target token."""

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor

    @classmethod
    def empty(cls, num_positions: int, num_logprobs: int, device: torch.device | str = "cpu",
              pinned: bool = False) -> "LogprobsTensors":
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
                   pinned: bool = False) -> "LogprobsTensors":
        """Host tensors, pinned on request (raises PinnedMemoryUnavailable without CUDA)."""
        return cls.empty(num_positions, num_logprobs, "cpu", pinned)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.logprob_token_ids, self.logprobs, self.selected_token_ranks

    def rows(self, start: int, end: int) -> "LogprobsTensors":
        """A view of rows ``start:end``."""
        return LogprobsTensors(*(t[start:end] for t in self.tensors()))

    def copy_(self, other: "LogprobsTensors", non_blocking: bool = False) -> "LogprobsTensors":
        """Copy ``other`` into these tensors (any devices), returning self."""
        for dst, src in zip(self.tensors(), other.tensors()):
            dst.copy_(src, non_blocking=non_blocking)
        return self

    def to_host(self) -> "LogprobsTensors":
        """A fresh host copy (synchronous)."""
        return LogprobsTensors(*(t.to("cpu") for t in self.tensors()))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


# ------------------------------------------------------------------------------------ checks

def check_scores(scores: torch.Tensor, name: str = "logits") -> tuple[int, int]:
    """A 2-D floating ``[rows, vocab]`` tensor with at least one column; returns its shape."""
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(scores).__name__}")
    if scores.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, vocab], got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {scores.dtype}")
    rows, vocab = scores.shape
    if vocab == 0:
        raise ValueError(f"{name} has an empty vocabulary dimension")
    return rows, vocab


def check_num_logprobs(num_logprobs: int, vocab: int) -> None:
    """``0 <= K <= V``."""
    if isinstance(num_logprobs, bool) or not isinstance(num_logprobs, int):
        raise TypeError(f"num_logprobs must be an int, got {type(num_logprobs).__name__}")
    if not 0 <= num_logprobs <= vocab:
        raise ValueError(f"num_logprobs must be in [0, {vocab}] (the vocabulary), "
                         f"got {num_logprobs}")


def check_token_ids(token_ids: torch.Tensor, rows: int, vocab: int,
                    name: str = "token_ids") -> None:
    """An integer 1-D tensor of ``rows`` ids, each in ``[0, vocab)``."""
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(token_ids).__name__}")
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {token_ids.dtype}")
    if token_ids.dim() != 1 or token_ids.numel() != rows:
        raise ValueError(f"{name} must be 1-D with {rows} entries (one per row), got shape "
                         f"{tuple(token_ids.shape)}")
    if rows:
        low, high = int(token_ids.min()), int(token_ids.max())
        if low < 0 or high >= vocab:
            bad = torch.nonzero((token_ids < 0) | (token_ids >= vocab)).flatten()[:8].tolist()
            raise ValueError(f"{name} out of range [0, {vocab}): rows {bad} hold "
                             f"{token_ids[bad].tolist()}")


def _raise_bad_rows(bad: torch.Tensor, what: str) -> None:
    """Raise naming the rows flagged in a boolean ``[rows]`` tensor, if any."""
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten()
        shown = rows[:8].tolist()
        more = f" and {len(rows) - 8} more" if len(rows) > 8 else ""
        raise ValueError(f"{what}: rows {shown}{more}")


def check_inputs(scores: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor,
                 name: str = "logits") -> tuple[int, int]:
    """All the cheap checks, before anything large is allocated."""
    rows, vocab = check_scores(scores, name)
    check_num_logprobs(num_logprobs, vocab)
    check_token_ids(token_ids, rows, vocab)
    return rows, vocab


# ------------------------------------------------------------------------------------ device

def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-softmax over the last dimension (vLLM V1's ``compute_logprobs``)."""
    check_scores(logits)
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int,
                    token_ids: torch.Tensor) -> LogprobsTensors:
    """Top-K, the target and its rank from ``[N, V]`` logprobs, on the tensors' device."""
    check_inputs(logprobs, num_logprobs, token_ids, "logprobs")
    _raise_bad_rows(torch.isnan(logprobs.amax(dim=-1)), "logprobs contain NaN")
    targets = token_ids.to(device=logprobs.device, dtype=torch.int64).unsqueeze(-1)
    top_values, top_ids = torch.topk(logprobs, num_logprobs, dim=-1)
    target_values = logprobs.gather(-1, targets)
    ranks = (logprobs >= target_values).sum(-1)
    return LogprobsTensors(torch.cat([targets, top_ids], dim=1).to(torch.int32),
                           torch.cat([target_values, top_values], dim=1).to(torch.float32),
                           ranks.to(torch.int32))


def block_rows(rows: int, itemsize: int) -> int:
    """Rows per block of the fused path: temporaries within 10 % of the logits' bytes."""
    return max(1, min(rows, int(BLOCK_EXTRA_FRACTION * rows * itemsize / BLOCK_TEMP_BYTES)))


def logprobs_from_logits(logits: torch.Tensor, num_logprobs: int,
                         token_ids: torch.Tensor) -> LogprobsTensors:
    """The fused path: the same result as ``gather_logprobs(compute_logprobs(logits), ...)``
    without a fp32 ``[N, V]`` tensor; logprobs are ``logit - logsumexp`` formed in fp32."""
    rows, vocab = check_inputs(logits, num_logprobs, token_ids)
    device = logits.device
    out = LogprobsTensors.empty(rows, num_logprobs, device)
    targets = token_ids.to(device=device, dtype=torch.int64)
    lse = torch.empty(rows, dtype=torch.float32, device=device)
    step = block_rows(rows, logits.element_size())
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
    _raise_bad_rows(~torch.isfinite(lse), "logits contain NaN, +inf, or only -inf")
    out.logprob_token_ids[:, 0] = targets
    out.logprobs.sub_(lse[:, None])
    return out


# -------------------------------------------------------------------------------------- host

def gather_logprobs_host(logprobs: torch.Tensor, num_logprobs: int,
                         token_ids: torch.Tensor) -> LogprobsTensors:
    """The seed engine's host gather: per row, argpartition of the top K then a sort of those K,
    and a count for the rank; numpy on host memory. Same result as :func:`gather_logprobs`."""
    rows, vocab = check_inputs(logprobs, num_logprobs, token_ids, "logprobs")
    if logprobs.device.type != "cpu":
        raise ValueError(f"logprobs must be on the host for gather_logprobs_host, got "
                         f"{logprobs.device}")
    values = logprobs.numpy() if logprobs.dtype == torch.float32 else (
        logprobs.float().numpy())
    _raise_bad_rows(torch.from_numpy(np.isnan(values.max(axis=1))), "logprobs contain NaN")
    targets = token_ids.to(torch.int64).numpy()
    k = num_logprobs
    ids = np.empty((rows, k + 1), dtype=np.int32)
    out = np.empty((rows, k + 1), dtype=np.float32)
    ranks = np.empty(rows, dtype=np.int32)
    for i in range(rows):
        row = values[i]
        target = row[targets[i]]
        ranks[i] = np.count_nonzero(row >= target)
        ids[i, 0], out[i, 0] = targets[i], target
        if k:
            top = np.argpartition(row, vocab - k)[vocab - k:] if k < vocab else np.arange(vocab)
            top = top[np.argsort(row[top], kind="stable")[::-1]]
            ids[i, 1:], out[i, 1:] = top, row[top]
    return LogprobsTensors(torch.from_numpy(ids), torch.from_numpy(out), torch.from_numpy(ranks))
