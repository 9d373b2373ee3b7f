"""The torch-free analysis floor on small hand-made tables with known answers."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from stagelab.analyse import (
    copy_analysis,
    goal_rows,
    prompt_analysis,
    step_analysis,
    summaries,
    timings,
)
from stagelab.core import catalogue, schema


def _timings_frame(arms: dict[str, list[float]], rounds: list[int], **cell) -> pd.DataFrame:
    rows = [dict(arm=arm, round=r, seconds=s, metric="time", stage="total", status="ok", **cell)
            for arm, seconds in arms.items() for r, s in zip(rounds, seconds)]
    return pd.DataFrame(rows)


def test_compare_pairs_by_round():
    drift = [1.0, 5.0, 2.0, 9.0, 3.0]
    base = _timings_frame({"fresh": drift, "fresh~aa": drift}, [0, 1, 2, 3, 4], rows=8)
    # the candidate's rows arrive in another order, and its round 4 is missing
    cand = _timings_frame({"pinned": [d / 2 for d in drift[:4]][::-1]}, [3, 2, 1, 0], rows=8)
    other = _timings_frame({"fresh": [1.0, 1.0], "pinned": [0.25, 0.25]}, [0, 1], rows=64)
    frame = pd.concat([base, cand, other]).sample(frac=1.0, random_state=0)
    out = timings.compare(frame, "fresh", "pinned", ["rows"], twin=True)
    small = out.set_index("rows").loc[8]
    assert small["n_rounds"] == 4 and small["speedup"] == 2.0
    assert (small["ci_low"], small["ci_high"]) == (2.0, 2.0)  # paired: the drift cancels
    assert small["twin_speedup"] == 1.0
    assert small["saved_ms"] == pytest.approx(1e3 * np.mean(drift[:4]) / 2)  # mean times
    assert out.set_index("rows").loc[64, "speedup"] == 4.0


def test_an_unpaired_candidate_says_why_beside_the_twins_own_rounds():
    """Before: notebook 02's decisive table on a CPU read "rounds 0" beside the A/A twin's CI,
    as if the CI came from no round; the twin's rounds are their own column now, and a
    candidate with no paired round a note saying why."""
    frame = pd.concat([
        _timings_frame({"fresh": [1.0, 1.1, 0.9], "fresh~aa": [1.0, 1.1, 0.9]}, [0, 1, 2],
                       rows=8),
        pd.DataFrame([dict(arm="pinned", status="unavailable", metric="time", rows=8,
                           note="pinned host memory needs a CUDA device")])])
    row = timings.compare(frame, "fresh", "pinned", ["rows"], twin=True).iloc[0]
    assert (row["n_rounds"], row["twin_n_rounds"], row["twin_speedup"]) == (0, 3, 1.0)
    assert row["note"].startswith("pinned unavailable") and "CUDA" in row["note"]  # its own note
    assert "speedup" not in row or pd.isna(row["speedup"])


def test_compare_refuses_two_timings_of_one_round_in_a_cell():
    frame = pd.concat([_timings_frame({"a": [1.0, 1.0], "b": [1.0, 1.0]}, [0, 1], rows=r)
                       for r in (8, 64)])
    with pytest.raises(ValueError, match=r"arm 'a' has several timings for one round"):
        timings.compare(frame.assign(k=5), "a", "b", ["k"])
    assert len(timings.compare(frame.assign(k=5), "a", "b", ["k", "rows"])) == 2



# ---------------------------------------------------------------------- schema-shaped tables

V = 152_064
SEED_STAGES = {"device": 1.0, "alloc": 2.0, "copy": 3.0, "host_gather": 4.0}  # free not timed


def rows(*records: dict, **common) -> pd.DataFrame:
    """Schema-conforming rows (the types every real table carries)."""
    return schema.make_rows(records, **common)


def timed(arm: str, seconds: list[float], stage: str = "total", first_round: int = 0,
          **cell) -> list[dict]:
    return [dict(arm=arm, stage=stage, round=first_round + i, seconds=s, **cell)
            for i, s in enumerate(seconds)]


def step_arm(arm: str, scale: float, drift: list[float], gather: float | None = None,
             **cell) -> list[dict]:
    """One arm's stages and total per round: SEED_STAGES / scale, times the round's drift."""
    stages = {s: ms / scale for s, ms in SEED_STAGES.items()}
    if gather is not None:
        stages["host_gather"] = gather
    out = []
    for stage, ms in {**stages, "total": sum(stages.values())}.items():
        out += timed(arm, [ms * d / 1e3 for d in drift], stage, **cell)
    return out


CELL = dict(rows=64, vocab=V, k=5)


def test_ok_timings_keeps_ok_timings_of_one_stage():
    frame = rows(dict(arm="a", seconds=1.0), dict(arm="b", seconds=2.0, stage="copy"),
                 dict(arm="c", seconds=3.0, status="failed", note="boom"),
                 dict(arm="d", metric="peak_host_bytes", bytes=10),
                 dict(arm="e", status="unavailable", note="no GPU"))
    assert timings.ok_timings(frame)["arm"].tolist() == ["a"]
    assert timings.ok_timings(frame, stage=None)["arm"].tolist() == ["a", "b"]
    assert timings.ok_timings(frame, stage="copy")["arm"].tolist() == ["b"]


def test_paired_rounds_aligns_by_round_and_drops_incomplete_rounds():
    frame = rows(*timed("a", [1.0, 2.0, 3.0, 4.0]),
                 *[{**r, "round": 3 - i} for i, r in enumerate(timed("b", [40., 30., 20., 10.]))],
                 *timed("b", [99.0], stage="copy"),
                 dict(arm="c", round=0, seconds=7.0), dict(arm="c", round=2, seconds=9.0),
                 dict(arm="c", round=3, seconds=5.0, status="failed", note="x"))
    a, b = timings.paired_rounds(frame.iloc[::-1], "a", "b")
    assert a.tolist() == [1.0, 2.0, 3.0, 4.0] and b.tolist() == [10.0, 20.0, 30.0, 40.0]
    a, b, c = timings.paired_rounds(frame, "a", "b", "c")
    assert (a.tolist(), b.tolist(), c.tolist()) == ([1.0, 3.0], [10.0, 30.0], [7.0, 9.0])
    (copy,) = timings.paired_rounds(frame, "b", stage="copy")
    assert copy.tolist() == [99.0]
    missing = timings.paired_rounds(frame, "a", "nobody")
    assert [len(x) for x in missing] == [0, 0]


def test_not_measured_reason_quotes_the_row_or_says_nothing_ran():
    frame = rows(dict(arm="seed_pinned", status="unavailable", note="needs a CUDA device"))
    quoted = timings.not_measured_reason(frame, "seed_pinned")
    assert quoted.startswith("seed_pinned unavailable") and quoted.endswith("needs a CUDA device")
    nothing = timings.not_measured_reason(frame, "fused")
    assert nothing.startswith("fused") and "not measured" in nothing


def test_decomposition_gives_mean_stages_and_their_shares():
    frame = rows(*step_arm("seed_pageable", 1.0, [1.0, 1.0, 4.0], **CELL),
                 *step_arm("seed_pinned", 2.0, [1.0, 1.0, 1.0], **CELL),
                 *timed("seed_pageable", [5.0], stage="copy", first_round=9,
                        status="failed", note="x", **CELL))
    parts = step_analysis.decomposition(frame).set_index("arm")
    seed = parts.loc["seed_pageable"]  # mean drift 2: every stage twice SEED_STAGES
    assert [seed[s] for s in (*step_analysis.SPLIT, "total")] == pytest.approx(
        [0.0, 2e-3, 4e-3, 6e-3, 8e-3, 0.0, 0.0, 20e-3])  # no forward recorded: 0
    assert [seed[f"{s}_share"] for s in step_analysis.SPLIT] == pytest.approx(
        [0.0, 0.1, 0.2, 0.3, 0.4, 0.0, 0.0])
    assert parts.loc["seed_pinned", "total"] == pytest.approx(5e-3)
    assert parts.loc["seed_pinned", "copy_share"] == pytest.approx(0.3)
    empty = step_analysis.decomposition(rows(dict(arm="a", status="skipped", note="too big", **CELL)))
    assert empty.empty and list(empty.columns) == ["rows", "vocab", "k", "arm",
                                                   *step_analysis.SPLIT, "total"]


def test_decomposition_parts_add_up_to_the_total_with_unattributed_time():
    """Skewed rounds: the stage medians would not add up to the median total; the means do, and
    time outside every stage (or stages that overlap) is its own part."""
    rng = np.random.default_rng(3)
    records = []
    for round_ in range(15):
        stages = {s: float(rng.lognormal(-6, 1)) for s in step_analysis.STAGES}
        total = sum(stages.values()) + (2e-3 if round_ % 3 else -1e-3)  # gaps, sometimes overlap
        records += [dict(arm="seed_pageable", stage=s, round=round_, seconds=v, **CELL)
                    for s, v in {**stages, "total": total}.items()]
    records += [dict(arm="fused", stage=s, round=r, seconds=v, **CELL)  # no alloc, free, ...
                for r in range(3) for s, v in (("device", 1e-3), ("total", 1.5e-3))]
    parts = step_analysis.decomposition(rows(*records)).set_index("arm")
    for arm in ("seed_pageable", "fused"):
        row = parts.loc[arm]
        assert sum(row[s] for s in step_analysis.SPLIT) == pytest.approx(row["total"], rel=1e-12)
        assert sum(row[f"{s}_share"] for s in step_analysis.SPLIT) == pytest.approx(1.0)
    assert parts.loc["seed_pageable", "unattributed"] == pytest.approx(1e-3)  # (10*2 - 5*1) / 15
    assert parts.loc["fused", "unattributed"] == pytest.approx(0.5e-3)
    medians = rows(*records).query("arm == 'seed_pageable'").groupby("stage")["seconds"].median()
    assert sum(medians[s] for s in step_analysis.STAGES) != pytest.approx(medians["total"], rel=1e-3)


def test_copy_dwarfed_answers_per_cell():
    small = step_arm("seed_pageable", 1.0, [1.0], gather=50.0, rows=16, vocab=V, k=5)  # 3/56
    big = step_arm("seed_pageable", 1.0, [1.0], **CELL)  # copy 3 of 10 ms
    frame = rows(*small, *big)
    shares = step_analysis.stage_shares(frame).set_index("rows")
    assert shares["copy_share"].tolist() == pytest.approx([3 / 56, 3 / 10])
    assert shares["pinning_share"].tolist() == pytest.approx([5 / 56, 5 / 10])
    sentences = step_analysis.copy_dwarfed(frame)
    assert [s.split(":")[0] for s in sentences] == [f"n={n}, V={V}, K=5" for n in (16, 64)]
    assert ["is dwarfed" in s for s in sentences] == [True, False]  # the answer, per cell
    assert "is not dwarfed" in sentences[1]
    for sentence, figures in zip(sentences, (("3.00 ms", "56.00 ms", "5.4%", "8.9%"),
                                             ("3.00 ms", "10.00 ms", "30.0%", "50.0%"))):
        assert all(figure in sentence for figure in figures), sentence
    unavailable = rows(dict(arm="seed_pageable", status="unavailable",
                            note="the native build failed: no compiler", **CELL))
    (why,) = step_analysis.copy_dwarfed(unavailable)
    assert "(seed_pageable) was not timed" in why and why.endswith("no compiler.")  # its note


def test_lever_savings_compares_every_lever_with_the_seed_by_round():
    drift = [1.0, 3.0, 2.0]
    frame = rows(*step_arm("seed_pageable", 1.0, drift, **CELL),
                 *step_arm("seed_pageable~aa", 1.0, drift, **CELL),
                 *step_arm("seed_pinned", 2.0, drift, **CELL),
                 *step_arm("fused", 10.0, drift, **CELL))
    levers = step_analysis.lever_savings(frame).set_index("candidate")
    assert levers.index.tolist() == ["fused", "seed_pinned"]  # the twin is not a lever
    assert levers.loc["seed_pinned", ["speedup", "ci_low", "ci_high"]].tolist() == [2.0, 2.0, 2.0]
    assert levers.loc["fused", "speedup"] == pytest.approx(10.0)
    assert levers.loc["seed_pinned", "saved_ms"] == pytest.approx(10.0)  # 20 ms - 10 ms
    assert (levers["n_rounds"] == 3).all() and set(levers["baseline"]) == {"seed_pageable"}
    assert step_analysis.lever_savings(rows(*step_arm("seed_pageable", 1.0, drift, **CELL))).empty


def test_host_gather_backends_per_cell_in_ms():
    frame = rows(*step_arm("seed_pageable", 1.0, [1.0, 1.0, 1.0], **CELL),
                 *step_arm("seed_pageable_numpy", 1.0, [1.0, 1.0, 1.0], gather=14.0, **CELL),
                 *step_arm("seed_pageable", 1.0, [1.0], rows=256, vocab=V, k=5))
    out = step_analysis.host_gather_backends(frame)
    assert len(out) == 1  # the numpy arm was timed at n=64 only
    row = out.iloc[0]
    assert (row["rows"], row["native_ms"], row["numpy_ms"]) == (64, pytest.approx(4.0),
                                                                pytest.approx(14.0))
    assert row["numpy_over_native"] == pytest.approx(3.5)


def test_clock_disagreements_count_only_cross_checked_ok_totals():
    frame = rows(dict(arm="a", seconds=1.0, clock_agrees=True),
                 dict(arm="a", seconds=1.0, clock_agrees=False),
                 dict(arm="a", seconds=1.0, clock_agrees=False),
                 dict(arm="a", seconds=1.0),
                 dict(arm="a", seconds=1.0, stage="copy", clock_agrees=False),
                 dict(arm="b", status="failed", note="x", clock_agrees=False))
    assert summaries.clock_disagreements(frame) == {"checked": 3, "disagree": 2}
    assert summaries.clock_disagreements(rows(dict(arm="a", seconds=1.0))) == {
        "checked": 0, "disagree": 0}


def test_nothing_measured_names_the_cells_and_the_reason():
    skipped = rows(dict(arm="seed_pageable", status="skipped", note="would not fit: 9 GB", **CELL),
                   dict(arm="seed_pinned", status="skipped", note="would not fit: 9 GB", **CELL),
                   dict(arm="seed_pageable", status="skipped", note="would not fit: 9 GB",
                        rows=256, vocab=V, k=5))
    expected = (f"Nothing was measured in notebook 02 (cells n=64 V={V}, n=256 V={V}). Why: "
                "skipped: would not fit: 9 GB. Change the sizes or arms in the parameters "
                "(smaller rows or vocabularies, arms that exist on this machine) and run it again.")
    assert summaries.nothing_measured(skipped, "notebook 02") == expected
    assert summaries.measured_summary(skipped, "notebook 02") == f"**{expected}**"
    assert summaries.closing(skipped, "notebook 02") == f"**{expected}**"
    said = summaries.nothing_measured(rows(), "notebook 02")
    assert said is not None and "notebook 02" in said and "no cell" in said
    measured = pd.concat([skipped, rows(dict(arm="fused", seconds=1.0, **CELL))])
    assert summaries.nothing_measured(measured, "notebook 02") is None


def test_measured_summary_names_the_device_the_arms_timed_and_the_rest():
    frame = rows(*timed("seed_pageable", [1.0, 1.0]), *timed("fused", [0.1]),
                 dict(arm="seed_pinned", status="unavailable", note="needs a CUDA device"),
                 dict(arm="seed_pinned", status="unavailable", note="needs a CUDA device"),
                 device="cpu")
    head, unavailable = summaries.measured_summary(frame, "notebook 02").splitlines()
    assert "`cpu`" in head and head.endswith(" fused, seed_pageable")  # the device, arms timed
    assert unavailable.startswith("- `seed_pinned` unavailable") and "CUDA" in unavailable


def test_closing_counts_calls_cells_and_arms_and_names_failures():
    frame = rows(*timed("a", [1.0, 1.0], **CELL), *timed("b", [1.0], **CELL),
                 *timed("a", [1.0], rows=256, vocab=V, k=5),
                 dict(arm="c", status="failed", note="raised", **CELL))
    closing, ok_only = (summaries.closing(f, "notebook 02")
                        for f in (frame, frame[frame["status"] == "ok"]))
    counts = r"(\d+) timed calls over (\d+) cell\(s\) and (\d+) arm\(s\)"
    assert re.search(counts, closing).groups() == ("4", "2", "2") == re.search(
        counts, ok_only).groups()
    assert "Failed: c " in closing and "Failed" not in ok_only


def test_a_prompts_closing_counts_its_one_cell_and_its_configurations():
    """Before: notebook 03's progress said "cell 1/1" and its closing line "3 cell(s)" (each
    chunk counted as a cell); the closing counts the sweep's cells, and the configurations."""
    prompt = dict(rows=96, vocab=1000, k=5)
    frame = rows(*timed("fused", [1.0, 1.0], chunk=96, **prompt),
                 *timed("fused", [1.0, 1.0], chunk=16, **prompt),
                 *timed("head_fused", [1.0, 1.0], chunk=16, tile=1024, **prompt),
                 *timed("head_fused", [1.0, 1.0], chunk=16, tile=2048, **prompt))
    counted = re.findall(r"(\d+) (timed calls|cell\(s\)|configuration\(s\)|arm\(s\))",
                         summaries.closing(frame, "the prompt sweep"))
    assert counted == [("8", "timed calls"), ("1", "cell(s)"), ("4", "configuration(s)"),
                       ("2", "arm(s)")]


