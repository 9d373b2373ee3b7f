"""The roofline model from the cubins' figures: its arithmetic on hand-made figures, and the
committed figures' predictions at the issue's shapes (a model, never a measurement)."""

from __future__ import annotations

import math

import pytest

from stagelab.analyse import roofline
from stagelab.core import forward, launches

GPU = roofline.GPUS["H200"]


@pytest.fixture
def four_warp(monkeypatch):
    """The four-warp plan at every call (the plan a tile or slices given take): the hand-made
    walks below are worked out on its 2048-wide tiles and two (one with a top-K) programs an
    SM."""
    monkeypatch.setattr(launches, "narrow_walk", lambda *call: False)


def variant(rows: int, vocab: int, k: int, dtype: str, **figures) -> dict:
    """A compile check row for the first launch of ``(rows, vocab, k)`` with ``figures``."""
    first = launches.triton_launches(rows, vocab, k, True, None, None,
                                     launches.device_slots(GPU.sms, k))[0]
    return dict(kernel=first.kernel, arch=90, compiles=True, triton="3.6.0",
                pointers=dict(x_ptr=dtype), constexprs=dict(first.constexprs),
                num_warps=first.num_warps, max_registers=first.max_registers,
                **dict(dict(ctas_per_sm=4, registers=96, loop_instructions=4000,
                            guard_instructions=400, count_instructions=80,
                            enter_instructions=150, sort_instructions=3000,
                            candidate_instructions=250, merge_instructions=600,
                            tail_reads=1, tail_instructions=250, tail_trips=1,
                            tail_clocks=[300, 500], merge_trips=1,
                            merge_clocks=[800, 1200], guard_clocks=[400, 400],
                            count_clocks=[80, 80], enter_clocks=[150, 150],
                            sort_clocks=[3000, 3000], candidate_clocks=[250, 250]),
                       **figures))


def test_the_candidates_of_a_tile_are_binomial_by_hand():
    """A wide top-K (K_PAD above the limit), tile 2 of 4 values against the k-th best of the 4
    before: each value above it with probability k / 5. k = 2, a limit of 1 pass: none
    0.6 ** 4, one 4 * 0.4 * 0.6 ** 3; more than one candidate sorts, one takes one pass.
    k = 3, a limit of 3 (K_PAD 4): the best 3 of any count are taken, E[min(J, 3)] for J
    binomial(4, 0.6)."""
    none, one = 0.6 ** 4, 4 * 0.4 * 0.6 ** 3
    assert roofline.tile_candidates(4, 2, 2, limit=1) == pytest.approx(
        (1 - none, 1 - none - one, one))
    binomial = [math.comb(4, j) * 0.6 ** j * 0.4 ** (4 - j) for j in range(5)]
    assert roofline.tile_candidates(4, 3, 2, limit=3) == pytest.approx(
        (1 - 0.4 ** 4, 0, binomial[1] + 2 * binomial[2] + 3 * (binomial[3] + binomial[4])))
    assert roofline.tile_candidates(2048, 64, 1) == (1.0, 1.0, 0.0)  # 64 passes: it sorts
    with pytest.raises(ValueError, match="k must be"):
        roofline.tile_candidates(2048, 0, 2)


def test_a_small_top_k_inserts_the_values_among_the_best_k_so_far_by_hand():
    """K_PAD within the limit: tile 2 of 4 values, k = 2: the 2 best of the 8 are a random
    pair of the 28; both among the first 4 in 6 of them (entered 1 - 6 / 28), and the tile
    holds 2 * 4 / 8 = 1 of them on average; k = 1: entered and inserting 1 / 2. The first
    tile inserts its best k."""
    assert roofline.tile_candidates(4, 2, 2, limit=2) == pytest.approx((1 - 6 / 28, 0, 1))
    assert roofline.tile_candidates(4, 1, 2, limit=2) == pytest.approx((0.5, 0, 0.5))
    entered, _, inserted = roofline.tile_candidates(2048, 20, 3)  # all 20 of 6144 in 4096:
    assert entered == pytest.approx(1 - (2 / 3) ** 20, abs=1e-5)  # about (2 / 3) ** 20
    assert inserted == pytest.approx(20 / 3)
    assert roofline.tile_candidates(2048, 5, 1) == (1.0, 0.0, 5.0)  # the first: its best 5


def test_a_walk_s_mean_tile_weighs_each_path_by_its_share():
    """Two tiles of 4 values, k = 2: the first inserts its best 2; the second enters with
    probability 1 - 6 / 28 and inserts 1 on average; neither sorts. The paths' critical
    paths are weighed alike, at the end of the latencies asked for."""
    row = dict(guard_instructions=200, enter_instructions=100, sort_instructions=3000,
               candidate_instructions=250, guard_clocks=[700, 900], count_clocks=[0, 0],
               enter_clocks=[300, 400], sort_clocks=[9000, 9000],
               candidate_clocks=[800, 1000])
    found = roofline.walk_costs(row, 2, 4, 2)
    entered, passes = (1 + 1 - 6 / 28) / 2, (2 + 1) / 2
    assert found["entered"] == pytest.approx(entered) and found["sorted"] == 0
    assert found["candidates"] == pytest.approx(passes)
    assert found["instructions"] == pytest.approx(200 + 100 * entered + 250 * passes)
    assert found["clocks"] == pytest.approx(900 + 400 * entered + 1000 * passes)
    fast = roofline.walk_costs(row, 2, 4, 2, end=0)
    assert fast["clocks"] == pytest.approx(700 + 300 * entered + 800 * passes)
    assert roofline.walk_costs(row, 2, 4, 0) == dict(instructions=200, clocks=900, entered=0,
                                                       sorted=0, candidates=0)
    wide = roofline.walk_costs(row, 2, 4096, 64)  # the first sorts; the second's ~64 too
    assert 0.99 < wide["sorted"] < 1 and wide["candidates"] < 0.01


