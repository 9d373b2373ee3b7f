"""The prediction as issue 38 has it: the GPU's usual host (data/hosts.csv) by default and stable,
this machine only when asked (with its load said), every assumption an input (THP, allocator
regime, sliding window, memory fit, widened points), the inputs that flip each answer, physical
bounds on what a folder gives, and a check of the model that is not circular (out_of_sample)."""

from __future__ import annotations

import csv
import json
import math
import re

import pandas as pd
import pytest

from stagelab.analyse import predict_check, predict_model, predict_study, predict_tables, verdict
from stagelab.cli import main as cli_main
from stagelab.core import forward, paths, records, schema
from stagelab.core.errors import UserError
from stagelab.measure import busy, hostrates, priorrates
from stagelab.run import profiles

QWEN = forward.model_dims("Qwen2.5-7B")
GEMMA3 = forward.model_dims("Gemma-3-4B")


def no_measuring(monkeypatch):
    """predict on host classes must measure nothing here: measuring raises."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the host classes path measured this machine")

    monkeypatch.setattr(hostrates, "measure_rates", refuse)


# ------------------------------------------------------------------------ the host table

def test_every_host_figure_has_a_source_or_says_range_with_the_reason():
    with open(paths.HOSTS_FILE, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["host"] for r in rows] == ["x86 bare metal", "x86 VM", "Grace"]
    for row in rows:
        for rate in (*predict_tables.HOST_RATES, "cores"):
            low, high = float(row[f"{rate}_gbps_low" if rate != "cores" else "cores_low"]), float(
                row[f"{rate}_gbps_high" if rate != "cores" else "cores_high"])
            assert 0 < low <= high, (row["host"], rate)
            said = row[f"{rate}_source"]
            assert "http" in said or "measured" in said or said.startswith(("range:", "derived")), (
                row["host"], rate, said)
        assert set(row["thp"].split("|")) <= set(predict_tables.THP_MODES)
    hosts = predict_tables.load_hosts()
    for platform in predict_tables.load_platforms().values():
        assert platform.host_classes and all(h in hosts for h in platform.host_classes)
        assert math.isfinite(platform.memory_gb) and "http" in platform.memory_source
    assert predict_tables.platform_named("GH200").host_classes == ("Grace",)


def test_thp_and_the_allocator_regime_are_inputs_of_the_host_class():
    metal = predict_tables.host_named("x86 bare metal")
    assert metal.first_touch() == (1.6, 10.5)  # always|madvise: both page sizes
    assert metal.options(thp="always").first_touch() == metal.gbps["first_touch_thp"]
    assert metal.options(thp="madvise").first_touch() == metal.gbps["first_touch_4k"]
    big, small = 64 * 152_064 * 4, 16 * 152_064 * 4  # 38.9 MB above glibc's 32 MiB, 9.7 below
    assert metal.faulted_share(big) == (1.0, 1.0) and metal.faulted_share(small) == (0.0, 1.0)
    assert metal.options(regime="mapped").faulted_share(big) == (0.0, 0.0)
    with pytest.raises(ValueError, match="thp: unknown 'sometimes'"):
        metal.options(thp="sometimes")


def test_a_host_class_gives_the_fresh_vector_its_faults_or_a_warm_fill_by_regime():
    k = {"first_touch_gbps": 2.0, "warm_fill_gbps": 10.0, "top_k_gbps": 4.0, "free_gbps": 20.0,
         "free_mapped_gbps": 1000.0}
    faulted = predict_tables.class_terms_ms(10**7, {**k, "faulted_share": 1.0})
    mapped = predict_tables.class_terms_ms(10**7, {**k, "faulted_share": 0.0})
    assert faulted["fresh_vector"] == pytest.approx(5.0) and mapped["fresh_vector"] == 1.0
    assert faulted["free"] == pytest.approx(0.5) and mapped["free"] == pytest.approx(0.01)
    assert faulted["top_k"] == pytest.approx(2.5)


# ------------------------------------------------------------------------- the command

def test_two_predict_calls_print_the_same_answers_and_measure_nothing_here(monkeypatch,
                                                                             capsys):
    no_measuring(monkeypatch)
    assert cli_main(["predict", "--platform", "H200"]) == 0
    first = capsys.readouterr().out
    assert cli_main(["predict", "--platform", "H200"]) == 0
    assert capsys.readouterr().out == first
    assert first.startswith("Predicted, not measured")
    assert all(host in first for host in ("host class x86 bare metal", "host class x86 VM"))
    assert first.count("across hosts: bundle ") == 6  # every cell says if it flips by host
    pinning = [line for line in first.splitlines() if "sensitivity (pinning): " in line]
    assert pinning and "CLOSE if pageable_gbps >" in pinning[0]  # the flip, its knob, its side


def test_gh200s_pinning_answer_says_the_pageable_figure_it_rests_on(monkeypatch, capsys):
    """Before: GH200's CLOSE on pinning hid that it rests on an assumed pageable D2H figure."""
    no_measuring(monkeypatch)
    assert cli_main(["predict", "--platform", "GH200"]) == 0
    out = capsys.readouterr().out
    flips = [line for line in out.splitlines() if "sensitivity (pinning)" in line]
    assert len(flips) == 6 and all("PORT if pageable_gbps <" in f for f in flips)
    assert "hosts: host class Grace" in out and "across hosts" not in out