def test_spread_flags_noisy_cells():
    frame = rows(*timed("steady", [1.0, 1.0, 1.0, 1.0, 1.0], rows=8, vocab=V),
                 *timed("noisy", [1.0, 2.0, 3.0, 4.0, 5.0], rows=8, vocab=V),
                 dict(arm="steady", seconds=100.0, status="failed", note="x", rows=8, vocab=V))
    out = timings.spread(frame).set_index("arm")
    assert out.loc["noisy", "median"] == 3.0 and out.loc["noisy", "iqr"] == 2.0
    assert out.loc["noisy", "iqr_over_median"] == pytest.approx(2 / 3)
    assert out.loc["steady", "n"] == 5 and out.loc["steady", "iqr"] == 0.0
    assert out["noisy"].to_dict() == {"noisy": True, "steady": False}


def staging_frame(**arms: float) -> pd.DataFrame:
    drift = [1.0, 2.0, 4.0]
    return rows(*[r for arm, ms in arms.items()
                  for r in timed(arm, [ms * d / 1e3 for d in drift], rows=64, vocab=V,
                                 bytes=64 * V * 4)],
                dict(arm="raw_ceiling", status="unavailable", note="no GPU", rows=64, vocab=V))


def test_copy_comparisons_measure_every_timed_arm_against_the_fresh_buffer():
    frame = staging_frame(**{"pageable_fresh": 10.0, "pageable_fresh~aa": 10.0,
                             "pinned_grow_only": 2.0, "pageable_reused": 5.0})
    out = copy_analysis.copy_comparisons(frame)
    assert out["candidate"].tolist() == ["pageable_reused", "pinned_grow_only"]  # catalogue order
    assert out["speedup"].tolist() == [2.0, 5.0]
    assert out["twin_speedup"].tolist() == [1.0, 1.0]
    assert out["saved_ms"].tolist() == pytest.approx([35 / 3, 56 / 3])  # mean fresh 70/3 ms
    assert copy_analysis.copy_comparisons(staging_frame(pageable_reused=5.0)).empty


