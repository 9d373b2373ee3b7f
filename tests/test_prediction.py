"""The cost model of the seed's step (issue 29): the platform table's sources, the host-rate rows
every step cell records, the model's arithmetic on given rates (overlap, copies, intervals,
answers, crossings), its check against a run, the verdict's block, `stagelab predict`, the plot."""

from __future__ import annotations

import csv
import math
import re

import numpy as np
import pytest
import torch

from stagelab.analyse import predict_check, predict_model, predict_tables, verdict
from stagelab.cli import main as cli_main
from stagelab.core import forward, paths, records, schema
from stagelab.core.errors import NativeUnavailable
from stagelab.measure import hostrates, native, shapes, step

NATIVE_OK, NATIVE_WHY = native.status()
PLATFORMS = ("A100 PCIe", "A100 SXM", "H100 PCIe", "H100 SXM", "H200", "GH200", "L4", "L40S",
             "B200")

QWEN = forward.model_dims("Qwen2.5-7B")  # V = 152,064: the forward of the cells below


# ----------------------------------------------------------------------------- the table

def test_every_platform_figure_has_a_source_or_says_range_not_published():
    with open(paths.PLATFORMS_FILE, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["platform"] for r in rows] == list(PLATFORMS)
    for row in rows:
        for figure, source in (("pinned_d2h_gbps_low", "pinned_source"),
                               ("pageable_d2h_gbps_low", "pageable_source"),
                               ("hbm_gbps", "hbm_source"), ("host_type", "host_source")):
            said = row[source].strip()
            assert row[figure].strip(), (row["platform"], figure)
            assert "http" in said or said.startswith("range: not published") or (
                "PB-" in said), (row["platform"], source, said)
        for kind in ("pinned", "pageable"):
            low, high = float(row[f"{kind}_d2h_gbps_low"]), float(row[f"{kind}_d2h_gbps_high"])
            assert 0 < low <= high, (row["platform"], kind)
    loaded = predict_tables.load_platforms()
    assert predict_tables.platform_of_gpu("NVIDIA H200", loaded).name == "H200"
    assert predict_tables.platform_of_gpu("NVIDIA H100 PCIe", loaded).name == "H100 PCIe"
    assert predict_tables.platform_of_gpu("NVIDIA H100 80GB HBM3", loaded).name == "H100 SXM"
    assert predict_tables.platform_of_gpu("NVIDIA A100-SXM4-80GB", loaded).name == "A100 SXM"
    assert predict_tables.platform_of_gpu("Tesla T4", loaded) is None
    assert predict_tables.platform_of_gpu("NVIDIA GH200 480GB", loaded).name == "GH200"
    assert predict_tables.platform_of_gpu("NVIDIA L40S", loaded).name == "L40S"
    assert predict_tables.platform_of_gpu("NVIDIA L4", loaded).name == "L4"
    assert predict_tables.platform_of_gpu("NVIDIA L40", loaded) is None  # no row: not the L4's
    assert predict_tables.platform_of_gpu("NVIDIA A100-PCIE-40GB", loaded).name == "A100 PCIe"
    with pytest.raises(ValueError, match="platform: unknown 'Z9'"):
        predict_tables.platform_named("Z9", loaded)


# ------------------------------------------------------------------------------ host rates

@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
def test_host_rates_time_every_term_once_per_repeat_at_the_cells_size():
    rows = hostrates.measure_rates(2, 1000, 3, repeats=2, warmup=0)
    assert sorted({r["stage"] for r in rows}) == sorted(hostrates.TERMS)
    assert len(rows) == 2 * len(hostrates.TERMS)
    assert all(r["arm"] == "host_rates" and r["metric"] == "host_rate" and r["bytes"] == 8000
               and r["seconds"] > 0 for r in rows)
    assert schema.make_rows(rows)["status"].eq("ok").all()