def test_the_walk_and_the_bound_by_hand(four_warp):
    """n = 64, V = 152,064, fp32, no top-K, the four-warp plan: 4 slices a row (264 slots /
    64: a fifth would start a second wave), 256 programs on 132 SMs (the busiest with 2), 1
    resident (the cubin's CTAs per SM): two waves; 19 tiles a slice of 2048 fp32 (8 KiB),
    ``tiles_ahead()`` in flight: at 2000 ns each round of 7 tiles takes a latency and a
    tile's work, three rounds for 19 tiles, then the last round's 4 other tiles' work, bound
    by the loads (its 300 instructions and its 300-clock path at 1.98 GHz take less); then
    each row's last slice fences, counts itself in and reads the 4 slices' scalars: three L2
    round trips (400 ns) and its path's clocks at the slow end, after the walk."""
    rows = (variant(64, 152064, 0, "fp32", ctas_per_sm=1, loop_instructions=300,
                    guard_instructions=300, count_instructions=0, guard_clocks=[300, 300],
                    count_clocks=[0, 0]),)
    found = roofline.predict(64, 152064, 0, "fp32", GPU, roofline.Latencies(2000.0), rows)
    ahead = launches.tiles_ahead()
    assert ahead == 7 and 300 / GPU.clock_ghz < 2000 / ahead
    work = 300 / GPU.clock_ghz
    walk_ns = 2 * (3 * (2000 + work) + 4 * work)
    assert 3 * (2000 + work) + 4 * work > 2000 + 19 * work
    assert walk_ns > 64 * 152064 * 4 / 4800
    assert found["programs"] == 256 and found["resident_per_sm"] == 1 and found["waves"] == 2
    assert found["tiles_per_slice"] == 19 and found["scheduler_warps"] == 1
    assert found["bytes_in_flight_per_sm"] == 8192 * ahead
    tail = (2 + 1) * 400 + 500 / GPU.clock_ghz  # fence, count, one trip; 500 clocks
    assert found["walk_ns"] == pytest.approx(walk_ns, abs=0.1)
    assert found["tail_ns"] == pytest.approx(tail, abs=0.1)
    assert found["model_gbps"] == pytest.approx(64 * 152064 * 4 / (walk_ns + tail), abs=0.1)
    assert found["bound"] == "memory parallelism" and found["entered_share"] == 0
    assert found["instructions_per_logit"] == pytest.approx(300 * 4 * 32 / 2048, abs=0.1)


def test_a_tile_waits_its_critical_path_however_few_its_instructions(four_warp):
    """The same walk at 450 ns with the tile's path 3000 clocks long (its warps each alone on
    a scheduler hide none of it): each program's tile takes 3000 / 1.98 ns, not its 300
    instructions' issue; at a path of 100 clocks, the loads bind again."""
    slow_path = (variant(64, 152064, 0, "fp32", ctas_per_sm=1, guard_instructions=300,
                         count_instructions=0, guard_clocks=[3000, 3000],
                         count_clocks=[0, 0]),)
    found = roofline.predict(64, 152064, 0, "fp32", GPU, roofline.Latencies(450.0), slow_path)
    assert found["bound"] == "dependences" and found["tile_clocks"] == 3000
    assert found["walk_ns"] == pytest.approx(2 * (450 + 19 * 3000 / GPU.clock_ghz), abs=0.1)
    short = (dict(slow_path[0], guard_clocks=[100, 100]),)
    found = roofline.predict(64, 152064, 0, "fp32", GPU, roofline.Latencies(2000.0), short)
    assert found["bound"] == "memory parallelism"


def test_a_tile_counts_toward_the_target_only_where_it_holds_a_value_at_or_above_it(four_warp):
    """Rank 1 in 8 values, tiles of 2: the one value is in the tile 2 times in 8; rank 2: the
    tile holds neither in C(6, 2) / C(8, 2) = 15 / 28 of the pairs; every tile counts once
    the rank leaves no room; the tile's count block is weighed by that share."""
    assert roofline.counted_share(2, 8, 1) == pytest.approx(2 / 8)
    assert roofline.counted_share(2, 8, 2) == pytest.approx(1 - 15 / 28)
    assert roofline.counted_share(2, 8, 7) == 1.0
    with pytest.raises(ValueError, match="rank must be"):
        roofline.counted_share(2, 8, 0)
    row = dict(guard_instructions=200, count_instructions=90, guard_clocks=[500, 600],
               count_clocks=[100, 120])
    costs = roofline.walk_costs(row, 2, 4, 0, 0.25)
    assert costs["instructions"] == pytest.approx(222.5)
    assert costs["clocks"] == pytest.approx(630)
    found = roofline.predict(64, 152064, 0, "fp32", GPU, roofline.Latencies(450.0),
                             (variant(64, 152064, 0, "fp32", count_instructions=90),))
    share = roofline.counted_share(2048, 152064, roofline.TARGET_RANK)
    assert found["counted_share"] == round(share, 3) and 0.2 < share < 0.3
    assert found["tile_instructions"] == pytest.approx(400 + 90 * share, abs=0.1)
    every = roofline.predict(64, 152064, 0, "fp32", GPU, roofline.Latencies(450.0),
                             (variant(64, 152064, 0, "fp32", count_instructions=90),),
                             target_rank=None)
    assert every["counted_share"] == 1 and every["tile_instructions"] == 490


