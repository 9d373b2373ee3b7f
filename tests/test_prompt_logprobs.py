"""Chunked prompt logprobs: exact for every chunk size, overlap that cannot read early, bad input."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from reference import assert_matches_reference
from stagelab.measure import logprobs as lp
from stagelab.measure import memory
from stagelab.measure import prompt_logprobs as pl

T, H, V = 41, 8, 257


def inputs(dtype=torch.float32, tokens: int = T, vocab: int = V, seed: int = 0):
    return pl.make_inputs(tokens, vocab, H, dtype, seed=seed)


class LookupHead:
    """An lm_head whose logits for a row do not depend on the chunk: looked up by row content."""

    def __init__(self, hidden_states: torch.Tensor, vocab: int, dtype=torch.float32) -> None:
        g = torch.Generator().manual_seed(5)
        self.table = (3 * torch.randn(hidden_states.shape[0], vocab, generator=g)).to(dtype)
        self.keys = hidden_states

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        index = (rows[:, None, :] == self.keys[None]).all(-1).float().argmax(1)
        return self.table[index]


def same(a: lp.LogprobsTensors, b: lp.LogprobsTensors) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors()))


CHUNKS = [1, 3, 7, 16, T - 2, T - 1, T, T + 9]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_logsoftmax_chunked_is_bitwise_the_unchunked_result(chunk, overlap):
    hidden, _, ids = inputs()
    head = LookupHead(hidden, V)
    reference = pl.prompt_logprobs(hidden, head, ids, 5, None, method="logsoftmax")
    result = pl.prompt_logprobs(hidden, head, ids, 5, chunk, method="logsoftmax", overlap=overlap)
    assert same(result, reference)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_fused_chunked_is_bitwise_the_unchunked_result(chunk):
    hidden, _, ids = inputs()
    head = LookupHead(hidden, V)
    assert same(pl.prompt_logprobs(hidden, head, ids, 5, chunk),
                pl.prompt_logprobs(hidden, head, ids, 5, None))


@pytest.mark.parametrize("method", pl.METHODS)
@pytest.mark.parametrize("chunk", [1, 7, None])
def test_weight_matrix_agrees_within_fp32_rounding(method, chunk):
    hidden, weight, ids = inputs()
    result = pl.prompt_logprobs(hidden, weight, ids, 4, chunk, method=method)
    reference = pl.prompt_logprobs(hidden, weight, ids, 4, None, method=method)
    torch.testing.assert_close(result.logprobs, reference.logprobs, atol=1e-5, rtol=0)
    assert_matches_reference(result, hidden[:-1] @ weight.T, 4, ids[1:])


@pytest.mark.parametrize("k", [0, 1, V])
def test_fused_matches_float64_for_every_k(k):
    hidden, _, ids = inputs()
    head = LookupHead(hidden, V)
    result = pl.prompt_logprobs(hidden, head, ids, k, 6)
    assert result.logprobs.shape == (T - 1, k + 1)
    assert_matches_reference(result, head(hidden[:-1]), k, ids[1:], atol=1e-5)


def test_bf16_logits_bound():
    """bf16 logits: within 1e-5 of float64 of those same bf16 logits (the fused path rounds only
    its fp32 logsumexp); against the fp32 logits before rounding, bf16 itself costs up to
    |logit| x 2^-8."""
    hidden, _, ids = inputs()
    head = LookupHead(hidden, V, torch.bfloat16)
    result = pl.prompt_logprobs(hidden, head, ids, 5, 9)
    assert_matches_reference(result, head(hidden[:-1]), 5, ids[1:], atol=1e-5)


class DeferredEngine:
    """Copies only when their event is waited on, and poisons the slot meanwhile: a read of a
    slot before its wait, or a slot reused before it was read, yields poison or another chunk."""

    def __init__(self) -> None:
        self.launched = 0

    def launch(self, dst: lp.LogprobsTensors, src: lp.LogprobsTensors):
        snapshot = lp.LogprobsTensors(*(t.clone() for t in src.tensors()))
        for tensor in dst.tensors():
            tensor.fill_(-7)
        self.launched += 1

        class Event:
            def synchronize(self) -> None:
                dst.copy_(snapshot)

        return Event()


class EarlyReadCopier(pl.DoubleBufferCopier):
    """A deliberately broken copier: reads the slot before waiting on its event."""

    def drain(self) -> None:
        if self.pending is not None:
            event, slot, dest = self.pending
            dest.copy_(slot)
            event.synchronize()
            self.pending = None


@pytest.mark.parametrize("method", pl.METHODS)
@pytest.mark.parametrize("chunk", [1, 4, 13, T])
def test_overlap_never_reads_a_slot_before_its_copy_completed(method, chunk):
    hidden, weight, ids = inputs()
    engine = DeferredEngine()
    result = pl.prompt_logprobs(hidden, weight, ids, 3, chunk, method=method, copy_engine=engine)
    assert engine.launched == -(-(T - 1) // min(chunk, T - 1))
    assert same(result, pl.prompt_logprobs(hidden, weight, ids, 3, chunk, method=method,
                                           overlap=False))


def test_the_poisoning_catches_an_early_read(monkeypatch):
    """The negative control: the same check fails when the copier reads before it waits."""
    monkeypatch.setattr(pl, "DoubleBufferCopier", EarlyReadCopier)
    hidden, weight, ids = inputs()
    result = pl.prompt_logprobs(hidden, weight, ids, 3, 4, copy_engine=DeferredEngine())
    assert (result.selected_token_ranks == -7).any()


@pytest.mark.parametrize("mutate, error, message", [
    (lambda h, w, i, k, c: (h[:1], w, i[:1], k, c), ValueError, "T >= 2 tokens"),
    (lambda h, w, i, k, c: (h, w, i, k, 0), ValueError, "chunk_rows must be a positive int"),
    (lambda h, w, i, k, c: (h, w, i, k, -3), ValueError, "chunk_rows must be a positive int"),
    (lambda h, w, i, k, c: (h, w, i, V + 1, c), ValueError, r"num_logprobs must be in \[0, 257\]"),
    (lambda h, w, i, k, c: (h, w, i, -1, c), ValueError, r"num_logprobs must be in \[0, 257\]"),
    (lambda h, w, i, k, c: (h, w, i + V, k, c), ValueError, r"prompt_token_ids out of range"),
    (lambda h, w, i, k, c: (h, w, i.float(), k, c), TypeError, "prompt_token_ids must be an integer"),
    (lambda h, w, i, k, c: (h, w, i[:-1], k, c), ValueError, f"prompt_token_ids must be 1-D with {T}"),
    (lambda h, w, i, k, c: (h, w[:, :-1], i, k, c), ValueError, r"lm_head must be a \[V, 8\] weight"),
    (lambda h, w, i, k, c: (h, w.double(), i, k, c), TypeError, "lm_head is torch.float64"),
    (lambda h, w, i, k, c: (h[0], w, i, k, c), ValueError, "hidden_states must be a 2-D"),
    (lambda h, w, i, k, c: (h, "head", i, k, c), TypeError, "lm_head must be a"),
])
def test_bad_input_names_the_parameter(mutate, error, message):
    hidden, weight, ids = inputs()
    with pytest.raises(error, match=message):
        pl.prompt_logprobs(*mutate(hidden, weight, ids, 2, 8))


def test_unknown_method_is_named():
    hidden, weight, ids = inputs()
    with pytest.raises(ValueError, match="method must be one of"):
        pl.prompt_logprobs(hidden, weight, ids, 2, 8, method="fast")


def test_a_configuration_that_cannot_fit_is_refused_before_allocating(monkeypatch):
    hidden, weight, ids = inputs()
    monkeypatch.setattr(memory, "free_host_bytes", lambda: 1000)
    monkeypatch.setattr(lp.LogprobsTensors, "empty_host", None)  # any allocation would crash
    with pytest.raises(memory.InsufficientMemory, match=r"needs .* GiB but only .* smaller chunk"):
        pl.prompt_logprobs(hidden, weight, ids, 2, None)


def test_predicted_peak_follows_the_documented_model():
    f32, bf16 = torch.float32, torch.bfloat16

    def results(rows: int, chunk: int, k: int) -> int:
        return ((k + 1) * 8 + 4) * (chunk + rows + 2 * chunk) + rows

    assert pl.predicted_peak_bytes(101, 1000, None, f32, "logsoftmax", 2) == (
        100 * 1000 * (4 + 4 + 9) + results(100, 100, 2))
    assert pl.predicted_peak_bytes(101, 1000, 50, bf16, "logsoftmax", 0) == (
        50 * 1000 * (2 + 4 + 9) + results(100, 50, 0))
    blocks = lp.block_rows(100, 1000, 2, lp.bounded_budget(100, 1000, 2))
    assert blocks == 2  # 10 % of 100 x 1000 bf16 logits holds 2 rows of 9-byte temporaries
    assert pl.predicted_peak_bytes(101, 1000, None, bf16, "fused", 0) == (
        100 * 1000 * 2 + blocks * 1000 * 9 + results(100, 100, 0))
    with pytest.raises(ValueError, match="method must be"):
        pl.predicted_peak_bytes(3, 3, None, f32, "other")


# no machine alone needed: a probe's figure is its own process's peak (memory.measure_peaks)
def test_measured_peaks_separate_chunked_fused_from_unchunked_logsoftmax():
    config = dict(sizes=dict(tokens=257, vocab=32768, hidden=16, dtype="float32", k=5),
                  overlap=True)
    small, large = memory.measure_peaks(pl.memory_probe, [
        {**config, "chunk": 32, "method": "fused"},
        {**config, "chunk": None, "method": "logsoftmax"}], parallel=2)
    assert small["hwm_reset"] and large["hwm_reset"]
    assert small["device_extra_bytes"] is None or torch.cuda.is_available()
    logits = 256 * 32768 * 4
    assert large["host_extra_bytes"] > 3 * logits  # logits, fp32 logprobs, rank temporaries
    # a chunk of 32 rows holds 4 MiB of logits; the rest of its peak is the allocator's and the
    # process's own slack, which moves by a few MiB between runs (8.4 MiB seen against 8 MiB)
    assert small["host_extra_bytes"] < logits / 2
    assert small["host_extra_bytes"] < large["host_extra_bytes"] / 10


def test_numpy_integers_are_accepted_for_k_and_chunk():
    """Issue 14: np.int64 num_logprobs or chunk_rows were refused."""
    import numpy as np

    hidden, weight, ids = inputs()
    expected = pl.prompt_logprobs(hidden, weight, ids, 3, 8)
    assert same(pl.prompt_logprobs(hidden, weight, ids, np.int64(3), np.int32(8)), expected)
    with pytest.raises(ValueError, match="chunk_rows must be a positive int"):
        pl.prompt_logprobs(hidden, weight, ids, 3, 8.0)
    with pytest.raises(ValueError, match="chunk_rows must be a positive int"):
        pl.prompt_logprobs(hidden, weight, ids, 3, np.bool_(True))


@pytest.mark.parametrize("mutate, message", [
    (lambda h, w, i: (h.to("meta"), w, i), "hidden_states is a meta tensor"),
    (lambda h, w, i: (h.to("meta"), w.to("meta"), i), "hidden_states is a meta tensor"),
    (lambda h, w, i: (h, w, i.to("meta")), "prompt_token_ids is a meta tensor"),
    (lambda h, w, i: (h.requires_grad_(), w, i), r"hidden_states requires grad"),
    (lambda h, w, i: (h, w.requires_grad_(), i), r"lm_head requires grad"),
    (lambda h, w, i: (h, torch.nn.Linear(H, V, bias=False), i), "require grad: call .*no_grad"),
])
def test_meta_and_grad_inputs_get_clear_errors(mutate, message):
    """Issue 14: meta tensors got raw torch errors; tensors that require grad were not named."""
    hidden, weight, ids = inputs()
    with pytest.raises(ValueError, match=message):
        pl.prompt_logprobs(*mutate(hidden, weight, ids), 2, 8)


@pytest.mark.parametrize("method", pl.METHODS)
@pytest.mark.parametrize("chunk", [7, None])
def test_bad_rows_are_named_by_prompt_position_once_per_prompt(method, chunk):
    hidden, weight, ids = inputs()
    hidden[[3, 30]] = float("nan")  # rows 3 and 30 fall in different chunks of 7
    with pytest.raises(ValueError, match=r"NaN.*rows \[3, 30\]"):
        pl.prompt_logprobs(hidden, weight, ids, 2, chunk, method=method)
    result = pl.prompt_logprobs(hidden, weight, ids, 2, chunk, method=method, validate=False)
    assert result.logprobs.shape == (T - 1, 3)


def test_bad_ids_are_named_before_the_chunk_loop(monkeypatch):
    hidden, weight, ids = inputs()
    ids[[5, 9]] = V + 1
    monkeypatch.setattr(pl, "_project", None)  # any chunk would crash
    with pytest.raises(ValueError, match=rf"prompt_token_ids out of range \[0, {V}\): rows "
                                         rf"\[5, 9\] hold \[{V + 1}, {V + 1}\]"):
        pl.prompt_logprobs(hidden, weight, ids, 2, 8)


def test_a_tiny_sweep_measures_every_configuration_and_says_its_memory_first():
    from stagelab.measure.shapes import ModelShape

    shape = ModelShape("tiny", 64, 8)
    plan = pl.memory_plan(pl.PromptSweep(
        17, shape, 8, [4], torch.float32, 2, ["fused"], [False]), device="cpu")
    assert plan.startswith("Memory: T=17 V=64 H=8") and "fits" in plan
    records = pl.measure(pl.PromptSweep(
        17, shape, 8, [4], torch.float32, 2, ["fused"], [False], rounds=2, warmup=0,
        measure_memory=False), device="cpu", progress=False)
    timed = {(r["arm"], r["chunk"]) for r in records
             if r.get("metric", "time") == "time" and r.get("status", "ok") == "ok"}
    assert timed == {("fused", 16), ("fused", 4)}  # unchunked (T - 1 rows) and chunk 4


def test_exactness_is_checked_on_the_timed_results_without_running_them_again(monkeypatch):
    from stagelab.measure.shapes import ModelShape

    calls = []
    real = pl.prompt_logprobs
    monkeypatch.setattr(pl, "prompt_logprobs", lambda *a, **kw: calls.append(a[4]) or real(*a, **kw))
    records = pl.measure(pl.PromptSweep(
        17, ModelShape("tiny", 64, 8), 8, [4], torch.float32, 2, ["fused"], [True], rounds=2,
        warmup=1, measure_memory=False), device="cpu", progress=False)
    # two configurations x three timed calls, and the reference (unchunked, no overlap) once
    assert sorted(calls, key=str) == sorted([16] * 3 + [4] * 3 + [16], key=str)
    checks = {(r["arm"], r["chunk"]): r["value"] for r in records if r.get("metric") == "bitwise_equal"}
    assert checks == {("fused+overlap", 16): 1.0, ("fused+overlap", 4): 1.0}


def test_memory_probes_run_side_by_side_only_as_cores_and_memory_allow(monkeypatch):
    monkeypatch.setattr(pl.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(pl.memory, "free_host_bytes", lambda: 10 * 2**30)
    assert pl.probe_parallelism("cpu", 2**20, 6) == 2  # two cores
    assert pl.probe_parallelism("cpu", 2**20, 1) == 1
    assert pl.probe_parallelism("cpu", 8 * 2**30, 6) == 1  # one probe's need is most of memory
    assert pl.probe_parallelism("cuda:0", 2**20, 6) == 1  # probes would share the device
    monkeypatch.setattr(pl.memory, "free_host_bytes", lambda: None)  # unknown: the cores bound
    assert pl.probe_parallelism("cpu", 2**20, 6) == 2


class _FakeProbe:
    """Stands in for a probe process: finishes at once with its configuration as its figures."""

    envs: list = []
    thresholds: list = []

    def __init__(self, target, config, env, timeout):
        self.config = config
        _FakeProbe.envs.append(env.get("OMP_WAIT_POLICY"))
        _FakeProbe.thresholds.append(env.get("MALLOC_MMAP_THRESHOLD_"))

    def finished(self):
        return True

    def result(self):
        return self.config


def test_probes_side_by_side_keep_their_order_and_wait_passively(monkeypatch):
    monkeypatch.setattr(memory, "_Probe", _FakeProbe)
    monkeypatch.setattr(_FakeProbe, "envs", [])
    monkeypatch.setattr(_FakeProbe, "thresholds", [])
    configs = [{"chunk": c} for c in (8, 16, 32, None)]
    assert memory.measure_peaks("m:f", configs, 2) == configs
    assert _FakeProbe.envs == ["PASSIVE"] * 4
    _FakeProbe.envs.clear()
    assert memory.measure_peaks("m:f", configs[:1]) == configs[:1]
    assert _FakeProbe.envs == [os.environ.get("OMP_WAIT_POLICY")]  # one at a time: the caller's
    # every probe, alone or side by side, with glibc handing freed blocks back at once
    assert _FakeProbe.thresholds == [memory.HOST_ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]] * 5
    with pytest.raises(ValueError, match="parallel"):
        memory.measure_peaks("m:f", configs, 0)


@pytest.fixture
def sleepy_target(tmp_path, monkeypatch):
    """A probe target whose set-up sleeps: ``sleepy_probe:build`` (found through PYTHONPATH)."""
    (tmp_path / "sleepy_probe.py").write_text(
        "import time\n\ndef build(seconds):\n    time.sleep(seconds)\n    return lambda: None\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    started = []
    real = memory._Probe

    def recording(*args):
        started.append(real(*args))
        return started[-1]

    monkeypatch.setattr(memory, "_Probe", recording)
    return started


def test_a_stop_kills_the_running_probes_at_once(sleepy_target):
    """Ctrl-C or SIGTERM while probes run: they are killed, not waited for."""
    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            memory.measure_peaks("sleepy_probe:build", [{"seconds": 60}] * 3, parallel=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # both running probes were killed, not waited for (they sleep 60 s before measuring)
    assert [p.process.returncode for p in sleepy_target] == [-signal.SIGKILL] * 2


def test_a_probe_past_its_time_is_named_and_killed(sleepy_target):
    with pytest.raises(TimeoutError, match="memory probe sleepy_probe:build .* ran past its time"):
        memory.measure_peaks("sleepy_probe:build", [{"seconds": 60}], timeout=0.5)
    (probe,) = sleepy_target
    assert probe.process.returncode == -signal.SIGKILL


def test_a_probe_target_is_built_from_the_function_object():
    assert memory.probe_target(pl.memory_probe) == "stagelab.measure.prompt_logprobs:memory_probe"
    assert memory.probe_target("m:f") == "m:f"

    def nested(**config):
        return lambda: None

    for unimportable in (nested, lambda **config: None):
        with pytest.raises(ValueError, match="top level of an importable module"):
            memory.probe_target(unimportable)


# ------------------------------------------------------------------------------ head_fused

HEAD_FUSED = pl.catalogue.HEAD_FUSED


@pytest.mark.parametrize(("chunk", "tile"), [(1, 64), (7, 100), (None, 64), (16, 1000)])
def test_head_fused_tiles_give_the_unchunked_answer(chunk, tile):
    """Ragged tiles (V = 257), one tile wider than the vocabulary, a row per chunk: the fused
    method's ids and ranks at the same chunk, its logprobs within fp32 rounding. (The ranks
    are exact where a tile's product rounds as the whole product does: here from 64 columns;
    7-column products rounded differently, flipping a rank against a near-tie.)"""
    hidden, weight, ids = inputs()
    reference = pl.prompt_logprobs(hidden, weight, ids, 6, chunk)
    result = pl.prompt_logprobs(hidden, weight, ids, 6, chunk, method=HEAD_FUSED, tile=tile)
    assert torch.equal(result.logprob_token_ids, reference.logprob_token_ids)
    assert torch.equal(result.selected_token_ranks, reference.selected_token_ranks)
    torch.testing.assert_close(result.logprobs, reference.logprobs, atol=1e-5, rtol=0)


def test_configurations_sweep_tiles_for_head_fused_alone():
    """The first tile as every method (unchunked and each chunk, every overlap), each further
    tile at the chunks with the first overlap; the other methods carry no tile."""
    configs = pl.configurations(16, [4, 8, 32], ["fused", HEAD_FUSED], [True, False], [64, 128])
    assert configs == {
        "fused+overlap@16": ("fused", 16, True, None), "fused@16": ("fused", 16, False, None),
        "fused+overlap@4": ("fused", 4, True, None), "fused@4": ("fused", 4, False, None),
        "fused+overlap@8": ("fused", 8, True, None), "fused@8": ("fused", 8, False, None),
        "head_fused+overlap@16/tile64": (HEAD_FUSED, 16, True, 64),
        "head_fused@16/tile64": (HEAD_FUSED, 16, False, 64),
        "head_fused+overlap@4/tile64": (HEAD_FUSED, 4, True, 64),
        "head_fused@4/tile64": (HEAD_FUSED, 4, False, 64),
        "head_fused+overlap@8/tile64": (HEAD_FUSED, 8, True, 64),
        "head_fused@8/tile64": (HEAD_FUSED, 8, False, 64),
        "head_fused+overlap@4/tile128": (HEAD_FUSED, 4, True, 128),
        "head_fused+overlap@8/tile128": (HEAD_FUSED, 8, True, 128)}
    assert pl.probed(configs, [True, False]) == [k for k in configs if "+overlap" in k]
    assert pl.configurations(16, [32], [HEAD_FUSED], [False], [64, 128]) == {
        "head_fused@16/tile64": (HEAD_FUSED, 16, False, 64),
        "head_fused@16/tile128": (HEAD_FUSED, 16, False, 128)}  # no chunk: the whole prompt
    assert set(pl.configurations(16, [4], [HEAD_FUSED], [True])) == {
        "head_fused+overlap@16/tile1024", "head_fused+overlap@4/tile1024"}  # the default


def test_a_tile_sweep_rows_carry_their_tile_checked_against_the_same_tile_unchunked(monkeypatch):
    from stagelab.measure.shapes import ModelShape

    tiles_run = []
    real = pl.prompt_logprobs
    monkeypatch.setattr(pl, "prompt_logprobs",
                        lambda *a, **kw: tiles_run.append((a[4], kw["tile"])) or real(*a, **kw))
    records = pl.measure(pl.PromptSweep(
        17, ModelShape("tiny", 64, 8), 8, [4], torch.float32, 2, ["fused", HEAD_FUSED], [True],
        rounds=2, warmup=0, measure_memory=False, tiles=[16, 32]), device="cpu", progress=False)
    timed = {(r["arm"], r["chunk"], r["tile"]) for r in records
             if r.get("metric", "time") == "time" and r.get("status", "ok") == "ok"}
    assert timed == {("fused+overlap", 16, None), ("fused+overlap", 4, None),
                     ("head_fused+overlap", 16, 16), ("head_fused+overlap", 4, 16),
                     ("head_fused+overlap", 4, 32)}
    # tile 32's unchunked reference ran once, untimed, for its exactness check
    assert tiles_run.count((16, 32)) == 1 and tiles_run.count((4, 32)) == 2
    checks = {(r["chunk"], r["tile"]): r["value"] for r in records
              if r.get("metric") == "id_mismatches" and r["arm"].startswith(HEAD_FUSED)}
    assert checks == {(16, 16): 0.0, (4, 16): 0.0, (4, 32): 0.0}
    predicted = {r["tile"]: r["bytes"] for r in records
                 if r.get("metric") == "predicted_peak_bytes" and r["chunk"] == 4}
    assert predicted[32] > predicted[16] and predicted[None] > 0


@pytest.mark.parametrize(("tiles", "match"), [([], "tiles is empty"),
                                              ([64, 0], "tile must be a positive int")])
def test_bad_tiles_are_refused_before_anything_runs(tiles, match):
    from stagelab.measure.shapes import ModelShape

    with pytest.raises(ValueError, match=match):
        pl.prompt_cell(pl.PromptSweep(
            17, ModelShape("tiny", 64, 8), 8, [4], torch.float32, 2, [HEAD_FUSED], [True],
            tiles=tiles), device="cpu")


def test_head_fused_needs_a_weight_and_a_positive_tile():
    hidden, weight, ids = inputs()
    with pytest.raises(TypeError, match="lm_head must be a \\[V, H\\] weight tensor"):
        pl.prompt_logprobs(hidden, LookupHead(hidden, V), ids, 2, 8, method=HEAD_FUSED)
    with pytest.raises(ValueError, match="tile must be a positive int"):
        pl.prompt_logprobs(hidden, weight, ids, 2, 8, method=HEAD_FUSED, tile=0)


def test_head_fused_predicted_peak_holds_no_chunk_of_logits():
    chunk_logits = 256 * 152064 * 4
    head = pl.predicted_peak_bytes(513, 152064, 256, torch.float32, HEAD_FUSED, 5)
    assert head < 0.35 * chunk_logits
    assert head < pl.predicted_peak_bytes(513, 152064, 256, torch.float32, "fused", 5) / 4


def test_head_fused_predicted_peak_counts_the_tile_its_upcast_and_its_keys():
    f32, bf16 = torch.float32, torch.bfloat16
    bare = {dtype: pl.predicted_peak_bytes(513, 32768, 256, dtype, HEAD_FUSED, 5, tile=1)
            for dtype in (f32, bf16)}
    wider = 256 * (pl.TARGET_COLUMNS - 1)  # the targets' product: as wide as a tile, up to 256
    for tile in (1024, 2048):
        extra = 256 * (tile - 1)  # elements a tile holds beyond a one-column tile, per moment
        assert pl.predicted_peak_bytes(513, 32768, 256, f32, HEAD_FUSED, 5, tile=tile) == (
            bare[f32] + extra * (4 + pl.HEAD_TILE_TEMP_BYTES) + wider * 4)  # no upcast
        assert pl.predicted_peak_bytes(513, 32768, 256, bf16, HEAD_FUSED, 5, tile=tile) == (
            bare[bf16] + extra * (2 + 4 + pl.HEAD_TILE_TEMP_BYTES) + wider * 2)


def test_head_fused_measured_peak_is_close_to_its_model():
    """Before: at chunk 256, tile 2048 the model said 13.1 MiB and RSS 15.7 or 23.4 MiB by the
    run (glibc kept freed blocks resident); now glibc hands them back and the model counts what a
    tile holds at once."""
    config = dict(sizes=dict(tokens=513, vocab=32768, hidden=256, dtype="float32", k=5),
                  chunk=256, method=HEAD_FUSED, overlap=False, tile=2048)
    (peak,) = memory.measure_peaks(pl.memory_probe, [config])
    model = pl.predicted_peak_bytes(513, 32768, 256, torch.float32, HEAD_FUSED, 5, tile=2048,
                                    hidden=256)
    assert peak["hwm_reset"]
    assert 0.85 * model <= peak["host_extra_bytes"] <= 1.1 * model, (peak, model)


@pytest.mark.slow
def test_head_fused_is_exact_at_a_real_vocabulary_and_holds_a_third_of_a_chunk():
    """T = 513, V = 152,064: the unchunked reference's ids, its logprobs within fp32 rounding;
    at chunk 256 a resident peak (a fresh probe process) under 0.35 of one [256, V] fp32 chunk."""
    tokens, vocab, hidden_size = 513, 152064, 64
    hidden, weight, ids = pl.make_inputs(tokens, vocab, hidden_size, torch.float32)
    reference = pl.prompt_logprobs(hidden, weight, ids, 5, None)
    result = pl.prompt_logprobs(hidden, weight, ids, 5, 256, method=HEAD_FUSED)
    assert torch.equal(result.logprob_token_ids, reference.logprob_token_ids)
    assert torch.equal(result.selected_token_ranks, reference.selected_token_ranks)
    torch.testing.assert_close(result.logprobs, reference.logprobs, atol=5e-5, rtol=0)
    del reference, result
    (peak,) = memory.measure_peaks(pl.memory_probe, [dict(
        sizes=dict(tokens=tokens, vocab=vocab, hidden=hidden_size, dtype="float32", k=5),
        chunk=256, method=HEAD_FUSED, overlap=True)])
    assert peak["hwm_reset"]
    assert 0 < peak["host_extra_bytes"] <= 0.35 * 256 * vocab * 4


@pytest.mark.parametrize("method", pl.METHODS)
def test_every_method_ranks_as_vllm_on_tied_bf16_rows(method):
    """vLLM's rank (V1's ``batched_count_greater_than``: the logprobs ``>=`` the target's),
    restated here, on bf16 logits that are small integers (exact in every product, so that
    ties are ties in every method): a tied target ranks behind every logit it ties."""
    generator = torch.Generator().manual_seed(5)
    hidden = torch.randint(-3, 4, (41, 8), generator=generator).to(torch.bfloat16)
    weight = torch.randint(-3, 4, (300, 8), generator=generator).to(torch.bfloat16)
    ids = torch.randint(0, 300, (41,), generator=generator)
    result = pl.prompt_logprobs(hidden, weight, ids, 4, 16, method=method, tile=64)
    logits = (hidden.float() @ weight.float().T)[:-1]
    target = logits.gather(1, ids[1:, None])
    want = (logits >= target).sum(1)
    assert ((logits == target).sum(1) > 1).float().mean() > 0.9  # ties on most rows
    assert torch.equal(result.selected_token_ranks.long(), want)


def test_each_probe_that_ends_is_told_with_the_count(monkeypatch):
    """The finished callback: notebook 03's progress line while its probes run."""
    monkeypatch.setattr(memory, "_Probe", _FakeProbe)
    monkeypatch.setattr(_FakeProbe, "envs", [])
    monkeypatch.setattr(_FakeProbe, "thresholds", [])
    told: list[tuple[int, int]] = []
    configs = [{"chunk": c} for c in (8, 16, 32)]
    assert memory.measure_peaks("m:f", configs, 2, finished=lambda *a: told.append(a)) == configs
    assert told == [(1, 3), (2, 3), (3, 3)]
