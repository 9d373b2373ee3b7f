"""The one-pass top-K/logsumexp/rank: both backends against an independent float64 reference.

The reference is a plain float64 log-softmax and numpy's lexicographic sort (value descending,
then id ascending), nothing of the module under test. The Triton backend runs in Triton's
interpreter here (``TRITON_INTERPRET=1``, set by the ``interpreted`` fixture for its tests only),
on a CUDA device where there is one; sizes are small but exercise ragged tiles, the running
top-K's merges and the split variant's merge of partial states.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import sys
import warnings

import numpy as np
import pytest
import torch

from stagelab.core import launches
from stagelab.measure import logprobs as lp
from stagelab.measure import onepass

ON_CUDA = torch.cuda.is_available()


def _kernels_module():
    from stagelab.measure import onepass_triton

    return onepass_triton


def _rebuild_kernels() -> None:
    importlib.reload(_kernels_module())
    onepass._import_kernels.cache_clear()


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def _library_interpreted() -> bool:
    """Whether Triton's own library functions were built for its interpreter (they are built
    once, when Triton is first imported)."""
    return type(sys.modules["triton"].language.standard.sort).__name__ == "InterpretedFunction"


@pytest.fixture
def interpreted(monkeypatch):
    """The Triton kernels as Triton's interpreter builds them (on a CPU), rebuilt as before
    afterwards so that no other test sees the interpreter."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (the test extra installs it)")
    if ON_CUDA:
        yield "cuda"
        return
    if (_version(importlib.metadata.version("triton")) < (3, 9)
            and _version(np.__version__) >= (2, 4)):
        pytest.skip("Triton < 3.9's interpreter cannot take loop bounds from numpy >= 2.4")
    if "triton" in sys.modules and not _library_interpreted():
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 was set: its own library "
                    "functions are compiled ones, which the interpreter cannot call")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _rebuild_kernels()
    assert onepass.interpreted(_kernels_module())
    yield "cpu"
    monkeypatch.delenv("TRITON_INTERPRET")
    _rebuild_kernels()


# Triton's interpreter runs every program in Python: its cases leave make check for make test,
# but for test_one_row's, their representative in the fast lane
@pytest.fixture(params=["torch", pytest.param("triton", marks=pytest.mark.slow)])
def backend(request):
    """Each backend, with the device its logits go to."""
    if request.param == "triton":
        return "triton", request.getfixturevalue("interpreted")
    return "torch", "cuda" if ON_CUDA else "cpu"


def reference(logits: torch.Tensor, k: int, targets: torch.Tensor) -> dict[str, np.ndarray]:
    """float64 log-softmax; top-K by value descending then id ascending; rank by counting the
    logits at or above the target's (vLLM's convention), ties by counting the equal ones."""
    x = logits.double().cpu().numpy()
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    logprobs = x - lse[:, None]
    ids = np.stack([np.lexsort((np.arange(x.shape[1]), -row))[:k] for row in x])
    t = targets.cpu().numpy()
    target = x[np.arange(len(x)), t]
    return dict(values=np.take_along_axis(logprobs, ids.reshape(len(x), k), 1),
                ids=ids.reshape(len(x), k), logsumexp=lse,
                target_logprob=logprobs[np.arange(len(x)), t],
                target_rank=(x >= target[:, None]).sum(1),
                target_ties=(x == target[:, None]).sum(1))


def check_against_reference(result: onepass.OnePass, logits: torch.Tensor, k: int,
                            targets: torch.Tensor) -> None:
    want = reference(logits, k, targets)
    np.testing.assert_array_equal(result.ids.cpu().numpy(), want["ids"])
    for name in ("values", "logsumexp", "target_logprob"):
        got = getattr(result, name).cpu().double().numpy()
        np.testing.assert_allclose(got, want[name], rtol=0, atol=5e-5, err_msg=name)
    for name in ("target_rank", "target_ties"):
        np.testing.assert_array_equal(getattr(result, name).cpu().numpy(), want[name])


def run(backend, logits, k, targets, **tuning):
    name, device = backend
    logits, targets = logits.to(device), targets.to(device)
    result = onepass.topk_logprobs(logits, k, targets, backend=name, **tuning)
    assert result.backend == name
    check_against_reference(result, logits, k, targets)
    return result


def randn(n: int, vocab: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(n, vocab, generator=generator)).to(dtype)


