"""The report's first screen reads at a glance: no placeholder cells, no repeated reasons, a stage
split whose parts add up to the total."""

from __future__ import annotations

import json
import re

from conftest import fake_run
from stagelab.present import next_step, report, tables

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
    assert tables.SPLIT_WORDS.split(": ", 1)[1] in box  # the parts, named in their order
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
    for forward_ms, shown in (([3.2], True), ([0.0], False)):
        # before: the overlap order's paragraph (the seed's sampler.cpp lines) headed the first
        # screen of a CPU run, which queues no forward; it is folded, and only with a forward
        (run_dir / "verdict.json").write_text(json.dumps(
            {"overall": {"decision": "CLOSE", "summary": "Closed."},
             "decisive": [decisive_cell(16)],
             "context": {"words": words, "forward_ms": forward_ms},
             "conditions": {"overlap": {
                 "column": "overlap_order", "decided": "queued", "values": ["queued"],
                 "under": {}, "changes_answer": None, "flipped_cells": [], "words": "w",
                 "note": note}}}))
        page = report.write_index(run_dir).read_text()
        assert (f"<p class='condition overlap'>{note}</p>" in page) is shown
        assert page.index("<details id='context'>") > page.index("<table id='decisive'>")
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
    said = report.source_sentence(measured["source"])
    assert "tree abababababab" in said and "no commit" in said and "v1" in said
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
    change = "port a reused pageable buffer"
    assert f"<b>{change}</b>: why" in page  # the change, then its reason
    assert "<td>pinning words</td><td>CLOSE</td>" in page  # each question's answer
    assert "n=16 V=152064 K=5: CLOSE 1.200x [1.100, 1.300]" in page  # and each cell's
    reason = "the Holm-level bound 1.01 is below"
    held = {**questions["reuse"], "decision": "INCONCLUSIVE", "cells": [
        {**answer, "decision": "INCONCLUSIVE", "reason": reason}]}
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "INCONCLUSIVE", "summary": "Held."},
         "decisive": [decisive_cell(16)], "questions": {"reuse": held},
         "recommendation": {"change": "INCONCLUSIVE", "reason": "why"}}))
    assert (f"INCONCLUSIVE 1.200x [1.100, 1.300] ({reason})"
            in report.write_index(run_dir).read_text())  # before: the reason only in the json
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


def _answer(platform: str, rows: int, host: str, decision: str, low: float = 1.0,
            high: float = 3.0) -> dict:
    return {"platform": platform, "rows": rows, "vocab": 152064, "k": 5, "question": "bundle",
            "host": host, "decision": decision, "saving_ms": (low + high) / 2,
            "saving_low_ms": low, "saving_high_ms": high, "bar_ms": 0.3, "bar_low_ms": 0.2,
            "bar_high_ms": 0.4}


PREDICTED = {"answers": [
    _answer("H200", 16, "host class x86 bare metal", "depends on pageable_gbps", 0.1, 3.2),
    _answer("H200", 16, "host class x86 VM", "depends on pageable_gbps", 0.1, 5.2),
    _answer("H200", 64, "host class x86 bare metal", "PORT", 1.15, 23.2),
    _answer("H200", 64, "host class x86 VM", "PORT", 1.15, 31.3),
    _answer("L4", 64, "host class x86 bare metal", "PORT"),
    _answer("L4", 64, "host class x86 VM", "CLOSE"),
    _answer("H200", 64, "this host", "CLOSE", 0.0, 0.1),  # this run's host: never a platform's
]}