def test_the_copy_finding_states_the_largest_cell_the_twin_and_what_was_not_measured():
    frame = staging_frame(**{"pageable_fresh": 10.0, "pageable_fresh~aa": 10.0,
                             "pageable_reused": 5.0})
    finding = copy_analysis.copy_finding(frame, copy_analysis.copy_comparisons(frame))
    # the one test that holds the copy finding's wording (notebook 01's page)
    assert finding == (
        f"**Finding at the largest copy measured (n=64, V={V}):** against the seed's fresh "
        "zero-filled buffer (its time over the arm's; above 1 the arm is faster): "
        "`pageable_reused` 2.00x (CI 2.00-2.00, 11.67 ms saved per copy). The A/A twin reads "
        "1.000x (CI 1.000-1.000): the harness's own noise. The proposal `pinned_grow_only` was "
        "not measured: pinned_grow_only was not measured in this run. This is the copy alone: "
        "whether it matters for the engine is decided on the whole step (notebook 02, decided "
        "in 04).")
    alone = staging_frame(pageable_fresh=10.0)
    assert "nothing can be compared" in copy_analysis.copy_finding(
        alone, copy_analysis.copy_comparisons(alone))


def prompt_frame(medians: dict[int, float], arm: str = "fused+overlap",
                 prompt_rows: int = 2048, overlap: bool = True) -> list[dict]:
    return [dict(arm=arm, chunk=chunk, rows=prompt_rows, vocab=V, overlap=overlap,
                 dtype="float32", round=r, seconds=ms * f / 1e3)
            for chunk, ms in medians.items() for r, f in enumerate((0.9, 1.0, 1.3))]