def ids(n: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------- the cases

@pytest.mark.parametrize("splits", [1, 3])
def test_a_ragged_vocabulary_split_or_not(backend, splits):
    """V = 300 is no multiple of the 64-wide tile; 3 slices of a row merge their states."""
    run(backend, randn(3, 300), 5, ids(3, 300), tile=64, splits=splits)


def test_ties_come_in_order_of_lower_id_and_count_in_the_rank(backend):
    """Integer logits: hundreds of ties, across tiles and slices, at and around the K-th value."""
    logits = torch.randint(-3, 4, (4, 200), generator=torch.Generator().manual_seed(2)).float()
    logits[1] = 1.0  # a whole row tied
    logits[2, 0] = -0.0  # -0.0 ties with 0.0
    result = run(backend, logits, 20, ids(4, 200), tile=32, splits=2)
    assert result.target_ties[1] == 200 and result.target_rank[1] == 200
    assert result.rank_strict()[1] == 1


def test_a_few_candidates_a_tile_enter_one_by_one_ties_by_lower_id(backend):
    """After the first tile, each 64-wide tile holds a few values above the K-th held (fewer
    than launches.CANDIDATE_LIMIT: the kernel's per-candidate path), tied with each other,
    with a held value and with the K-th; a last tile holds more (the sort path)."""
    logits = torch.zeros(3, 64 * 6)
    logits[:, :64] = torch.arange(64.0) / 8  # the first tile: 7.875 down to 7.375 held at k=5
    for row in (0, 2):
        logits[row, [70, 75, 80]] = 9.0      # three tied candidates in one tile
        logits[row, [130, 140]] = 7.875       # tied with the best held, then with each other
        logits[row, 200] = 7.5                # tied with the K-th held: a higher id, never in
    logits[1, 64:] = torch.arange(64.0 * 5) % 11  # every later tile: candidates, ties
    logits[2, 320:] = 20 + torch.arange(64.0)  # the last tile: more than the limit
    result = run(backend, logits, 5, ids(3, 64 * 6), tile=64, splits=1)
    assert result.ids[0].tolist() == [70, 75, 80, 63, 130]
    assert result.ids[1, :2].tolist() == [74, 85]
    assert result.ids[2].tolist() == list(range(383, 378, -1))


def test_minus_infinity_masks_and_a_row_with_one_finite_logit(backend):
    logits = randn(3, 130)
    logits[0, ::2] = float("-inf")
    logits[1] = float("-inf")
    logits[1, 77] = 2.5
    targets = torch.tensor([1, 77, 5])
    result = run(backend, logits, 8, targets, tile=32, splits=2)
    assert result.values[1, 0] == 0.0 and result.ids[1, 0] == 77
    assert torch.isinf(result.values[1, 1:]).all()
    assert result.ids[1, 1:].tolist() == list(range(7))  # -inf ties: lowest ids first


def vllm_ranks(logits: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    """vLLM's rank, restated here: V1's ``batched_count_greater_than`` and MRv2's
    ``_ranks_kernel`` count, per row, the fp32 logprobs greater than or equal to the target's."""
    x = logits.float().cpu().numpy()
    logprobs = x - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)) - x.max(
        1, keepdims=True)
    target = logprobs[np.arange(len(x)), targets.cpu().numpy()]
    return (logprobs >= target[:, None]).sum(1)


def test_the_rank_is_vllms_on_tied_bf16_rows(backend):
    """Before: ``target_rank`` was 1 + the logits strictly above the target's, and differed
    from vLLM's count on every row whose target ties another logit (61 of 64 bf16 rows at
    V = 32000). Tile and splits are small so that the ties fall across tiles and slices."""
    logits = randn(16, 4000, seed=7, dtype=torch.bfloat16)
    targets = ids(16, 4000, seed=8)
    result = run(backend, logits, 5, targets, tile=256, splits=3)
    tied = result.target_ties.cpu().numpy() > 1
    assert tied.sum() >= 12  # the case this test is for: most targets tie another logit
    np.testing.assert_array_equal(result.target_rank.cpu().numpy(), vllm_ranks(logits, targets))
    strict = result.rank_strict().cpu().numpy()
    assert (strict < result.target_rank.cpu().numpy())[tied].all()


def test_bf16_logits_are_read_as_they_are(backend):
    logits = randn(2, 1000, dtype=torch.bfloat16)  # bf16: many ties at this vocabulary
    run(backend, logits, 37, ids(2, 1000), tile=128, splits=2)


@pytest.mark.parametrize("k", [1, 2])
def test_the_smallest_k(backend, k):
    """Before: k = 1 failed in the kernel (a one-entry top-K has no dimension to sort along)."""
    run(backend, randn(3, 300), k, ids(3, 300), tile=64, splits=3)


def test_a_split_row_s_last_slice_merges_its_slices_in_groups_and_leaves_the_counts_zero(
        interpreted, monkeypatch):
    """Ten slices of a row, K_PAD 32: the last slice reads their scalars as 16 records
    and their keys 8 at a time (a full group, then one of two with six masked slots); one
    launch a call, whose arrival counts the rows' last slices set back to zero (here, in the
    interpreter, a fresh buffer a call: a grid stopped part-way must not leave a count
    behind)."""
    first = launches.triton_launches(3, 1200, 20, True, 64, 10, 4)[0]
    assert first.grid == (3, 10) and first.constexprs["GROUP"] == 8
    assert first.constexprs["SLICES"] == 16
    assert launches.merge_group(32, 10) == 8 and launches.merge_group(32, 2) == 2
    assert launches.merge_group(1024, 10) == 1
    counts = []
    real_run = onepass.run_launch
    monkeypatch.setattr(onepass, "run_launch", lambda launch, pointers: (
        counts.append(pointers["arrivals_ptr"]), real_run(launch, pointers)))
    logits, targets = randn(3, 1200, seed=5), ids(3, 1200)
    for _ in range(2):
        run(("triton", interpreted), logits, 20, targets, tile=64, splits=10)
    assert len(counts) == 2 and [c[:3].tolist() for c in counts] == [[0, 0, 0]] * 2
    # fresh zeros each call in the interpreter; one persistent buffer on a CUDA device
    fresh = counts[0].data_ptr() != counts[1].data_ptr()
    assert fresh == (counts[0].device.type != "cuda")