def test_host_rates_without_the_native_build_mark_its_terms_unavailable(monkeypatch):
    def refuse() -> None:
        raise NativeUnavailable("no C++ compiler found")

    monkeypatch.setattr(native, "require", refuse)
    rows = hostrates.measure_rates(2, 1000, 3, repeats=1, warmup=0)
    missing = {r["stage"] for r in rows if r.get("status") == "unavailable"}
    assert missing == set(hostrates.NATIVE_TERMS) - {"log_softmax"}
    assert all(r["note"] == "no C++ compiler found" for r in rows if r.get("status"))


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
@pytest.mark.parametrize("host_block, softmaxes_per_call", [(False, 1), (True, 2)])
def test_host_rates_allocate_in_the_steps_own_pattern(monkeypatch, host_block,
                                                      softmaxes_per_call):
    """Before: the C++ cycle made a same-size host log-softmax output before every vector, a
    block a GPU step (its log-softmax on the device) never has. Now only a CPU step's pattern
    (``host_block``) makes it; each fresh vector's regime (mapped, faults) is recorded."""
    sampler = hostrates.Sampler(2, 1000, 3, warmup=0, host_block=host_block)
    calls = []
    real = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    sampler.sample()
    assert len(calls) == softmaxes_per_call  # the torch term's own, and the CPU step's
    fresh = [r for r in sampler.rows(1) if r["stage"] == "fresh_vector"]
    assert len(fresh) == 1 and fresh[0]["minor_faults"] >= 0
    assert fresh[0]["mapped"] in (True, False, None)
    assert ("as a CPU step" in fresh[0]["note"]) is host_block


@pytest.mark.parametrize("args, message", [
    ((0, 1000, 3), "rows must be a positive integer"),
    ((2, 1000, 2000), r"k must be an integer in \[0, vocab=1000\]"),
    ((2, True, 3), "vocab must be a positive integer"),
])
def test_host_rates_refuse_bad_sizes_by_name(args, message):
    with pytest.raises(ValueError, match=message):
        hostrates.measure_rates(*args)


# ------------------------------------------------------------------------ the model itself

def rates_of(samples_ms: dict[str, list[float]], nbytes: int) -> predict_tables.HostRates:
    return predict_tables.HostRates({nbytes: {t: [v / 1e3 for v in vs] for t, vs in samples_ms.items()}})


CPU_TERMS = {"log_softmax": [2.0], "fresh_vector": [1.0], "copy_fresh": [0.5],
             "copy_reused": [0.25], "top_k": [3.0], "free": [0.1]}


def test_on_a_cpu_each_arm_is_the_sum_of_its_measured_terms():
    cell = predict_tables.Cell(4, 1000, 5)
    model = predict_model.cpu_model(cell, rates_of(CPU_TERMS, cell.nbytes))
    mid, low, high = model.interval(predict_tables.BASELINE)
    assert mid == pytest.approx(2.0 + 1.0 + 0.5 + 3.0 + 0.1) and low == mid == high
    assert model.interval(predict_tables.REUSED)[0] == pytest.approx(2.0 + 0.25 + 3.0)
    assert math.isnan(model.interval(predict_tables.CANDIDATE)[0])  # no pinned memory on a CPU
    predicted = predict_model.predict_cell(model, delta=0.02)
    assert set(predicted["arms"]) == {predict_tables.BASELINE, predict_tables.REUSED}
    assert [a["question"] for a in predicted["answers"]] == ["reuse"]
    reuse = predicted["answers"][0]
    assert reuse["saving_ms"] == pytest.approx(6.6 - 5.25)
    assert reuse["decision"] == predict_model.PORT and reuse["dominant_term"] == "alloc"


def test_the_repeats_spread_is_the_interval_and_the_median_the_point():
    cell = predict_tables.Cell(4, 1000, 5)
    spread = {**CPU_TERMS, "top_k": [2.0, 3.0, 7.0]}
    mid, low, high = predict_model.cpu_model(cell, rates_of(spread, cell.nbytes)).interval(
        predict_tables.BASELINE)
    assert (mid, low, high) == pytest.approx((6.6, 5.6, 10.6))


def test_host_terms_are_interpolated_per_byte_and_flagged_beyond_the_measured_sizes():
    rates = predict_tables.HostRates({1000: {"top_k": [1e-3]}, 4000: {"top_k": [8e-3]}})
    assert rates.term_ms("top_k", 1000)[:3] == pytest.approx((1.0, 1.0, 1.0))
    median, _, _, outside = rates.term_ms("top_k", 2000)  # halfway in log size: 1.5 us/B
    assert median == pytest.approx(2000 * 1.5e-3) and not outside
    assert rates.term_ms("top_k", 16000)[0] == pytest.approx(16000 * 2e-3)
    assert rates.term_ms("top_k", 16000)[3] and rates.term_ms("free", 1000) is None