def test_recommend_chunk_picks_the_smallest_chunk_within_tolerance():
    frame = rows(*prompt_frame({256: 1.10, 512: 1.04, 1024: 1.00, 2048: 1.02}),
                 *prompt_frame({256: 0.1}, arm="fused"))
    rec = prompt_analysis.recommend_chunk(frame)
    mean_factor = (0.9 + 1.0 + 1.3) / 3  # each chunk's rounds, scaled alike: paired ratios exact
    assert rec == {"arm": "fused+overlap", "chunk": 512,
                   "mean_seconds": pytest.approx(1.04e-3 * mean_factor),
                   "best_seconds": pytest.approx(1e-3 * mean_factor), "best_chunk": 1024,
                   "ratio_to_best": pytest.approx(1.04), "ratio_ci_low": pytest.approx(1.04),
                   "ratio_ci_high": pytest.approx(1.04), "unchunked_rows": 2048,
                   "tolerance": 0.05, "within_tolerance": True, "reason": rec["reason"]}
    assert "1.040x" in rec["reason"] and "chunk 1024" in rec["reason"]  # against the fastest
    assert prompt_analysis.recommend_chunk(frame, tolerance=0.01)["chunk"] == 1024
    assert prompt_analysis.recommend_chunk(frame, tolerance=0.2)["chunk"] == 256


def test_a_chunk_whose_ci_straddles_the_tolerance_is_no_recommendation():
    """Before: 512, 8 % slower on average with a paired CI reaching below 1.05, was recommended
    as "not shown to be slower"; the rounds leave its question open, so nothing is recommended,
    and the reason says how many rounds would resolve it."""
    rng = np.random.default_rng(0)
    noise = np.exp(rng.normal(0, 0.10, (2, 12)))
    records = [dict(arm="fused+overlap", chunk=chunk, rows=2048, vocab=V, overlap=True,
                    dtype="float32", round=r, seconds=ms * noise[i, r] / 1e3)
               for i, (chunk, ms) in enumerate({512: 1.08, 1024: 1.00}.items()) for r in range(12)]
    rec = prompt_analysis.recommend_chunk(rows(*records))
    assert rec["chunk"] is None and rec["recommended"] is False
    assert rec["open"] == [512]  # the question the rounds leave open
    more = int(re.search(r"about (\d+) paired rounds \(this run: 12\)", rec["reason"])[1])
    assert more > 12
    said = prompt_analysis.recommendation_sentence(rec)
    assert said.startswith("No recommended chunk (fused+overlap)")
    assert "no recommendation" not in said.lower()  # said once, not twice
    quiet = [{**r, "seconds": (1.08 if r["chunk"] == 512 else 1.0) / 1e3} for r in records]
    assert prompt_analysis.recommend_chunk(rows(*quiet))["chunk"] == 1024  # clearly 8 % slower


