"""The verdict on synthetic run folders: the seed's step, pinned against pageable, paired by round.

Each run folder holds a ``step`` table built here with known stage times, a true speedup per cell
and a drift shared by the arms of each round (so that only a paired analysis sees a tight effect),
and optionally the ``staging`` and ``prompt_logprobs`` tables.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from stagelab.analyse import (
    prompt_analysis,
    step_analysis,
    verdict,
    verdict_decision,
    verdict_words,
)
from stagelab.core import catalogue, records, schema
from stagelab.core.errors import SchemaError

V = 152_064
STAGE_MS = {"device": 2.0, "alloc": 4.0, "copy": 6.0, "host_gather": 7.0, "free": 1.0}  # 20 ms
MIN_SPEEDUP = 1 / (1 - 0.02)
UNAVAILABLE = "pinned host memory needs a CUDA device"


def arm_rows(arm: str, stage_ms: dict[str, float], drift: np.ndarray, rng: np.random.Generator,
             noise: float, rows: int, vocab: int, k: int) -> list[dict]:
    """One arm's rows of one cell: every stage and the total (their sum), per round."""
    out = []
    for round_, shared in enumerate(drift):
        factor = shared * (1 + noise * rng.standard_normal())
        parts = {stage: ms * factor / 1e3 for stage, ms in stage_ms.items()}
        for stage, seconds in {**parts, "total": sum(parts.values())}.items():
            out.append(dict(experiment="step", arm=arm, stage=stage, round=round_,
                            seconds=seconds, rows=rows, vocab=vocab, k=k))
    return out


def step_cell(rows: int, speedup: float | None, *, rounds: int = 150, vocab: int = V, k: int = 5,
              seed: int = 0, noise: float = 0.002, drift_sigma: float = 0.3,
              twin_factor: float = 1.0, extra: dict[str, float] | None = None,
              numpy_gather: bool = False) -> list[dict]:
    """One cell of the step table: the seed's arm, its A/A twin (``twin_factor`` times slower)
    and ``seed_pinned`` ``speedup`` times faster (None: unavailable, with a note); ``extra`` adds
    arms by their speedup over the seed's step; ``numpy_gather`` the numpy arm, whose host top-K
    takes twice the native one's time."""
    rng = np.random.default_rng(seed)
    drift = np.exp(drift_sigma * rng.standard_normal(rounds))
    cell = dict(rows=rows, vocab=vocab, k=k)
    recs = arm_rows("seed_pageable", STAGE_MS, drift, rng, noise, **cell)
    recs += arm_rows("seed_pageable~aa", {s: ms * twin_factor for s, ms in STAGE_MS.items()},
                     drift, rng, noise, **cell)
    arms = dict(extra or {})
    if speedup is None:
        recs.append(dict(experiment="step", arm="seed_pinned", status="unavailable",
                         note=UNAVAILABLE, **cell))
    else:
        arms["seed_pinned"] = speedup
    for arm, arm_speedup in arms.items():
        recs += arm_rows(arm, {s: ms / arm_speedup for s, ms in STAGE_MS.items()}, drift, rng,
                         noise, **cell)
    if numpy_gather:
        recs += arm_rows("seed_pageable_numpy", {**STAGE_MS, "host_gather": 14.0}, drift, rng,
                         noise, **cell)
    return recs


def write_step(run: Path, records: list[dict]) -> Path:
    schema.write_table(schema.make_rows(records), run, "step")
    return run


def build(run: Path, rows: list[int], **kwargs) -> dict:
    """The verdict as notebook 04 builds it, its parameters by name (delta, conditions...)."""
    chosen = {k: kwargs.pop(k) for k in list(kwargs)
              if k in (*verdict.RULE_PARAMETERS, "conditions")}
    return verdict.build_verdict(run, decisive_rows=rows, decisive_vocabs=[V], decisive_ks=[5],
                                 **verdict.arguments(chosen), **kwargs)


def means_ms(records: list[dict], arm: str, stage: str) -> float:
    return 1e3 * float(np.mean([r["seconds"] for r in records
                                if r["arm"] == arm and r.get("stage") == stage]))


# --------------------------------------------------------------------------- decisions

def test_a_clear_step_level_gain_ports_with_its_evidence(tmp_path):
    records = step_cell(64, 1.5)
    result = build(write_step(tmp_path / "run", records), [64])
    (cell,) = result["decisive"]
    assert (cell["rows"], cell["vocab"], cell["k"], cell["candidate"]) == (64, V, 5, "seed_pinned")
    assert cell["decision"] == "PORT" and result["overall"]["decision"] == "PORT"
    assert cell["reason"].startswith("speedup 1.50")
    assert "above the A/A twin's CI" in cell["reason"]
    assert cell["speedup"] == pytest.approx(1.5, rel=0.005)
    assert cell["ci_low"] > MIN_SPEEDUP and cell["ci_low"] <= cell["speedup"] <= cell["ci_high"]
    assert cell["min_speedup"] == pytest.approx(MIN_SPEEDUP, rel=1e-12)
    assert cell["n_rounds"] == 150 and cell["delta"] == 0.02
    step_ms = means_ms(records, "seed_pageable", "total")  # the engine pays the mean
    pinned_ms = means_ms(records, "seed_pinned", "total")
    assert cell["step_ms"] == pytest.approx(step_ms, rel=1e-12)
    assert cell["saved_ms"] == pytest.approx(step_ms - pinned_ms, rel=1e-12)
    assert cell["saved_ms"] == pytest.approx(step_ms / 3, rel=0.01)  # 1 - 1/1.5 of the step
    means = {stage: means_ms(records, "seed_pageable", stage) for stage in (*STAGE_MS, "total")}
    means["unattributed"] = means["total"] - sum(means[stage] for stage in STAGE_MS)
    means["forward"] = 0.0  # none queued (a CPU run)
    assert cell["stages_ms"] == pytest.approx(means, rel=1e-9, abs=1e-9)
    assert sum(v for k, v in cell["stages_ms"].items() if k != "total") == pytest.approx(
        cell["stages_ms"]["total"], rel=1e-12)
    # the one test that holds the verdict summary's wording (issue 47: one per page)
    assert result["overall"]["summary"].startswith(
        "Pinned grow-only staging saves more than delta of the seed's step: 1 of 1 cell(s) "
        f"carry the saving, clearing the bar at the family's Holm level (n=64 V={V} K=5); every "
        "cell's mean is non-inferior and no cell's p99 tail is shown heavier beyond delta")
    assert (f"; the largest saving is {cell['saved_ms']:.2f} ms per step at n=64, V={V}, K=5"
            in result["overall"]["summary"])
    assert "Each cell: n=64 V=152064 K=5 PORT 1.500x" in result["overall"]["summary"]