def test_predict_on_l4_marks_the_configurations_that_do_not_fit(monkeypatch, capsys):
    no_measuring(monkeypatch)
    assert cli_main(["predict", "--platform", "L4"]) == 0
    out = capsys.readouterr().out
    unfit = [line for line in out.splitlines() if "does not fit" in line]
    assert len(unfit) == 2 and all(line.startswith("  n=256 ") for line in unfit)
    assert "> 24 GB: not predicted" in unfit[0]
    assert out.count("across hosts: bundle ") == 4  # the four cells that fit


def test_predict_on_this_machine_says_it_was_busy(monkeypatch, capsys):
    def rows(n, v, k, repeats):
        return [{"arm": "host_rates", "stage": term, "metric": "host_rate", "round": 0,
                 "seconds": 1e-3, "bytes": n * v * 4} for term in ("fresh_vector", "top_k",
                                                                    "free")]

    class Loaded(busy.LoadWatch):
        def __exit__(self, *exc):
            super().__exit__(*exc)  # its sampler stops; before, it read /proc every 2 s after
            self.summary = {"busy": True, "why": ["other processes took 2.00 of 2 cores"],
                            "load_avg_max": 9.0}

    monkeypatch.setattr(hostrates, "measure_rates", rows)
    monkeypatch.setattr(busy, "LoadWatch", Loaded)
    assert cli_main(["predict", "--platform", "H200", "--host", "this"]) == 0
    out = capsys.readouterr().out
    assert "BUSY while measured" in out
    assert "across hosts" not in out  # one host: this machine


def test_predict_refuses_an_unknown_host_by_name(capsys):
    assert cli_main(["predict", "--platform", "H200", "--host", "Itanium"]) == 2
    assert "host: unknown 'Itanium'" in capsys.readouterr().err


# ------------------------------------------------------------- assumptions and the model

def test_the_sliding_window_cuts_gemma3s_kv_read_on_five_of_six_layers():
    assert (GEMMA3.sliding_window, GEMMA3.sliding_layers, GEMMA3.layers) == (1024, 29, 34)
    full = GEMMA3.kv_bytes_per_token() * 2048
    assert full / GEMMA3.kv_bytes(2048) == pytest.approx(34 / (5 + 29 / 2))  # about 1.74x
    assert GEMMA3.kv_bytes(512) == GEMMA3.kv_bytes_per_token() * 512  # within the window
    assert QWEN.kv_bytes(2048) == QWEN.kv_bytes_per_token() * 2048  # no window


def test_point_figures_are_widened_to_a_stated_range():
    sxm = predict_tables.platform_named("A100 SXM")
    assert sxm.pageable_gbps == pytest.approx((9.72, 11.88))
    assert "point figure widened" in sxm.pageable_source
    assert predict_tables.platform_named("H200").pinned_gbps == (45.0, 57.0)  # a range stays