def test_the_four_warp_plan_aims_at_two_programs_an_sm_without_a_top_k_and_one_with():
    """The four-warp plan (a tile given): 2 programs an SM without a top-K (two CTAs of the
    pipeline fit an SM); 1 with one, the slices chosen by the busiest SM's work: V = 152,064
    (75 tiles) at n = 64 is 4 slices of 19 tiles without (264 slots / 64: a fifth would start a
    second wave of slots for 15 tiles a slice), 2 of 38 with; n = 16, k = 5 is 8 slices of
    10. Without a top-K, slots a row count leaves idle are filled where that starts no second
    wave: 2 slices of 1000 rows in 2112 slots, but 1 of 1651 rows, where 2 would make two
    waves of 149 tiles in place of one of 297."""
    plain, small, wide = (launches.triton_launches(64, 152064, k, True, 2048, None,
                                                   launches.device_slots(132, k))[0]
                          for k in (0, 5, 20))
    assert plain.grid == (64, 4) and small.grid == (64, 2) and wide.grid == (64, 2)
    assert {launch.num_warps for launch in (plain, small, wide)} == {4}
    assert [launches.programs_per_sm(k) for k in (0, 1, 15, 16, 1024)] == [2, 1, 1, 1, 1]
    assert launches.device_slots(132, 0) == 2 * launches.device_slots(132, 20) == 264
    assert launches.launch_plan(16, 152064, 5, 2048, None, 132) == (2048, 8, 8, 20480)
    assert [launches.default_splits(rows, 75, 264) for rows in (1, 64, 132, 263, 264, 1000)] == [
        75, 4, 2, 1, 1, 1]
    assert [launches.default_splits(rows, 297, 2112) for rows in (64, 1000, 1651)] == [33, 2, 1]


def first_launch(rows: int, k: int, tile: int | None = None, sms: int = 132):
    """The first launch of a top-``k`` call of ``rows`` rows of 152,064 on ``sms`` SMs."""
    return launches.triton_launches(rows, 152064, k, True, tile, None,
                                    launches.device_slots(sms, k))[0]


def test_a_top_k_of_at_most_32_walks_in_one_warp_programs_twelve_an_sm():
    """K_PAD at most 32 (none included), the tile and slices left to the plan, from 16 rows
    (decode's fewer keep the four-warp plan): 512-wide tiles (297), one warp a program,
    slices planned for twelve programs an
    SM: on 132 SMs, n = 256, k = 20 takes 6 slices of 50 tiles (1536 programs of the 1584
    slots); on an A100's 108, 5 of 60; n = 64 without a top-K, sixteen programs an SM: 33
    slices (2112 / 64). A wider top-K, a tile or slices asked for keep 4-warp programs of
    2048-wide tiles."""
    narrow = first_launch(256, 20)
    assert (narrow.grid, narrow.constexprs["BLOCK"], narrow.num_warps) == ((256, 6), 512, 1)
    assert narrow.scalars["span"] == 50 * 512 and narrow.max_registers == 255
    assert first_launch(256, 20, sms=108).grid == (256, 5)
    assert first_launch(256, 20, sms=108).scalars["span"] == 60 * 512
    assert first_launch(64, 0).grid == (64, 33) and first_launch(64, 0).max_registers is None
    assert [launches.narrow_programs_per_sm(k) for k in (0, 1, 32)] == [16, 12, 12]
    assert {first_launch(n, k, sms=sms).num_warps for n in (16, 64, 131, 256, 1000)
            for sms in (132, 108) for k in (0, 1, 5, 16, 17, 20, 32)} == {1}
    for rows, k, tile in ((256, 33, None), (16, 64, None), (256, 20, 2048), (64, 0, 2048),
                          (1, 5, None), (15, 20, None), (15, 0, None)):
        wide = first_launch(rows, k, tile)
        assert (wide.constexprs["BLOCK"], wide.num_warps) == (2048, 4), (rows, k, tile)
    forced = launches.triton_launches(256, 152064, 20, True, None, 2, 132)[0]
    assert (forced.constexprs["BLOCK"], forced.num_warps) == (2048, 4)
    # a row longer than one slice of 2**15 - 2 tiles of 512 keeps the wide tile it fits in
    assert launches.launch_plan(528, 17_000_000, 20, None, None, 132)[0] == 2048
    assert launches.launch_plan(528, 16_000_000, 20, None, None, 132)[0] == 512
    assert launches.launch_plan(256, 152064, 20, None, None, 132) == (512, 32, 6, 50 * 512)


def test_the_model_reads_a_launch_s_own_warps_and_register_cap():
    """A cubin of the same constexprs on other warps, or under another register cap, is
    another cubin: it does not stand for the launch, and the lookup names the warps and the
    cap."""
    row = variant(256, 152064, 20, "bf16")
    found = roofline.predict(256, 152064, 20, "bf16", GPU, roofline.SLOW, (row,))
    assert found["programs"] == 1536
    for other in (dict(row, num_warps=4), dict(row, max_registers=None)):
        with pytest.raises(LookupError, match="on 1 warps, at most 255 registers"):
            roofline.predict(256, 152064, 20, "bf16", GPU, roofline.SLOW, (other,))


def test_the_narrow_walk_s_words_hold_for_the_committed_figures():
    """What narrow_walk's words quote of the committed Triton 3.6 sm_90 cubins: a one-warp
    tile's guard and a candidate at n = 256 fp32 k = 20 (the four-warp figures it sets them
    against are compiled by scripts/compare_narrow_plan.py: the slow test of
    test_kernel_compile); and the registers narrow_programs_per_sm quotes, with and without
    a top-K, over every narrow walk compiled."""
    if not roofline.compiled_variants():
        pytest.skip("data/kernel_compile.json is not written (scripts/kernel_compile_check.py)")
    narrow = roofline.figures_of(first_launch(256, 20), "fp32", 90)
    assert narrow["num_warps"] == 1
    assert (narrow["guard_clocks"], narrow["candidate_clocks"]) == ([355, 513], [467, 669])
    walks = [row for row in roofline.compiled_variants() if row["num_warps"] == 1
             and row["arch"] == 90 and row["triton"].startswith("3.6.")]
    for top_k, least, most in ((True, 137, 195), (False, 71, 112)):
        registers = [row["registers"] for row in walks if row["constexprs"]["TOPK"] == top_k]
        assert (min(registers), max(registers)) == (least, most)