def test_pairing_by_round_is_what_resolves_a_small_gain_under_drift(tmp_path):
    records = step_cell(64, 1.06, drift_sigma=0.3)
    assert build(write_step(tmp_path / "paired", records), [64])["decisive"][0]["decision"] == (
        "PORT")
    # negative control: the same timings with the candidate's rounds shuffled lose the pairing
    order = np.random.default_rng(1).permutation(150)
    shuffled = [{**r, "round": int(order[r["round"]])} if r["arm"] == "seed_pinned" else r
                for r in records]
    cell = build(write_step(tmp_path / "shuffled", shuffled), [64])["decisive"][0]
    assert cell["decision"] == "INCONCLUSIVE" and "straddles the minimum 1.020x" in cell["reason"]


@pytest.mark.parametrize("speedup", [1.0, 1.01, 0.8], ids=["no-effect", "below-delta", "slower"])
def test_no_gain_a_gain_below_delta_or_a_slowdown_closes(tmp_path, speedup):
    result = build(write_step(tmp_path / "run", step_cell(64, speedup) + step_cell(
        256, speedup, seed=1)), [64, 256])
    for cell in result["decisive"]:
        assert cell["decision"] == "CLOSE"
        assert cell["ci_high"] < cell["min_speedup"] and "minimum 1.020x" in cell["reason"]
        assert cell["speedup"] == pytest.approx(speedup, rel=0.005)
    assert (result["overall"]["decision"], result["overall"]["where"]) == ("CLOSE", "")
    assert "all 2 decisive cells" in result["overall"]["summary"]


def test_one_cell_slower_beyond_delta_keeps_a_port_elsewhere_from_carrying(tmp_path):
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5) + step_cell(
        256, 0.8, seed=1)), [64, 256])
    assert [c["decision"] for c in result["decisive"]] == ["PORT", "CLOSE"]
    overall = result["overall"]
    assert overall["decision"] == "INCONCLUSIVE"
    assert str({"CLOSE": 1, "PORT": 1}) in overall["summary"]  # the decisions counted
    assert "blocked by n=256 V=152064 K=5" in overall["summary"]  # the cell that blocks


def test_a_cell_slower_within_delta_does_not_block_a_port(tmp_path):
    # negative control of the test above: 1 % slower is within delta, so the PORT cell carries
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5) + step_cell(
        256, 0.99, seed=1)), [64, 256])
    assert [c["decision"] for c in result["decisive"]] == ["PORT", "CLOSE"]
    assert result["overall"]["decision"] == "PORT"


def test_the_pinned_arm_unavailable_makes_every_decisive_cell_inconclusive(tmp_path):
    records = step_cell(64, None, extra={"seed_pageable_reused": 1.25}) + step_cell(
        256, None, seed=1, extra={"seed_pageable_reused": 1.25})
    result = build(write_step(tmp_path / "run", records), [64, 256])
    for cell in result["decisive"]:
        assert cell["decision"] == "INCONCLUSIVE"
        assert cell["reason"] == f"not measured: seed_pinned unavailable: {UNAVAILABLE}"
        seed_step = [r for r in records if r["rows"] == cell["rows"]]
        assert cell["stages_ms"]["total"] == pytest.approx(  # the seed's step is still measured
            means_ms(seed_step, "seed_pageable", "total"))
    assert (result["overall"]["decision"], result["overall"]["where"]) == ("INCONCLUSIVE", "")
    assert UNAVAILABLE in result["overall"]["summary"]  # why nothing decisive was measured
    # what a CPU can measure is still reported: the reuse lever at step level
    reuse = [line for line in result["findings"] if line.startswith("Reuse lever")]
    assert len(reuse) == 2 and f"n=64, V={V}, K=5: 1.25x" in reuse[0]


def test_a_decisive_cell_named_but_not_measured_is_inconclusive_naming_it(tmp_path):
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5)), [64, 256])
    port, missing = result["decisive"]
    assert port["decision"] == "PORT"
    assert (missing["rows"], missing["decision"]) == (256, "INCONCLUSIVE")
    assert missing["reason"].startswith("not measured: seed_pageable")
    assert missing["stages_ms"] is None and missing["speedup"] is None
    # intersection-union (issue 27): a cell not measured could regress, so no family PORT
    assert result["overall"]["decision"] == "INCONCLUSIVE"
    assert "blocked by n=256 V=152064 K=5" in result["overall"]["summary"]


def test_too_few_rounds_is_inconclusive(tmp_path):
    run = write_step(tmp_path / "run", step_cell(64, 1.5, rounds=5))
    cell = build(run, [64])["decisive"][0]
    assert cell["decision"] == "INCONCLUSIVE"
    assert "(5 < 10)" in cell["reason"]  # the rounds against the minimum
    assert cell["n_rounds"] == 5 and cell["speedup"] is None
    few = build(run, [64], min_samples=5)
    assert few["decisive"][0]["decision"] == "INCONCLUSIVE"
    assert "149" in few["decisive"][0]["reason"]  # the rounds a PORT needs
    # a profile of a few rounds (smoke) says so instead of deciding
    assert few["recommendation"]["change"] == "not a decision"
    assert few["overall"]["decision"] == "INCONCLUSIVE"
    assert few["overall"]["summary"].startswith("Not a decision:") and "149" in (
        few["overall"]["summary"])


def test_an_aa_twin_that_differs_from_its_baseline_is_inconclusive(tmp_path):
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5, twin_factor=1.10)), [64])
    cell = result["decisive"][0]
    assert cell["decision"] == "INCONCLUSIVE"
    assert cell["twin_ci_high"] < 1 and "0.909x" in cell["reason"]  # the twin differs
    assert cell["twin_speedup"] == pytest.approx(1 / 1.1, rel=0.005)
    assert result["overall"]["decision"] == "INCONCLUSIVE"


def test_the_harness_check_holds_every_twin_of_the_run_as_one_bonferroni_family(full_verdict):
    harness = full_verdict["harness"]
    checks = [(c["level"], c["rows"], c.get("k")) for c in harness["checks"]]
    assert checks == [("step", 64, 5), ("step", 256, 5), ("copy", 64, None), ("copy", 256, None)]
    assert harness["confidence"] == pytest.approx(1 - 0.05 / 4)
    assert harness["family_confidence"] == 0.95 and harness["delta"] == 0.02
    assert not any(c["differs"] for c in harness["checks"])  # identical twins, low noise
    step64 = full_verdict["decisive"][0]  # the same pair, at the family's wider level
    assert harness["checks"][0]["twin_speedup"] == pytest.approx(step64["twin_speedup"])
    assert harness["checks"][0]["twin_ci_low"] < step64["twin_ci_low"]