def test_an_undecided_first_screen_gives_each_platforms_predicted_answer_and_the_command(tmp_path):
    """Before: an INCONCLUSIVE run named no next step; the H200 answer was only in the CLI."""
    run_dir = fake_run(tmp_path / "runs")
    (run_dir / "prediction.json").write_text(json.dumps(PREDICTED))
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "INCONCLUSIVE", "summary": "No GPU."},
         "decisive": [decisive_cell(16), decisive_cell(64)],
         "questions": {"bundle": {"words": "bundle", "decision": None, "cells": [],
                                  "baseline": "a", "candidate": "b", "measured": False},
                       "reuse": {"words": "reuse alone", "decision": "INCONCLUSIVE",
                                 "cells": [], "baseline": "a", "candidate": "c",
                                 "measured": True}}}))
    page = report.write_index(run_dir).read_text()
    block = page[page.index("<div id='next-step'>"):page.index("<table id='decisive'>")]
    assert "reuse alone: INCONCLUSIVE" in block  # the answer measured instead
    assert "Not measured: bundle." in block
    assert "predicted, not measured" in block and "stagelab predict --profile quick" in block
    rows = dict(re.findall(r"<tr><td>([^<]+)</td>(.*?)</tr>", block))
    assert set(rows) == {"H200", "L4"}
    assert "pageable_gbps" in rows["H200"] and "0.1-5.2 ms" in rows["H200"]
    assert "PORT: saves 1.15-31.3 ms" in rows["H200"]  # the VM's wider range: CLOSE never
    assert "PORT on x86 bare metal" in rows["L4"] and "CLOSE on x86 VM" in rows["L4"]
    assert "does not fit: not predicted" in rows["L4"]  # L4 has no n=16 answer
    assert f"<code>{next_step.CONFIRM}</code>" in block
    lines = next_step.terminal_lines(run_dir, json.loads((run_dir / "verdict.json").read_text()),
                                     "quick")
    assert len(lines) == 2 and next_step.CONFIRM in lines[1]
    assert "PORT at n=64 on H200" in lines[0] and "not measured" in lines[0]


def test_a_decided_run_is_set_beside_its_platforms_prediction(tmp_path):
    run_dir = fake_run(tmp_path / "runs")
    (run_dir / "prediction.json").write_text(json.dumps(PREDICTED))
    verdict = {"overall": {"decision": "PORT", "summary": "Port."},
               "hardware": {"gpu": "NVIDIA H200"}, "decisive": [decisive_cell(64)]}
    (run_dir / "verdict.json").write_text(json.dumps(verdict))
    page = report.write_index(run_dir).read_text()
    assert "Measured <b>PORT</b>" in page and re.search(r"H200 .*n=64 V=152,064 K=5: PORT", page)
    assert "id='next-step'" not in page and next_step.terminal_lines(run_dir, verdict, "x") == []
    assert next_step.platform_of("NVIDIA H100 80GB HBM3", ["H100 SXM", "H200"]) == "H100 SXM"


def test_the_front_page_shows_few_short_findings_that_bear_on_the_decision(tmp_path):
    """Before: 16 dense bullets on the front page, one of 9 lines on glibc's mmap threshold."""
    findings = [
        "Seed's step at n=16, V=152064, K=5: 110.49 ms on average, made of the queued forward "
        "0.00, log-softmax 58.92, zero-filled vector 5.21, copy 20.55, host top-K (C++) 25.43, "
        "free 0.05 and unattributed 0.33 ms (time outside the timed stages).",
        "Zero-fill of the seed's fresh vector at n=64: 91.99 ms per step (CI 35.01-157.04); the "
        "vector is 37.1 MiB, above glibc's largest mmap threshold. More on glibc follows.",
        "Reuse lever at step level at n=64, V=152064, K=5: 1.07x (CI [0.95, 1.19]), 38.12 ms "
        "per step.", *[f"Host top-K finding {i}: 2.0x." for i in range(12)]]
    shown = report.front_findings(findings)
    assert len(shown) == report.FRONT_FINDINGS
    assert shown[0].startswith("Reuse lever") and shown[1].startswith("Seed's step")
    assert all(len(f) <= report.FRONT_CHARS + 2 and re.search(r"\d", f) for f in shown)
    assert report.first_sentence(findings[1]) == (
        "Zero-fill of the seed's fresh vector at n=64: 91.99 ms per step (CI 35.01-157.04).")
    run_dir = fake_run(tmp_path / "runs")
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "INCONCLUSIVE", "summary": "Undecided."},
         "decisive": [decisive_cell(16)], "findings": findings}))
    page = report.write_index(run_dir).read_text()
    listed = page[page.index("<ul id='findings'>"):page.index("</ul>", page.index("id='findings'"))]
    assert listed.count("<li>") == report.FRONT_FINDINGS and "mmap" not in listed
    assert "(15): <a href='04_verdict.html'>" in page  # every finding, on notebook 04's page


