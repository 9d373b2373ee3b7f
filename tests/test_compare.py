"""``stagelab compare``: runs side by side, ratios to the first run, a self-contained escaped page,
runs that lack something named while the others are compared, and no torch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import copy_records, make_run
from stagelab import cli
from stagelab.core import paths, schema
from stagelab.present import compare

CELL = "n=64 V=152064 K=5"
TOTAL = ("seed step, ms", f"{CELL} total")
PINNED_GBPS = ("copy bandwidth", "n=64 V=152064 pinned_grow_only GB/s")



@pytest.fixture
def cpu_and_h200(tmp_path: Path) -> tuple[Path, Path]:
    return (make_run(tmp_path, "A_cpu", total_ms=10.0, copy_seconds=0.5),
            make_run(tmp_path, "B_h200", gpu="NVIDIA H200", link=64.0, total_ms=25.0,
                     copy_seconds=0.25))


def test_table_has_a_column_per_run_and_the_exact_ratio_of_shared_cells(cpu_and_h200, tmp_path,
                                                                         capsys):
    a, b = cpu_and_h200
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "c.html")]) == 0
    out = capsys.readouterr().out

    comparison = compare.compare([a, b])
    table, ratios = comparison.table, comparison.ratios
    assert list(table.columns) == ["A_cpu", "B_h200"]
    assert table.loc[TOTAL, "A_cpu"] == 10.0 and table.loc[TOTAL, "B_h200"] == 25.0
    assert ratios.loc[TOTAL, "B_h200 / A_cpu"] == 2.5
    assert ratios.loc[("seed step, ms", f"{CELL} device"), "B_h200 / A_cpu"] == 3.5
    assert ratios.loc[("seed step, ms", f"{CELL} copy"), "B_h200 / A_cpu"] == 1.0
    assert ratios.loc[("prompt logprobs", "peak device MiB fused chunk 512"),
                      "B_h200 / A_cpu"] == 0.5
    # bandwidth: 1 GB over the median 0.5 s and 0.25 s, at the largest cell only, twin left out
    assert table.loc[PINNED_GBPS, "A_cpu"] == pytest.approx(2.0)
    assert ratios.loc[PINNED_GBPS, "B_h200 / A_cpu"] == pytest.approx(2.0)
    assert ("copy bandwidth", "n=16 V=152064 pinned_grow_only GB/s") not in table.index
    assert not any("~aa" in quantity for _, quantity in table.index)
    # the share of the link where it is known (B: 4 GB/s of 64), not known for the CPU
    share = ("copy bandwidth", "n=64 V=152064 pinned_grow_only % of link")
    assert table.loc[share, "B_h200"] == pytest.approx(6.25) and table.loc[share, "A_cpu"] is None
    # text quantities never get a ratio
    assert ("hardware", "GPU") not in ratios.index
    assert table.loc[("hardware", "GPU"), "B_h200"] == "NVIDIA H200"

    lines = out.splitlines()
    assert lines[0].split() == ["A_cpu", "B_h200", "B_h200", "/", "A_cpu"]  # a ratio beside B
    total_lines = [line for line in lines if line.rstrip().endswith("2.50x")]
    assert len(total_lines) == 1 and f"{CELL} total" in total_lines[0]
    assert total_lines[0].split()[-3:] == ["10.0", "25.0", "2.50x"]  # three significant digits
    assert "PORT 1.500x [1.400, 1.600] min 1.020x" in out
    assert lines[2].startswith("verdict ") and "overall" in lines[2]  # the verdicts first


def test_html_is_written_to_out_self_contained_with_the_same_numbers_escaped(cpu_and_h200,
                                                                           tmp_path, capsys):
    page = tmp_path / "sub" / "compare.html"
    assert cli.main(["compare", *map(str, cpu_and_h200), "--out", str(page)]) == 0
    assert f"page: {page}" in capsys.readouterr().out
    text = page.read_text()
    assert "2.50x" in text and "6.25" in text and "NVIDIA H200" in text
    assert "&lt;script&gt;" in text and "<script" not in text  # the hostile reason and CPU name
    for fetch in ("<link", "src=", "@import", "url(", "http://", "https://"):
        assert fetch not in text


def test_a_run_lacking_its_verdict_is_named_and_the_others_compared(cpu_and_h200, tmp_path,
                                                                    capsys):
    a, b = cpu_and_h200
    bare = make_run(tmp_path, "C_noverdict", copy_seconds=1.0, verdict="none")
    older = make_run(tmp_path, "D_older", verdict="older", staging=False)
    page = tmp_path / "c.html"
    assert cli.main(["compare", str(a), str(b), str(bare), str(older), "--out", str(page)]) == 0
    captured = capsys.readouterr()
    notes = captured.err.splitlines()
    assert any(line.startswith("note: C_noverdict: no verdict.json") for line in notes)
    assert any(line.startswith("note: D_older:") and "verdict.json" in line and "older" in line
               for line in notes)
    assert any(line.startswith("note: D_older: no data/staging.parquet") for line in notes)
    assert not any("A_cpu" in line or "B_h200" in line for line in notes)

    comparison = compare.compare([a, b, bare, older])
    missing = comparison.table.loc[("run", "missing")]
    assert missing["C_noverdict"] == "no verdict.json"
    older_verdict, no_prompt, no_staging = missing["D_older"].split("; ")
    assert "verdict.json" in older_verdict and "prompt" in no_prompt and "staging" in no_staging
    assert missing["A_cpu"] is None
    assert comparison.table.loc[("verdict", "overall"), "D_older"] == "CLOSE (older format)"
    # the bare run's bandwidth is still compared (1 GB/s against 2), the older run has none
    assert comparison.ratios.loc[PINNED_GBPS, "C_noverdict / A_cpu"] == pytest.approx(0.5)
    assert math.isnan(comparison.ratios.loc[PINNED_GBPS, "D_older / A_cpu"])
    assert ("run", "missing") not in comparison.ratios.index  # text, even where A has none
    assert "C_noverdict" in page.read_text()


def test_all_runs_unusable_exit_2_in_one_line(tmp_path, capsys):
    empty = [make_run(tmp_path, name, verdict="none", staging=False) for name in ("E1", "E2")]
    page = tmp_path / "c.html"
    assert cli.main(["compare", *map(str, empty), "--out", str(page)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stagelab: error:") and "no run to compare" in err[0]
    assert "E1 (no verdict.json" in err[0] and "E2" in err[0]
    assert not page.exists()


def test_a_path_that_is_not_a_run_folder_is_refused_in_one_line(cpu_and_h200, tmp_path, capsys):
    stray = tmp_path / "not_a_run"
    stray.mkdir()
    assert cli.main(["compare", str(cpu_and_h200[0]), str(stray),
                     "--out", str(tmp_path / "c.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stagelab: error: {stray} ")
    assert "manifest.json" in err[0] and "verdict.json" in err[0]  # what a run folder holds


def test_runs_with_the_same_id_get_distinct_columns(cpu_and_h200):
    a, _ = cpu_and_h200
    assert list(compare.compare([a, a]).table.columns) == ["A_cpu", "A_cpu (2)"]


def test_without_out_the_page_goes_under_the_runs_folder_and_is_named(cpu_and_h200, tmp_path,
                                                                     monkeypatch, capsys):
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path / "runs")
    assert cli.main(["compare", *map(str, cpu_and_h200)]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("page: ")]
    assert len(printed) == 1
    page = Path(printed[0].removeprefix("page: "))
    assert page.parent == tmp_path / "runs" and page.name.startswith("compare_")
    assert "2.50x" in page.read_text()


def test_a_staging_table_of_an_older_schema_still_gives_its_bandwidth(cpu_and_h200, tmp_path,
                                                                      capsys):
    a, _ = cpu_and_h200
    frame = schema.make_rows(copy_records(0.5), run_id="K", notebook="01_d2h_staging")
    older = make_run(tmp_path, "K_older", verdict="none", staging=False)
    (older / "data").mkdir()
    frame.drop(columns=["clock_agrees"]).to_parquet(schema.table_path(older, "staging"))
    broken = make_run(tmp_path, "L_broken", verdict="none", staging=False)
    (broken / "data").mkdir()
    frame.drop(columns=["gb_per_s"]).to_parquet(schema.table_path(broken, "staging"))

    assert cli.main(["compare", str(a), str(older), str(broken),
                     "--out", str(tmp_path / "c.html")]) == 0
    notes = capsys.readouterr().err.splitlines()
    assert any(line.startswith("note: K_older:") and "older schema (without clock_agrees)" in line
               for line in notes)
    assert any(line.startswith("note: L_broken:") and "missing ['gb_per_s']" in line
               for line in notes)
    comparison = compare.compare([a, older, broken])
    assert comparison.ratios.loc[PINNED_GBPS, "K_older / A_cpu"] == pytest.approx(1.0)
    assert math.isnan(comparison.ratios.loc[PINNED_GBPS, "L_broken / A_cpu"])
    no_verdict, other_schema = comparison.table.loc[("run", "missing"), "L_broken"].split("; ")
    assert "verdict.json" in no_verdict and "staging" in other_schema and "schema" in other_schema


def test_a_single_run_is_shown_without_ratios(cpu_and_h200, capsys, tmp_path):
    assert cli.main(["compare", str(cpu_and_h200[1]), "--out", str(tmp_path / "c.html")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["B_h200"]
    assert "/" not in out.splitlines()[0]
    assert compare.compare([cpu_and_h200[1]]).ratios.empty and compare.NO_RATIO in out


def test_figures_have_three_significant_digits_whatever_their_size():
    # Before: 16.4 beside 1.657 and 0.02582 (four significant digits, trailing zeros dropped).
    assert [compare.format_value(v) for v in (2562.4, 16.4, 1.657, 0.02582, 10.0, 0.0)] == [
        "2562", "16.4", "1.66", "0.0258", "10.0", "0"]
    assert [compare.format_ratio(v) for v in (2.5, 0.5, 45.7)] == ["2.50x", "0.500x", "45.7x"]


def test_a_run_with_untrustworthy_timings_is_flagged_in_its_column_and_a_note(cpu_and_h200,
                                                                              tmp_path, capsys):
    a, b = cpu_and_h200
    verdict = json.loads((b / "verdict.json").read_text())
    verdict["decisive"][0].update(twin_speedup=0.7, twin_ci_low=0.6, twin_ci_high=0.8)
    (b / "verdict.json").write_text(json.dumps(verdict))
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "c.html")]) == 0
    captured = capsys.readouterr()
    assert any(line.startswith("note: B_h200:") and "A/A" in line
               for line in captured.err.splitlines())
    timings = compare.compare([a, b]).table.loc[("verdict", "timings")]
    assert timings["B_h200"].startswith("NOT TRUSTWORTHY") and "A/A" in timings["B_h200"]
    assert timings["A_cpu"] == "A/A passed; load not recorded"
    bare = make_run(tmp_path, "C_bare", verdict="none")
    unchecked = compare.compare([a, bare]).table.loc[("verdict", "timings"), "C_bare"]
    assert "A/A not checked" in unchecked and "load not recorded" in unchecked
    quiet = {"busy": False, "why": []}
    manifest = json.loads((a / "manifest.json").read_text())
    manifest["notebooks"] = [{"name": "02_logprobs_step", "status": "ok", "load": quiet}]
    (a / "manifest.json").write_text(json.dumps(manifest))
    assert compare.compare([a]).table.loc[("verdict", "timings"), "A_cpu"] == (
        "yes (quiet, A/A passed)")


def test_the_comparison_shows_the_recommended_change_and_each_cells_other_answers(tmp_path):
    run = make_run(tmp_path, "R")
    data = json.loads((run / "verdict.json").read_text())
    data["recommendation"] = {"change": "port the pinned scratch", "reason": "why"}
    data["decisive"][0]["answers"] = {
        "bundle": {"decision": "PORT", "speedup": 1.5, "ci_low": 1.4, "ci_high": 1.6},
        "reuse": {"decision": "PORT", "speedup": 1.2, "ci_low": 1.1, "ci_high": 1.3},
        "pinning": {"decision": "PORT", "speedup": 1.25, "ci_low": 1.2, "ci_high": 1.3}}
    (run / "verdict.json").write_text(json.dumps(data))
    table = compare.compare([run]).table
    assert table.loc[("verdict", "recommendation"), "R"] == "port the pinned scratch"
    name = next(q for s, q in table.index if s == "decisive cells" and q.endswith("pinning alone"))
    assert table.loc[("decisive cells", name), "R"] == "PORT 1.250x [1.200, 1.300]"


def test_the_comparison_shows_each_decisive_cells_carry_over(tmp_path):
    run = make_run(tmp_path, "R")
    data = json.loads((run / "verdict.json").read_text())
    cell = data["decisive"][0]
    data["carry_over"] = {"method": "m", "bar": 0.01, "flagged": ["x"], "cells": [
        {"rows": cell["rows"], "vocab": cell["vocab"], "k": cell["k"], "estimated": True,
         "flagged": True, "arms": [
             {"arm": "seed_pageable", "carry_over": 0.05, "ci_low": 0.04, "ci_high": 0.06,
              "flagged": True},
             {"arm": "seed_pinned", "carry_over": -0.01, "ci_low": -0.02, "ci_high": 0.0,
              "flagged": False}]}]}
    (run / "verdict.json").write_text(json.dumps(data))
    table = compare.compare([run]).table
    name = f"n={cell['rows']} V={cell['vocab']} K={cell['k']} carry-over"
    shown = table.loc[("decisive cells", name), "R"]
    assert shown.startswith("FLAGGED") and "seed_pageable" in shown and "seed_pinned" not in shown
    assert all(figure in shown for figure in ("+5.0%", "+4.0%", "+6.0%"))


def test_the_comparison_shows_the_recommendation_under_each_value_of_each_condition(tmp_path):
    run = make_run(tmp_path, "R")
    data = json.loads((run / "verdict.json").read_text())
    def block(column: str, decided: str, under: dict) -> dict:
        return {"column": column, "decided": decided, "values": list(under), "changes_answer": None,
                "flipped_cells": [], "words": "w", "note": "n",
                "under": {value: {**found, "reason": ""} for value, found in under.items()}}

    data["conditions"] = {"overlap": {**block("overlap_order", "queued", {
            "queued": {"measured": True, "cells": ["a", "b"], "decision": "CLOSE",
                       "change": "close"},
            "waited": {"measured": True, "cells": ["a"], "decision": "PORT",
                       "change": "port the pinned scratch"}}),
        "seed": {"order": "unknown", "words": "w"}},
        "log_softmax": block("log_softmax", "device", {
            "device": {"measured": True, "cells": ["a"], "decision": "CLOSE", "change": "close"},
            "host": {"measured": False, "cells": [], "decision": None, "change": None}})}
    (run / "verdict.json").write_text(json.dumps(data))
    table = compare.compare([run]).table
    queued, waited = (table.loc[("verdict", f"overlap: {o}"), "R"] for o in ("queued", "waited"))
    assert queued.startswith("CLOSE") and "2 cell" in queued and "decided" in queued
    assert waited.startswith("PORT") and "port the pinned scratch" in waited and "1 cell" in waited
    assert "decided" not in waited
    assert table.loc[("verdict", "overlap: seed's order"), "R"] == "unknown"
    assert table.loc[("verdict", "log_softmax: host"), "R"] == "not measured"
    del data["conditions"]  # an older verdict (format 1): no condition rows
    (run / "verdict.json").write_text(json.dumps(data))
    assert not any(q.startswith("overlap") for _, q in compare.compare([run]).table.index)


# ------------------------------------------------- figures of trustworthy runs beyond their CIs

def _trusted(run: Path, lever: tuple[float, float, float], rounds: int = 30,
             cores: int = 2, torch_version: str = "2.5.1") -> Path:
    """Make a synthetic run trustworthy (a quiet machine, A/A checks passed at ``rounds``) with
    one step lever measured as (speedup, low, high)."""
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["notebooks"] = [{"name": "02_logprobs_step", "status": "ok",
                              "load": {"busy": False, "why": []}}]
    manifest["hardware"]["host"]["logical_cores"] = cores
    manifest["hardware"]["torch"]["torch"] = torch_version
    (run / "manifest.json").write_text(json.dumps(manifest))
    verdict = json.loads((run / "verdict.json").read_text())
    verdict["harness"] = {"method": "bonferroni", "delta": 0.02, "confidence": 0.99,
                          "family_confidence": 0.95, "checks": [
        {"level": "step", "rows": 64, "vocab": 152064, "k": 5, "n_rounds": rounds,
         "twin_speedup": 1.0, "twin_ci_low": 0.99, "twin_ci_high": 1.01, "differs": False}]}
    speedup, low, high = lever
    verdict["step_levers"] = [{"rows": 64, "vocab": 152064, "k": 5, "baseline": "seed_pageable",
                               "candidate": "seed_pageable_reused", "speedup": speedup,
                               "ci_low": low, "ci_high": high}]
    (run / "verdict.json").write_text(json.dumps(verdict))
    return run


LEVER = "step lever seed_pageable_reused at n=64 V=152064 K=5"


def test_compare_flags_a_figure_two_trusted_runs_disagree_on_and_the_factor_that_differs(
        tmp_path, capsys):
    a = _trusted(make_run(tmp_path, "A", total_ms=10.0), (1.44, 1.31, 1.57))
    b = _trusted(make_run(tmp_path, "B", total_ms=10.0), (0.98, 0.90, 1.04), cores=4)
    comparison = compare.compare([a, b])
    assert [run.trusted for run in comparison.runs] == [True, True]
    apart, why = comparison.flags
    assert apart.startswith(f"{LEVER}: ") and "beyond both CIs" in apart
    assert all(figure in apart for figure in ("1.440x [1.310, 1.570]", "0.980x [0.900, 1.040]"))
    assert why.startswith("A vs B: ") and why.endswith("logical cores (2 vs 4)")
    # the decisive speedups agree within their CIs (the same in both): not flagged
    assert not any(line.startswith("step speedup") for line in comparison.flags)
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "c.html")]) == 0
    out = capsys.readouterr().out
    assert f"{compare.FLAG}: {LEVER}" in out
    page = (tmp_path / "c.html").read_text()
    assert "id=\"beyond-ci\"" in page and "logical cores (2 vs 4)" in page


def test_compare_says_when_no_machine_factor_differs_and_flags_nothing_within_the_cis(tmp_path):
    a = _trusted(make_run(tmp_path, "A"), (1.44, 1.31, 1.57))
    b = _trusted(make_run(tmp_path, "B"), (1.20, 1.10, 1.30))
    (alike,) = compare.compare([a, b]).flags[1:]
    assert alike.startswith("A vs B: ") and "no recorded machine factor" in alike
    c = _trusted(make_run(tmp_path, "C"), (1.35, 1.25, 1.45))
    assert compare.compare([a, c]).flags == []  # the CIs overlap


def test_compare_does_not_judge_runs_that_are_not_trustworthy_or_too_short(tmp_path):
    a = _trusted(make_run(tmp_path, "A"), (1.44, 1.31, 1.57))
    short = _trusted(make_run(tmp_path, "S"), (0.98, 0.90, 1.04), rounds=3)
    comparison = compare.compare([a, short])
    assert comparison.flags == []
    timings = comparison.table.loc[("verdict", "timings"), "S"]
    assert timings.startswith("not a decision") and "3 rounds" in timings
    busy = _trusted(make_run(tmp_path, "busy"), (0.98, 0.90, 1.04))
    manifest = json.loads((busy / "manifest.json").read_text())
    manifest["notebooks"][0]["load"] = {"busy": True, "why": ["others took 1.6 cores"]}
    (busy / "manifest.json").write_text(json.dumps(manifest))
    assert compare.compare([a, busy]).flags == []


def test_compare_cells_read_as_the_report_s_tables_do():
    assert [compare.format_value(v) for v in (None, True, False, 3, 2.0, "no `decisive` cells")] == [
        "-", "yes", "no", "3", "2.00", "no decisive cells"]


def test_compare_json_gives_each_quantity_every_runs_value_and_the_ratio(cpu_and_h200,
                                                                         tmp_path, capsys):
    """`stagelab compare --json`: the comparison machine-readable (pyperf's compare_to and
    nvbandwidth print JSON), strict JSON, the same figures as the table."""
    import json

    a, b = cpu_and_h200
    assert cli.main(["compare", str(a), str(b), "--json", "--out", str(tmp_path / "c.html")]) == 0
    captured = capsys.readouterr()
    found = json.loads(captured.out)
    assert "page: " in captured.err and (tmp_path / "c.html").is_file()
    assert [run["label"] for run in found["runs"]] == ["A_cpu", "B_h200"]
    total = next(q for q in found["quantities"] if (q["section"], q["quantity"]) == TOTAL)
    assert total["values"] == {"A_cpu": 10.0, "B_h200": 25.0}
    assert total["ratios_to_first"] == {"B_h200 / A_cpu": 2.5}
    share = next(q for q in found["quantities"]
                 if q["quantity"] == "n=64 V=152064 pinned_grow_only % of link")
    assert share["values"]["A_cpu"] is None and share["ratios_to_first"] == {}
    gpu = next(q for q in found["quantities"] if (q["section"], q["quantity"]) == (
        "hardware", "GPU"))
    assert gpu["values"]["B_h200"] == "NVIDIA H200"