def test_a_cell_without_its_twin_is_listed_unchecked_and_not_counted(tmp_path):
    records = [r for r in step_cell(64, 1.5) if r["arm"] != "seed_pageable~aa"]
    harness = build(write_step(tmp_path / "run", records + step_cell(16, 1.5, seed=2)),
                    [16, 64])["harness"]
    assert [(c["rows"], c["differs"]) for c in harness["checks"]] == [(16, False), (64, None)]
    assert harness["checks"][1]["note"]  # why it is unchecked
    assert harness["confidence"] == pytest.approx(0.95)  # m = 1: the unchecked cell is not counted


def test_a_twin_slower_than_its_baseline_is_flagged_by_the_harness_check(tmp_path):
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5, twin_factor=1.10)), [64])
    (check,) = result["harness"]["checks"]
    assert check["differs"] is True and check["twin_ci_high"] < 0.98


def test_a_decisive_cell_without_its_aa_twin_is_inconclusive(tmp_path):
    records = [r for r in step_cell(64, 1.5) if r["arm"] != "seed_pageable~aa"]
    records.append({"experiment": "step", "arm": "seed_pageable~aa", "rows": 64, "vocab": V,
                    "k": 5, "round": 3, "status": "failed", "note": "RuntimeError: lost"})
    cell = build(write_step(tmp_path / "run", records), [64])["decisive"][0]
    assert cell["decision"] == "INCONCLUSIVE"
    assert cell["twin_speedup"] is None  # no A/A check
    assert "seed_pageable~aa" in cell["reason"] and "RuntimeError: lost" in cell["reason"]


def test_where_the_effect_lies_counts_a_size_as_port_only_when_every_k_is():
    cells = [{"rows": 64, "vocab": 1000, "k": 5, "decision": "INCONCLUSIVE"},
             {"rows": 64, "vocab": 1000, "k": 20, "decision": "PORT"},
             {"rows": 256, "vocab": 1000, "k": 5, "decision": "PORT"},
             {"rows": 16, "vocab": 1000, "k": 5, "decision": "CLOSE"}]
    assert verdict_decision.effect_location(cells) == (
        "PORT from n x V >= 256,000; CLOSE/INCONCLUSIVE/PORT below.")


def test_where_the_effect_lies_names_the_smallest_size_of_the_port_run(tmp_path):
    records = step_cell(16, 1.0) + step_cell(64, 1.5, seed=1) + step_cell(256, 1.5, seed=2)
    result = build(write_step(tmp_path / "run", records), [16, 64, 256])
    assert [c["decision"] for c in result["decisive"]] == ["CLOSE", "PORT", "PORT"]
    assert result["overall"]["decision"] == "PORT"
    assert result["overall"]["where"] == f"PORT from n x V >= {64 * V:,}; CLOSE below."
    assert result["overall"]["summary"].endswith(result["overall"]["where"])
    # negative control: PORT only at the smallest cell is not a run from some size up
    records = step_cell(16, 1.5) + step_cell(64, 1.0, seed=1) + step_cell(256, 1.0, seed=2)
    result = build(write_step(tmp_path / "low", records), [16, 64, 256])
    assert result["overall"]["where"] == ""


# ------------------------------------------------------------------ missing and bad input

def test_missing_tables_are_named_and_do_not_crash(tmp_path):
    result = build(tmp_path / "empty_run", [64])
    assert [line.split(" ")[0] for line in result["missing"]] == [
        "data/staging.parquet", "data/step.parquet", "data/prompt_logprobs.parquet"]
    assert "02_logprobs_step" in result["missing"][1]
    assert result["decisive"][0]["reason"].startswith("not measured: seed_pageable ")
    assert result["overall"]["decision"] == "INCONCLUSIVE"
    assert result["decisive"][0]["speedup"] is None
    assert "seed_pageable" in result["overall"]["summary"]  # the arm that was not measured
    assert (result["goals"], result["step_levers"], result["copy_cells"]) == ([], [], [])
    assert result["prompt_logprobs"] is None and result["findings"] == result["missing"]
    step_only = build(write_step(tmp_path / "run", step_cell(64, 1.5)), [64])
    assert [line.split(" ")[0] for line in step_only["missing"]] == [
        "data/staging.parquet", "data/prompt_logprobs.parquet"]


def test_a_prompt_table_with_every_cell_skipped_does_not_crash(tmp_path):
    run = write_step(tmp_path / "run", step_cell(64, 1.5))
    schema.write_table(schema.make_rows([dict(
        experiment="prompt_logprobs", arm="fused+overlap", chunk=512, rows=2048, vocab=V,
        status="skipped", note="would not fit")]), run, "prompt_logprobs")
    result = build(run, [64])
    assert result["prompt_logprobs"]["recommendation"]["chunk"] is None
    assert result["goals"][-1]["status"] == "not measured"


def test_a_corrupt_table_raises_naming_the_file(tmp_path):
    run = write_step(tmp_path / "run", step_cell(64, 1.5))
    (run / "data" / "step.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(SchemaError, match=r"step\.parquet: cannot be read as a parquet table"):
        build(run, [64])


@pytest.mark.parametrize("kwargs, parameter", [
    ({"delta": 0}, "delta"), ({"delta": 1}, "delta"), ({"delta": -0.1}, "delta"),
    ({"delta": True}, "delta"), ({"min_samples": 1}, "min_samples"),
    ({"min_samples": 2.5}, "min_samples"), ({"decisive_rows": []}, "decisive_rows"),
    ({"decisive_vocabs": []}, "decisive_vocabs"), ({"decisive_ks": []}, "decisive_ks")])
def test_bad_parameters_raise_naming_the_parameter_before_reading(tmp_path, kwargs, parameter):
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "data" / "step.parquet").write_bytes(b"corrupt: never read")
    given = {**dict(decisive_rows=[64], decisive_vocabs=[V], decisive_ks=[5]), **kwargs}
    cells = {k: v for k, v in given.items() if k.startswith("decisive_")}
    with pytest.raises(ValueError, match=rf"^{parameter} ") as raised:
        verdict.build_verdict(run, **cells, **verdict.arguments(given))
    assert not isinstance(raised.value, SchemaError)



def test_the_rule_is_one_frozen_value_checked_when_built_and_recorded_whole(tmp_path):
    """The decision's settings travel as one Rule: built once (a bad value refused there, named),
    never changed after, and the verdict's parameters hold every one of its fields."""
    rule = verdict_decision.Rule(delta=0.05, min_samples=12, confidence=0.9, seed=7)
    assert rule.min_speedup == pytest.approx(1 / 0.95)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.delta = 0.1  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"^confidence "):
        verdict_decision.Rule(confidence=1)
    made = build(write_step(tmp_path / "run", step_cell(64, 1.5)), [64])
    assert {k: made["parameters"][k] for k in dataclasses.asdict(rule)} == dataclasses.asdict(
        verdict_decision.Rule())


# ------------------------------------------------------------------------ a full run folder