@pytest.mark.parametrize(("k", "tile", "vocab", "splits", "group"), [
    (100, 128, 1000, 3, 2),  # K_PAD 128: slices 0 and 1 merged, then 2 beside a masked 3
    (1024, 1024, 3500, 4, 1),  # K_PAD 1024: each slice's list alone, three later groups
])
def test_a_row_s_slices_merge_in_groups_of_two_and_of_one(interpreted, k, tile, vocab,
                                                             splits, group):
    """The last slice's groups of two slices (their lists merged, no sort) and of one, a
    later group's second slice past the row's last."""
    first = launches.triton_launches(2, vocab, k, True, tile, splits, 4)[0]
    assert first.grid[1] == splits and first.constexprs["GROUP"] == group
    run(("triton", interpreted), randn(2, vocab, seed=11), k, ids(2, vocab), tile=tile,
        splits=splits)


def test_the_plan_merges_a_group_s_keys_as_a_tree_where_they_take_a_lane_more_than_one_load():
    """MERGE_TREE where a group's int64 keys pass 16 bytes a lane: a one-warp split walk at
    n = 64, k = 5 (32 slices of 8 keys: 2048 bytes on 32 lanes); not its four-warp decode
    (n = 4: 128 lanes), a call without a top-K, an unsplit row or a group of one slice's
    K_PAD 1024 (merged, never sorted); and only where set, so the variants it leaves keep
    their specialisation."""
    narrow = launches.triton_launches(64, 152064, 5, True, None, None, 132)[0]
    assert narrow.num_warps == 1 and narrow.constexprs["GROUP"] * narrow.constexprs["K_PAD"] > 64
    assert narrow.constexprs["MERGE_TREE"] is True
    decode = launches.triton_launches(4, 152064, 5, True, None, None, 132)[0]
    assert decode.num_warps == 4 and decode.grid[1] > 1 and "MERGE_TREE" not in decode.constexprs
    assert "MERGE_TREE" not in launches.triton_launches(64, 152064, 0, True, None, None,
                                                        264)[0].constexprs
    assert "MERGE_TREE" not in launches.triton_launches(1, 300, 5, True, 64, 1, 4)[0].constexprs
    assert launches.merge_tree(8, 32, 1) and not launches.merge_tree(8, 32, 4)
    assert not launches.merge_tree(2, 32, 1)  # 512 bytes: one load a lane
    assert not launches.merge_tree(1024, 1, 4)  # one slice's list: merged, not sorted
    wide = launches.triton_launches(1, 152064, 1024, True, None, None, 132)[0]
    assert wide.grid[1] > 1 and "MERGE_TREE" not in wide.constexprs


@pytest.mark.parametrize(("k", "splits", "group", "blank"), [
    (20, 10, 8, None),  # K_PAD 32: a group of 8 slices, then a later one with six masked
    (20, 3, 4, 2),  # K_PAD 32: 3 slices in a group of 4 (an odd one masked), one all -inf
    (5, 12, 16, 3),  # K_PAD 8: 12 slices in one group of 16, an odd one all -inf
    (2, 19, 32, None),  # K_PAD 2: 19 slices (a tile each) in one group of 32
])
def test_a_group_s_keys_merged_as_a_tree_leave_the_results(interpreted, monkeypatch, k,
                                                          splits, group, blank):
    """MERGE_TREE merges a group's lists in pairs, the odd slices' read in reverse
    (``launches.merge_tree``): the top-K, logsumexp and the target's rank are the
    reference's, ties by the lower id, where a slice holds no finite value (``blank``)."""
    real_run, flagged = onepass.run_launch, []

    def tree(launch, pointers):
        if launch.constexprs.get("SPLIT") and launch.constexprs["GROUP"] > 2:
            launch = dataclasses.replace(launch, constexprs=dict(launch.constexprs,
                                                                 MERGE_TREE=True))
            flagged.append(launch.constexprs["GROUP"])
        real_run(launch, pointers)

    monkeypatch.setattr(onepass, "run_launch", tree)
    logits = randn(3, 1200, seed=7)
    logits[:, 600:640] = logits[:, 0:40]  # ties across slices
    targets = ids(3, 1200)
    if blank is not None:
        span = launches.triton_launches(3, 1200, k, True, 64, splits, 4)[0].scalars["span"]
        logits[:, blank * span:(blank + 1) * span] = float("-inf")  # the whole slice
        targets = torch.zeros(3, dtype=torch.long)  # a finite logit
    run(("triton", interpreted), logits, k, targets, tile=64, splits=splits)
    assert flagged == [group]


# The kernels' module while a test's own kernel calls into it: Triton's interpreter resolves a
# kernel's names among its module's globals (test_the_tree_merges_any_group_...).
_KERNELS = None


def _tree_pairs() -> list[tuple[int, int]]:
    """Every (GROUP, K_PAD) at which a one-warp split walk merges its slices' keys as a tree
    (``launches.merge_tree``), a group's keys within ``launches.MERGED_KEYS``."""
    return [(group, k_pad) for k_pad in (2, 4, 8, 16, 32)
            for group in (4, 8, 16, 32, 64, 128)
            if group * k_pad <= launches.MERGED_KEYS and launches.merge_tree(k_pad, group, 1)]


def _slice_lists(rng: np.random.Generator, slices: int, k_pad: int) -> np.ndarray:
    """``slices`` lists of ``k_pad`` unique int64 keys, each descending as a slice writes
    them, about a third padded with the floor below every key (a slice with fewer than
    ``k`` values), drawn across the keys' whole range."""
    floor = np.iinfo(np.int64).min
    keys = rng.choice(np.arange(-2**40, 2**40, 7919, dtype=np.int64), (slices, k_pad),
                      replace=False) * 1021
    lists = -np.sort(-keys, axis=1)
    for at in range(slices):
        if rng.random() < 0.3:
            lists[at, rng.integers(0, k_pad):] = floor
    return lists