def test_the_chunk_question_is_answered_on_the_first_screen_and_in_the_terminal(tmp_path):
    """Before: the second question (which prompt-logprobs chunk) was answered only in notebook
    03's page; the first screen and the terminal's last lines say it, or why there is none."""
    from stagelab.cli import next_step_lines

    held = {"arm": "fused", "chunk": None, "reason": "no recommendation: the timings are not "
            "trustworthy (a busy machine); what would give one: a quiet machine"}
    run_dir = fake_run(tmp_path / "runs")
    verdict = {"overall": {"decision": "INCONCLUSIVE", "summary": "No GPU."},
               "decisive": [decisive_cell(16)], "prompt_logprobs": {"recommendation": held}}
    (run_dir / "verdict.json").write_text(json.dumps(verdict))
    page = report.write_index(run_dir).read_text()
    said = page[page.index("<p id='chunk'>"):]
    said = said[:said.index("</p>")]
    assert "No recommended chunk (fused)" in said and "a quiet machine" in said
    assert "href='03_prompt_logprobs.html'" in said
    lines = next_step_lines(run_dir, {"profile": "quick"})
    assert lines[-1].startswith("prompt chunk: No recommended chunk (fused): ")
    verdict["prompt_logprobs"]["recommendation"] = {"arm": "fused", "chunk": 512, "reason": "why"}
    verdict["overall"]["decision"] = "CLOSE"
    (run_dir / "verdict.json").write_text(json.dumps(verdict))
    (line,) = next_step_lines(run_dir, {})
    assert line.startswith("prompt chunk: ") and line.endswith("512 (fused): why.")
    del verdict["prompt_logprobs"]
    (run_dir / "verdict.json").write_text(json.dumps(verdict))
    assert next_step_lines(run_dir, {}) == []
    assert "id='chunk'" not in report.write_index(run_dir).read_text()


def test_the_reuse_lever_is_quoted_once_and_an_unmeasured_question_says_so(tmp_path):
    """Before (issue 45): the front page quoted the reuse lever's CI three times (the questions
    table, its reason restating it, a finding with another CI), and a question not measured
    read "n=2 V=1000 K=2: INCONCLUSIVE" per cell, as if it had been."""
    cell = {"rows": 16, "vocab": 152064, "k": 5}
    straddles = {**cell, "decision": "INCONCLUSIVE", "speedup": 2.902, "ci_low": 0.123,
                 "ci_high": 116.062, "reason": "speedup 2.902x (95% CI [0.123, 116.062]) "
                 "straddles the minimum 1.020x: more rounds or less noise are needed to tell"}
    questions = {
        "bundle": {"words": "bundle words", "decision": None, "measured": False,
                   "baseline": "a", "candidate": "b",
                   "cells": [{**cell, "decision": "INCONCLUSIVE", "reason": "not measured"}]},
        "reuse": {"words": "reuse words", "decision": "INCONCLUSIVE", "measured": True,
                  "baseline": "a", "candidate": "c", "cells": [straddles]}}
    run_dir = fake_run(tmp_path / "runs")
    findings = ["Reuse lever at step level at n=16, V=152064, K=5: 2.90x (CI [0.35, 106.93]).",
                "Seed's step at n=16, V=152064, K=5: 5.25 ms on average."]
    (run_dir / "verdict.json").write_text(json.dumps(
        {"overall": {"decision": "INCONCLUSIVE", "summary": "Held."},
         "decisive": [decisive_cell(16)], "questions": questions, "findings": findings,
         "recommendation": {"change": "INCONCLUSIVE", "reason": "why"}}))
    page = report.write_index(run_dir).read_text()
    assert "<td>bundle words</td><td>not measured</td>" in page
    assert "n=16 V=152064 K=5: not measured" in page
    assert page.count("0.123") == 1 and "straddles the minimum 1.020x" in page
    listed = page[page.index("<ul id='findings'>"):]
    assert "Reuse lever" not in listed[:listed.index("</ul>")]
    assert "n=16, V=152064, K=5: 5.25 ms" in listed[:listed.index("</ul>")]