def staging_records(rounds: int = 20) -> list[dict]:
    rng = np.random.default_rng(3)
    drift = np.exp(0.2 * rng.standard_normal(rounds))
    recs = []
    for rows in (64, 256):
        size = rows * V * 4
        for arm, seconds in (("pageable_fresh", 0.010), ("pageable_fresh~aa", 0.010),
                             ("pageable_reused", 0.005), ("pageable_fresh_empty", 0.008)):
            recs += [dict(experiment="d2h_copy", arm=arm, rows=rows, vocab=V, round=r,
                          seconds=seconds * rows / 64 * d, bytes=size)
                     for r, d in enumerate(drift)]
        recs.append(dict(experiment="d2h_copy", arm="pinned_grow_only", rows=rows, vocab=V,
                         status="unavailable", note=UNAVAILABLE))
    return recs


PROMPT_MS = {256: 1.20, 512: 1.03, 1024: 1.00, 2048: 1.01}  # chunk -> ms; 2048 = the whole prompt


def prompt_records() -> list[dict]:
    common = dict(experiment="prompt_logprobs", rows=2048, vocab=V, hidden=3584,
                  dtype="float32")
    recs = []
    for arm, overlap, factor in (("fused", False, 1.1), ("fused+overlap", True, 1.0)):
        for chunk, ms in PROMPT_MS.items():
            recs += [dict(arm=arm, overlap=overlap, chunk=chunk, round=r,
                          seconds=factor * ms / 1e3, **common) for r in range(3)]
    recs += [dict(arm="fused+overlap", overlap=True, chunk=chunk, metric="peak_host_bytes",
                  bytes=int(1.1 * chunk * V * 4), **common) for chunk in (512, 1024)]
    return recs


def full_step_records() -> list[dict]:
    return step_cell(64, 1.5, extra={"seed_pageable_reused": 1.2, "fused": 20.0},
                     numpy_gather=True) + step_cell(256, 1.5, seed=1, numpy_gather=True,
                                                    extra={"seed_pageable_reused": 1.2})


def write_full_run(run: Path) -> Path:
    write_step(run, full_step_records())
    schema.write_table(schema.make_rows(staging_records()), run, "staging")
    schema.write_table(schema.make_rows(prompt_records()), run, "prompt_logprobs")
    return run


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    return write_full_run(tmp_path_factory.mktemp("full") / "run")


@pytest.fixture(scope="module")
def full_verdict(full_run) -> dict:
    return build(full_run, [64, 256])


def test_the_verdict_is_deterministic(full_run, full_verdict):
    assert json.dumps(build(full_run, [64, 256])) == json.dumps(full_verdict)
    # negative control: another bootstrap seed moves the CIs, and the comparison sees it
    assert json.dumps(build(full_run, [64, 256], seed=1)) != json.dumps(full_verdict)


def test_every_goal_row_has_the_one_shape(full_verdict):
    goals = full_verdict["goals"]
    assert [g["goal"] for g in goals] == [
        "pinned grow-only vs raw pinned ceiling", "raw ceiling vs NVML link (copies >= 64 MB)",
        "A/A twin's CI precision (not the trust check)", "reuse lever: reused vs fresh pageable",
        "fused step vs the seed's step",
        "fused peak extra memory, chunk 512 (fused+overlap)",
        "fused peak extra memory, chunk 1024 (fused+overlap)",
        "chunked time, chunk 512 (fused)", "chunked time, chunk 1024 (fused)",
        "chunked time, chunk 512 (fused+overlap)", "chunked time, chunk 1024 (fused+overlap)"]
    for row in goals:
        assert list(row) == ["goal", "target", "measured", "status", "note"]
    statuses = {g["goal"]: g["status"] for g in goals}
    assert statuses["pinned grow-only vs raw pinned ceiling"] == "not measured"
    assert statuses["fused step vs the seed's step"] == "met"
    assert statuses["reuse lever: reused vs fresh pageable"] == "met"
    assert statuses["chunked time, chunk 512 (fused)"] == "met"  # 1.03 / 1.01 within 1.05


def test_the_full_run_reports_levers_backends_copies_and_the_prompt(full_verdict):
    assert full_verdict["missing"] == [] and full_verdict["overall"]["decision"] == "PORT"
    assert full_verdict["overall"]["where"] == f"PORT from n x V >= {64 * V:,}."
    levers = {(lv["rows"], lv["candidate"]): lv for lv in full_verdict["step_levers"]}
    assert sorted(levers) == [(n, arm) for n in (64, 256) for arm in (
        "fused", "seed_pageable_numpy", "seed_pageable_reused", "seed_pinned")]
    assert levers[(64, "fused")]["speedup"] == pytest.approx(20.0, rel=0.005)
    assert levers[(256, "seed_pageable_reused")]["speedup"] == pytest.approx(1.2, rel=0.005)
    assert levers[(256, "fused")]["n_rounds"] == 0  # measured in another cell only
    small = [r for r in full_step_records() if r["rows"] == 64]
    native = means_ms(small, "seed_pageable", "host_gather")
    numpy_ = means_ms(small, "seed_pageable_numpy", "host_gather")
    (top_k,) = [f for f in full_verdict["findings"] if f.startswith(f"Host top-K at n=64, V={V}")]
    assert f"{native:.2f} ms" in top_k and f"{numpy_:.2f} ms" in top_k and "(2.0x)" in top_k
    # one statistic per claim: the host top-K the finding quotes is the stage split's
    split = next(c["stages_ms"] for c in full_verdict["decisive"] if c["rows"] == 64)
    assert f"host top-K (C++) {split['host_gather']:.2f}" in " ".join(full_verdict["findings"])
    assert f"native C++ {split['host_gather']:.2f} ms" in " ".join(full_verdict["findings"])
    copies = {(c["rows"], c["candidate"]): c for c in full_verdict["copy_cells"]}
    assert copies[(64, "pageable_reused")]["speedup"] == pytest.approx(2.0)
    assert copies[(64, "pageable_fresh_empty")]["speedup"] == pytest.approx(1.25)
    assert copies[(64, "pinned_grow_only")]["n_rounds"] == 0
    assert copies[(64, "pinned_grow_only")]["twin_speedup"] == pytest.approx(1.0)
    prompt = full_verdict["prompt_logprobs"]
    assert prompt["recommendation"]["chunk"] == 512 and prompt["recommendation"]["arm"] == (
        "fused+overlap")
    assert prompt["peaks"] == [
        {"arm": "fused+overlap", "chunk": c, "metric": "peak_host_bytes",
         "bytes": int(1.1 * c * V * 4)} for c in (512, 1024)]
    assert full_verdict["clock_check"] == {"checked": 0, "disagree": 0}