def test_the_sensitivity_names_the_value_where_an_answer_flips():
    link = predict_tables.Platform("Test", ("Test",), "PCIe", (50.0, 50.0), "x", (2.0, 60.0), "x",
                            4000.0, "x", "x")
    rates = predict_tables.HostRates({16 * 100_000 * 4: {"fresh_vector": [1e-3], "top_k": [3e-3],
                                                  "free": [1e-4]}})
    model = predict_model.gpu_model(link, predict_tables.Cell(16, 100_000, 5), rates, forward_ms=4.0)
    row = next(r for r in predict_model.sensitivity(model, "pinning", 0.02)
               if r["knob"] == "pageable_gbps")
    x = row["flips_at"]
    # CLOSE at the range's midpoint (31 GB/s pageable against 50 pinned), PORT on a slow link
    assert row["within_range"] and row["flips_when"] == "below" and row["flips_to"] == "PORT"
    assert predict_model._margin_at(model, "pinning", 0.02, pageable_gbps=x * 0.99) > 0
    assert predict_model._margin_at(model, "pinning", 0.02, pageable_gbps=x * 1.01) < 0
    assert f"PORT if pageable_gbps < {x:.3g}" in predict_model.sensitivity_words(row)


# ------------------------------------------------------------------------------ bounds

def test_impossible_host_rates_are_refused_before_use():
    """Before: a negative fresh_vector row reached the model and a bar of -20 ms was printed."""
    nbytes = 16 * 152_064 * 4
    rows = [{"arm": "host_rates", "stage": "fresh_vector", "metric": "host_rate", "round": i,
             "seconds": s, "bytes": nbytes, "rows": 16, "vocab": 152_064, "k": 5}
            for i, s in enumerate([-1.0, 0.0, 1e-12, 2e-3, 3e-3])]
    rows.append({**rows[0], "stage": "top_k", "seconds": 3e-3})
    rates = predict_tables.host_rates(schema.make_rows(rows))
    assert rates.samples[nbytes]["fresh_vector"] == [2e-3, 3e-3]
    assert "3 row(s) refused" in rates.notes[0]
    cell = predict_model.predict_cell(predict_model.gpu_model(predict_tables.platform_named("H200"),
                                                  predict_tables.Cell(16, 152_064, 5, QWEN), rates),
                                0.02)
    assert all(a["bar_low_ms"] > 0 for a in cell["answers"])
    assert any("refused by the physical bounds" in n for n in cell["notes"])
    raw = predict_tables.HostRates({nbytes: {"fresh_vector": [1e-3], "top_k": [-1.0], "free": [0.0]}})
    with pytest.raises(ValueError, match="a negative step"):
        predict_model.predict_cell(predict_model.cpu_model(predict_tables.Cell(16, 152_064, 5), raw), 0.02)


@pytest.mark.parametrize("forward_ms, why", [(-20.0, "not a positive time"),
                                             (0.5, "below the")])
def test_an_impossible_forward_is_refused_and_the_models_own_used(forward_ms, why):
    """Before: a folder's forward_ms went into the step unchecked; a negative one gave a
    negative decode step and a negative bar beside a PORT."""
    rates = predict_tables.HostRates({16 * 152_064 * 4: {"fresh_vector": [1e-3], "top_k": [1e-3],
                                                  "free": [1e-4]}})
    model = predict_model.gpu_model(predict_tables.platform_named("H200"), predict_tables.Cell(16, 152_064, 5, QWEN),
                              rates, forward_ms=forward_ms)
    assert "forward_ms" not in model.knobs and any(why in n for n in model.notes)
    assert model.parts_mid(predict_tables.BASELINE)["forward"] > 3.0  # 15 GB of weights at 4.8 TB/s


# ---------------------------------------------------------------------- out of sample

def step_rows(rows=4, vocab=1000, pinned=False):
    sizes = {"experiment": "step", "rows": rows, "vocab": vocab, "k": 5, "dtype": "float32",
             "metric": "time", "status": "ok"}
    arms = [("seed_pageable", {"device": 2.0, "alloc": 1.0, "copy": 0.5, "host_gather": 3.0,
                               "free": 0.1}, 8.0),
            ("seed_pageable_reused", {"device": 2.0, "copy": 0.25, "host_gather": 3.0}, 5.0)]
    if pinned:
        arms.append(("seed_pinned", {"device": 2.0, "copy": 0.1, "host_gather": 3.0}, 4.5))
    out = []
    for r in range(3):
        for arm, stages, total in arms:
            out += [{**sizes, "arm": arm, "stage": s, "round": r, "seconds": v / 1e3}
                    for s, v in stages.items()]
            out.append({**sizes, "arm": arm, "stage": "total", "round": r, "seconds": total / 1e3})
    return out