def platform(pinned=(50.0, 50.0), pageable=(20.0, 20.0), hbm=4000.0) -> predict_tables.Platform:
    return predict_tables.Platform("Test", ("Test",), "PCIe", pinned, "x", pageable, "x", hbm, "x", "x")


GPU_TERMS = {"fresh_vector": [1.0], "top_k": [3.0], "free": [0.1]}


def test_on_a_gpu_the_fresh_vector_hides_behind_the_queued_forward_and_copies_follow_the_link():
    cell = predict_tables.Cell(16, 100_000, 5)  # 6.4 MB
    model = predict_model.gpu_model(platform(), cell, rates_of(GPU_TERMS, cell.nbytes), forward_ms=4.0)
    parts = model.parts_mid(predict_tables.BASELINE)
    assert parts["alloc"] == 0.0  # 1 ms of fill under 4 ms of forward
    assert parts["copy"] == pytest.approx(6.4e6 / 20e9 * 1e3)
    assert model.parts_mid(predict_tables.CANDIDATE)["copy"] == pytest.approx(6.4e6 / 50e9 * 1e3)
    slow = predict_model.gpu_model(platform(), cell, rates_of({**GPU_TERMS, "fresh_vector": [9.0]},
                                                        cell.nbytes), forward_ms=4.0)
    softmax = slow.parts_mid(predict_tables.BASELINE)["device"]
    assert slow.parts_mid(predict_tables.BASELINE)["alloc"] == pytest.approx(9.0 - 4.0 - softmax)


def test_the_one_pass_arm_reads_the_logits_once_and_copies_only_the_results():
    cell = predict_tables.Cell(64, 152_064, 5)
    model = predict_model.gpu_model(platform(), cell, rates_of(GPU_TERMS, cell.nbytes), forward_ms=4.0)
    parts = model.parts_mid(predict_tables.ONE_PASS)
    fixed = predict_tables.Knob(*predict_tables.DEVICE_TOP_K_FIXED_MS, "").mid
    hbm = 4000e9 * predict_tables.Knob(*predict_tables.HBM_EFFICIENCY, "").mid
    assert parts["device"] == pytest.approx(fixed + 1e3 * 64 * 152_064 * 2 / hbm)
    assert parts["copy"] == model.parts_mid(predict_tables.DEVICE_TOP_K)["copy"]
    assert parts["device"] < model.parts_mid(predict_tables.DEVICE_TOP_K)["device"]
    assert predict_tables.ONE_PASS in predict_model.predict_cell(model, delta=0.02)["arms"]
    cpu = predict_model.cpu_model(predict_tables.Cell(4, 1000, 5), rates_of(CPU_TERMS, 16000))
    assert predict_tables.ONE_PASS not in predict_model.predict_cell(cpu, delta=0.02)["arms"]


def test_answers_port_close_or_name_the_range_that_spans_the_bar():
    cell = predict_tables.Cell(256, 152_064, 5, QWEN)  # 156 MB a step
    rates = rates_of(GPU_TERMS, cell.nbytes)
    wide = predict_model.predict_cell(predict_model.gpu_model(platform(pageable=(2.0, 60.0)), cell, rates),
                                0.02)
    pinning = next(a for a in wide["answers"] if a["question"] == "pinning")
    assert pinning["decision"] == "depends on pageable_gbps"
    assert pinning["saving_low_ms"] < pinning["bar_ms"] < pinning["saving_high_ms"]
    slow_link = predict_model.predict_cell(predict_model.gpu_model(platform(pageable=(5.0, 6.0)), cell,
                                                       rates), 0.02)
    assert {a["question"]: a["decision"] for a in slow_link["answers"]}["bundle"] == predict_model.PORT
    same = predict_model.predict_cell(predict_model.gpu_model(platform(pageable=(50.0, 50.0)), cell, rates),
                                0.02)
    assert {a["question"]: a["decision"] for a in same["answers"]}["pinning"] == predict_model.CLOSE


