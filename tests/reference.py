"""A float64 reference for logprobs results, and the comparison every exactness test uses."""

from __future__ import annotations

import torch

from stagelab.measure.logprobs import LogprobsTensors


def reference_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.double(), dim=-1)


def assert_matches_reference(result: LogprobsTensors, logits: torch.Tensor, k: int,
                             tokens: torch.Tensor, atol: float = 1e-5,
                             exact_ranks: bool = True) -> None:
    """Values within ``atol`` of float64, ranks equal, top-K ids right up to the order of ties."""
    ref = reference_logprobs(logits.cpu())
    rows, vocab = ref.shape
    ids = result.logprob_token_ids.cpu().long()
    values = result.logprobs.cpu().double()
    assert result.logprob_token_ids.dtype == torch.int32 and ids.shape == (rows, k + 1)
    assert result.logprobs.dtype == torch.float32 and values.shape == (rows, k + 1)
    assert result.selected_token_ranks.dtype == torch.int32
    assert torch.equal(ids[:, 0], tokens.cpu().long())
    # every reported value is the reference value of the id it names
    torch.testing.assert_close(values, ref.gather(1, ids), atol=atol, rtol=0)
    # the top-K values are the K largest, in descending order
    torch.testing.assert_close(values[:, 1:], torch.topk(ref, k, dim=1).values, atol=atol, rtol=0)
    for row in ids[:, 1:]:
        assert len(set(row.tolist())) == k, "top-K ids must be distinct"
    target = ref.gather(1, tokens.cpu().long()[:, None])
    expected_ranks = (ref >= target).sum(1)
    ranks = result.selected_token_ranks.cpu().long()
    if exact_ranks:
        assert torch.equal(ranks, expected_ranks)
    else:  # ties within fp32 rounding may count against the target
        assert (ranks >= expected_ranks).all()