def test_the_tree_merges_any_group_of_slices_as_a_sort_would(interpreted, monkeypatch):
    """``_group_best`` with ``MERGE_TREE`` at every (GROUP, K_PAD) the plan sets it, for 3,
    GROUP - 1 and GROUP + 1 slices a row (a group cut short, a later group), two rows and
    real keys past the last row (a mask that let them in would show): the best ``K_PAD``
    keys of the group's slices, descending, as numpy's sort gives them."""
    import triton
    import triton.language as tl

    monkeypatch.setitem(globals(), "_KERNELS", _kernels_module())

    @triton.jit
    def group_best(keys_ptr, out_ptr, first, lead, parts, GROUP: tl.constexpr,
                   K_PAD: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, K_PAD),
                 _KERNELS._group_best(keys_ptr, first, lead, parts, GROUP, K_PAD, True))

    pairs, rng, checked = _tree_pairs(), np.random.default_rng(11), 0
    assert {(128, 2), (32, 8), (8, 32)} <= set(pairs) and all(g > 2 for g, _ in pairs)
    for group, k_pad in pairs:
        for parts in sorted({3, group - 1, group + 1}):
            lists = _slice_lists(rng, 2 * parts + 2, k_pad)  # 2 rows, then 2 slices past
            for row in range(2):
                for lead in range(0, parts, group):
                    first = row * parts
                    out = torch.empty(k_pad, dtype=torch.int64)
                    group_best[(1,)](torch.from_numpy(lists), out, first, lead, parts, group,
                                     k_pad)
                    held = lists[first + lead:first + min(lead + group, parts)].ravel()
                    assert out.tolist() == sorted(held, reverse=True)[:k_pad], (group, k_pad,
                                                                                parts, lead)
                    checked += 1
    assert checked >= 4 * len(pairs)


