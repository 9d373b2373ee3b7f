"""The report's first screen reads at a glance: no placeholder cells, no repeated reasons, a stage
split whose parts add up to the total."""

from __future__ import annotations

import json
import re

from conftest import fake_run
from stagelab.present import report, tables

UNAVAILABLE = "not measured: seed_pinned unavailable: pinned host memory needs a CUDA device"


def decisive_cell(rows: int, **extra) -> dict:
    split = {"device": 1.5, "alloc": 0.6, "copy": 0.6, "host_gather": 2.2, "free": 0.01,
             "unattributed": 0.59, "total": 5.5}
    return {"rows": rows, "vocab": 152064, "k": 5, "decision": "INCONCLUSIVE", "delta": 0.02,
            "speedup": None, "ci_low": None, "ci_high": None, "min_speedup": None,
            "twin_speedup": None, "reason": UNAVAILABLE, "stages_ms": split, **extra}


def verdict_page(tmp_path, cells: list[dict], summary: str) -> str:
    run_dir = fake_run(tmp_path / "runs")
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "INCONCLUSIVE", "summary": summary}, "decisive": cells}))
    page = report.write_index(run_dir).read_text()
    return page[page.index("<table id='decisive'>"):page.index("</section>")]


def test_the_decisive_table_has_no_placeholders_and_says_a_shared_reason_once(tmp_path):
    # Before: "2% (-)", "- [-, -]" and the same long reason on every row.
    box = verdict_page(tmp_path, [decisive_cell(16), decisive_cell(64)],
                       "No decisive cell was measured (seed_pinned unavailable: pinned host "
                       "memory needs a CUDA device), so nothing is decided.")
    assert "(-)" not in box and "[-" not in box and "<td>-</td>" not in box
    assert "pinned host memory needs a CUDA device" not in box  # the summary said it already
    assert "counts from" not in box and "A/A twin" not in box  # no cell has a value there
    elsewhere = verdict_page(tmp_path / "b", [decisive_cell(16), decisive_cell(64)], "Undecided.")
    assert elsewhere.count("pinned host memory needs a CUDA device") == 1


def test_the_stage_split_parts_add_up_to_the_total_shown(tmp_path):
    box = verdict_page(tmp_path, [decisive_cell(16)], "Undecided.")
    assert "log-softmax + zero-fill + copy + host top-K + free + unattributed = total" in box
    (parts, total), = re.findall(r"<td>([\d.+ ]+) = ([\d.]+)</td>", box)
    assert sum(float(p) for p in parts.split("+")) == float(total) == 5.5


def test_measured_cells_show_their_figures_and_unmeasured_ones_say_so(tmp_path):
    measured = decisive_cell(64, decision="PORT", speedup=1.5, ci_low=1.4, ci_high=1.6,
                             min_speedup=1.0204, twin_speedup=1.0, twin_ci_low=0.99,
                             twin_ci_high=1.01, reason="the CI lies above 1.020x")
    box = verdict_page(tmp_path, [decisive_cell(16), measured], "Mixed.")
    assert "1.500x [1.400, 1.600]" in box and "1.020x" in box and "1.000x [0.990, 1.010]" in box
    assert "counts from (delta 2%)" in box
    assert box.count("not measured</td>") == 3  # speedup, threshold and twin of n=16


def test_the_key_plot_labels_decisions_only_and_captions_what_it_draws():
    import matplotlib
    matplotlib.use("Agg")
    from stagelab.present import plots

    # Before: two stray "measured" labels and a caption for a grey twin CI that was not drawn.
    reuse = [{"rows": n, "vocab": 152064, "k": 5, "decision": "measured", "speedup": s,
              "ci_low": s - 0.05, "ci_high": s + 0.05} for n, s in ((16, 0.9), (64, 1.5))]
    ax = plots.verdict_forest(reuse, "reuse lever")
    assert [t.get_text() for t in ax.texts] == []
    assert "grey" not in ax.get_xlabel() and "tick" not in ax.get_xlabel()
    decided = [{**reuse[1], "decision": "PORT", "twin_ci_low": 0.98, "twin_ci_high": 1.02,
                "min_speedup": 1.02}]
    ax = plots.verdict_forest(decided, "decided")
    assert [t.get_text().strip() for t in ax.texts] == ["PORT"]
    assert "grey band" in ax.get_xlabel() and "black tick" in ax.get_xlabel()