def test_every_corner_of_the_ranged_inputs_is_evaluated():
    knobs = {"a": predict_tables.Knob(1, 2, "x"), "b": predict_tables.Knob(3, 3, "x"),
             "c": predict_tables.Knob(0, 1, "x")}
    grid = predict_tables.corners(knobs)
    assert len(grid["a"]) == 4 and set(zip(grid["a"], grid["c"])) == {(1, 0), (1, 1), (2, 0),
                                                                     (2, 1)}
    assert np.all(grid["b"] == 3)


def test_the_crossing_lies_where_the_saving_passes_the_bar():
    rates = predict_tables.HostRates({4 * 152_064 * n: {"fresh_vector": [0.02 * n / 1e3],
                                                 "top_k": [0.05 * n / 1e3], "free": [0.0]}
                               for n in (1, 1024)})
    found = predict_model.crossing(platform(pageable=(10.0, 20.0)), 152_064, 5, QWEN, rates, 0.02)
    curve = predict_model.saving_curve(platform(pageable=(10.0, 20.0)), 152_064, 5, QWEN, rates, 0.02)
    assert found["may_port_from_nv"] <= found["port_from_nv"]
    first = curve[curve["n_x_v"] == found["port_from_nv"]].iloc[0]
    assert first["saving_low_ms"] > first["bar_ms"] * 0.99
    below = curve[curve["n_x_v"] < found["may_port_from_nv"]]
    assert (below["margin_high_ms"] <= 0).all()


# --------------------------------------------------------------- checked against a run

def synthetic_step(nbytes_rows=4, vocab=1000, k=5) -> list[dict]:
    """A CPU step cell: host rates (every term) and three rounds of two arms with stages."""
    sizes = dict(experiment="step", device="cpu", model="", rows=nbytes_rows, vocab=vocab, k=k,
                 log_softmax="device", dtype="float32")
    rows = [{**sizes, "arm": "host_rates", "stage": term, "metric": "host_rate", "round": 0,
             "seconds": ms[0] / 1e3, "bytes": nbytes_rows * vocab * 4}
            for term, ms in CPU_TERMS.items()]
    seed = {"device": 2.0, "alloc": 1.0, "copy": 0.5, "host_gather": 3.0, "free": 0.1}
    reused = {"device": 2.0, "alloc": 0.0, "copy": 0.25, "host_gather": 3.0, "free": 0.0}
    for r in range(3):
        for arm, stages, total in (("seed_pageable", seed, 8.0),
                                   ("seed_pageable_reused", reused, 5.0)):
            rows += [{**sizes, "arm": arm, "stage": s, "round": r, "seconds": v / 1e3}
                     for s, v in stages.items()]
            rows.append({**sizes, "arm": arm, "stage": "total", "round": r,
                         "seconds": total / 1e3})
    return rows


def test_a_cpu_run_is_checked_stage_by_stage_with_errors_and_disagreements():
    check = predict_check.check_run(schema.make_rows(synthetic_step()), None)
    assert check["platform"] == predict_tables.CPU_PLATFORM and len(check["cells"]) == 1
    cell = check["cells"][0]
    by_name = {c["name"]: c for c in cell["stages"] + cell["arms"]}
    assert by_name["alloc"]["error"] == pytest.approx(0.0)
    assert by_name["seed_pageable"]["predicted_ms"] == pytest.approx(6.6)
    assert by_name["seed_pageable"]["error"] == pytest.approx(6.6 / 8.0 - 1)
    assert by_name["seed_pageable"]["outside"] and not by_name["alloc"]["outside"]
    assert cell["reuse_ratio"]["predicted"] == pytest.approx(6.6 / 5.25)
    assert cell["reuse_ratio"]["measured"] == pytest.approx(8.0 / 5.0)
    words = predict_check.check_words(check)
    assert "measured 8.00 ms (error -18%)" in words[0] and "Outside the interval" in words[0]