def test_the_split_state_is_allocated_as_the_compile_check_types_it():
    """The partial states a split call allocates have the element types the compile check
    compiles the kernel for (kernel_variants.POINTER_TYPES): the counts int32 on both
    sides."""
    from stagelab.measure import kernel_variants

    names = {torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32"}
    first = launches.triton_launches(2, 1000, 5, True, 64, 4, 4)[0]
    pointers = onepass._partial_pointers(first, 2, torch.device("cpu"))
    assert {name: names[tensor.dtype] for name, tensor in pointers.items()} == {
        name: kernel_variants.POINTER_TYPES[name] for name in pointers}
    assert pointers["part_state_ptr"].dtype == torch.int32
    assert pointers["part_state_ptr"].numel() == 2 * first.grid[1] * 4  # a record a slice


def test_a_launch_whose_slices_outnumber_its_slices_constexpr_is_refused():
    """A hand-built split launch with SLICES below its slices a row would leave some slices'
    scalars out of the row's logsumexp and rank: refused by name before it runs."""
    first = launches.triton_launches(2, 1000, 5, True, 64, 4, 4)[0]
    stale = dataclasses.replace(first, constexprs=dict(first.constexprs, SLICES=2))
    with pytest.raises(ValueError, match="SLICES 2 is below its 4 slices"):
        onepass.run_launch(stale, {})


def test_a_prepared_call_takes_sources_that_lie_as_its_logits_do(interpreted):
    """The timing's prepared call launches what was planned for its logits: a source of the
    same shape at another origin is refused by name; one that lies alike runs."""
    whole = randn(2, 305, seed=4).to(interpreted)
    call = onepass.prepare_call(whole[:, :304], 3, ids(2, 304).to(interpreted), "triton")
    with pytest.raises(ValueError, match="source must lie as the prepared logits do"):
        call(whole[:, 1:])
    call(randn(2, 305, seed=5).to(interpreted)[:, :304])


def test_a_launch_that_raises_drops_the_arrival_counts(monkeypatch):
    """A launch that raises (a compile error, Ctrl-C) may leave counts part-way: the device's
    persistent buffer is dropped, so the next call starts from fresh zeros."""
    dropped = []
    monkeypatch.setattr(onepass, "forget_arrival_counts", dropped.append)

    def interrupted(launch, pointers):
        raise KeyboardInterrupt

    monkeypatch.setattr(onepass, "run_launch", interrupted)
    launch = launches.triton_launches(1, 300, 5, True, 64, 2, 4)
    with pytest.raises(KeyboardInterrupt):
        onepass.run_launches(launch, {}, torch.device("cpu"))
    assert dropped == [torch.device("cpu")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_that_start_off_16_bytes_are_walked_from_the_boundary_before_them(
        backend, dtype, monkeypatch):
    """Logits of a 304-wide stride (every row aligned) viewed from their second column: the
    kernel gets a view from the boundary before them and their origin, as a pointer it was
    compiled for (16-byte aligned), walking with LEAD for the origin alone; storage that
    starts off the boundary, with nothing before it, is copied."""
    whole = randn(3, 304, seed=3, dtype=dtype).to(backend[1])
    rows = whole[:, 1:]
    assert not launches.leads(rows.stride(0))
    view, origin = onepass.aligned_logits(rows)
    assert 0 < origin < 16 // whole.element_size() and view.data_ptr() % 16 == 0
    assert view.data_ptr() + origin * whole.element_size() == rows.data_ptr()
    seen = []
    real_run = onepass.run_launch
    monkeypatch.setattr(onepass, "run_launch", lambda launch, pointers: (
        seen.append((launch, pointers["x_ptr"].data_ptr() % 16)),
        real_run(launch, pointers)))
    run(backend, rows, 5, ids(3, 303), tile=64, splits=2)
    if backend[0] == "triton":
        assert [(launch.scalars["origin"], launch.constexprs["LEAD"], misaligned)
                for launch, misaligned in seen] == [(origin, True, 0)]
    storage = torch.arange(16.0).untyped_storage()[4:]  # its first float 4 bytes in
    odd = torch.empty(0).set_(storage, 0, (2, 5), (5, 1))
    assert odd.data_ptr() % 16 == 4 and odd.storage_offset() == 0
    with pytest.warns(RuntimeWarning, match="lie off 16 bytes with nothing of their storage"):
        copied, at = onepass.aligned_logits(odd)
    assert at == 0 and copied.data_ptr() % 16 == 0 and torch.equal(copied, odd)


def test_k_zero_still_gives_logsumexp_and_the_target(backend):
    result = run(backend, randn(2, 50), 0, ids(2, 50), tile=16, splits=2)
    assert result.values.shape == (2, 0) and result.ids.shape == (2, 0)


def test_k_1024_on_torch():
    run(("torch", "cuda" if ON_CUDA else "cpu"), randn(3, 2500), 1024, ids(3, 2500))


@pytest.mark.slow
def test_k_1024_on_triton(interpreted):
    """The largest top-K the kernel keeps, over a vocabulary of two and a half tiles, split."""
    run(("triton", interpreted), randn(1, 2500), 1024, ids(1, 2500), splits=2)


def test_targets_from_a_strided_or_shifted_view_of_tokens(backend):
    """Before: the kernel read row ``i``'s target at ``targets_ptr + i``, so a strided view
    (``tokens[::2]``) gave it other rows' tokens (a wrong rank and logprob on the Triton
    backend), and a shifted one (``tokens[1:]``, the next-token pattern) specialised a
    pointer the compile check never compiled. Now both read as the tokens they show."""
    tokens = ids(9, 300).to(backend[1])  # viewed where they lie: run() moves nothing then
    for targets in (tokens[::2][:4], tokens[1:5]):
        run(backend, randn(4, 300), 5, targets, tile=64, splits=2)
        assert onepass.kernel_targets(targets, targets.device).data_ptr() % 16 == 0
    aligned = ids(4, 300)
    assert onepass.kernel_targets(aligned, aligned.device).data_ptr() == aligned.data_ptr()


def test_targets_at_the_top_and_at_the_bottom(backend):
    logits = randn(2, 257)
    targets = torch.stack([logits[0].argmax(), logits[1].argmin()])
    result = run(backend, logits, 3, targets, tile=64, splits=1)
    assert result.target_rank.tolist() == [1, 257]


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "rows", "vocab", "k", "slots", "lead", "slices"), [
    (torch.bfloat16, 4, 3000, 20, 2, False, 6),  # a tile of 512 a slice, the last 440 wide
    (torch.float32, 2, 1100, 32, 2, False, 3),  # a tile a slice, the last 76 wide
    (torch.float16, 3, 700, 17, 2, False, 1),  # 2 tiles, the second 188 wide; row 1 finite in it
    (torch.float32, 3, 2000, 0, 2, False, 4),  # no top-K: a tile a slice, the last 464 wide
    (torch.bfloat16, 2, 1500, 5, 2, False, 1),  # 3 tiles in one slice, the last 476 wide
    (torch.bfloat16, 3, 1104, 0, 2, True, 3),  # no top-K, rows off 16 bytes: a cut first tile
    (torch.float32, 2, 1200, 9, 2, True, 1),  # K_PAD 16, whole rows off 16 bytes
    (torch.bfloat16, 2, 300, 5, 2, False, 1),  # a row narrower than a tile
    (torch.float32, 1, 30000, 20, 16, False, 15),  # two groups of slices' keys merged
    (torch.bfloat16, 1, 66000, 0, 32, False, 129),  # 256 slices' records (SLICES) read at once
])
def test_the_narrow_plan_is_exact(interpreted, monkeypatch, dtype, rows, vocab, k, slots, lead,
                                  slices):
    """k <= 32 (none included), tile and slices left to the plan: one-warp programs of
    512-wide tiles (``launches.narrow_walk``, here from one row), split as the plan splits
    them on the device's ``slots``, with ties, a run of ``-inf`` and targets at both ends;
    rows an odd stride apart where ``lead``. Triton's interpreter ignores the warps: on a
    CPU this runs the plan's tiles and slices; the one-warp code runs on a GPU (here where
    there is one, and in ``scripts/lease_kernel_check.py``) and is compiled by
    ``tests/test_kernel_compile.py``'s representatives."""
    monkeypatch.setattr(onepass, "program_slots", lambda device, k: slots)
    monkeypatch.setattr(launches, "NARROW_LEAST_ROWS", 1)
    stride = vocab + 3 if lead else vocab
    first = launches.triton_launches(rows, vocab, k, True, None, None, slots, stride)[0]
    assert (first.num_warps, first.constexprs["BLOCK"], first.grid[1]) == (
        1, launches.NARROW_TILE, slices)
    # an odd stride (``lead``, at a vocabulary that alone keeps rows aligned) or vocabulary
    assert first.constexprs["LEAD"] == (lead or vocab % launches.ALIGNED_LOGITS != 0)
    logits = randn(rows, stride, seed=7, dtype=dtype)[:, :vocab]
    logits[0, 100:140] = logits[0].max()  # 40 ties at the top, across the K-th
    logits[-1, 200:400] = float("-inf")  # after the ties, where one row holds both
    targets = ids(rows, vocab)
    targets[0], targets[-1] = 120, vocab - 1
    run(("triton", interpreted), logits, k, targets)