def test_a_busy_machine_recommends_no_chunk_and_no_tile_and_says_why():
    """Before: 3 rounds on a busy machine recommended chunk 256 and tile 1024 (measured 2.5x
    slower than tile 2048, CI 0.78-6.13); untrustworthy timings, or rounds that leave the 5 %
    question open, recommend nothing and say what would give a recommendation."""
    noisy = [1.0, 2.6, 0.7]  # a busy machine: each round's ratio far from the others
    chunks = [dict(arm="fused+overlap", chunk=chunk, rows=512, vocab=V, overlap=True,
                   dtype="float32", round=r, seconds=ms * (f if chunk == 256 else 1.0) / 1e3)
              for chunk, ms in {256: 1.0, 512: 1.0}.items() for r, f in enumerate(noisy)]
    tiles = [{**row, "seconds": row["seconds"] * (noisy[row["round"]] if row["tile"] == 1024
                                                  else 1.0)} if "seconds" in row else row
             for row in tiled({1024: 1.0, 2048: 1.0})]
    frame = rows(*chunks, *tiles)
    chunk = prompt_analysis.recommend_chunk(frame)
    tile = prompt_analysis.recommend_tile(frame)
    for rec, what in ((chunk, "chunk"), (tile, "tile")):
        assert rec[what] is None and rec["recommended"] is False, rec
        assert rec["open"] and any("(this run: 3)" in n for n in rec["needs"])  # more rounds
    assert any(n.startswith("chunks of 512") for n in chunk["needs"])  # none < 512 rows
    steady = rows(*prompt_frame({256: 1.0, 1024: 1.0}), *tiled({1024: 1.0, 2048: 1.0}))
    for rec, what in ((prompt_analysis.recommend_chunk(steady, trusted=False), "chunk"),
                      (prompt_analysis.recommend_tile(steady, trusted=False), "tile")):
        assert rec[what] is None and rec["needs"][0].startswith("a quiet machine"), rec
        assert rec["open"] == [] and rec["recommended"] is False  # withheld for trust alone
    assert prompt_analysis.recommend_chunk(steady)["chunk"] == 256  # quiet: decided


def test_recommend_chunk_says_when_the_whole_prompt_wins_or_nothing_was_timed():
    """Before: the unchunked prompt (chunk 2048 of a 2048-row prompt) was recommended, a chunk
    the profile never timed, while the sentence argued for a smaller one."""
    frame = rows(*prompt_frame({256: 2.0, 512: 1.5, 2048: 1.0}))
    rec = prompt_analysis.recommend_chunk(frame)
    assert rec["chunk"] == 512 and rec["best_chunk"] == 2048
    assert rec["ratio_to_best"] == pytest.approx(1.5)
    assert rec["within_tolerance"] is False and "1.500x" in rec["reason"]
    whole = prompt_analysis.recommend_chunk(rows(*prompt_frame({2048: 1.0})))
    assert whole["chunk"] is None and "ratio_to_best" not in whole  # no chunk to compare
    assert whole["unchunked_rows"] == 2048 and "2048 rows" in whole["reason"]
    untimed = prompt_analysis.recommend_chunk(frame, arm="chunked")
    assert (untimed["arm"], untimed["chunk"], set(untimed)) == ("chunked", None, {
        "arm", "chunk", "reason"})
    assert untimed["reason"].startswith("chunked")


def test_the_recommended_chunk_is_one_the_run_timed_even_beside_a_faster_whole_prompt():
    """Before: a 513-token prompt (512 rows) timed at chunks 64 and 256 recommended 512, the
    whole prompt, although chunk 256 was within the tolerance."""
    frame = rows(*prompt_frame({64: 1.2, 256: 1.02, 512: 1.0}, prompt_rows=512))
    rec = prompt_analysis.recommend_chunk(frame)
    assert rec["chunk"] == 256 and rec["within_tolerance"] is True


def test_prompt_time_relative_divides_by_the_same_arms_unchunked_time():
    records = (prompt_frame({2048: 2.0, 512: 3.0}, arm="a")
               + prompt_frame({512: 1.0, 2048: 4.0}, arm="b"))
    for order in (records, records[::-1]):
        out = prompt_analysis.prompt_time_relative(rows(*order)).set_index(["arm", "chunk"])
        assert out["relative"].to_dict() == pytest.approx(
            {("a", 512): 1.5, ("a", 2048): 1.0, ("b", 512): 0.25, ("b", 2048): 1.0})
        assert out.loc[("b", 512), "mean_seconds"] == pytest.approx(1e-3 * (0.9 + 1.0 + 1.3) / 3)


HF = "head_fused+overlap"


def tiled(medians: dict[int, float], chunk: int = 256, prompt_rows: int = 512,
          vocab: int = 32768, errors: dict[int, tuple[float, float]] | None = None,
          peaks: dict[int, int] | None = None) -> list[dict]:
    """head_fused's timings per tile at one chunk (the same round factors: paired ratios are
    exact), its agreement checks (``errors``: tile -> (id mismatches, max abs error); exact by
    default) and host peaks (``peaks``: tile -> bytes; a tenth of the bound by default)."""
    cell = dict(arm=HF, chunk=chunk, rows=prompt_rows, vocab=vocab, overlap=True,
                dtype="float32")
    records = [dict(cell, tile=tile, round=r, seconds=ms * f / 1e3)
               for tile, ms in medians.items() for r, f in enumerate((0.9, 1.0, 1.3))]
    for tile in medians:
        ids, error = (errors or {}).get(tile, (0.0, 0.0))
        peak = (peaks or {}).get(tile, int(0.035 * chunk * vocab * 4))
        records += [dict(cell, tile=tile, metric="id_mismatches", value=ids),
                    dict(cell, tile=tile, metric="max_abs_error", value=error),
                    dict(cell, tile=tile, metric="peak_host_bytes", bytes=peak)]
    return records


def test_recommend_tile_picks_the_smallest_exact_tile_within_the_bound_and_tolerance():
    frame = rows(*tiled({512: 1.10, 1024: 1.04, 2048: 1.00, 4096: 1.02}),
                 *prompt_frame({256: 0.5}, prompt_rows=512))
    rec = prompt_analysis.recommend_tile(frame)
    assert (rec["arm"], rec["tile"], rec["chunk"], rec["best_tile"]) == (HF, 1024, 256, 2048)
    assert rec["ratio_to_best"] == pytest.approx(1.04)
    assert rec["bound_bytes"] == int(0.35 * 256 * 32768 * 4)
    assert rec["within_tolerance"] is True and "1.040x" in rec["reason"]
    assert "tile 2048" in rec["reason"]  # the fastest, named
    assert prompt_analysis.recommendation_sentence(rec).startswith(
        f"Recommended tile: **1024** ({HF}, at chunk 256)")
    table = prompt_analysis.tile_table(rec)
    assert table["tile"].tolist() == [512, 1024, 2048, 4096] and table["exact"].all()
    assert table["chunk_share"].tolist() == pytest.approx([0.035] * 4)
    assert prompt_analysis.recommend_tile(frame, tolerance=0.01)["tile"] == 2048


