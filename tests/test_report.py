"""The report's first screen reads at a glance: no placeholder cells, no repeated reasons, a stage
split whose parts add up to the total."""

from __future__ import annotations

import json
import re

from stagelab import report
from test_runner import fake_run

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
    from stagelab import plots

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

    from stagelab import analysis, plots

    base = {"rows": 16, "vocab": 1000, "k": 5}
    parts = pd.DataFrame([
        {**base, "arm": "seed_pageable", **{s: 1e-3 for s in analysis.SPLIT}, "total": 6e-3},
        {**base, "arm": "fused", **{s: 0.0 for s in analysis.SPLIT}, "device": 60e-3,
         "total": 60e-3}])
    ax = plots.stage_bars(parts).axes[0]
    assert ax.get_ylim()[1] == plots.CLIP_OVER_BASELINE * 6.0
    assert [t.get_text() for t in ax.texts] == ["↑60"]