def prior_rows(rows=4, vocab=1000):
    terms = {"log_softmax": 2.0, "fresh_vector": 1.2, "copy_fresh": 0.5, "copy_reused": 0.25,
             "top_k": 3.0, "free": 0.1}
    return [{"arm": "host_rates", "stage": t, "metric": "host_rate", "round": 0,
             "seconds": ms / 1e3, "bytes": rows * vocab * 4, "rows": rows, "vocab": vocab,
             "k": 5} for t, ms in terms.items()]


def test_the_verdict_checks_the_model_out_of_sample_on_rates_measured_before_the_run(tmp_path):
    run = tmp_path / "run"
    schema.write_table(schema.make_rows(step_rows()), run, "step")
    made = verdict.build_verdict(run, decisive_rows=[4], decisive_vocabs=[1000], decisive_ks=[5])
    assert records.shape_errors(made, records.schema("verdict")) == []
    assert made["out_of_sample"]["cells"] == [] and "host rates" in made["out_of_sample"]["note"]
    assert made["prediction"]["kind"].startswith("additivity")
    schema.JsonLinesSink(run / paths.HOST_PRIOR_ROWS).append(prior_rows())
    made = verdict.build_verdict(run, decisive_rows=[4], decisive_vocabs=[1000], decisive_ks=[5])
    assert records.shape_errors(made, records.schema("verdict")) == []
    cell = made["out_of_sample"]["cells"][0]
    assert cell["host"] == predict_check.PRIOR_ORIGIN
    alloc = next(s for s in cell["stages"] if s["name"] == "alloc")
    assert alloc["error"] == pytest.approx(1.2 / 1.0 - 1)
    reuse = cell["questions"][0]
    assert reuse["name"] == "reuse" and reuse["measured_ms"] == pytest.approx(3.0)
    assert reuse["predicted_ms"] == pytest.approx((2 + 1.2 + 0.5 + 3 + 0.1) - (2 + 0.25 + 3))
    assert any(f.startswith("Out of sample (this CPU") for f in made["findings"])
    broken = {**made, "out_of_sample": {**made["out_of_sample"], "cells": [{"rows": 4}]}}
    assert any("vocab is missing" in e
               for e in records.shape_errors(broken, records.schema("verdict")))


def test_a_gpu_run_is_checked_out_of_sample_on_its_host_classes_pinning_saving_included():
    rows = step_rows(16, 100_000, pinned=True)
    table = {"Test": predict_tables.Platform("Test", ("Test",), "PCIe", (50.0, 50.0), "x",
                                      (20.0, 20.0), "x", 4000.0, "x", "x",
                                      host_classes=("x86 bare metal", "x86 VM"))}
    check = predict_check.out_of_sample_run(schema.make_rows(rows), "Test GPU", None, table)
    assert [c["host"] for c in check["cells"]] == ["host class x86 bare metal",
                                                   "host class x86 VM"]
    questions = {q["name"]: q for q in check["cells"][0]["questions"]}
    assert set(questions) == {"bundle", "reuse", "pinning"}
    assert questions["pinning"]["measured_ms"] == pytest.approx(0.5)
    assert questions["pinning"]["error_ms"] == pytest.approx(
        questions["pinning"]["predicted_ms"] - 0.5)
    words = predict_check.out_of_sample_words(check)
    assert check["falsification"]["held"] is not None  # the falsification line comes first
    assert all(key in words[1] for key in ("Test", "host class x86 bare metal", "n=16"))


def test_the_report_shows_the_out_of_sample_check_beside_the_additivity_one():
    from stagelab.present import report

    step = schema.make_rows(step_rows())
    prior = predict_tables.host_rates(schema.make_rows(prior_rows()), origin=predict_check.PRIOR_ORIGIN)
    outside = report.prediction_html(predict_check.out_of_sample_run(step, None, prior))
    inside = report.prediction_html(predict_check.check_run(step, None))
    assert "out of sample" in outside and predict_check.PRIOR_ORIGIN.split(",")[0] in outside
    cells = re.sub(r"<(t[dh])\b[^>]*>", r"<\1>", outside)  # the cells' text, not their ids
    assert "in sample (additivity)" in inside and "<td>reuse</td>" in cells


