"""The roofline model from the cubins' figures: its arithmetic on hand-made figures, and the
committed figures' predictions at the issue's shapes (a model, never a measurement)."""

from __future__ import annotations

import math

import pytest

from stagelab.analyse import roofline
from stagelab.core import launches

GPU = roofline.GPUS["H200"]


def variant(rows: int, vocab: int, k: int, dtype: str, **figures) -> dict:
    """A compile check row for the first launch of ``(rows, vocab, k)`` with ``figures``."""
    first = launches.triton_launches(rows, vocab, k, True, None, None,
                                     launches.device_slots(GPU.sms, k))[0]
    return dict(kernel=first.kernel, arch=90, compiles=True, triton="3.6.0",
                pointers=dict(x_ptr=dtype), constexprs=dict(first.constexprs),
                **dict(dict(ctas_per_sm=4, registers=96, loop_instructions=1000,
                            guard_instructions=400), **figures))


@pytest.mark.parametrize("tiles, k, share", [(1, 5, 1.0), (5, 0, 0.0), (2, 1, 0.75),
                                             (3, 2, (1 + 0.75 + 1 - (2 / 3) ** 2) / 3)])
def test_the_share_of_tiles_that_merge_for_independent_logits(tiles, k, share):
    assert roofline.merge_share(tiles, k) == pytest.approx(share)


def test_the_rates_and_the_bound_by_hand():
    """n = 64, V = 152,064, fp32, no top-K: 8 slices a row (528 slots / 64), 512 programs on
    132 SMs, 2 resident (the cubin's CTAs per SM); 10 tiles a slice of 2048 fp32 (8 KiB)."""
    rows = (variant(64, 152064, 0, "fp32", ctas_per_sm=2, loop_instructions=300,
                    guard_instructions=300),)
    found = roofline.predict(64, 152064, 0, "fp32", GPU, 600.0, rows)
    issue_ns = 300 / GPU.clock_ghz
    parallel = 132 * 2 * 8192 / roofline.tile_ns(600, issue_ns, launches.PREFETCH_TILES)
    issued = 132 * 4 * GPU.clock_ghz * 8192 / (4 * 300)
    assert found["programs"] == 512 and found["resident_per_sm"] == 2
    assert found["bytes_in_flight_per_sm"] == 2 * 8192
    assert found["model_gbps"] == pytest.approx(min(4800, parallel, issued), abs=0.1)
    assert found["bound"] == "memory parallelism" and found["merge_share"] == 0
    assert found["instructions_per_logit"] == pytest.approx(300 * 4 * 32 / 2048, abs=0.1)


def test_without_a_top_k_the_plan_aims_at_twice_the_programs_per_sm():
    """The split plan's programs per SM: 4 without a top-K (bound by bytes in flight), 2 with
    one (more slices would add merges to an issue-bound walk)."""
    plain, top = (launches.triton_launches(64, 152064, k, True, None, None,
                                           launches.device_slots(132, k))[0] for k in (0, 5))
    assert plain.grid == (64, 8) and top.grid == (64, 4)
    assert launches.device_slots(132, 0) == 2 * launches.device_slots(132, 20) == 528


def test_a_tile_loaded_ahead_hides_the_work_behind_the_latency():
    """Without a tile ahead a program waits the latency and then works; with one, the longer
    of the two; with two, half the latency's wait per tile."""
    assert roofline.tile_ns(600, 150, 0) == 750
    assert roofline.tile_ns(600, 150, 1) == 600 and roofline.tile_ns(600, 900, 1) == 900
    assert roofline.tile_ns(600, 150, 2) == 300


def test_a_top_k_merging_half_its_tiles_is_issue_bound():
    rows = (variant(256, 152064, 20, "bf16", ctas_per_sm=3, loop_instructions=4000,
                    guard_instructions=600),)
    found = roofline.predict(256, 152064, 20, "bf16", GPU, 450.0, rows)
    assert found["bound"] == "issue" and 0.45 < found["merge_share"] < 0.55
    assert found["model_hbm_share"] < 0.2


def test_a_missing_variant_says_how_to_make_the_figures():
    with pytest.raises(LookupError, match="kernel_compile_check"):
        roofline.predict(64, 152064, 5, "bf16", GPU, 600.0, ())


def test_the_committed_figures_predict_every_goal_shape_as_a_model():
    """The model at the goal's shapes from the committed cubins' figures: every share in
    (0, 1], the longer latency never above the shorter, each row saying it is a model."""
    if not roofline.compiled_variants():
        pytest.skip("data/kernel_compile.json is not written (scripts/kernel_compile_check.py)")
    found = roofline.grid()
    assert len(found) == 4 * 3 * 2
    for row in found:
        assert 0 < row["model_low"] <= row["model_high"] <= 1 and "model" in row["note"]
        assert row["triton"].startswith(roofline.LEASE_TRITON + ".")
        assert math.isfinite(row["instructions_per_logit"])


def test_the_read_rate_table_shows_the_model_beside_the_measured_share(monkeypatch):
    import pandas as pd

    from stagelab.analyse import step_analysis
    from stagelab.core import schema

    monkeypatch.setattr(roofline, "compiled_variants",
                        lambda: (variant(64, 152064, 5, "bf16"),))
    frame = pd.DataFrame([dict(metric=schema.READ_RATE, status="ok", stage=f"l2_{l2}", rows=64,
                               vocab=152064, k=k, dtype="bfloat16", bytes=64 * 152064 * 2,
                               seconds=1e-4, value=0.4, note="")
                          for l2 in ("warm", "cold") for k in (5, 20)])
    table = step_analysis.read_rate_table(frame)
    model = table["model_hbm_percent_h200"].tolist()
    assert model[0] == model[2] and model[0].endswith(" %") and "-" in model[0]
    assert model[1].startswith("no model")  # k = 20's variant was not compiled here


def test_predict_words_name_the_model_and_skip_gpus_not_modelled(monkeypatch):
    monkeypatch.setattr(roofline, "compiled_variants",
                        lambda: tuple(variant(64, 152064, 5, d) for d in ("fp32", "bf16")))
    words = roofline.one_pass_words("H200", [(64, 152064, 5), (64, 152064, 5)])
    assert "not measured" in words and words.count("n=64 V=152064 k=5") == 1
    assert words.count(" %") == 2
    assert roofline.one_pass_words("L4", [(64, 152064, 5)]) == ""