def test_every_committed_path_is_timed_over_the_instructions_it_counts():
    """Each committed row's paths: a path's critical path issues each of its instructions,
    one a clock at most, so its clocks are at least its instructions but one, and its slow
    end is no shorter than its fast one; a path counted but not timed (or timed over other
    lines) fails."""
    if not roofline.compiled_variants():
        pytest.skip("data/kernel_compile.json is not written (scripts/kernel_compile_check.py)")
    for row in roofline.compiled_variants():
        for path in ("guard", "count", "enter", "candidate", "sort"):
            fast, slow = row[f"{path}_clocks"]
            count = row[f"{path}_instructions"]
            assert fast >= count - 1 and slow >= fast, (row["where"], path)
            assert count > 0 or fast == 0, (row["where"], path)


def test_the_committed_figures_model_every_call_of_up_to_4000_rows():
    """Every row count from 1 to 4000 at each of ``kernel_variants.SCAN_KS``, of V = 152,064
    and of GPT-2's 50,257 (rows off 16-byte alignment: a cut first tile), on an H200 and an
    A100: each distinct launch the plan gives (the four-warp plan's below 16 rows, the
    narrow one's from 16, their slices changing with the rows) has the lease Triton's cubin
    in fp32 and bf16 (``kernel_variants.ROWS`` and ``SCAN_ROWS``), so the model answers any
    such call."""
    if not roofline.compiled_variants():
        pytest.skip("data/kernel_compile.json is not written (scripts/kernel_compile_check.py)")
    from stagelab.measure import kernel_variants

    for gpu in (GPU, roofline.GPUS["A100 SXM"]):
        for vocab in kernel_variants.SCAN_VOCABS:
            for k in kernel_variants.SCAN_KS:
                plans = {}
                for n in range(1, 4001):
                    launch = launches.triton_launches(n, vocab, k, True, None, None,
                                                      launches.device_slots(gpu.sms, k))[0]
                    plans.setdefault((launch.num_warps, tuple(launch.constexprs.items())),
                                     launch)
                assert {warps for warps, _ in plans} == {1, 4}
                for launch in plans.values():
                    for dtype in ("fp32", "bf16"):
                        assert roofline.figures_of(launch, dtype, gpu.arch)["compiles"]


def test_a_top_k_plan_weighs_the_busiest_sm_s_work():
    """75 tiles, 132 SMs. A slice's work is its tiles and k (1 + ln T) insertions; a split
    row adds its tail, 8 and 16 a group of merged slices. n = 16, k = 5: 8 slices of 10
    (10 + 5 (1 + ln 10) + 24 = 50.5) beat 1 of 75 (75 + 5 (1 + ln 75) = 101.6) and 16 of 5
    (two programs on the busiest SM: 2 x 18 + 24 = 60). n = 67, k = 5 stays whole: 3
    slices of 25 would put 2 on the busiest SM (2 x 46.1 + 24 = 116.3). n = 100 and 256,
    and k = 20 at n = 67, fill the SMs with rows. By hand, one row, k = 0: 4 tiles on 2 SMs
    stay whole (4 against 2 + 24); 64 on 4 SMs take 4 slices (16 + 24, the fewest of
    equals: 8 slices give 2 x 8 + 24)."""
    assert launches.top_k_splits(16, 75, 5, 132) == 8
    assert launches.top_k_splits(67, 75, 5, 132) == 1
    assert launches.top_k_splits(100, 75, 5, 132) == 1
    assert launches.top_k_splits(67, 75, 20, 132) == 1
    assert launches.top_k_splits(256, 75, 5, 132) == 1
    assert launches.top_k_splits(1, 4, 0, 2) == 1
    assert launches.top_k_splits(1, 64, 0, 4) == 4
    assert (launches.MERGE_FIXED_TILES, launches.MERGED_GROUP_TILES) == (8, 16)
    # the last slice reads every slice's scalars as one tl.arange: a power of two, and a cap
    assert launches.MAX_SLICES == launches.pow2_at_least(launches.MAX_SLICES)
    assert launches.launch_plan(1, 64 * 1024, 0, 64, 1000, 4)[2] == launches.MAX_SLICES


def test_a_slice_too_long_for_the_kernel_s_per_lane_counts_is_refused_by_name():
    """A lane counts one tie a tile in an int32's high 16 bits, and a row off alignment walks
    one tile more than its span: 2**15 - 2 tiles a slice at most; one tile more is refused,
    naming the vocabulary, before anything is allocated."""
    assert launches.MAX_SLICE_TILES + 1 < 2**15
    most = launches.MAX_SLICE_TILES
    assert launches.launch_plan(1, most * 16, 0, 16, 1, 4)[3] == most * 16
    with pytest.raises(ValueError, match=rf"vocab {(most + 1) * 16} in 1 slices of {most + 1}"):
        launches.launch_plan(1, (most + 1) * 16, 0, 16, 1, 4)


def test_a_plan_keeps_its_columns_in_int32_and_grows_its_slices_to_fit():
    """Before: at V = 2**31 - 1, n = 1, k = 5 the plan gave 132 slices of 16,269,312 logits,
    the last ending past 2**31 - 1, where the kernel's int32 column wrapped negative and that
    slice walked nothing (wrong results, no error); n = 64 rows of 300 million logits without
    a top-K planned 4 slices of more tiles than a slice may hold and were refused though 5
    fit; V = 0 divided by zero. Now: refused by name, 5 slices, refused by name."""
    with pytest.raises(ValueError, match="past 2147483647"):
        launches.launch_plan(1, 2**31 - 1, 5, None, None, 132)
    block, _, parts, span = launches.launch_plan(64, 300_000_000, 0, None, None, 264)
    assert (block, parts) == (2048, 5) and span // block <= launches.MAX_SLICE_TILES
    with pytest.raises(ValueError, match="vocab must be >= 1, got 0"):
        launches.triton_launches(1, 0, 0, True, None, None, 4)
    assert launches.launch_plan(1, 2**31 - 2**20, 5, None, None, 132)[2] == 132


