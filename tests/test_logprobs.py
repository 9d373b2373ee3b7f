"""Exactness of every logprobs path against float64, and clear errors for bad input."""

from __future__ import annotations

import pytest
import torch

from conftest import make_logits, make_tokens
from reference import assert_matches_reference
from stagelab.measure import logprobs as lp
from stagelab.measure import staging


def vllm_path(logits, k, tokens):
    return lp.gather_logprobs(lp.compute_logprobs(logits), k, tokens)


def host_path(logits, k, tokens):
    return lp.gather_logprobs_host(lp.compute_logprobs(logits), k, tokens)


def native_path(logits, k, tokens):
    return lp.gather_logprobs_host(lp.compute_logprobs(logits), k, tokens, backend="native")


PATHS = {"device_gather": vllm_path, "host_gather": host_path, "host_native": native_path,
         "fused": lp.logprobs_from_logits}
# torch's fp32 log-softmax rounds its V-term sum and every subtraction: at V = 152k we saw
# 1.3e-5 from float64, so those paths get 5e-5. The fused path forms each value once as
# logit - logsumexp from the exact logit: within 1e-5.
ATOL = {"device_gather": 5e-5, "host_gather": 5e-5, "host_native": 5e-5, "fused": 1e-5}
SHAPES = [(1, 7), (5, 1001), (33, 4099), (3, 151_937)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n, vocab", SHAPES)
@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_paths_match_float64(path, n, vocab, k):
    k = min(k, vocab)
    logits, tokens = make_logits(n, vocab, seed=n), make_tokens(n, vocab)
    assert_matches_reference(PATHS[path](logits, k, tokens), logits, k, tokens, atol=ATOL[path])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(path, dtype):
    logits, tokens = make_logits(9, 3001, dtype), make_tokens(9, 3001)
    # bf16 logits round values often: ids may differ among ties, values and ranks may not
    assert_matches_reference(PATHS[path](logits, 5, tokens), logits, 5, tokens,
                             atol=ATOL[path], exact_ranks=path == "fused")


@pytest.mark.parametrize("path", PATHS)
def test_k_equals_vocab_and_masked_entries(path):
    logits, tokens = make_logits(4, 50), make_tokens(4, 50)
    logits[:, ::3] = float("-inf")  # a masked vocabulary
    tokens[0] = 0  # a masked target: rank V
    result = PATHS[path](logits, 50, tokens)
    assert_matches_reference(result, logits, 50, tokens)
    assert result.selected_token_ranks[0] == 50
    assert torch.isneginf(result.logprobs[:, -17:]).all()


@pytest.mark.parametrize("path", PATHS)
def test_duplicated_values_rank_against_the_target(path):
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0]])
    tokens = torch.tensor([1, 4])
    result = PATHS[path](logits, 3, tokens)
    assert result.selected_token_ranks.tolist() == [3, 5]
    assert sorted(result.logprob_token_ids[0, 1:].tolist()) == [1, 2, 3]
    assert_matches_reference(result, logits, 3, tokens)


def test_fused_works_across_many_blocks():
    logits, tokens = make_logits(300, 40_000), make_tokens(300, 40_000)
    budget = lp.bounded_budget(300, 40_000, 4)
    assert lp.block_rows(300, 40_000, 4, budget) == 13  # 10 % of 4-byte logits, 9-byte temps
    assert_matches_reference(lp.logprobs_from_logits(logits, 4, tokens, budget_bytes=budget),
                             logits, 4, tokens)


@pytest.mark.parametrize("rows, vocab, itemsize, blocks", [
    (64, 262_208, 2, 64),  # a decode batch in bf16 fits the budget: one block, not 64
    (256, 262_208, 2, 113),  # 256 MiB of 9-byte temporaries at V = 262k: 113 rows
    (16_384, 152_064, 2, 364),  # a huge batch: 10 % of its logits (16384 x 2 / 90 rows)
    (1, 10**9, 4, 1),  # at least one row, whatever the budget
])
def test_fused_blocks_are_sized_from_a_memory_budget(rows, vocab, itemsize, blocks):
    assert lp.block_rows(rows, vocab, itemsize) == blocks