def test_the_zero_fill_finding_comes_from_the_native_vector_with_its_ci(full_verdict):
    # the step's alloc stage (the seed's value-initialised std::vector) is 4 ms in every cell,
    # the copy 6 of 20 ms and alloc + copy + free 11 of 20 ms
    (line,) = [f for f in full_verdict["findings"] if f.startswith("Zero-fill")]
    assert "native" in line and f"n=256, V={V}, K=5" in line  # the seed's own vector, its cell
    assert "30.0% (CI " in line and "55.0% (CI " in line  # the copy's share, then alloc + copy + free


def test_without_the_native_step_the_zero_fill_finding_is_the_labelled_copy_level_stand_in(
        full_verdict):
    stand_in = verdict_words._zero_fill_findings(full_verdict, None)
    cell = next(c for c in full_verdict["copy_cells"]
                if (c["rows"], c["candidate"]) == (256, "pageable_fresh_empty"))
    (line,) = stand_in
    assert "copy level" in line and f"256 x {V}" in line  # labelled a stand-in, of its size
    assert f"{cell['saved_ms']:.2f} ms per copy" in line and "1.25x" in line


def test_the_verdict_is_strict_json(full_verdict):
    json.dumps(full_verdict, allow_nan=False)


def test_no_finding_is_written_for_a_comparison_that_was_not_timed(tmp_path):
    skipped = [dict(experiment="step", arm=arm, rows=256, vocab=V, k=5, status="skipped",
                    note="would not fit") for arm in ("seed_pageable", "seed_pageable~aa",
                                                      "seed_pinned", "seed_pageable_reused")]
    run = write_step(tmp_path / "run",
                     step_cell(64, None, extra={"seed_pageable_reused": 1.25}) + skipped)
    staging = staging_records() + [
        dict(experiment="d2h_copy", arm=arm, rows=4096, vocab=V, status="skipped",
             note="would not fit") for arm in ("pageable_fresh", "pageable_fresh_empty")]
    schema.write_table(schema.make_rows(staging), run, "staging")
    findings = build(run, [64, 256])["findings"]
    reuse = [line for line in findings if line.startswith("Reuse lever")]
    assert len(reuse) == 1 and "n=64" in reuse[0]
    (zero_fill,) = [line for line in findings if line.startswith("Zero-fill")]
    assert "native vector" in zero_fill and "n=64" in zero_fill
    assert not any("nan" in line for line in findings)


def test_the_recommendation_has_one_source_the_table(tmp_path):
    run = write_full_run(tmp_path / "run")
    stray = {"arm": "fused", "chunk": 1024, "reason": "written by an older notebook 03"}
    (run / "prompt_chunk_recommendation.json").write_text(json.dumps(stray))
    result = build(run, [64])
    expected = prompt_analysis.recommend_chunk(schema.read_table(run, "prompt_logprobs"))
    assert result["prompt_logprobs"]["recommendation"] == expected and expected["chunk"] == 512


def test_reference_evidence_is_listed_with_its_hardware(tmp_path):
    root = tmp_path / "reference"
    for gpu, run_id, decision in (("H200", "20270101T000000Z_full", "CLOSE"),
                                  ("cpu", "20270102T000000Z_quick", "INCONCLUSIVE")):
        (root / gpu / run_id).mkdir(parents=True)
        (root / gpu / run_id / "verdict.json").write_text(json.dumps({
            "run_id": run_id, "overall": {"decision": decision, "summary": f"s {gpu}"},
            "hardware": {"gpu": "NVIDIA H200"} if gpu == "H200" else {"cpu": "Xeon"}}))
        (root / gpu / run_id / "kept.json").write_text(json.dumps({
            "kept_utc": "2027-01-03T00:00:00+00:00", "forced": False, "status": "ok"}))
    (root / "H200" / "notes.txt").write_text("not a verdict")
    # Not evidence, each named: a keep stopped mid-copy, a folder never kept, a damaged verdict.
    for name, text in ((".incoming-20270104T000000Z_full-x", '{"overall": {"decision": "PORT"}}'),
                       ("20270105T000000Z_full", '{"overall": {"decision": "PORT"}}'),
                       ("20270106T000000Z_full", '{"overall": {"decision": "MAYBE"}}')):
        (root / "H200" / name).mkdir()
        (root / "H200" / name / "verdict.json").write_text(text)
    (root / "H200" / "20270106T000000Z_full" / "kept.json").write_text(
        (root / "H200" / "20270101T000000Z_full" / "kept.json").read_text())
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5)), [64], reference_root=root)
    assert [r["path"] for r in result["reference"]] == [
        "H200/20270101T000000Z_full/verdict.json", "cpu/20270102T000000Z_quick/verdict.json"]
    skipped = result["reference_skipped"]
    assert [line.split(":")[0] for line in skipped] == [
        "H200/.incoming-20270104T000000Z_full-x", "H200/20270105T000000Z_full",
        "H200/20270106T000000Z_full"]
    assert "no kept.json (not kept" in skipped[1] and "'MAYBE'" in skipped[2]
    assert str(root / "H200" / "20270106T000000Z_full" / "verdict.json") in skipped[2]
    assert all(f"{verdict_words.NOT_READ}: {line}." in result["findings"] for line in skipped)
    assert result["reference"][0]["overall"]["decision"] == "CLOSE"
    decided = [re.search(r"run (\S+) decided (\w+)", f).groups() for f in result["findings"]
               if f.startswith(verdict_words.COMMITTED)]
    assert decided == [("20270101T000000Z_full", "CLOSE"),
                       ("20270102T000000Z_quick", "INCONCLUSIVE")]
    table = verdict_words.reference_table(result)
    assert list(table.columns) == ["path", "gpu", "cpu", "decision", "summary"]
    assert table["gpu"].fillna("-").tolist() == ["NVIDIA H200", "-"]
    assert table["cpu"].fillna("-").tolist() == ["-", "Xeon"]
    assert table["decision"].tolist() == ["CLOSE", "INCONCLUSIVE"]
    assert build(tmp_path / "run", [64])["reference"] == []


# --------------------------------------------------------------------------- table helpers

def test_the_decisive_table_holds_the_evidence_and_the_stage_split(full_verdict):
    table = verdict_words.decisive_table(full_verdict)
    stage_columns = [f"{s}_ms" for s in (*STAGE_MS, "unattributed", "total")]
    assert list(table.columns) == [*verdict_words.DECISIVE_COLUMNS, *stage_columns]
    assert table["rows"].tolist() == [64, 256]
    assert table["decision"].tolist() == ["PORT", "PORT"]
    first = full_verdict["decisive"][0]
    assert table.loc[0, "copy_ms"] == first["stages_ms"]["copy"]
    assert table.loc[0, "speedup"] == first["speedup"]
    empty = verdict_words.decisive_table({"decisive": []})
    assert list(empty.columns) == verdict_words.DECISIVE_COLUMNS and empty.empty