def test_the_prior_probe_plans_the_step_notebooks_cells_and_skips_the_huge():
    planned = {"models": ["Qwen2.5-7B", 1000], "rows": [16, 2], "ks": [0, 5]}
    assert priorrates.step_cells(planned) == [(2, 1000, 5), (16, 1000, 5), (2, 152064, 5),
                                              (16, 152064, 5)]
    summary = priorrates.measure_before("/nonexistent-run", cells=[(4096, 262_208, 5)])
    assert summary["cells"] == [] and "over 512 MiB" in summary["skipped"][0]
    assert "Not measured: 4096x262208" in priorrates.words(summary)


@pytest.mark.slow
def test_the_prior_probe_measures_in_a_child_process_into_the_run_folder(tmp_path):
    summary = priorrates.measure_before(tmp_path, cells=[(2, 1000, 3)])
    assert summary["error"] == "" and summary["cells"] == [[2, 1000, 3]]
    rates = predict_check.prior_rates(tmp_path)
    assert rates is not None and rates.sizes == [8000] and rates.origin == predict_check.PRIOR_ORIGIN
    lines = (tmp_path / paths.HOST_PRIOR_ROWS).read_text().splitlines()
    assert all(json.loads(line)["note"].endswith(priorrates.NOTE) for line in lines)


def test_notebook_05s_study_uses_the_host_classes_without_a_run(monkeypatch):
    no_measuring(monkeypatch)
    found = predict_study.study("", ["L4"], [16, 256], ["Qwen2.5-7B"], [5], 0.02)
    assert found.origin.startswith("each platform's usual host classes")
    assert found.unfit["rows"].tolist() == [256]
    assert set(found.answers["host"]) == {"host class x86 bare metal", "host class x86 VM"}
    assert {"knob", "flips_at", "words"} <= set(found.sensitivity.columns)
    assert set(found.host["host"]) == {"x86 bare metal", "x86 VM"}
    assert json.dumps(found.payload(), default=str)


def test_host_this_measures_only_through_the_function_the_run_floor_gives():
    """The study sits on the torch-free floor: host ``this`` is measured by the function
    ``stagelab predict`` and notebook 05 pass it, and without one it is refused, naming it."""
    cells = predict_study.cells_of([16], ["Qwen2.5-7B"], [5])
    with pytest.raises(UserError, match="measure_here"):
        predict_study.host_choice(predict_study.HOST_THIS, None, cells)
    asked = []

    def measure(given):
        asked.append(given)
        return predict_tables.HostRates(origin="a stand-in"), "rates from a stand-in"

    choice = predict_study.host_choice(predict_study.HOST_THIS, None, cells, measure_here=measure)
    assert asked == [cells]
    assert (choice.rates.origin, choice.words) == ("a stand-in", "rates from a stand-in")


def test_notebook_05_and_predict_give_h200_the_same_answers_for_the_same_inputs(
        tmp_path, monkeypatch, capsys):
    """Before: notebook 05 fed the run's own (busy CPU) host rates into every platform: the
    seed's step at n = 64 on H200 was 104 ms in the report against 16.8 ms from the CLI. The
    run's rates are now only "this host", and `predict --json` prints the very records."""
    no_measuring(monkeypatch)
    run = tmp_path / "run"
    slow_host = [{**row, "seconds": row["seconds"] * 50} for row in prior_rows(64, 152064)]
    schema.write_table(schema.make_rows(step_rows() + slow_host), run, "step")
    quick = profiles.profile_parameters("quick")["05_prediction"]
    found = predict_study.study(run, ["H200"], quick["decisive_rows"], quick["decisive_models"],
                                quick["decisive_ks"], quick["delta"])
    assert cli_main(["predict", "--platform", "H200", "--profile", "quick", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["predicted"] is True
    pd.testing.assert_frame_equal(found.answers, pd.DataFrame(printed["answers"]))
    pd.testing.assert_frame_equal(found.arms, pd.DataFrame(printed["arms"]))
    step_64 = found.arms[(found.arms["rows"] == 64) & (found.arms["arm"] == "seed_pageable")]
    assert set(step_64["host"]) == {"host class x86 bare metal", "host class x86 VM"}
    assert step_64["mid_ms"].max() < 30  # the usual hosts', not the slow host's
    assert set(found.this_host["host"]) == {predict_study.THIS_HOST}  # shown, never fed in
    grid = predict_study.answer_grid(found.answers)
    assert list(grid.columns) == ["platform", "rows", "vocab", "k", "bundle", "reuse", "pinning",
                                  "deferral"]
    assert grid.set_index("rows").loc[64, "bundle"] == "PORT"