def test_a_tall_arm_is_cut_and_labelled_so_the_seed_bars_stay_readable():
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd

    from stagelab.analyse import step_analysis
    from stagelab.present import plots

    base = {"rows": 16, "vocab": 1000, "k": 5}
    parts = pd.DataFrame([
        {**base, "arm": "seed_pageable", **{s: 1e-3 for s in step_analysis.SPLIT}, "total": 6e-3},
        {**base, "arm": "fused", **{s: 0.0 for s in step_analysis.SPLIT}, "device": 60e-3,
         "total": 60e-3}])
    ax = plots.stage_bars(parts).axes[0]
    assert ax.get_ylim()[1] == plots.CLIP_OVER_BASELINE * 6.0
    assert [t.get_text() for t in ax.texts] == ["↑60"]


def test_tables_show_units_three_significant_digits_and_a_speedup_with_its_ci():
    import pandas as pd

    from stagelab.present import tables

    frame = pd.DataFrame([{"rows": 64, "vocab": 152064, "arm": "fused", "seconds": 0.016432,
                           "speedup": 1.4761, "ci_low": 1.399, "ci_high": 1.4903,
                           "saved_ms": 19.281, "peak_host_bytes": 17.5 * 2**20,
                           "copy_share": 0.0912}]).set_index(["rows", "vocab"])
    shown = tables.readable(frame)
    assert list(shown.columns) == ["n (rows)", "V (vocabulary)", "arm", "seconds (ms)",
                                   "speedup [95 % CI]", "saved (ms)", "peak host (MiB)",
                                   "copy share (%)"]
    assert shown.iloc[0].tolist() == ["64", "152064", "fused", "16.4", "1.476x [1.399, 1.490]",
                                      "19.3", "17.5", "9.1 %"]
    html = tables.show(frame).to_html()
    assert "<table" in html and "speedup [95 % CI]" in html


def test_holdings_put_counts_and_bytes_in_their_own_named_columns():
    import pandas as pd

    from stagelab.analyse import copy_analysis
    from stagelab.core import schema

    # Before: bytes under "allocations", and one column per arm and metric, off the page.
    records = []
    for arm, pinned, count, capacity in (("pinned_grow_only", 2**20, 1, 2**20),
                                         ("pageable_fresh", 0, 23, 2**20)):
        records += [dict(arm=arm, metric="pinned_bytes_held", bytes=pinned, rows=1, vocab=8),
                    dict(arm=arm, metric="allocations", value=float(count), bytes=capacity,
                         rows=1, vocab=8)]
    table = copy_analysis.holdings(schema.make_rows(records))
    assert list(table.columns) == ["rows", "vocab", "arm", "allocations", "pinned_held_bytes",
                                   "buffer_capacity_bytes"]
    assert table[["arm", "allocations", "pinned_held_bytes"]].values.tolist() == [
        ["pageable_fresh", 23.0, 0], ["pinned_grow_only", 1.0, 2**20]]
    assert isinstance(table, pd.DataFrame)


def test_tables_fit_the_page_a_stage_split_reads_as_a_sum_and_empty_columns_go():
    import pandas as pd

    from stagelab.present import tables

    # Before: eighteen columns in notebook 04's decisive table, several of them all "NaN".
    split = {"device_ms": 1.5, "alloc_ms": 0.6, "copy_ms": 0.6, "host_gather_ms": 2.2,
             "free_ms": 0.01, "unattributed_ms": 0.59, "total_ms": 5.5}
    frame = pd.DataFrame([{"rows": 16, "vocab": 1000, "k": 5, "decision": "INCONCLUSIVE",
                           "speedup": None, "ci_low": None, "ci_high": None, "step_ms": 5.4,
                           **split}])
    shown = tables.readable(frame)
    assert list(shown.columns) == ["n (rows)", "V (vocabulary)", "K", "decision",
                                   "seed step, mean (ms)", tables.SPLIT_WORDS]
    assert shown.iloc[0, -1] == "1.50 + 0.60 + 0.60 + 2.20 + 0.01 + 0.59 = 5.50"


def test_the_verdict_states_its_context_in_the_report_and_older_verdicts_lack_it(tmp_path):
    run_dir = fake_run(tmp_path / "runs")
    words = ("Context: no device work before the step (forward_ms = 0: a CPU run, or the upper "
             "bound of the saving); delta = 2% of the decode step (forward + logprobs step); the "
             "log-softmax runs on the device.")
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "INCONCLUSIVE", "summary": "Undecided."},
         "decisive": [decisive_cell(16)], "context": {"words": words}}))
    assert f"<p class='context'>{words}</p>" in report.write_index(run_dir).read_text()
    note = "overlap: recommendation under queued: CLOSE, close (decided); waited: PORT."
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "CLOSE", "summary": "Closed."}, "decisive": [decisive_cell(16)],
         "context": {"words": words}, "conditions": {"overlap": {
             "column": "overlap_order", "decided": "queued", "values": ["queued"],
             "under": {}, "changes_answer": None, "flipped_cells": [], "words": "w",
             "note": note}}}))
    assert f"<p class='condition overlap'>{note}</p>" in report.write_index(run_dir).read_text()
    older = fake_run(tmp_path / "older")
    (older / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "INCONCLUSIVE", "summary": "Undecided."},
         "decisive": [decisive_cell(16)]}))
    assert "class='context'" not in report.write_index(older).read_text()