def test_a_split_row_waits_its_last_slice_s_tail_by_hand():
    """Unsplit: no tail. Split: the last slice's fence and count, then its tail's critical
    path (its round trips and the clocks beside them at the end asked for: here 300 fast,
    500 slow, at 2 GHz); with a top-K, each later group of slices its merge loop's path:
    10 slices in groups of 8 make one later group."""
    row = dict(tail_trips=1, tail_clocks=[300, 500], merge_trips=1, merge_clocks=[600, 900])
    assert roofline.split_tail_ns(1, 8, row, True, 400, 2.0, 1) == 0
    assert roofline.split_tail_ns(10, 8, row, False, 400, 2.0, 1) == 3 * 400 + 500 / 2
    assert roofline.split_tail_ns(10, 8, row, False, 200, 2.0, 0) == 3 * 200 + 300 / 2
    assert roofline.split_tail_ns(10, 8, row, True, 400, 2.0, 1) == 4 * 400 + (500 + 900) / 2
    assert roofline.split_tail_ns(8, 8, row, True, 400, 2.0, 1) == 3 * 400 + 500 / 2
    serial = dict(row, tail_trips=2)  # a read waiting behind another: a trip more
    assert roofline.split_tail_ns(8, 8, serial, True, 400, 2.0, 1) == 4 * 400 + 500 / 2
    # 18 slices in groups of 8: two later groups, each its merge loop's 2 trips and clocks
    twice = dict(row, merge_trips=2)
    assert roofline.split_tail_ns(18, 8, twice, True, 400, 2.0, 0) == (
        (2 + 1 + 2 * 2) * 400 + (300 + 2 * 600) / 2)


def test_a_tail_longer_than_the_walk_bounds_the_call(four_warp):
    """n = 1, k = 5: 25 slices of 3 tiles, a short walk; a tail whose path is 10000 clocks
    at the slow end (one group: K_PAD 8 reads 32 slices' keys at once, no merge loop run)
    outlasts it: the call is bound by the tail, its rate the bytes over walk and tail
    together."""
    rows = (variant(1, 152064, 5, "fp32", tail_clocks=[6000, 10000]),)
    found = roofline.predict(1, 152064, 5, "fp32", GPU, roofline.Latencies(800.0), rows)
    assert found["programs"] == 25 and found["bound"] == "tail"
    assert launches.merge_group(8, 25) == 32
    tail = 3 * 400 + 10000 / GPU.clock_ghz
    assert found["tail_ns"] == pytest.approx(tail, abs=0.1)
    assert found["tail_trips"] == 1 and found["tail_clocks"] == 10000
    assert found["model_gbps"] == pytest.approx(
        152064 * 4 / (found["walk_ns"] + tail), abs=0.1)
    assert found["tail_ns"] > found["walk_ns"]
    fast = roofline.predict(1, 152064, 5, "fp32", GPU, roofline.FAST, rows)
    assert fast["tail_ns"] == pytest.approx(3 * 200 + 6000 / GPU.clock_ghz, abs=0.1)


def test_rows_whose_stride_leaves_them_unaligned_are_walked_from_an_aligned_address():
    """GPT-2's 50,257 logits a row leave most rows off 16 bytes for 16-bit logits (8 a
    16-byte copy): its launches walk with LEAD; a stride of 152,064 or 32,000 keeps every
    row aligned; a fold tile of 81 logits a row (50,257 % 1024) leads too."""
    assert launches.leads(50257) and launches.leads(81) and launches.leads(4)
    assert not launches.leads(152064) and not launches.leads(32000) and not launches.leads(8)
    first = launches.triton_launches(64, 50257, 5, True, None, None, 132)[0]
    assert first.constexprs["LEAD"] is True
    assert launches.triton_launches(64, 50257, 5, True, None, None, 132,
                                    stride_row=50264)[0].constexprs["LEAD"] is False
    assert launches.fold_launch(8, 81, 50176, 5, True).constexprs["LEAD"] is True


def test_the_pipeline_s_stages_but_one_are_in_flight():
    assert launches.tiles_ahead() == launches.PIPELINE_STAGES - 1 >= 2


def test_a_tile_loaded_ahead_hides_the_work_behind_the_latency():
    """Without a tile ahead a program waits the latency for each tile, then works it; with
    tiles ahead it waits its first load, then works each tile (the longer of its issue and
    its critical path) unless the loads lag: a tile lands a latency after the one ``ahead``
    before it; a slice no longer than the tiles ahead has every load in flight from its
    start. What binds is named."""
    assert roofline.slice_ns(600, 150, 100, 0, 5) == (5 * 750, "memory parallelism")
    assert roofline.slice_ns(600, 150, 900, 0, 5) == (5 * 1500, "dependences")
    assert roofline.slice_ns(600, 150, 100, 2, 5) == (3 * 750 + 0, "memory parallelism")
    assert roofline.slice_ns(600, 150, 900, 2, 5) == (600 + 5 * 900, "dependences")
    # a slice of 1 or 3 tiles with 7 ahead: every load in flight at its start
    assert roofline.slice_ns(600, 150, 100, 7, 1) == (750, "memory parallelism")
    assert roofline.slice_ns(600, 150, 100, 7, 3) == (1050, "memory parallelism")
    assert roofline.slice_ns(600, 150, 100, 7, 8) == (1800, "issue")
    assert roofline.slice_ns(600, 150, 150, 7, 8) == (1800, "issue")  # a tie is issue
    # one round, whose two sums of the same time round apart: named by its work
    assert (800 + 1457.5244425409053) + 2 * 1457.5244425409053 > 800 + 3 * 1457.5244425409053
    assert roofline.slice_ns(800, 10, 1457.5244425409053, 7, 3)[1] == "dependences"