@pytest.mark.parametrize(("dtype", "vocab", "k", "tile", "splits"), [
    (torch.bfloat16, 7, 6, 2, 1),  # a cut first tile of fewer than k values, a short tail
    (torch.bfloat16, 20, 7, 2, 3),  # the same in a later slice: its values were lost
    (torch.float32, 1000, 64, 64, 1),  # a wide top-K: the cut tile's lanes before token 0
    (torch.float32, 12, 4, 4, 1),  # a small one of two finite logits: an id taken twice
    (torch.float16, 257, 5, 8, 1),  # many rows' first tiles cut, -inf runs across the cut
])
def test_rows_off_alignment_are_walked_exactly(interpreted, dtype, vocab, k, tile, splits):
    """Rows 3 logits wider than the vocabulary (a view: most start off 16 bytes) are
    walked from the aligned address before each (``LEAD``), their first tile cut there. The
    second review's reproducers (R5, R2, R6) broke the first version: a cut tile's values
    lost to the next few-valued tile's, and masked lanes' ids before token 0 overflowing into
    a key's value word."""
    logits = randn(8, vocab + 3, seed=5, dtype=dtype)[:, :vocab]
    if vocab == 12:  # two finite logits a row
        logits[:] = float("-inf")
        logits[:, 4], logits[:, 9] = 1.0, 2.0
    else:
        logits[1, 3:min(vocab, 40)] = float("-inf")
        if vocab > 10:  # the top two in the middle
            logits[:, 8:10] = logits.max() + torch.tensor([2.0, 1.0]).to(dtype)
    assert launches.leads(logits.stride(0))
    run(("triton", interpreted), logits, k, ids(8, vocab), tile=tile, splits=splits)


@pytest.mark.parametrize("backend", ["torch", "triton"], indirect=True)  # both, in make check
def test_one_row(backend):
    """n = 1 splits its row across programs by default (the split variant for small n)."""
    run(backend, randn(1, 700), 10, ids(1, 700), tile=64)


def test_n_1024_on_torch():
    logits = randn(1024, 333)
    run(("torch", "cuda" if ON_CUDA else "cpu"), logits, 16, ids(1024, 333))


@pytest.mark.slow
def test_n_1024_on_triton(interpreted):
    """In the interpreter every program runs in Python: a small vocabulary keeps it minutes."""
    run(("triton", interpreted), randn(1024, 40), 4, ids(1024, 40), tile=16, splits=1)


def test_without_targets_only_the_top_k_and_logsumexp(backend):
    name, device = backend
    logits = randn(2, 100).to(device)
    result = onepass.topk_logprobs(logits, 4, backend=name, tile=32)
    assert result.target_logprob is None and result.target_rank is None
    want = reference(logits, 4, torch.zeros(2, dtype=torch.int64))
    np.testing.assert_array_equal(result.ids.cpu().numpy(), want["ids"])
    with pytest.raises(ValueError, match="targets"):
        result.rank_strict()


def test_the_split_plan_leaves_no_slice_empty():
    for vocab, tile, splits in [(300, 64, 3), (300, 64, 5), (65, 64, 7), (1, 64, 4)]:
        block, _, parts, span = launches.launch_plan(1, vocab, 5, tile, splits, slots=2)
        assert 1 <= parts <= splits and (parts - 1) * span < vocab <= parts * span
        assert span % block == 0


# ------------------------------------------------------------- a vocabulary tile at a time

def fold(backend, logits, k, targets, tile):
    """Logits folded ``tile`` columns at a time by a TileFold, checked against the reference."""
    name, device = backend
    logits, targets = logits.to(device), targets.to(device)
    target_logits = logits.gather(1, targets[:, None])[:, 0].float()
    folding = onepass.TileFold(logits.shape[0], k, target_logits, logits.device, name)
    for start in range(0, logits.shape[1], tile):
        folding.add(logits[:, start:start + tile].clone(), start)
    result = folding.finish()
    assert result.backend == name
    check_against_reference(result, logits, k, targets)
    return result


def test_folded_tiles_of_a_ragged_vocabulary(backend):
    """V = 300 in tiles of 64 (the last 44 wide) and of 7 (narrower than K's padding)."""
    logits = randn(3, 300)
    fold(backend, logits, 5, ids(3, 300), tile=64)
    fold(backend, logits, 9, ids(3, 300), tile=7)


def test_a_folded_tile_wider_than_the_fold_kernels_tile(backend):
    """A ``head_fused`` tile of 2600 logits: the fold kernel walks it in tiles of at most
    ``FOLD_TILE`` (1024), the last one ragged; the top-K's guard skips tiles below its K-th."""
    fold(backend, randn(1, 5200, seed=4), 5, ids(1, 5200), tile=2600)