def test_the_origin_names_a_rehearsal_and_the_commit_its_source_matched():
    measured = {"host": "node", "gpu": None, "device": "cpu", "created_utc": "t", "status": "ok",
                "forced": False, "rehearsal": True,
                "source": {"tree": "ab" * 20, "matched_commit": "cd" * 20}}
    text = report.origin_text({"measured_on": measured, "analysed_on": {"host": "here"}})
    assert "(status ok, a CPU rehearsal);" in text
    assert text.endswith(" Its source is commit cdcdcdcdcdcd.")
    measured["source"] = {"tree": "ab" * 20, "matched_commit": None, "commit_env": "v1"}
    assert report.source_sentence(measured["source"]) == (
        " Its source (tree abababababab) matches no commit here (it names v1).")
    assert report.source_sentence(None) == ""
def test_the_report_shows_the_recommended_change_and_the_three_answers(tmp_path):
    run_dir = fake_run(tmp_path / "runs")
    answer = {"rows": 16, "vocab": 152064, "k": 5, "decision": "PORT", "speedup": 1.2,
              "ci_low": 1.1, "ci_high": 1.3}
    questions = {name: {"words": f"{name} words", "decision": decision, "baseline": "a",
                        "candidate": "b", "measured": True,
                        "cells": [{**answer, "decision": decision}]} for name, decision in
        (("bundle", "PORT"), ("reuse", "PORT"), ("pinning", "CLOSE"))}
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "PORT", "summary": "Ports."}, "decisive": [decisive_cell(16)],
         "recommendation": {"change": "port a reused pageable buffer", "reason": "why"},
         "questions": questions}))
    page = report.write_index(run_dir).read_text()
    assert "Recommended change: <b>port a reused pageable buffer</b>: why" in page
    assert ("<td>pinning words</td><td>CLOSE</td><td>n=16 V=152064 K=5: CLOSE 1.200x "
            "[1.100, 1.300]") in page
    older = fake_run(tmp_path / "older")
    (older / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "PORT", "summary": "Ports."}, "decisive": [decisive_cell(16)]}))
    assert "Recommended change" not in report.write_index(older).read_text()


def test_the_first_screen_shows_no_literal_backticks(tmp_path):
    """Before: a finding's Markdown `code` showed on the landing page with its backticks."""
    run_dir = fake_run(tmp_path / "runs")
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "CLOSE", "summary": "`seed_pinned` saves nothing."},
         "decisive": [decisive_cell(16)], "findings": ["The twin of `seed_pageable` <agrees>."]}))
    page = report.write_index(run_dir).read_text()
    box = page[page.index("<section class='verdict'"):page.index("</section>")]
    assert "`" not in box and "<code>seed_pinned</code> saves nothing." in box
    assert "<li>The twin of <code>seed_pageable</code> &lt;agrees&gt;.</li>" in box


def test_a_wide_table_is_shown_as_narrower_ones_that_repeat_which_row_it_is():
    """Before: notebooks 04 and 05 were 2,028 px wide at a 1,366 px screen (23 and 20 columns)."""
    import pandas as pd

    frame = pd.DataFrame([{"rows": n, "vocab": 1000, **{f"part_{i}_ms": float(i) for i in
                                                        range(20)}} for n in (16, 64)])
    shown = tables.show(frame)
    parts = -(-20 // (tables.MAX_COLUMNS - 2))  # 20 columns, each part led by n and V
    assert isinstance(shown, tables.SplitTable) and len(shown.parts) == parts
    heads = [list(part.data.columns) for part in shown.parts]
    assert all(head[:2] == ["n (rows)", "V (vocabulary)"] for head in heads)
    assert all(len(head) <= tables.MAX_COLUMNS for head in heads)
    assert sum(len(head) - 2 for head in heads) == 20
    assert shown._repr_html_().count("<table") == parts
    narrow = tables.show(frame.iloc[:, :8])
    assert not isinstance(narrow, tables.SplitTable)