def test_recommend_tile_passes_over_a_tile_that_is_not_exact_or_breaks_the_bound():
    bound = 0.35 * 256 * 32768 * 4
    frame = rows(*tiled({512: 1.0, 1024: 1.0, 2048: 1.0, 4096: 0.9},
                        errors={512: (3.0, 0.0), 1024: (0.0, 1e-3)},
                        peaks={4096: int(bound) + 1}))
    rec = prompt_analysis.recommend_tile(frame)
    table = prompt_analysis.tile_table(rec).set_index("tile")
    assert table["exact"].to_dict() == {512: False, 1024: False, 2048: True, 4096: True}
    assert table["within_bound"].to_dict() == {512: True, 1024: True, 2048: True, 4096: False}
    # 2048 is 11 % slower than the fastest tile (4096, outside the bound): still the choice
    assert rec["tile"] == 2048 and rec["best_tile"] == 4096
    assert rec["within_tolerance"] is False
    none = prompt_analysis.recommend_tile(rows(*tiled({1024: 1.0}, errors={1024: (1.0, 0.0)})))
    assert none["tile"] is None and "open" not in none  # none eligible, not a question left open
    assert not any(c["exact"] and c["within_bound"] for c in none["candidates"])
    assert prompt_analysis.recommendation_sentence(none).startswith("No recommended tile")


def test_recommend_tile_compares_at_the_largest_chunk_every_tile_ran_and_says_when_none_ran():
    frame = rows(*tiled({1024: 1.0, 2048: 2.0}, chunk=64), *tiled({1024: 2.0}, chunk=256),
                 *tiled({1024: 3.0, 2048: 3.0}, chunk=512))  # 512: the whole prompt
    rec = prompt_analysis.recommend_tile(frame)
    assert rec["chunk"] == 64 and rec["tile"] == 1024
    assert prompt_analysis.recommend_tile(frame, chunk=512)["tile"] == 1024
    nothing = prompt_analysis.recommend_tile(rows(*prompt_frame({256: 1.0}, prompt_rows=512)))
    assert nothing == {"arm": None, "tile": None, "chunk": None, "reason": nothing["reason"]}
    assert nothing["reason"].startswith("head_fused")
    assert prompt_analysis.tile_table(nothing).empty


def test_prompt_tables_keep_each_tile_apart_and_the_methods_without_one():
    """Before: head_fused's tiles were averaged into one configuration per chunk."""
    frame = rows(*tiled({1024: 1.0, 2048: 3.0}, chunk=512), *tiled({1024: 2.0}, chunk=256),
                 *prompt_frame({256: 1.0, 512: 2.0}, prompt_rows=512))
    relative = prompt_analysis.prompt_time_relative(frame)
    keyed = {(r.arm, None if pd.isna(r.tile) else int(r.tile), r.chunk): r.relative
             for r in relative.itertuples()}
    assert keyed == pytest.approx({(HF, 1024, 256): 2.0, (HF, 1024, 512): 1.0,
                                   (HF, 2048, 512): 1.0, ("fused+overlap", None, 256): 0.5,
                                   ("fused+overlap", None, 512): 1.0})
    peaks = prompt_analysis.prompt_peaks(frame)
    assert sorted(peaks.dropna(subset=["tile"])["tile"].tolist()) == [1024, 1024, 2048]
    effect = prompt_analysis.overlap_effect(frame)
    assert len(effect) == 5 and effect["tile"].isna().sum() == 2
    checks = timings.checks_table(frame, ["id_mismatches"], ["chunk", "tile"])
    assert len(checks) == 3  # the fused rows carry no checks here
    assert prompt_analysis.prompt_series(frame).drop_duplicates().tolist() == [
        f"{HF} · tile 1024", f"{HF} · tile 2048", "fused+overlap"]
    assert prompt_analysis.recommend_chunk(frame, arm=HF)["chunk"] == 256  # decided at tile 1024
    assert prompt_analysis.recommend_chunk(frame, arm=HF, tile=2048)["chunk"] is None


def test_overlap_effect_pairs_each_method_with_its_overlapped_arm():
    frame = rows(*prompt_frame({512: 3.0, 1024: 2.0}, arm="fused", overlap=False),
                 *prompt_frame({512: 2.0, 1024: 1.5}, arm="fused+overlap", overlap=True))
    out = prompt_analysis.overlap_effect(frame).set_index(["method", "chunk"])
    mean_factor = (0.9 + 1.0 + 1.3) / 3  # prompt_frame's rounds
    assert out["overlap_saves_mean_ms"].to_dict() == pytest.approx(
        {("fused", 512): mean_factor, ("fused", 1024): 0.5 * mean_factor})
    assert out.loc[("fused", 512), "plain_mean_s"] == pytest.approx(3e-3 * mean_factor)
    only_plain = prompt_analysis.overlap_effect(
        rows(*prompt_frame({512: 3.0}, arm="fused", overlap=False)))
    assert "overlap_saves_mean_ms" not in only_plain


def test_staging_goals_without_a_gpu():
    frame = staging_frame(**{"pageable_fresh": 10.0, "pageable_fresh~aa": 10.0,
                             "pageable_reused": 5.0})
    goals = goal_rows.staging_goals(frame, {})
    assert [g["status"] for g in goals] == ["not measured", "not measured", "met", "met"]
    assert "CUDA" in goals[0]["note"] and "GPU link" in goals[1]["note"]  # why not measured
    assert all(f in goals[2]["measured"] for f in (f"n=64, V={V}", "0.0%", "1.000-1.000"))
    assert (goals[3]["goal"], goals[3]["status"]) == ("reuse lever: reused vs fresh pageable", "met")
    assert all(f in goals[3]["measured"] for f in ("2.00x [2.00, 2.00]", "11.67 ms", "n=64"))
    without_reuse = goal_rows.staging_goals(
        staging_frame(**{"pageable_fresh": 10.0, "pageable_fresh~aa": 10.0}), {})
    assert without_reuse[3]["status"] == "not measured"
    assert all(arm in without_reuse[3]["note"] for arm in ("pageable_fresh", "pageable_reused"))