def test_the_levers_copy_and_reference_tables(full_verdict):
    levers = verdict_words.levers_table(full_verdict)
    assert len(levers) == 8 and set(levers["baseline"]) == {"seed_pageable"}
    copies = verdict_words.copy_table(full_verdict)
    assert len(copies) == 6
    assert sorted(set(copies["candidate"])) == [
        "pageable_fresh_empty", "pageable_reused", "pinned_grow_only"]
    assert verdict_words.reference_table(full_verdict).empty


def test_the_prompt_sentence(full_verdict):
    rec = full_verdict["prompt_logprobs"]["recommendation"]
    assert (rec["chunk"], rec["arm"]) == (512, "fused+overlap")
    said = verdict_words.prompt_sentence(full_verdict)
    assert said.startswith("Recommended chunk: **512** (fused+overlap)") and rec["reason"] in said
    assert "missing" in verdict_words.prompt_sentence({"prompt_logprobs": None})



# --------------------------------------------------------------- bad timings and the context

@pytest.mark.parametrize("arm, stage, value", [("seed_pinned", "total", float("nan")),
                                               ("seed_pageable", "total", 0.0),
                                               ("seed_pageable~aa", "copy", -1.0)])
def test_a_bad_timing_makes_its_cell_inconclusive_never_a_crash(tmp_path, arm, stage, value):
    records = step_cell(64, 1.5) + step_cell(256, 1.5, seed=1)
    target = next(r for r in records if r["arm"] == arm and r["stage"] == stage
                  and r["rows"] == 64 and r["round"] == 3)
    target["seconds"] = value
    result = build(write_step(tmp_path / "run", records), [64, 256])
    bad, good = result["decisive"]
    if stage == "total":
        assert bad["decision"] == "INCONCLUSIVE" and bad["reason"].startswith("bad timings: ")
        assert "round 3 holds" in bad["reason"]
    assert good["decision"] == "PORT"
    assert result["overall"]["decision"] in ("PORT", "INCONCLUSIVE")
    json.dumps(result, allow_nan=False)


def test_the_verdict_states_its_context(tmp_path):
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5)), [64])
    context = result["context"]
    assert context["forward_ms"] == [0.0] and context["log_softmax"] == "device"
    assert context["delta_of"].startswith("the decode step")
    assert context["min_speedup"] == pytest.approx(MIN_SPEEDUP)
    assert context["logprobs_only_min_speedup"] == pytest.approx([MIN_SPEEDUP] * 2)
    assert "forward_ms = 0" in context["words"] and "Holm" in context["family"]
    assert result["conditions"]["log_softmax"]["under"]["host"]["measured"] is False


def test_a_cpu_run_says_its_log_softmax_runs_on_the_cpu_before_the_copy(tmp_path):
    """Before: a CPU run said "the log-softmax runs on the device"; its device is the host.
    Then it said "runs on the host" beside "host: not measured in this run" (issue 45): the
    places differ on a CPU only by the side of the copy, and both say so."""
    cells = step_cell(64, 1.5)
    for device, on_cpu in (("cpu", True), ("cuda:0 NVIDIA H200", False)):
        run = write_step(tmp_path / device.replace(" ", "_").replace(":", ""),
                         [{**row, "device": device} for row in cells])
        result = build(run, [64])
        place = catalogue.log_softmax_place("device", on_cpu)
        assert ("CPU" in place, "before the copy" in place) == (on_cpu, on_cpu)
        clause = verdict_words.context_clause(catalogue.LOG_SOFTMAX, "device", on_cpu)
        assert place in clause and clause in result["context"]["words"]
        log_softmax = result["conditions"]["log_softmax"]
        assert log_softmax["under"]["host"]["measured"] is False
        assert verdict_words.SIDE_WORDS["host"].strip(" ()") in log_softmax["note"]
        shown = verdict_words.decisive_table(result)["log_softmax"].iloc[0]
        assert shown != "device" and ("before the copy" in shown)
        frame = schema.read_table(run, "step")
        assert f"runs on the {place}" in step_analysis.step_context(frame, 0.02)


def test_forward_ms_moves_the_logprobs_only_bar_and_the_other_log_softmax_is_decided(tmp_path):
    device = step_cell(64, 1.5)
    host = [{**r, "log_softmax": "host"} for r in step_cell(64, 1.0, seed=5)]
    forward = [dict(experiment="step", arm="forward", metric="forward_ms", value=10.0, rows=64,
                    vocab=V, k=5, log_softmax=where) for where in ("device", "host")]
    result = build(write_step(tmp_path / "run", device + host + forward), [64])
    (cell,) = result["decisive"]
    assert cell["forward_ms"] == 10.0 and cell["log_softmax"] == "device"
    step_ms = means_ms(device, "seed_pageable", "total")
    logprobs_ms = step_ms - 10.0
    assert cell["logprobs_step_ms"] == pytest.approx(logprobs_ms)
    assert cell["logprobs_only_min_speedup"] == pytest.approx(
        step_ms / (step_ms - 0.02 * logprobs_ms))
    assert cell["decision"] == "PORT"
    block = result["conditions"]["log_softmax"]
    other = block["under"]["host"]
    assert other["measured"] and other["decision"] == "CLOSE" and block["changes_answer"]
    on_host = build(write_step(tmp_path / "host", device + host + forward), [64],
                    conditions={"log_softmax": "host"})
    assert on_host["overall"]["decision"] == "CLOSE"


def test_the_context_says_when_the_fresh_buffer_filled_below_bare_metal():
    snapshot = {"machine": {
        "runtime": {"kind": "vm", "kernel": "6.1.0"}, "thp": {"enabled": "madvise"},
        "affinity": "0-1", "cgroup": {"version": 2},
        "fresh_fill": {"bytes": 256 << 20, "fill_gbps": 1.3, "bare_metal_typical_gbps": 4.0,
                       "stages": {"allocate": {"minor_faults": 10},
                                  "zero_fill": {"minor_faults": 65536}}}}}
    machine = verdict.machine_context(snapshot)
    assert machine["fill_below_bare_metal"] is True and machine["runtime"] == "vm"
    assert machine["page_faults_per_stage"] == {"allocate": 10, "zero_fill": 65536}
    words = machine["words"]  # the figures it names, then the VM's fault path
    assert all(f in words for f in ("256 MiB", "1.30 GB/s", "65536", "THP madvise", "4 GB/s"))
    assert machine["fault_path"] and words.endswith(machine["fault_path"])
    assert "VM" in machine["fault_path"] and "4-10 GB/s" in machine["fault_path"]
    snapshot["machine"]["fresh_fill"]["fill_gbps"] = 6.0
    assert not verdict.machine_context(snapshot)["fill_below_bare_metal"]
    snapshot["machine"]["runtime"]["kind"] = "bare metal"
    assert verdict.machine_context(snapshot)["words"].endswith("THP madvise).")
    assert verdict.machine_context(snapshot)["fault_path"] is None
    assert verdict.machine_context({})["recorded"] is False
    context = verdict.with_machine({"words": "Context: x."}, snapshot)
    now = verdict.machine_context(snapshot)["words"]  # of the snapshot as changed above
    assert context["words"] == f"Context: x. {now}"
    context = verdict.with_machine({"words": "Context: x.", "forward": {"measured_ms": 3.2}},
                                   snapshot)
    said = context["words"]
    assert said.startswith("Context: x. ") and said.endswith(f" {now}")
    assert "3.2 ms per call" in said  # the measured forward, between the two