def test_the_loads_of_a_slice_land_as_a_pipeline_of_tiles_ahead_gives_them():
    """The slice's time against a step-by-step pipeline (each tile waits its own load, is
    worked, then issues the load of the tile ``ahead`` after it; the first ``ahead`` issued
    at the start), for slices shorter and longer than the tiles ahead, bound by work or by
    the loads: the model's formula is the pipeline's within a round's work (``ahead``
    tiles')."""
    def pipeline(latency, work, ahead, tiles):
        landed = [latency] * min(ahead, tiles)
        clock = 0.0
        for tile in range(tiles):
            clock = max(clock, landed[tile]) + work
            if tile + ahead < tiles:
                landed.append(clock + latency)
        return clock

    for latency, work, ahead, tiles in ((800, 10, 7, 14), (800, 10, 7, 19), (800, 300, 7, 19),
                                        (2000, 151.5, 7, 19), (600, 150, 2, 5), (800, 50, 7, 3)):
        found, _ = roofline.slice_ns(latency, work, 0, ahead, tiles)
        assert abs(found - pipeline(latency, work, ahead, tiles)) <= ahead * work + 1e-9


@pytest.mark.parametrize("ahead", [0, 1, 2, 7])
def test_a_longer_slice_never_takes_less_time(ahead):
    """Before: a slice of 7 tiles (the tiles ahead) took 1338 ns and one of 8 took 914 ns at
    800 ns and 152 instructions a tile: the pipeline's fill was counted only for short
    slices. Now a program's time never falls as its slice grows."""
    for issue_ns, path_ns in ((76.8, 50.0), (76.8, 400.0), (500.0, 100.0)):
        times = [roofline.slice_ns(800, issue_ns, path_ns, ahead, t)[0] for t in range(1, 40)]
        assert all(later >= earlier for earlier, later in zip(times, times[1:]))


def test_a_top_k_walk_costs_its_paths_at_the_model_s_shares():
    """n = 256, V = 152,064, k = 20, bf16: six slices a row of 50 tiles of 512, one warp a
    program, twelve an SM; the tile's cost is the guard's, the counts' and each top-K path's
    at its modelled share, and the walk is bound by issue: twelve one-warp programs on the
    SM's four schedulers (three warps each), one wave, each waiting its first load (450 ns)
    then issuing its tiles at a third of its scheduler (their critical paths here as long as
    their instructions), the tail after it."""
    rows = (variant(256, 152064, 20, "bf16", ctas_per_sm=12),)
    found = roofline.predict(256, 152064, 20, "bf16", GPU, roofline.Latencies(450.0), rows)
    counted = roofline.counted_share(512, 152064)
    costs = roofline.walk_costs(rows[0], 50, 512, 20, counted)
    assert found["tiles_per_slice"] == 50 and found["sorted_share"] == round(costs["sorted"], 3)
    assert (found["warps"], found["resident_per_sm"], found["scheduler_warps"]) == (1, 12, 3)
    assert found["tile_instructions"] == pytest.approx(costs["instructions"], abs=0.1)
    assert costs["instructions"] == pytest.approx(
        400 + 80 * counted + 150 * costs["entered"] + 3000 * costs["sorted"]
        + 250 * costs["candidates"])
    assert costs["sorted"] == 0 and 0.3 < costs["entered"] < 0.7
    assert 20 / 50 < costs["candidates"] < 2  # the first tile's 20 passes, then few
    assert costs["clocks"] == pytest.approx(costs["instructions"])
    assert found["bound"] == "issue" and found["tail_ns"] > 0 and found["waves"] == 1
    assert found["walk_ns"] == pytest.approx(
        450 + 50 * 3 * costs["instructions"] / GPU.clock_ghz, abs=0.1)
    assert found["model_gbps"] == pytest.approx(
        256 * 152064 * 2 / (found["walk_ns"] + found["tail_ns"]), rel=1e-4)


def test_the_range_pairs_the_fast_ends_and_the_slow_ends(four_warp):
    """model_high: the short HBM latency with the short L2 one and the tail's fast clocks;
    model_low: the long ones with the slow clocks (n = 16, k = 5: 8 slices, one group).
    One program of four warps an SM whose work outlasts the latency's share of its tile is
    paced by the SM's issue: both bounds agree, and the bound says issue."""
    rows = (variant(16, 152064, 5, "fp32", tail_clocks=[300, 700]),)
    found = roofline.predict_range(16, 152064, 5, "fp32", variants=rows)
    fast = roofline.predict(16, 152064, 5, "fp32", GPU, roofline.FAST, rows)
    slow = roofline.predict(16, 152064, 5, "fp32", GPU, roofline.SLOW, rows)
    assert fast["tail_ns"] == pytest.approx(3 * 200 + 300 / GPU.clock_ghz, abs=0.1)
    assert slow["tail_ns"] == pytest.approx(3 * 400 + 700 / GPU.clock_ghz, abs=0.1)
    assert (found["model_high"], found["model_low"]) == (
        fast["model_hbm_share"], slow["model_hbm_share"])
    assert found["tail_ns"] == slow["tail_ns"] and found["tail_clocks"] == 700
    busy = (variant(64, 152064, 20, "fp32", ctas_per_sm=1, guard_instructions=2000),)
    found = roofline.predict(64, 152064, 20, "fp32", GPU, roofline.Latencies(800.0), busy)
    assert found["bound"] == "issue" and found["resident_per_sm"] == 1


def test_a_missing_variant_says_how_to_make_the_figures():
    with pytest.raises(LookupError, match="kernel_compile_check"):
        roofline.predict(64, 152064, 5, "bf16", GPU, roofline.Latencies(600.0), ())