def test_folded_ties_come_in_order_of_lower_id_and_count_in_the_rank(backend):
    logits = torch.randint(-3, 4, (4, 200), generator=torch.Generator().manual_seed(2)).float()
    logits[1] = 1.0
    logits[2, 0] = -0.0
    result = fold(backend, logits, 20, ids(4, 200), tile=32)
    assert result.target_ties[1] == 200 and result.target_rank[1] == 200
    assert result.rank_strict()[1] == 1


def test_folded_minus_infinity_masks_and_a_row_with_one_finite_logit(backend):
    """Whole tiles of -inf (row 1 before and after its one finite logit) fold as nothing."""
    logits = randn(3, 130)
    logits[0, ::2] = float("-inf")
    logits[1] = float("-inf")
    logits[1, 77] = 2.5
    result = fold(backend, logits, 8, torch.tensor([1, 77, 5]), tile=32)
    assert result.values[1, 0] == 0.0 and result.ids[1, 0] == 77
    assert result.ids[1, 1:].tolist() == list(range(7))


def test_folded_bf16_tiles_are_read_as_they_are(backend):
    fold(backend, randn(2, 1000, dtype=torch.bfloat16), 37, ids(2, 1000), tile=128)


def test_folded_k_zero_and_targets_at_the_top_and_the_bottom(backend):
    logits = randn(2, 257)
    targets = torch.stack([logits[0].argmax(), logits[1].argmin()])
    result = fold(backend, logits, 0, targets, tile=64)
    assert result.values.shape == (2, 0) and result.target_rank.tolist() == [1, 257]
    assert fold(backend, logits, 3, targets, tile=64).target_rank.tolist() == [1, 257]


def test_folded_one_row_and_k_one(backend):
    fold(backend, randn(1, 700), 1, ids(1, 700), tile=256)


def test_fold_backend_is_torch_on_a_cpu_and_triton_is_refused_where_it_cannot_run(monkeypatch):
    """The interpreter is never chosen by default (every program in Python); asked for where
    Triton is absent, the triton fold says why instead of falling back silently."""
    assert onepass.fold_backend(torch.device("cpu")) == "torch"
    monkeypatch.setattr(onepass, "triton_module", lambda: None)
    assert onepass.fold_backend(torch.device("cuda")) == "torch"
    with pytest.raises(RuntimeError, match="Triton is not installed"):
        onepass.TileFold(2, 3, None, torch.device("cpu"), "triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        onepass.TileFold(2, 3, None, torch.device("cpu"), "numpy")


@pytest.mark.slow  # the kernels' fold in the interpreter: make test
@pytest.mark.parametrize(("dtype", "k", "tile"), [(torch.float32, 6, 100),
                                                  (torch.bfloat16, 0, 64)])
def test_head_fused_on_the_kernels_fold_equals_the_unchunked_reference(interpreted, monkeypatch,
                                                                       dtype, k, tile):
    """The prompt method as a GPU runs it (the kernels' state merge, here in the interpreter):
    V = 257 in ragged tiles, chunks of 7, against the fused method unchunked."""
    from stagelab.measure import prompt_logprobs as pl

    hidden, weight, prompt = pl.make_inputs(20, 257, 64, dtype, device=interpreted)
    monkeypatch.setattr(onepass, "fold_backend", lambda device: "triton")
    result = pl.prompt_logprobs(hidden, weight, prompt, k, 7, method=pl.catalogue.HEAD_FUSED,
                                tile=tile)
    reference = pl.prompt_logprobs(hidden, weight, prompt, k, None)
    assert torch.equal(result.logprob_token_ids, reference.logprob_token_ids)
    assert torch.equal(result.selected_token_ranks, reference.selected_token_ranks)
    torch.testing.assert_close(result.logprobs, reference.logprobs, atol=5e-5, rtol=0)


# ------------------------------------------------------------------------ bad rows and input

@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning",
                            "ignore:invalid value:RuntimeWarning")  # the interpreter's numpy
def test_a_nan_row_is_flagged_as_the_fused_path_flags_it(backend):
    name, device = backend
    logits = randn(3, 64)
    logits[1, 5] = float("nan")
    logits[2] = float("-inf")
    logits = logits.to(device)
    with pytest.raises(ValueError, match=r"logits contain NaN, \+inf, or only -inf: rows \[1, 2\]"):
        onepass.topk_logprobs(logits, 2, ids(3, 64).to(device), backend=name, tile=32)
    with pytest.raises(ValueError, match=r"rows \[1, 2\]"):  # the fused path's words
        lp.logprobs_from_logits(logits, 2, ids(3, 64).to(device))
    result = onepass.topk_logprobs(logits, 2, ids(3, 64).to(device), backend=name, tile=32,
                                   validate=False)
    assert torch.isfinite(result.logsumexp).tolist() == [True, False, False]


