"""No hidden host waits in measured paths, counted on CPU by the library's SyncCounter."""

from __future__ import annotations

import pytest
import torch

from stagelab.measure import device
from stagelab.measure import logprobs as lp
from stagelab.measure import prompt_logprobs as pl
from stagelab.measure.testing import SyncCounter

T, V, H = 513, 1000, 16  # 512 scored rows: chunk 512 is one chunk, chunk 16 is 32 chunks


def count_waits(call) -> SyncCounter:
    with SyncCounter() as counter:
        call()
    return counter


@pytest.fixture(scope="module")
def prompt():
    return pl.make_inputs(T, V, H, torch.float32)


@pytest.mark.parametrize("method", pl.METHODS)
def test_prompt_logprobs_waits_do_not_grow_with_the_number_of_chunks(prompt, method):
    hidden, weight, ids = prompt
    waits = {chunk: count_waits(lambda c=chunk: pl.prompt_logprobs(
        hidden, weight, ids, 5, c, method=method, overlap=True)).hidden
        for chunk in (512, 128, 32, 16)}
    assert waits[16] <= waits[512] + 1, waits
    assert waits == {512: 2, 128: 2, 32: 2, 16: 2}  # the ids up front, the row flags at the end


def test_prompt_logprobs_without_validation_makes_no_wait(prompt):
    hidden, weight, ids = prompt
    counter = count_waits(lambda: pl.prompt_logprobs(hidden, weight, ids, 5, 16, validate=False))
    assert counter.hidden == 0 and counter.explicit == 0


@pytest.mark.parametrize("call", [
    lambda x, t: lp.logprobs_from_logits(x, 5, t),
    lambda x, t: lp.gather_logprobs(lp.compute_logprobs(x), 5, t),
], ids=["logprobs_from_logits", "gather_logprobs"])
def test_one_wait_per_device_call_and_none_without_validation(call):
    logits, tokens = torch.randn(64, V), torch.randint(0, V, (64,))
    assert count_waits(lambda: call(logits, tokens)).hidden <= 1
    assert count_waits(lambda: lp.logprobs_from_logits(logits, 5, tokens, validate=False)
                       ).hidden == 0
    assert count_waits(lambda: lp.gather_logprobs(logits, 5, tokens, validate=False)).hidden == 0


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_the_host_gather_counts_no_wait(backend):
    """Host data never waits: its checks run in numpy, so a step's count is its designed waits."""
    logprobs = torch.log_softmax(torch.randn(16, V), dim=-1)
    tokens = torch.randint(0, V, (16,))
    assert count_waits(lambda: lp.gather_logprobs_host(logprobs, 5, tokens, backend=backend)
                       ).hidden == 0


@pytest.mark.parametrize("op, name", [
    (lambda t: int(t.max()), "_local_scalar_dense"),
    (lambda t: bool(t.any()), "_local_scalar_dense"),
    (lambda t: t.sum().item(), "_local_scalar_dense"),
    (lambda t: torch.nonzero(t), "nonzero"),
    (lambda t: torch.equal(t, t), "equal"),
    (lambda t: t[t > 0], "index"),
    (lambda t: torch.masked_select(t, t > 0), "masked_select"),
    (lambda t: torch.unique(t), "_unique2"),
    (lambda t: torch.repeat_interleave(t.long().abs()), "repeat_interleave"),
    (lambda t: t.tolist(), "tolist"),
])
def test_the_counter_sees_each_kind_of_wait(op, name):
    """The negative control: each of these forces a wait on CUDA, and the counter sees it."""
    counter = count_waits(lambda: op(torch.tensor([1.0, 0.0, 3.0])))
    assert counter.hidden >= 1 and name in counter.ops, counter.ops


def test_the_counter_ignores_ops_that_do_not_wait():
    t = torch.randn(8, 16)
    counter = count_waits(lambda: (torch.topk(t, 3), t.sum(1), t.clone(), t[t.argmax(1) > 2 * 0],
                                   torch.repeat_interleave(t, 2, dim=0)))
    assert counter.ops == ["index"]  # only the boolean-mask indexing


def test_explicit_waits_are_counted_and_the_wrapper_removed():
    original, tolist = device.synchronize, torch.Tensor.tolist
    with SyncCounter() as counter:
        device.synchronize("cpu")
        device.synchronize(torch.device("cpu"))
    assert counter.explicit == 2 and counter.hidden == 0
    assert device.synchronize is original and torch.Tensor.tolist is tolist
    assert "tolist" not in vars(torch.Tensor)
    assert count_waits(lambda: None).explicit == 0