def test_empty_host_tensors():
    out = lp.LogprobsTensors.empty_host(3, 4)
    assert out.logprob_token_ids.shape == (3, 5) and out.selected_token_ranks.shape == (3,)
    assert out.nbytes == 3 * 5 * 8 + 3 * 4
    if not torch.cuda.is_available():
        with pytest.raises(staging.PinnedMemoryUnavailable):
            lp.LogprobsTensors.empty_host(3, 4, pinned=True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mutate, error, message", [
    (lambda x, k, t: (x, -1, t), ValueError, r"num_logprobs must be in \[0, 10\]"),
    (lambda x, k, t: (x, 11, t), ValueError, r"num_logprobs must be in \[0, 10\]"),
    (lambda x, k, t: (x, k, t.float()), TypeError, "token_ids must be an integer tensor"),
    (lambda x, k, t: (x, k, t[:2]), ValueError, "token_ids must be 1-D with 3 entries"),
    (lambda x, k, t: (x, k, t + 10), ValueError, r"token_ids out of range \[0, 10\): rows \[0, 1, 2\]"),
    (lambda x, k, t: (x[0], k, t), ValueError, "must be 2-D"),
    (lambda x, k, t: (x[None], k, t), ValueError, "must be 2-D"),
])
def test_bad_input_names_the_parameter(path, mutate, error, message):
    logits, tokens = make_logits(3, 10), torch.tensor([1, 2, 3])
    with pytest.raises(error, match=message):
        PATHS[path](*mutate(logits, 2, tokens))


@pytest.mark.parametrize("path", PATHS)
def test_nan_rows_are_named(path):
    logits, tokens = make_logits(12, 10), make_tokens(12, 10)
    logits[3, 4] = logits[7, 0] = float("nan")
    with pytest.raises(ValueError, match=r"NaN.*rows \[3, 7\]"):
        PATHS[path](logits, 2, tokens)


def test_host_gather_refuses_device_tensors_and_fused_names_all_minus_inf_rows():
    logits, tokens = make_logits(3, 10), make_tokens(3, 10)
    logits[1] = float("-inf")
    with pytest.raises(ValueError, match=r"only -inf: rows \[1\]"):
        lp.logprobs_from_logits(logits, 2, tokens)


@pytest.mark.parametrize("path", PATHS)
def test_numpy_integers_are_accepted_as_num_logprobs(path):
    """Issue 14: num_logprobs=np.int64(3) was refused ("must be an int, got int64")."""
    import numpy as np

    logits, tokens = make_logits(4, 30), make_tokens(4, 30)
    result = PATHS[path](logits, np.int64(3), tokens)
    assert result.logprobs.shape == (4, 4)
    assert_matches_reference(result, logits, 3, tokens)
    with pytest.raises(TypeError, match="num_logprobs must be an int, got bool"):
        PATHS[path](logits, True, tokens)
    with pytest.raises(TypeError, match="num_logprobs must be an int, got float"):
        PATHS[path](logits, 3.0, tokens)


@pytest.mark.parametrize("path", PATHS)
def test_meta_tensors_get_a_clear_error(path):
    """Issue 14: meta tensors got raw torch errors (item() on a meta tensor)."""
    logits, tokens = make_logits(4, 30), make_tokens(4, 30)
    with pytest.raises(ValueError, match="logits is a meta tensor"):
        PATHS[path](logits.to("meta"), 2, tokens)
    with pytest.raises(ValueError, match="token_ids is a meta tensor"):
        PATHS[path](logits, 2, tokens.to("meta"))
    for name, call in [("logprobs", lp.gather_logprobs), ("logprobs", lp.gather_logprobs_host)]:
        with pytest.raises(ValueError, match=f"{name} is a meta tensor"):
            call(torch.empty(4, 30, device="meta"), 2, tokens)


@pytest.mark.parametrize("path", PATHS)
def test_inputs_that_require_grad_get_a_clear_error(path):
    """Issue 14: the host gather failed inside numpy() ("Can't call numpy() on Tensor that
    requires grad"); the device paths silently built an autograd graph."""
    logits, tokens = make_logits(4, 30).requires_grad_(), make_tokens(4, 30)
    with pytest.raises(ValueError, match=r"logits requires grad.*logits\.detach\(\)"):
        PATHS[path](logits, 2, tokens)
    with pytest.raises(ValueError, match="logprobs requires grad"):
        lp.gather_logprobs_host(lp.compute_logprobs(logits.detach()).requires_grad_(), 2, tokens)


@pytest.mark.parametrize("path", PATHS)
def test_validate_false_gives_the_same_result(path):
    logits, tokens = make_logits(9, 300), make_tokens(9, 300)
    checked = PATHS[path](logits, 4, tokens)
    if path == "fused":
        unchecked = lp.logprobs_from_logits(logits, 4, tokens, validate=False)
    elif path == "device_gather":
        unchecked = lp.gather_logprobs(lp.compute_logprobs(logits), 4, tokens, validate=False)
    else:
        unchecked = lp.gather_logprobs_host(lp.compute_logprobs(logits), 4, tokens,
                                            backend=path.removeprefix("host_").replace(
                                                "gather", "numpy"), validate=False)
    assert all(torch.equal(a, b) for a, b in zip(checked.tensors(), unchecked.tensors()))