# --------------------------------------------------------------------------- three questions

@pytest.mark.parametrize("pinned, reused, change, answers", [
    (1.5, 1.2, "port the pinned scratch", ("PORT", "PORT", "PORT")),
    (1.2, 1.2, "port a reused pageable buffer", ("PORT", "PORT", "CLOSE")),
    (1.0, 1.0, "close", ("CLOSE", "CLOSE", "CLOSE")),
    (1.2, 0.8, "port the pinned scratch", ("PORT", "CLOSE", "PORT")),
    (1.0, 1.2, "port a reused pageable buffer", ("CLOSE", "PORT", "CLOSE")),
], ids=["pinning-adds", "reuse-carries-it", "nothing", "reuse-alone-slower",
        "pinning-takes-it-back"])
def test_the_verdict_recommends_one_change_from_three_answers(tmp_path, pinned, reused, change,
                                                              answers):
    records = step_cell(64, pinned, extra={"seed_pageable_reused": reused})
    result = build(write_step(tmp_path / "run", records), [64])
    assert result["recommendation"]["change"] == change
    assert "fixed sequence" in result["recommendation"]["method"]
    questions = result["questions"]
    assert tuple(questions[q]["decision"] for q in ("bundle", "reuse", "pinning")) == answers
    assert (questions["pinning"]["baseline"], questions["pinning"]["candidate"]) == (
        "seed_pageable_reused", "seed_pinned")
    pinning = questions["pinning"]["cells"][0]
    assert pinning["speedup"] == pytest.approx(pinned / reused, rel=0.005)
    assert pinning["ci_low"] <= pinning["speedup"] <= pinning["ci_high"]
    cell = result["decisive"][0]
    assert cell["answers"]["reuse"]["speedup"] == pytest.approx(reused, rel=0.005)
    assert cell["answers"]["bundle"]["decision"] == answers[0]
    helps = "n=64 V=152064 K=5" if answers[2] == "PORT" else "no cell"
    reason = result["recommendation"]["reason"]
    assert ("pinning would help" in reason and helps in reason) == (answers[0] == "PORT")


@pytest.mark.parametrize("deferred, change, answer", [
    (1.8, "port the pinned scratch and defer its wait one step", "PORT"),
    (1.5, "port the pinned scratch", "CLOSE"),
    (None, "port the pinned scratch", None),
], ids=["deferring-saves", "deferring-adds-nothing", "not-measured"])
def test_deferring_the_wait_is_the_fourth_question_decided_after_the_pinned_scratch(
        tmp_path, deferred, change, answer):
    extra = {"seed_pageable_reused": 1.2, **({"seed_pinned_deferred": deferred} if deferred
                                             else {})}
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5, extra=extra)), [64])
    deferral = result["questions"]["deferral"]
    assert (deferral["baseline"], deferral["candidate"]) == ("seed_pinned", "seed_pinned_deferred")
    assert deferral["decision"] == answer and deferral["measured"] is (deferred is not None)
    assert result["recommendation"]["change"] == change
    assert ("one step late" in result["recommendation"]["reason"]) is (answer == "PORT")
    if deferred:
        assert deferral["cells"][0]["speedup"] == pytest.approx(deferred / 1.5, rel=0.005)
        assert result["decisive"][0]["answers"]["deferral"]["decision"] == answer


def test_without_the_reused_arm_pinning_alone_is_not_measured_and_the_change_is_open(tmp_path):
    result = build(write_step(tmp_path / "run", step_cell(64, 1.5)), [64])
    assert result["questions"]["pinning"]["measured"] is False
    assert result["questions"]["pinning"]["decision"] is None
    assert result["overall"]["decision"] == "PORT"
    assert result["recommendation"]["change"] == "INCONCLUSIVE"
    assert "pinning alone was not measured" in result["recommendation"]["reason"]


def test_the_verdict_states_the_forward_and_each_condition_in_one_block(tmp_path):
    """Each condition of the catalogue has its block, of one shape, which the schema requires
    of a verdict of format 2 (and not of an older one, which has no format)."""
    rows = step_cell(64, 1.5) + [dict(experiment="step", arm="forward", metric="forward_ms",
                                         value=4.45, note="(15.22 GB ...) = 4.45 ms", rows=64,
                                         vocab=V, k=5)]
    made = build(write_step(tmp_path / "run", rows), [64])
    context = made["context"]
    assert context["forward"]["nominal_ms"] == [4.45] and context["forward"]["measured_ms"] is None
    assert context["forward"]["context_tokens"] == 2048
    conditions = made["conditions"]
    assert set(conditions) == {c.name for c in catalogue.CONDITIONS} and made["format"] == 2
    assert len(verdict_words.condition_notes(made)) == 3 and verdict_words.condition_notes({}) == []
    overlap = conditions["overlap"]
    assert (overlap["decided"], overlap["values"], list(overlap["under"])) == (
        "queued", ["queued"], ["queued", "waited"])
    assert overlap["words"] == catalogue.OVERLAP.words["queued"]
    assert overlap["under"]["waited"]["measured"] is False and overlap["changes_answer"] is None
    assert "waited: not measured" in overlap["note"]
    assert all(verdict_words.context_clause(c, conditions[c.name]["decided"], False)  # no CPU here
               in context["words"] for c in (catalogue.ALLOCATOR, catalogue.OVERLAP))
    allocator = conditions["allocator"]  # rows without a regime read as the process's malloc
    assert (allocator["decided"], allocator["values"]) == ("malloc", ["malloc"])
    assert allocator["under"]["mapped fresh"]["measured"] is False
    assert not records.shape_errors(made, records.schema("verdict"))
    assert records.shape_errors({**made, "conditions": None}, records.schema("verdict"))
    assert "conditions is missing" in records.shape_errors(
        {k: v for k, v in made.items() if k != "conditions"}, records.schema("verdict"))