@pytest.mark.parametrize("gpu_name", sorted(roofline.GPUS))
def test_the_committed_figures_predict_every_goal_shape_as_a_model(gpu_name):
    """Every goal shape has its cubin's figures on each GPU modelled (an A100 from its sm_80
    rows), from the lease's Triton. And what the committed figures say: a program whose
    warps each have a scheduler to itself waits its tiles' critical paths (far longer than
    their instructions), so wherever neither the HBM nor a tail binds, the dependences do."""
    if not roofline.compiled_variants():
        pytest.skip("data/kernel_compile.json is not written (scripts/kernel_compile_check.py)")
    found = roofline.grid(gpu_name)
    assert len(found) == 4 * 3 * 2
    for row in found:
        assert 0 < row["model_low"] <= row["model_high"] <= 1
        assert 0 < row["model_low_counting_all"] <= row["model_low"]
        assert row["triton"].startswith(roofline.LEASE_TRITON + ".")
        assert row["tile_clocks"] > 2 * row["tile_instructions"]
        if row["scheduler_warps"] == 1 and row["bound"] not in ("hbm", "tail"):
            assert row["bound"] == "dependences", row


def read_rate_frame(ks: tuple[int, ...] = (5, 20)):
    """Step rows of metric ``read_rate`` at n = 64, V = 152,064, bf16, L2 warm and cold."""
    import pandas as pd

    from stagelab.core import schema

    return pd.DataFrame([dict(metric=schema.READ_RATE, status="ok", stage=f"l2_{l2}", rows=64,
                              vocab=152064, k=k, dtype="bfloat16", bytes=64 * 152064 * 2,
                              seconds=1e-4, value=0.4, note="")
                         for l2 in ("warm", "cold") for k in ks])


def test_the_read_rate_table_shows_the_model_beside_the_measured_share(monkeypatch):
    from stagelab.analyse import step_analysis

    monkeypatch.setattr(roofline, "compiled_variants",
                        lambda: (variant(64, 152064, 5, "bf16"),))
    table = step_analysis.read_rate_table(read_rate_frame(), "NVIDIA H200")
    model = table["model_hbm_percent"].tolist()
    assert model[0] == model[2] and model[0].endswith(" %") and "-" in model[0]
    assert model[1].startswith("no model")  # k = 20's variant was not compiled here
    assert set(table["model_gpu"]) == {"NVIDIA H200"}


def test_the_read_rate_table_models_the_gpu_the_rows_were_measured_on(monkeypatch):
    """Before: the model beside a read rate was always an H200's, whatever GPU measured it
    (an H100 lease's rate stood beside an H200's model). Now the run's GPU's, at its own
    HBM peak; a GPU not modelled says so; a CPU's run shows the lease's H200, so named."""
    from stagelab.analyse import step_analysis

    monkeypatch.setattr(roofline, "compiled_variants",
                        lambda: (variant(64, 152064, 5, "bf16"),))
    frame = read_rate_frame((5,))

    def model(gpu_name):
        return step_analysis.read_rate_table(frame, gpu_name)["model_hbm_percent"].iloc[0]

    h100, h200 = roofline.GPUS["H100 SXM"], roofline.GPUS["H200"]
    assert model("NVIDIA H100 80GB HBM3") == roofline.percent_range(64, 152064, 5, "bf16", h100)
    assert model("NVIDIA H100 80GB HBM3") != model("NVIDIA H200")
    assert model("NVIDIA L4") == "no model: NVIDIA L4 is not modelled"
    assert model(None) == roofline.percent_range(64, 152064, 5, "bf16", h200)
    label = step_analysis.read_rate_table(frame)["model_gpu"].iloc[0]
    assert label.startswith("H200 (") and "no GPU" in label


def test_a_40_gb_a100_s_read_rate_is_modelled_at_its_own_peak(monkeypatch):
    """A 40 GB A100 shares the 80 GB card's sm_80 rows, SMs and clock, not its HBM: its share
    is of 1555 GB/s, not 2039."""
    from stagelab.analyse import step_analysis

    a100 = roofline.GPUS["A100 SXM"]
    first = launches.triton_launches(64, 152064, 5, True, None, None,
                                     launches.device_slots(a100.sms, 5))[0]
    monkeypatch.setattr(roofline, "compiled_variants", lambda: (
        dict(variant(64, 152064, 5, "bf16"), constexprs=dict(first.constexprs), arch=80),))
    small = roofline.gpu_of_device("NVIDIA A100-SXM4-40GB")
    model = step_analysis.read_rate_table(read_rate_frame((5,)), "NVIDIA A100-SXM4-40GB")
    found = model["model_hbm_percent"].iloc[0]
    assert found == roofline.percent_range(64, 152064, 5, "bf16", small)
    assert found != roofline.percent_range(64, 152064, 5, "bf16", "A100 SXM")
    assert found.endswith(" %")


def test_the_goal_is_issue_44_s_by_rows():
    assert [roofline.goal_share(n) for n in (1, 15, 16, 63, 64, 256)] == [
        None, None, 0.40, 0.40, 0.70, 0.70]


def test_the_instruction_budget_is_the_most_a_tile_may_cost_to_meet_the_goal(four_warp,
                                                                              monkeypatch):
    """At the budget the model meets the goal at the slow ends; a tenth of an instruction
    more misses it, at a budget under 400 and one over; a tail that alone outlasts the
    goal's time leaves no budget; a row count without a goal has none; a goal met even at
    the bisection's end is refused."""
    rows = tuple(variant(n, 152064, k, dtype) for n, k, dtype in
                 ((64, 0, "bf16"), (16, 5, "bf16"), (256, 0, "fp32")))

    def share(n, k, dtype, instructions):
        return roofline.predict(n, 152064, k, dtype, GPU, roofline.SLOW, rows,
                                tile_instructions=instructions)["model_hbm_share"]

    for n, k, dtype, least, most in ((64, 0, "bf16", 50, 400), (256, 0, "fp32", 400, 2000)):
        budget = roofline.goal_instructions(n, 152064, k, dtype, "H200", rows)
        assert least < budget < most
        assert share(n, k, dtype, budget) >= 0.70 > share(n, k, dtype, budget + 0.1)
    slow_tail = tuple(dict(row, tail_clocks=[10**6, 10**6]) for row in rows)
    assert roofline.goal_instructions(64, 152064, 0, "bf16", "H200", slow_tail) is None
    assert roofline.goal_instructions(1, 152064, 5, "bf16", "H200", rows) is None
    monkeypatch.setattr(roofline, "MOST_INSTRUCTIONS", 100)
    with pytest.raises(ValueError, match="bisection's end"):
        roofline.goal_instructions(256, 152064, 0, "fp32", "H200", rows)