def test_the_verdict_sets_the_prediction_beside_the_measurement_in_its_schema(tmp_path):
    run = tmp_path / "run"
    schema.write_table(schema.make_rows(synthetic_step()), run, "step")
    made = verdict.build_verdict(run, decisive_rows=[4], decisive_vocabs=[1000],
                                 decisive_ks=[5])
    assert records.shape_errors(made, records.schema("verdict")) == []
    assert made["prediction"]["cells"][0]["arms"][0]["measured_ms"] == pytest.approx(8.0)
    assert any(f.startswith("Prediction (") and "n=4, V=1000, K=5" in f for f in made["findings"])
    broken = {**made, "prediction": {"platform": None, "cells": [{"rows": 1}], "note": ""}}
    assert any("vocab is missing" in e
               for e in records.shape_errors(broken, records.schema("verdict")))


def test_a_gpu_without_a_row_in_the_table_is_not_checked():
    check = predict_check.check_run(schema.make_rows(synthetic_step()), "Tesla T4")
    assert check["cells"] == [] and "Tesla T4 has no row" in check["note"]


@pytest.mark.skipif(not NATIVE_OK, reason=f"the native path cannot be built here: {NATIVE_WHY}")
def test_a_measured_step_records_host_rates_and_the_prediction_runs_with_errors_recorded():
    measured = step.measure(step.StepSweep(
        [shapes.ModelShape("", 2000, 0)], [2, 4], [3], torch.float32,
        ["seed_pageable", "seed_pageable_reused"], rounds=2, warmup=1), progress=False)
    frame = schema.make_rows(measured)
    assert set(frame[frame["metric"] == "host_rate"]["rows"]) == {2, 4}
    check = predict_check.check_run(frame, None)
    assert [(c["rows"], c["vocab"]) for c in check["cells"]] == [(2, 2000), (4, 2000)]
    for cell in check["cells"]:
        assert {c["name"] for c in cell["stages"]} == {"device", "alloc", "copy",
                                                       "host_gather", "free"}
        assert all(c["error"] is not None for c in cell["stages"] + cell["arms"])
        assert cell["reuse_ratio"]["error"] is not None


# ----------------------------------------------------------------------- the command, plot

@pytest.mark.parametrize("sink_class, name", [(schema.GzipJsonLinesSink, "step.jsonl.gz"),
                                              (schema.JsonLinesSink, "step.jsonl")])