def test_staging_goals_ignore_a_cell_that_was_skipped():
    frame = pd.concat([
        staging_frame(**{"pageable_fresh": 10.0, "pageable_fresh~aa": 10.0,
                         "pageable_reused": 5.0}),
        rows(*[dict(arm=arm, rows=4096, vocab=V, status="skipped", note="would not fit")
               for arm in ("pageable_fresh", "pageable_fresh~aa", "pageable_reused")])])
    harness, reuse = goal_rows.staging_goals(frame, {})[2:]
    assert harness["status"] == "met" and "n=64" in harness["measured"]
    assert all(f in reuse["measured"] for f in ("2.00x [2.00, 2.00]", "11.67 ms", "n=64"))


def test_harness_goal_met_not_met_and_not_measured():
    close = pd.DataFrame([dict(rows=64, vocab=V, baseline="pageable_fresh", twin_speedup=1.0,
                               twin_ci_low=0.99, twin_ci_high=1.01)])
    assert goal_rows.harness_goal(close)["status"] == "met"
    far = pd.concat([close, pd.DataFrame([dict(rows=256, vocab=V, baseline="pageable_fresh",
                                               twin_speedup=1.05, twin_ci_low=1.03,
                                               twin_ci_high=1.07)])])
    out = goal_rows.harness_goal(far)
    assert out["status"] == "not met"
    assert all(f in out["measured"] for f in (f"n=256, V={V}", "2.0%", "1.030-1.070"))
    assert "1.05" not in out["measured"]  # the twin's ratio would read as a difference
    assert "identical arms" in out["note"]  # imprecision, not a difference
    wide = goal_rows.harness_goal(pd.DataFrame([dict(rows=8, vocab=V, twin_speedup=1.0,
                                                    twin_ci_low=0.95, twin_ci_high=1.06)]))
    assert wide["status"] == "not met"  # centred on 1 but too wide: imprecise, not different
    none = goal_rows.harness_goal(pd.DataFrame([dict(rows=64, vocab=V, speedup=2.0)]))
    assert (none["status"], none["note"]) == ("not measured", "no twin was timed")


@pytest.mark.parametrize("fused_scale, status", [(20.0, "met"), (5.0, "not met")])
def test_fused_goal_met_or_not(fused_scale, status):
    drift = [1.0, 2.0, 3.0]
    frame = rows(*step_arm("seed_pageable", 1.0, drift, **CELL),
                 *step_arm("fused", fused_scale, drift, **CELL))
    out = goal_rows.fused_goal(frame)
    assert out["status"] == status
    assert out["measured"].startswith(f"{fused_scale:.1f}x (CI {fused_scale:.1f}-")
    assert out["measured"].endswith(f"n=64, V={V}, K=5")  # the goal's own cell


def test_fused_goal_at_the_nearest_cell_or_not_measured():
    drift = [1.0, 2.0, 3.0]
    cell = dict(rows=16, vocab=V, k=5)
    frame = rows(*step_arm("seed_pageable", 1.0, drift, **cell),
                 *step_arm("fused", 12.0, drift, **cell))
    out = goal_rows.fused_goal(frame)
    assert out["status"] == "met" and out["measured"].endswith(f"n=16, V={V}, K=5")
    assert "nearest" in out["measured"]  # not the goal's own cell
    seed_only = goal_rows.fused_goal(rows(*step_arm("seed_pageable", 1.0, drift, **cell)))
    assert seed_only["status"] == "not measured" and "fused" in seed_only["note"]


def test_prompt_goals_peak_ratio_and_chunked_time():
    peaks = [dict(arm="fused+overlap", chunk=c, rows=2048, vocab=V, dtype="float32",
                  metric="peak_host_bytes", bytes=int(ratio * c * V * 4))
             for c, ratio in ((512, 1.10), (1024, 1.20))]
    frame = rows(*prompt_frame({256: 1.0, 512: 1.03, 1024: 1.10, 2048: 1.00}), *peaks)
    goals = goal_rows.prompt_goals(frame)
    assert [(g["goal"], g["measured"], g["status"]) for g in goals] == [
        ("fused peak extra memory, chunk 512 (fused+overlap)",
         f"1.10 x ({int(1.1 * 512 * V * 4) / 2**20:.1f} MiB, host RSS)", "met"),
        ("fused peak extra memory, chunk 1024 (fused+overlap)",
         f"1.20 x ({int(1.2 * 1024 * V * 4) / 2**20:.1f} MiB, host RSS)", "not met"),
        ("chunked time, chunk 512 (fused+overlap)", "1.030 x", "met"),
        ("chunked time, chunk 1024 (fused+overlap)", "1.100 x", "not met")]
    on_gpu = rows(*[{**p, "metric": "peak_device_bytes", "bytes": 512 * V * 4} for p in peaks],
                  *peaks, *prompt_frame({2048: 1.0}))
    assert [g["measured"].endswith("device)") for g in goal_rows.prompt_goals(on_gpu)] == [
        True, True, False]  # the device peak decides where one was measured, not the host RSS
    nothing = goal_rows.prompt_goals(rows(*prompt_frame({256: 1.0, 2048: 1.0})))
    assert [(g["goal"], g["status"]) for g in nothing] == [
        ("fused peak extra memory", "not measured"),
        ("chunked time, chunks of 512 or more", "not measured")]
    assert "peak" in nothing[0]["note"] and "512" in nothing[1]["note"]  # what was missing


def test_goal_rows_have_one_shape():
    assert goal_rows.goal("g", "t", "m", True) == {
        "goal": "g", "target": "t", "measured": "m", "status": "met", "note": ""}
    assert goal_rows.goal("g", "t", "m", False, "why")["status"] == "not met"
    assert goal_rows.goal("g", "t", "-", None)["status"] == "not measured"
    frame = goal_rows.goals_frame([goal_rows.goal("g", "t", "m", True)])
    assert list(frame.columns) == list(goal_rows.GOAL_COLUMNS) and len(frame) == 1


def test_prompt_goals_on_a_table_whose_timings_were_all_skipped():
    skipped = rows(dict(arm="fused+overlap", chunk=512, rows=2048, vocab=V, status="skipped",
                        note="would not fit"))
    assert prompt_analysis.prompt_time_relative(skipped).empty
    assert {g["status"] for g in goal_rows.prompt_goals(skipped)} == {"not measured"}