def test_a_cell_meets_its_goal_by_its_unrounded_share():
    assert roofline.meets_goal(dict(rows=64, model_low=0.6999)) is False
    assert roofline.meets_goal(dict(rows=64, model_low=0.70)) is True
    assert roofline.meets_goal(dict(rows=16, model_low=0.40)) is True
    assert roofline.meets_goal(dict(rows=1, model_low=0.01)) is None


def test_a_device_is_modelled_by_its_exact_name_at_its_own_hbm_peak():
    """CUDA's names map to the modelled GPUs exactly: a 40 GB A100 at its 1555 GB/s (its
    SMs, clock and sm_80 the 80 GB card's), an H200 NVL or H100 PCIe (other clocks and
    SMs) not at all."""
    a100_40 = roofline.gpu_of_device("NVIDIA A100-SXM4-40GB")
    assert (a100_40.name, a100_40.hbm_gbps, a100_40.sms, a100_40.arch) == (
        "A100 SXM", 1555.0, 108, 80)
    assert roofline.gpu_of_device("NVIDIA A100-SXM4-80GB").hbm_gbps == 2039.0
    assert roofline.gpu_of_device("NVIDIA A100-PCIE-40GB").hbm_gbps == 1555.0
    assert roofline.gpu_of_device("NVIDIA H200") == roofline.GPUS["H200"]
    assert roofline.gpu_of_device("NVIDIA H100 80GB HBM3") == roofline.GPUS["H100 SXM"]
    assert roofline.gpu_of_device("  NVIDIA H200 \n") == roofline.GPUS["H200"]
    for name in ("NVIDIA H200 NVL", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA GH200 480GB",
                 "", None):
        assert roofline.gpu_of_device(name) is None


def test_every_device_a_modelled_gpu_stands_for_has_a_datasheet_peak():
    for gpu in roofline.GPUS.values():
        assert gpu.devices and gpu.hbm_gbps == forward.PEAK_BANDWIDTH_GBPS[gpu.devices[0]]
        assert all(name in forward.PEAK_BANDWIDTH_GBPS for name in gpu.devices)


def test_predict_words_name_the_model_and_skip_gpus_not_modelled(monkeypatch):
    monkeypatch.setattr(roofline, "compiled_variants",
                        lambda: tuple(variant(64, 152064, 5, d) for d in ("fp32", "bf16")))
    words = roofline.one_pass_words("H200", [(64, 152064, 5), (64, 152064, 5)])
    assert "not measured" in words and words.count("n=64 V=152064 k=5") == 1
    assert words.count(" %") == 2
    assert roofline.one_pass_words("L4", [(64, 152064, 5)]) == ""


def test_an_a100_is_modelled_from_its_own_plan_and_the_sm_80_figures(four_warp):
    """An A100 (108 SMs at 1.41 GHz) plans its own grid and reads sm_80 figures; an sm_90
    row of the same launch does not stand in for them."""
    a100 = roofline.GPUS["A100 SXM"]
    first = launches.triton_launches(64, 152064, 5, True, None, None,
                                     launches.device_slots(a100.sms, 5))[0]
    row = dict(variant(64, 152064, 5, "bf16"), constexprs=dict(first.constexprs))
    with pytest.raises(LookupError, match="sm_80"):
        roofline.predict(64, 152064, 5, "bf16", a100, roofline.Latencies(600.0), (row,))
    found = roofline.predict(64, 152064, 5, "bf16", a100, roofline.Latencies(600.0), (dict(row, arch=80),))
    assert found["gpu"] == "A100 SXM" and found["programs"] == first.grid[0] * first.grid[1]
    assert found["programs"] <= a100.sms < GPU.sms
    assert a100.hbm_gbps == 2039.0 and roofline.GPUS["A100 PCIe"].hbm_gbps == 1935.0


def test_predict_words_model_an_a100_platform_from_its_sm_80_rows(monkeypatch):
    """``stagelab predict`` names platforms as data/platforms.csv does ("A100 SXM"): its
    words give the model's share from sm_80 rows, and no model from sm_90 rows alone."""
    a100 = roofline.GPUS["A100 SXM"]
    first = launches.triton_launches(64, 152064, 5, True, None, None,
                                     launches.device_slots(a100.sms, 5))[0]
    rows = tuple(dict(variant(64, 152064, 5, dtype), constexprs=dict(first.constexprs))
                 for dtype in ("fp32", "bf16"))
    monkeypatch.setattr(roofline, "compiled_variants", lambda: rows)
    assert roofline.one_pass_words("A100 SXM", [(64, 152064, 5)]).count("no model") == 2
    monkeypatch.setattr(roofline, "compiled_variants",
                        lambda: tuple(dict(row, arch=80) for row in rows))
    words = roofline.one_pass_words("A100 SXM", [(64, 152064, 5)])
    assert "no model" not in words and words.count(" %") == 2


def test_each_modelled_gpu_has_the_sms_its_architecture_is_compiled_for():
    """The compile check compiles each architecture for one GPU's plan of slices
    (kernel_variants.ARCH_SMS); a GPU modelled from that architecture with other SMs would
    plan launches nobody compiled."""
    from stagelab.measure import kernel_variants

    assert {gpu.name: kernel_variants.ARCH_SMS[gpu.arch] for gpu in roofline.GPUS.values()} == {
        gpu.name: gpu.sms for gpu in roofline.GPUS.values()}