def test_predict_for_h200_prints_four_answers_per_decisive_cell_and_the_crossing(
        tmp_path, capsys, sink_class, name):
    """From a measured folder's rows as ``stagelab measure`` writes them (compressed), or as
    older folders did (plain)."""
    sink = sink_class(tmp_path / "measured" / "rows" / name, run_id="x",
                      notebook="02_logprobs_step")
    rates = [{"arm": "host_rates", "stage": term, "metric": "host_rate", "round": 0,
              "seconds": ms / 1e3 * n / 16, "bytes": 4 * 152_064 * n, "rows": n,
              "vocab": 152_064, "k": 5}
             for n in (16, 256) for term, ms in (("fresh_vector", 0.7), ("top_k", 2.8),
                                                 ("free", 0.01))]
    sink.append(rates)
    assert cli_main(["predict", "--platform", "H200", "--rates", str(tmp_path / "measured")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Predicted, not measured") and "host rates recorded" in out
    assert out.count("  n=") == 6  # the gate's decisive cells: 3 rows x 2 models
    for question in ("bundle", "reuse", "pinning", "deferral"):
        assert out.count(f"    {question} ") == 6
    assert out.count("dominating term:") == 24 and out.count("crossing (bundle, V=") == 2
    assert len(re.findall(r"Deferring the wait .* on H200 at n=", out)) == 1
    assert "note: host term fresh_vector extrapolated" in out  # Gemma's cells lie beyond


def test_predict_refuses_an_unknown_platform_and_a_folder_without_rates(tmp_path, capsys):
    assert cli_main(["predict", "--platform", "Z9", "--rates", str(tmp_path)]) == 2
    assert "platform: unknown 'Z9'" in capsys.readouterr().err
    assert cli_main(["predict", "--platform", "H200", "--rates", str(tmp_path)]) == 2
    assert "no step table" in capsys.readouterr().err


def test_the_plot_draws_one_panel_per_platform_with_its_band_and_bar():
    """Small multiples: nine platforms' bands once shared one panel, and grey meant two things."""
    from stagelab.present import plots

    rates = rates_of(GPU_TERMS, 4 * 152_064 * 16)
    curves = pd_concat([predict_model.saving_curve(p, 152_064, 5, QWEN, rates, 0.02)
                        for p in (platform(), predict_tables.platform_named("H200"))])
    figure = plots.prediction_bands(curves)
    panels = [ax for ax in figure.axes if ax.axison]
    assert [ax.get_title() for ax in panels] == ["H200", "Test"]
    assert all(len(ax.collections) == 1 and len(ax.lines) == 2 for ax in panels)
    labels = [t.get_text() for t in figure.legends[0].get_texts()]
    assert labels[0] == "V = 152,064" and "grey: host rates measured here" in labels


def pd_concat(frames):
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def test_the_report_and_the_fleet_page_show_prediction_beside_measurement(tmp_path):
    import json

    from stagelab.present import fleet_page, report
    from stagelab.run import fleet

    check = predict_check.check_run(schema.make_rows(synthetic_step()), None)
    shown = re.sub(r"<(t[dh])\b[^>]*>", r"<\1>", report.prediction_html(check))  # cells' text
    assert "Predicted beside measured (this CPU" in shown
    assert "<td>seed_pageable</td>" in shown and "<th>measured (ms)</th>" in shown
    # Before: DataFrame.to_html with high_ms, low_ms, True/False and bare fractions
    assert not any(raw in shown for raw in ("_ms", ">True<", ">False<", ">nan<", ">None<"))
    assert "<th>error (%)</th>" in shown
    assert report.prediction_html(None) == ""
    run = tmp_path / "node-run"
    run.mkdir()
    (run / "verdict.json").write_text(json.dumps({"prediction": check}))
    node = fleet.NodeRecord(fleet.Target("node-a", "a", "x", None, 1), status=fleet.OK,
                            run_dir=str(run))
    section = fleet_page.prediction_section([node, fleet.NodeRecord(
        fleet.Target("node-b", "b", "x", None, 1), status=fleet.OK)])
    assert "node-a</h3>" in section and "node-b" not in section  # node-b has no verdict
    assert "lies outside the predicted" in section
    alone = fleet_page.prediction_section([])
    assert alone.startswith("<p>") and "<h3>" not in alone  # no node: one line saying so


def test_a_gpu_run_is_checked_against_its_platform_with_the_stages_own_durations():
    rows = synthetic_step(16, 100_000)
    for row in rows:
        row["device"] = "cuda:0 Test GPU"
    rows.append({**{k: rows[0][k] for k in ("experiment", "rows", "vocab", "k", "dtype")},
                 "arm": "forward", "metric": "forward_ms", "value": 4.0})
    table = {"Test": platform()}
    check = predict_check.check_run(schema.make_rows(rows), "Test GPU", table)
    cell = check["cells"][0]
    stages = {c["name"]: c for c in cell["stages"]}
    assert check["platform"] == "Test" and stages["alloc"]["predicted_ms"] == pytest.approx(1.0)
    assert stages["copy"]["predicted_ms"] == pytest.approx(6.4e6 / 20e9 * 1e3)
    total = next(a for a in cell["arms"] if a["name"] == predict_tables.BASELINE)
    softmax = 16 * 100_000 * 6 / (4000e9 * 0.75) * 1e3
    wait = 0.0125
    assert total["predicted_ms"] == pytest.approx(4.0 + softmax + 0.32 + wait + 3.0 + 0.1)


def test_the_host_table_names_the_fresh_vectors_regime_at_each_size():
    rates = predict_tables.HostRates({1000: {"fresh_vector": [1e-4], "warm_fill": [1e-4]},
                               9000: {"fresh_vector": [9e-3, 1e-2, 2e-2], "warm_fill": [1e-3]}})
    table = predict_tables.host_table(rates).set_index("bytes")
    assert table.loc[1000, "regime"] == "pages found mapped"
    assert table.loc[9000, "regime"] == "faulted afresh"
    assert table.loc[9000, "faults_ms"] == pytest.approx(10.0 - 1.0)


def test_a_sampler_between_rounds_spreads_its_calls_and_tops_up_to_its_repeats(monkeypatch):
    sampler = hostrates.Sampler(2, 1000, 3, warmup=1)
    calls = []
    monkeypatch.setattr(sampler, "probes", [lambda: calls.append(1) or {"top_k": 1e-3}])
    hook = sampler.every(rounds=12, repeats=3)  # a call every 3rd round, 1 warm-up + 3 kept
    for _ in range(12):
        hook()
    assert len(calls) == 4 and sampler.kept == 3
    rows = sampler.rows(5)  # topped up after the rounds
    assert len(calls) == 6 and [r["round"] for r in rows if r["stage"] == "top_k"] == list(
        range(5))
    assert {r["status"] for r in rows if r["stage"] != "top_k"} == {"unavailable"}


def test_the_sweep_runs_a_plans_between_rounds_work_after_every_round():
    from stagelab.measure import sweep

    seen = []
    cell = sweep.Cell(sizes={"experiment": "step", "rows": 1, "vocab": 2}, arms=["a"], label="c")
    plan = sweep.CellPlan(calls={"a": lambda r: seen.append(("a", r))},
                          between_rounds=lambda: seen.append("between"))
    sweep.measure_cell(cell, lambda c: plan, rounds=2, warmup=1, seed=0, device="cpu",
                       after_round=lambda: seen.append("after"))
    assert seen == [("a", 0), "between", "after", ("a", 1), "between", "after", ("a", 2),
                    "between", "after"]


def test_host_rates_that_fail_cost_the_step_cell_nothing_but_their_own_row(monkeypatch):
    def broken(self) -> None:
        raise MemoryError("no room for the host rates")

    monkeypatch.setattr(hostrates.Sampler, "sample", broken)
    measured = step.measure(step.StepSweep(
        [shapes.ModelShape("", 1000, 0)], [2], [3], torch.float32, ["seed_pageable_reused"],
        rounds=2, warmup=1, aa_arm=None), progress=False)
    frame = schema.make_rows(measured)
    timed = frame[(frame["arm"] == "seed_pageable_reused") & (frame["stage"] == "total")
                  & (frame["metric"] == "time")]
    assert len(timed) == 2 and timed["status"].eq("ok").all()
    failed = frame[frame["arm"] == "host_rates"]
    assert failed["status"].tolist() == ["failed"]
    assert "MemoryError" in failed["note"].iloc[0]  # the probe's own error


def test_the_deferred_arm_on_a_gpu_is_its_longest_path_and_on_a_cpu_the_pinned_step():
    t = {name: np.array([value]) for name, value in dict(
        forward=4.0, log_softmax=1.0, copy_pinned=2.0, wait=0.01, top_k=3.0, host_softmax=0.0,
        alloc=0.5, copy_fresh=6.0, copy_reused=5.0, free=0.2, device_top_k=1.0,
        copy_results=0.01, one_pass=1.0).items()}
    deferred = predict_model.DEFERRED
    assert predict_model.arm_total(deferred, t, concurrent=True)[0] == pytest.approx(5.0)
    t["top_k"] = np.array([7.0])  # the host top-K now outlasts the device's path
    assert predict_model.arm_total(deferred, t, concurrent=True)[0] == pytest.approx(7.01)
    t["copy_pinned"] = np.array([9.0])  # the copy engine's path the longest
    assert predict_model.arm_total(deferred, t, concurrent=True)[0] == pytest.approx(9.0)
    assert predict_model.arm_total(deferred, t, concurrent=False)[0] == pytest.approx(
        predict_model.arm_total(predict_model.CANDIDATE, t, concurrent=False)[0])


def test_where_deferral_matters_names_the_largest_and_smallest_share_of_the_pinned_step():
    def cell(platform: str, pinned_ms: float, saving_ms: float) -> dict:
        return {"platform": platform, "rows": 16, "vocab": 152064, "k": 5, "host": "",
                "arms": {predict_model.CANDIDATE: {"mid_ms": pinned_ms}},
                "answers": [{"question": "deferral", "saving_ms": saving_ms,
                             "decision": "PORT"}]}
    words = predict_model.where_deferral_matters([cell("L4", 10.0, 1.0), cell("H200", 8.0, 4.0)])
    assert words.index("H200") < words.index("L4") and "50 %" in words and "10 %" in words
    assert predict_model.where_deferral_matters([]) == ""