def test_sync_warnings_are_summed_up_per_arm_and_absent_without_cuda():
    frame = schema.make_rows([
        dict(arm="fused", metric="sync_warnings", value=0.0, rows=16),
        dict(arm="fused", metric="sync_warnings", value=2.0, rows=64, note="a.py:3: sync"),
        dict(arm="seed_pageable", metric="sync_warnings", value=1.0, rows=16)])
    sentence = summaries.sync_warnings(frame)
    assert "fused 2 (a.py:3: sync)" in sentence and "seed_pageable 1" in sentence  # per arm
    unavailable = schema.make_rows([dict(arm="sync_debug", metric="sync_warnings",
                                         status="unavailable", note="needs CUDA")])
    assert summaries.sync_warnings(unavailable) is None


def test_the_two_overlap_orders_are_told_apart_and_never_compared_as_one_cell():
    queued = timed("seed_pageable", [2e-3, 2e-3], rows=64, vocab=V, k=5, overlap_order="queued")
    waited = timed("seed_pageable", [3e-3, 3e-3], rows=64, vocab=V, k=5, overlap_order="waited")
    older = timed("seed_pageable", [1e-3], rows=16, vocab=V, k=5)  # kept before the order
    frame = rows(*queued, *waited, *older)
    order = catalogue.OVERLAP
    assert len(step_analysis.where_condition(frame, order, "queued")) == 3  # the older row queued
    assert len(step_analysis.where_condition(frame, order, "waited")) == 2
    assert step_analysis.condition_values(frame, catalogue.OVERLAP) == ["queued", "waited"]
    assert step_analysis.condition_values(rows(*older), catalogue.OVERLAP) == ["queued"]
    table = step_analysis.condition_table(frame, catalogue.OVERLAP)
    assert len(table) == 1  # the older cell has one order only
    assert (table.iloc[0]["queued_ms"], table.iloc[0]["waited_ms"]) == pytest.approx((2.0, 3.0))
    assert table.iloc[0]["waited_over_queued"] == pytest.approx(1.5)
    assert step_analysis.condition_table(rows(*queued), catalogue.OVERLAP).empty
    stranger = timed("seed_pageable", [9e-3], rows=64, vocab=V, k=5, overlap_order="<b>x</b>")
    assert step_analysis.condition_table(rows(*queued, *stranger), order).empty  # a stranger: none
    assert len(step_analysis.condition_table(rows(*queued, *waited, *stranger), catalogue.OVERLAP)) == 1
    pinned = [timed("seed_pinned", [1e-3, 1e-3], rows=64, vocab=V, k=5, overlap_order=order)
              for order in ("queued", "waited")]
    compared = timings.compare(rows(*queued, *waited, *pinned[0], *pinned[1]), "seed_pageable",
                                "seed_pinned", ["rows", "vocab", "k"])
    assert dict(zip(compared["overlap_order"], compared["speedup"])) == pytest.approx(
        {"queued": 2.0, "waited": 3.0})


def test_the_two_places_of_the_log_softmax_are_told_apart():
    device = timed("seed_pageable", [2e-3, 2e-3], rows=64, vocab=V, k=5, log_softmax="device")
    host = timed("seed_pageable", [3e-3, 3e-3], rows=64, vocab=V, k=5, log_softmax="host")
    older = timed("seed_pageable", [1e-3], rows=16, vocab=V, k=5)  # kept before the choice
    frame = rows(*device, *host, *older)
    place = catalogue.LOG_SOFTMAX
    assert len(step_analysis.where_condition(frame, place, "device")) == 3  # the older row: device
    assert len(step_analysis.where_condition(frame, place, "host")) == 2
    places = step_analysis.condition_table(frame, catalogue.LOG_SOFTMAX).iloc[0]
    assert (places["device_ms"], places["host_ms"]) == pytest.approx((2.0, 3.0))
    assert places["host_over_device"] == pytest.approx(1.5)
    assert step_analysis.condition_table(rows(*device), catalogue.LOG_SOFTMAX).empty
    both = rows(*device, *host, *timed("seed_pinned", [1e-3, 1e-3], rows=64, vocab=V, k=5,
                                        log_softmax="device"),
                *timed("seed_pinned", [1e-3, 1e-3], rows=64, vocab=V, k=5, log_softmax="host"))
    compared = timings.compare(both, "seed_pageable", "seed_pinned", ["rows", "vocab", "k"])
    assert sorted(compared["speedup"]) == pytest.approx([2.0, 3.0])  # one row per place


def test_the_link_goal_sits_below_the_practical_pcie_ceiling_and_numa_minus_one_is_unknown():
    nbytes = 100 * 10**6
    frame = rows(*timed("raw_ceiling", [nbytes / 41e9] * 3, rows=256, vocab=V, bytes=nbytes))
    snap = {"gpu": {"name": "H200"}, "nvml": {"pcie_max_gbps_per_direction": 50.0,
                                              "numa_node": -1}}
    link = goal_rows.staging_goals(frame, snap)[1]
    assert link["target"] == ">= 80 % (practical ceiling about 87 %)"
    assert (link["status"], link["measured"]) == ("met", "82.0% of 50.0 GB/s")  # 85 % failed it
    slow = rows(*timed("raw_ceiling", [nbytes / 30e9] * 3, rows=256, vocab=V, bytes=nbytes))
    note = goal_rows.staging_goals(slow, snap)[1]["note"]
    assert "NUMA" not in note and note.startswith("the buffer size")
    assert "NUMA node 1" in goal_rows.likely_link_cause({"nvml": {"numa_node": 1}})
def test_the_queued_forward_is_its_own_part_of_the_step_not_unattributed():
    common = dict(experiment="step", rows=4, vocab=100, k=1)
    records = [dict(arm="seed_pageable", stage=stage, round=r, seconds=seconds, **common)
               for r in range(3) for stage, seconds in (("copy", 0.002), ("total", 0.010))]
    records.append(dict(arm="forward", metric="forward_ms", value=5.0, **common))
    seed = step_analysis.decomposition(schema.make_rows(records)).iloc[0]
    assert seed["forward"] == pytest.approx(0.005) and seed["unattributed"] == pytest.approx(0.003)
    measured = records + [dict(arm="forward", metric="forward_measured_ms", value=6.0, **common)]
    seed = step_analysis.decomposition(schema.make_rows(measured)).iloc[0]
    assert seed["forward"] == pytest.approx(0.006)  # the measured duration, where recorded
    assert sum(seed[s] for s in step_analysis.SPLIT) == pytest.approx(seed["total"])
