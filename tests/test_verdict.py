"""The verdict's rules on synthetic run folders: PORT, CLOSE, INCONCLUSIVE, missing and corrupt data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagelab import schema, verdict

RNG = np.random.default_rng(7)


def timings(arm: str, seconds: float, n: int, rows: int = 64, vocab: int = 152064,
            experiment: str = "d2h_copy", stage: str = "total") -> list[dict]:
    jitter = 1 + 0.005 * RNG.standard_normal(n)
    return [{"experiment": experiment, "arm": arm, "stage": stage, "rows": rows, "vocab": vocab,
             "repeat": i, "seconds": float(seconds * j), "bytes": rows * vocab * 4}
            for i, j in enumerate(jitter)]


def staging_rows(pinned: float | None, n: int = 30, reused: float = 0.004) -> list[dict]:
    rows = timings("pageable_fresh", 0.010, n) + timings("pageable_fresh~aa", 0.010, n)
    rows += timings("pageable_reused", reused, n)
    if pinned is None:
        rows.append({"experiment": "d2h_copy", "arm": "pinned_grow_only", "rows": 64,
                     "vocab": 152064, "status": "unavailable",
                     "note": "pinned_grow_only: pinned host memory needs a CUDA device"})
    else:
        rows += timings("pinned_grow_only", pinned, n)
    return rows


def write_run(tmp_path, staging=None, step_seconds: float | None = 0.050):
    run = tmp_path / "run"
    if staging is not None:
        schema.write_table(schema.make_rows(staging), run, "staging")
    if step_seconds is not None:
        step = timings("seed_pageable", step_seconds, 20, experiment="step")
        schema.write_table(schema.make_rows(step, k=5), run, "step")
    return run


def test_a_clear_gain_ports(tmp_path):
    result = verdict.build_verdict(write_run(tmp_path, staging_rows(pinned=0.005)))
    (cell,) = result["cells"]
    assert cell["decision"] == "PORT" and result["overall"]["decision"] == "PORT"
    assert cell["speedup"] == pytest.approx(2.0, rel=0.02)
    assert cell["saved_ms"] == pytest.approx(5.0, rel=0.05) and cell["step_ms"] == pytest.approx(50, rel=0.02)
    assert cell["min_speedup"] == pytest.approx(1 / (1 - 0.02 * 50 / 10), rel=0.02)


def test_no_effect_closes(tmp_path):
    result = verdict.build_verdict(write_run(tmp_path, staging_rows(pinned=0.010)))
    assert result["cells"][0]["decision"] == "CLOSE"
    assert result["overall"]["decision"] == "CLOSE"


def test_a_real_gain_smaller_than_two_percent_of_the_step_closes(tmp_path):
    # 1.5 % faster copy: outside a 0.5 % noise band, but saves 0.15 ms of a 50 ms step
    result = verdict.build_verdict(write_run(tmp_path, staging_rows(pinned=0.010 / 1.015, n=200)))
    cell = result["cells"][0]
    assert cell["decision"] == "CLOSE" and "real but below the minimum" in cell["reason"]
    assert result["overall"]["decision"] == "CLOSE"


def test_pinned_slower_in_one_cell_blocks_a_port(tmp_path):
    rows = staging_rows(pinned=0.005) + [
        {**r, "rows": 8} for r in staging_rows(pinned=0.020)]
    result = verdict.build_verdict(write_run(tmp_path, rows, step_seconds=None))
    assert sorted(c["decision"] for c in result["cells"]) == ["CLOSE", "PORT"]
    assert result["overall"]["decision"] == "INCONCLUSIVE"


def test_unmeasured_pinned_arm_is_inconclusive_with_the_reason(tmp_path):
    result = verdict.build_verdict(write_run(tmp_path, staging_rows(pinned=None)))
    cell = result["cells"][0]
    assert cell["decision"] == "INCONCLUSIVE" and "needs a CUDA device" in cell["reason"]
    assert result["overall"]["decision"] == "INCONCLUSIVE"
    assert "not measured" in result["overall"]["summary"]
    assert result["reuse_lever"][0]["decision"] == "PORT"  # the reuse lever is still measured
    assert any("Reuse lever" in line for line in result["findings"])


def test_too_few_samples_is_inconclusive(tmp_path):
    result = verdict.build_verdict(write_run(tmp_path, staging_rows(pinned=0.005, n=5)),
                                   min_samples=10)
    assert result["cells"][0]["decision"] == "INCONCLUSIVE"
    assert "fewer samples than the minimum" in result["cells"][0]["reason"]


def test_missing_tables_are_named_and_do_not_crash(tmp_path):
    result = verdict.build_verdict(write_run(tmp_path, staging=None, step_seconds=None))
    assert result["overall"]["decision"] == "INCONCLUSIVE"
    assert len(result["missing"]) == 3 and "data/staging.parquet is missing" in result["missing"][0]
    partial = verdict.build_verdict(write_run(tmp_path, staging_rows(pinned=0.005),
                                              step_seconds=None))
    assert "no step time for this cell" in partial["cells"][0]["reason"]


def test_a_corrupt_table_is_a_clear_error_naming_the_file(tmp_path):
    run = write_run(tmp_path, staging_rows(pinned=0.005))
    (run / "data" / "step.parquet").write_bytes(b"garbage")
    with pytest.raises(schema.SchemaError, match="step.parquet: cannot be read"):
        verdict.build_verdict(run)


def test_the_verdict_is_deterministic(tmp_path):
    run = write_run(tmp_path, staging_rows(pinned=0.009))
    first = json.dumps(verdict.build_verdict(run), sort_keys=True)
    assert json.dumps(verdict.build_verdict(run), sort_keys=True) == first


def test_reference_evidence_is_listed_with_its_hardware(tmp_path):
    ref = tmp_path / "reference" / "H200" / "20270101T000000Z_node_full"
    ref.mkdir(parents=True)
    (ref / "verdict.json").write_text(json.dumps({
        "run_id": ref.name, "hardware": {"gpu": "NVIDIA H200"},
        "overall": {"decision": "CLOSE", "summary": "s"}}))
    result = verdict.build_verdict(write_run(tmp_path, staging_rows(pinned=None)),
                                   reference_root=tmp_path / "reference")
    assert result["reference"][0]["hardware"]["gpu"] == "NVIDIA H200"
    assert any("(NVIDIA H200; not this run)" in line for line in result["findings"])


@pytest.mark.parametrize("kwargs, message", [({"min_effect_fraction": 1.5}, "min_effect_fraction"),
                                             ({"min_samples": 1}, "min_samples")])
def test_bad_parameters(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        verdict.build_verdict(tmp_path, **kwargs)


def test_min_speedup_conversion():
    assert verdict.min_speedup_for(0.010, 0.050, 0.02) == pytest.approx(1 / 0.9)
    assert verdict.min_speedup_for(0.010, None, 0.02) == pytest.approx(1 / 0.98)
    assert verdict.min_speedup_for(0.001, 0.100, 0.02) == float("inf")