@pytest.mark.parametrize(("change", "match"), [
    (dict(k=-1), "k must be in"), (dict(k=65), r"k must be in \[0, 64\]"),
    (dict(k=1.0), "k must be an int"), (dict(backend="cuda"), "backend must be one of"),
    (dict(logits=torch.zeros(4, 64, dtype=torch.int32)), "logits must be floating point"),
    (dict(logits=torch.zeros(4, 64, dtype=torch.float64)), "logits must be float32"),
    (dict(logits=torch.zeros(64)), "logits must be 2-D"),
    (dict(targets=torch.zeros(3, dtype=torch.int64)), "targets must be 1-D with 4 entries"),
    (dict(targets=torch.zeros(4)), "targets must be an integer tensor"),
    (dict(targets=torch.tensor([0, 1, 64, 2])), r"targets out of range \[0, 64\)"),
    (dict(tile=48), "tile must be a power of two"), (dict(splits=0), "splits must be"),
])
def test_bad_arguments_are_named(change, match):
    arguments = dict(logits=torch.zeros(4, 64), k=2, targets=torch.zeros(4, dtype=torch.int64),
                     backend="torch")
    arguments.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        onepass.topk_logprobs(arguments.pop("logits"), arguments.pop("k"), **arguments)


def test_k_above_1024_is_refused_where_the_vocabulary_allows_it():
    with pytest.raises(ValueError, match=r"k must be in \[0, 1024\]"):
        onepass.topk_logprobs(torch.zeros(1, 2000), 1025, backend="torch")


# ------------------------------------------------------------------------------ the fallback

def test_triton_on_a_cpu_without_the_interpreter_falls_back_and_says_so(monkeypatch):
    pytest.importorskip("triton")
    if ON_CUDA:
        pytest.skip("a CUDA device runs the kernel itself")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _rebuild_kernels()
    with pytest.warns(RuntimeWarning, match="ran the torch backend"):
        result = onepass.topk_logprobs(randn(2, 50), 3, ids(2, 50))
    assert result.backend == "torch"


def test_without_triton_installed_the_torch_backend_runs(monkeypatch):
    monkeypatch.setattr(onepass, "triton_module", lambda: None)
    assert onepass.resolve_backend("triton", torch.device("cpu")) == (
        "torch", "Triton is not installed")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = onepass.topk_logprobs(randn(2, 50), 3, ids(2, 50))
    assert result.backend == "torch" and "Triton is not installed" in str(caught[0].message)


def test_into_logprobs_tensors_matches_the_fused_path():
    """Column 0 the target, then the top-K; ranks counting ties, as vLLM V1's."""
    logits = torch.randint(-5, 5, (6, 90), generator=torch.Generator().manual_seed(3)).float()
    targets = ids(6, 90)
    result = onepass.topk_logprobs(logits, 7, targets, backend="torch")
    got = result.into(lp.LogprobsTensors.empty_host(6, 7), targets)
    want = lp.logprobs_from_logits(logits, 7, targets)
    torch.testing.assert_close(got.logprobs, want.logprobs)
    assert torch.equal(got.selected_token_ranks, want.selected_token_ranks)
    assert torch.equal(got.logprob_token_ids[:, 0], want.logprob_token_ids[:, 0])


def test_read_rates_on_a_cpu_say_no_kernel_and_no_hbm_ran():
    found = onepass.read_rates(2, 300, 3, torch.float32, repeats=2, warmup=1, device="cpu")
    assert [r["l2"] for r in found] == ["warm", "cold"]
    for row in found:
        assert row["backend"] == "torch" and row["hbm_share"] is None and row["note"]
        assert row["read_gbps"] == pytest.approx(2 * 300 * 4 / row["seconds"] / 1e9)


class _RecordingClock:
    """A host clock that records what happens while it runs: allocations by torch.empty."""

    def __init__(self, log):
        self.log = log

    def start(self):
        self.log.append("start")

    def stop(self):
        self.log.append("stop")
        return 1.0


def test_the_read_rate_interval_holds_the_launches_alone(interpreted, monkeypatch):
    """Before: the start event was recorded before the host allocated the outputs and launched,
    so at n <= 64 the read rate timed the host. Now every output is allocated before the
    interval, and only the kernel's launches run inside it."""
    name, device = "triton", interpreted
    logits, targets = randn(2, 300).to(device), ids(2, 300).to(device)
    log = []
    real_empty = torch.empty

    def empty(*args, **kwargs):
        log.append("alloc")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    ran = []
    real_run = onepass.run_launch
    monkeypatch.setattr(onepass, "run_launch",
                        lambda launch, pointers: (log.append("launch"), ran.append(launch),
                                                  real_run(launch, pointers)))
    monkeypatch.setattr(onepass, "HostClock", lambda: _RecordingClock(log))
    onepass._median_call_seconds(logits, 3, targets, name, "warm", repeats=2, warmup=1)
    first = log.index("start")
    assert "alloc" in log[:first] and "launch" not in log[:first]
    inside = [event for event in log[first:] if event not in ("start", "stop")]
    assert inside and set(inside) == {"launch"}
    assert len(ran) == 3 * len(launches.triton_launches(2, 300, 3, True, None, None,
                                                            onepass.program_slots(
                                                                logits.device, 3)))


def test_the_device_clock_queues_a_sleep_before_its_start_event(monkeypatch):
    """The host's launches sit behind a sleep kernel queued before the start event, so the
    interval opens on the device only once they are queued."""
    log = []

    class Event:
        def __init__(self, enable_timing):
            self.name = f"event{len(log)}"

        def record(self):
            log.append(("record", self.name))

        def synchronize(self):
            log.append(("sync", self.name))

        def elapsed_time(self, other):
            return 2.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))
    clock = onepass.DeviceClock()
    clock.start()
    assert log == [("sleep", onepass.SLEEP_CYCLES), ("record", clock.begin.name)]
    assert clock.stop() == pytest.approx(2e-3)
    assert log[-2:] == [("record", clock.end.name), ("sync", clock.end.name)]
