"""A prediction that can fail (issue 49): ``stagelab predict`` states, per platform and decisive
cell, the intervals and the rule by which a run falsifies it; the verdict's ``out_of_sample``
applies that rule to those same intervals, per figure and overall; a GPU run's first screen says
whether the prediction held. The step rows are drawn by this module's own generator."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pandas as pd
import pytest

from conftest import good_run
from stagelab.analyse import predict_check, predict_model, predict_tables
from stagelab.cli import main as cli_main
from stagelab.core import records, schema
from stagelab.present import report

GPU, V, K, N = "NVIDIA H200", 152_064, 5, 16


def _stated(platform: predict_tables.Platform) -> list[list[dict]]:
    """What the model states at the cell, per host class of the platform, as the verdict builds
    it (the cell's forward dimensions from its vocabulary)."""
    cell = predict_tables.Cell(N, V, K, predict_check.models_by_vocab().get(V), "device")
    return [predict_model.stated_figures(predict_model.gpu_model(platform, cell, host))
            for host in predict_tables.hosts_of(platform)]


def _step_rows(stages_ms: dict[str, float], arms_ms: dict[str, float], rounds: int = 20,
               seed: int = 0) -> list[dict]:
    """Own generator: the seed arm's stages and every arm's total per round at the given means
    (0.1 % noise, a zero-mean pattern so the means are exact)."""
    wiggle = np.random.default_rng(seed).standard_normal(rounds // 2) * 1e-3
    factors = 1 + np.concatenate([wiggle, -wiggle])
    out = []
    for arm, total in arms_ms.items():
        parts = {**(stages_ms if arm == predict_tables.BASELINE else {}), "total": total}
        for stage, ms in parts.items():
            out += [dict(experiment="step", arm=arm, stage=stage, round=r,
                         seconds=ms * f / 1e3, rows=N, vocab=V, k=K)
                    for r, f in enumerate(factors)]
    return out


def _at_predicted(figures: list[dict], **moved: float) -> pd.DataFrame:
    """Step rows whose every figure sits at its predicted point; ``moved`` sets an arm's step."""
    stages = {f["name"]: f["predicted_ms"] for f in figures if f["level"] == "stage"
              and f["name"] not in predict_check.UNTIMED_STAGES}
    arms = {f["name"]: f["predicted_ms"] for f in figures if f["level"] == "arm"}
    return schema.make_rows(_step_rows(stages, {**arms, **moved}))


@pytest.fixture(scope="module")
def h200() -> predict_tables.Platform:
    found = predict_tables.platform_of_gpu(GPU)
    assert found is not None and found.name == "H200"
    return found


def test_falsifies_is_the_rule_on_one_figure():
    assert predict_check.falsifies(None, 1.0, 2.0) is None
    assert predict_check.falsifies(1.5, 1.0, 2.0) is False
    assert predict_check.falsifies(1.0, 1.0, 2.0) is False  # the ends belong to the interval
    assert predict_check.falsifies(2.01, 1.0, 2.0) is True
    assert predict_check.falsifies(0.5, 1.0, 2.0) is True


def test_predict_json_states_the_rule_and_every_cells_intervals(capsys, h200):
    assert cli_main(["predict", "--platform", "H200", "--profile", "quick", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["falsification"]
    assert said["rule"] == predict_model.FALSIFICATION_RULE
    at_cell = [f for f in said["figures"] if (f["rows"], f["vocab"], f["k"]) == (N, V, K)]
    assert {f["level"] for f in at_cell} == {"stage", "arm", "question"}
    assert all(f["low_ms"] <= f["predicted_ms"] <= f["high_ms"] for f in said["figures"])
    hosts = sorted({f["host"] for f in at_cell})
    assert len(hosts) == len(predict_tables.hosts_of(h200)) >= 1


def test_the_verdict_judges_the_intervals_predict_stated(h200):
    """One source: every figure the verdict judges carries the interval predict stated for its
    host and cell."""
    stated = _stated(h200)
    check = predict_check.out_of_sample_run(_at_predicted(stated[0]), GPU)
    by_host = {c["host"]: c for c in check["cells"]}
    for host, figures in zip(predict_tables.hosts_of(h200), stated):
        judged = {(level, f["name"]): (f["low_ms"], f["high_ms"])
                  for level in ("stages", "arms", "questions") for f in by_host[host.origin][level]}
        for f in figures:
            key = (f["level"] + "s", f["name"])
            if key in judged:
                assert judged[key] == (f["low_ms"], f["high_ms"])
    assert len(judged) >= 10


def test_a_run_at_the_predicted_points_holds(h200):
    check = predict_check.out_of_sample_run(_at_predicted(_stated(h200)[0]), GPU)
    verdict = check["falsification"]
    assert verdict["held"] is True and verdict["failed_at"] == [] and verdict["figures"] >= 10
    figures = [f for c in check["cells"] for level in ("stages", "arms", "questions")
               for f in c[level]]
    assert all(f["held"] is not None for f in figures)
    first = predict_check.stated_lines(check)[0]  # the held verdict above, said first
    assert first.startswith("Prediction") and "held (H200)" in first


def test_a_step_outside_every_hosts_interval_fails_and_is_named(h200):
    stated = _stated(h200)
    highest = max(f["high_ms"] for figures in stated for f in figures
                  if f["name"] == predict_tables.CANDIDATE)
    check = predict_check.out_of_sample_run(
        _at_predicted(stated[0], **{predict_tables.CANDIDATE: 3 * highest}), GPU)
    verdict = check["falsification"]
    assert verdict["held"] is False
    assert f"{predict_tables.CANDIDATE} at n={N}, V={V}, K={K}" in verdict["failed_at"]
    line = predict_check.stated_lines(check)[0]
    assert "FAILED" in line and f"at {len(verdict['failed_at'])} of {verdict['figures']}" in line


def test_a_figure_one_host_holds_does_not_fail(h200):
    """The hosts are alternatives: inside the interval of one host is enough."""
    stated = _stated(h200)
    if len(stated) < 2:
        pytest.skip("the platform has one host class")
    per_host = [next(f for f in figures if f["name"] == predict_tables.BASELINE)
                for figures in stated]
    wider = max(per_host, key=lambda f: f["high_ms"])
    narrower = min(per_host, key=lambda f: f["high_ms"])
    if wider["high_ms"] <= narrower["high_ms"]:
        pytest.skip("the hosts' intervals for the seed step coincide")
    between = (wider["high_ms"] + narrower["high_ms"]) / 2
    check = predict_check.out_of_sample_run(
        _at_predicted(stated[0], **{predict_tables.BASELINE: between}), GPU)
    assert f"{predict_tables.BASELINE} at n={N}, V={V}, K={K}" not in check["falsification"][
        "failed_at"]


def test_a_cpu_run_or_an_older_verdict_has_no_first_screen_line():
    assert predict_check.stated_lines(None) == []
    cpu = {"platform": predict_tables.CPU_PLATFORM, "falsification": {"held": False}}
    assert predict_check.stated_lines(cpu) == []
    assert predict_check.stated_lines({"platform": "H200", "cells": []}) == []


def test_the_first_screen_of_a_gpu_run_says_the_prediction_failed(tmp_path, h200):
    stated = _stated(h200)
    check = predict_check.out_of_sample_run(
        _at_predicted(stated[0], **{predict_tables.CANDIDATE: 100.0}), GPU)
    run = good_run(tmp_path)
    verdict = {"overall": {"decision": "PORT"}, "out_of_sample": check}
    jsonschema.validate(json.loads(json.dumps(verdict)), records.schema("verdict"))
    (run / "verdict.json").write_text(json.dumps(verdict))
    page = report.write_index(run).read_text()
    section = page.split("id='verdict'")[1].split("</section>")[0]
    assert "FAILED (H200)" in section
    assert section.index("FAILED (H200)") < section.index("Predicted beside measured")


def test_predict_prints_the_rule_and_each_cells_falsifying_intervals(capsys, h200):
    assert cli_main(["predict", "--platform", "H200", "--profile", "quick"]) == 0
    out = capsys.readouterr().out
    assert out.count(predict_model.FALSIFICATION_RULE) == 1
    stated = _stated(h200)
    lines = [line for line in out.splitlines() if "falsified if" in line]
    hosts = predict_tables.hosts_of(h200)
    assert any(f"({hosts[0].origin})" in line for line in lines)
    pinned = next(f for f in stated[0] if f["name"] == predict_tables.CANDIDATE)
    assert any(f"{predict_tables.CANDIDATE} step [{pinned['low_ms']:.3g}, "
               f"{pinned['high_ms']:.3g}] ms" in line for line in lines)