def test_the_verdict_decides_each_overlap_order_alone_and_says_which_the_seed_has(tmp_path):
    """Planted rows where the orders disagree: the fill hidden by the forward (queued: too small
    a saving) and paid in full (waited: a clear one). Each order's rows are decided alone (one
    cell holding both orders' rounds would be refused by the pairing), per order."""
    reused = {"seed_pageable_reused": 1.005}
    queued = [{**r, "overlap_order": "queued"} for r in step_cell(64, 1.01, extra=reused)]
    waited = [{**r, "overlap_order": "waited"} for r in step_cell(64, 1.5, seed=2, extra=reused)]
    run = write_step(tmp_path / "run", queued + waited)
    name = f"n=64 V={V} K=5"
    decided = {}
    for order, other, answer, theirs in (("queued", "waited", "CLOSE", "PORT"),
                                         ("waited", "queued", "PORT", "CLOSE")):
        result = build(run, [64], conditions={"overlap": order})
        overlap = result["conditions"]["overlap"]
        (cell,) = result["decisive"]
        assert result["parameters"]["overlap_order"] == order
        assert result["overall"]["decision"] == answer and cell["decision"] == answer
        assert cell["speedup"] == pytest.approx(1.01 if order == "queued" else 1.5, rel=0.01)
        assert (overlap["decided"], overlap["values"]) == (order, ["queued", "waited"])
        assert overlap["under"][order]["decision"] == answer
        assert overlap["under"][other]["decision"] == theirs
        assert overlap["under"][other]["answers"] == {name: theirs}
        assert overlap["changes_answer"] is True and overlap["flipped_cells"] == [name]
        assert other in overlap["note"] and name in overlap["note"]  # the value, the cell
        assert verdict_words.context_clause(catalogue.OVERLAP, order, False) in (
            result["context"]["words"])
        decided[order] = {o: overlap["under"][o]["change"] for o in ("queued", "waited")}
    assert decided["queued"] == decided["waited"]  # the same recommendation per order either way
    assert decided["queued"] == {"queued": "close", "waited": "port the pinned scratch"}
    seed = result["conditions"]["overlap"]["seed"]
    assert seed["order"] == "unknown" and seed["lead"] == "waited"
    assert all(line in seed["words"] for line in ("sampler.cpp:289", ":296", ":405", ":412"))
    with pytest.raises(ValueError, match="overlap must be one of"):
        build(run, [64], conditions={"overlap": "after"})


def test_the_other_order_measured_at_some_cells_is_shown_per_cell_not_decided(tmp_path):
    """A lease measures the waited order at one decisive cell: its answer there is shown, never
    counted unmeasured (or mixed) at the others, and it says which cells it covers. Before
    (issue 49): a family of the one cell gave a family answer beside the headline, one the rule
    would not give for that order."""
    queued = [{**r, "overlap_order": "queued"} for r in step_cell(16, 1.5) + step_cell(64, 1.5)]
    waited = [{**r, "overlap_order": "waited"} for r in step_cell(16, 1.5, seed=3)]
    result = build(write_step(tmp_path / "run", queued + waited), [16, 64])
    under = result["conditions"]["overlap"]["under"]
    assert under["queued"]["cells"] == [f"n=16 V={V} K=5", f"n=64 V={V} K=5"]
    assert under["waited"]["cells"] == [f"n=16 V={V} K=5"]
    assert under["queued"]["decision"] == "PORT" and under["waited"]["decision"] is None
    assert under["waited"]["change"] is None and under["waited"]["answers"] == {
        f"n=16 V={V} K=5": "PORT"}
    assert "1 of the 2" in under["waited"]["reason"]  # the decisive cells it was measured at
    assert "1 of the 2" in result["conditions"]["overlap"]["note"]
    assert result["conditions"]["overlap"]["changes_answer"] is False


def test_the_verdict_says_whether_the_allocators_regime_changes_the_answer(tmp_path):
    heap = [{**r, "regime": "glibc"} for r in step_cell(64, 1.01)]  # heap reused: too small
    mapped = [{**r, "regime": "mapped fresh"} for r in step_cell(64, 1.5, seed=2)]
    result = build(write_step(tmp_path / "run", heap + mapped), [64])
    allocator = result["conditions"]["allocator"]
    assert allocator["values"] == ["malloc", "mapped fresh"] and allocator["decided"] == "malloc"
    assert result["overall"]["decision"] == "CLOSE"  # decided under the process's malloc
    assert allocator["under"]["mapped fresh"]["decision"] == "PORT"
    assert allocator["changes_answer"] is True and allocator["flipped_cells"] == [f"n=64 V={V} K=5"]
    assert "32 MiB" in allocator["threshold"]


def test_each_decisive_cell_names_the_regime_its_vector_met(tmp_path):
    records = step_cell(64, 1.5, rounds=20)
    for record in records:
        if record["arm"] == "seed_pageable" and record["stage"] == "alloc":
            record.update(mapped=record["round"] % 2 == 0, minor_faults=2400)
    (cell,) = build(write_step(tmp_path / "run", records), [64], min_samples=10)["decisive"]
    regime = cell["vector_regime"]
    assert {k: v for k, v in regime.items() if k != "words"} == {
        "recorded": True, "steps": 20, "mapped_steps": 10, "median_minor_faults": 2400.0}
    assert "10 of 20" in regime["words"] and "2400" in regime["words"]
    (old,) = build(write_step(tmp_path / "old", step_cell(64, 1.5, rounds=20)), [64],
                   min_samples=10)["decisive"]
    assert old["vector_regime"]["recorded"] is False


def test_notebook_04s_parameters_give_one_rule_and_one_conditions_mapping():
    """build_verdict takes the rule and the conditions as two values: notebook 04's parameters
    (and keep's re-derivation) become them by name; an unknown condition or value is refused."""
    assert verdict.decided_conditions(None) == {c.name: c.decides for c in catalogue.CONDITIONS}
    assert verdict.decided_conditions({"overlap": "waited"})["overlap"] == "waited"
    with pytest.raises(ValueError, match=r"no step condition \['thp'\]"):
        verdict.decided_conditions({"thp": "always"})
    with pytest.raises(ValueError, match="log_softmax must be one of"):
        verdict.decided_conditions({"log_softmax": "gpu"})
    given = {"delta": 0.05, "conditions": {"overlap": "waited"}, "decisive_rows": [1]}
    assert verdict.arguments(given) == {
        "rule": verdict_decision.Rule(delta=0.05), "conditions": {"overlap": "waited"}}


def test_the_copy_table_notes_an_unpaired_candidate_in_a_few_words():
    cells = [{"rows": 1, "vocab": 10, "candidate": "pinned_grow_only", "n_rounds": 0,
              "note": "pinned_grow_only unavailable: pinned host memory needs a CUDA device",
              "twin_n_rounds": 4},
             {"rows": 1, "vocab": 10, "candidate": "pageable_reused", "n_rounds": 4,
              "speedup": 1.2, "note": None, "twin_n_rounds": 4}]
    table = verdict_words.copy_table({"copy_cells": cells})
    assert list(table["note"].fillna("")) == ["pinned_grow_only unavailable", ""]
