"""What a reviewer reads must not contradict itself: one colour per arm in every figure, one
statistic per claim (a finding quotes the numbers of the table and figure it comes from), and
tables without raw None, booleans or Markdown."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from matplotlib.colors import to_hex  # noqa: E402

from stagelab.analyse import prompt_analysis, timings  # noqa: E402
from stagelab.core import catalogue, schema  # noqa: E402
from stagelab.present import machine, plots, tables  # noqa: E402

V = 32_768


def _prompt_rows(arms: dict[str, dict[int, float]], rounds: int = 6, seed: int = 0,
                 prompt_rows: int = 1024) -> pd.DataFrame:
    """Prompt-logprob timings whose rounds are skewed (one slow round), so that each chunk's
    mean and median differ: a figure showing medians beside a sentence quoting means would not
    agree with it."""
    rng = np.random.default_rng(seed)
    skew = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.6])[:rounds]
    records = [dict(arm=arm, chunk=chunk, rows=prompt_rows, vocab=V,
                    overlap=arm.endswith(catalogue.OVERLAP_SUFFIX), dtype="float32", round=r,
                    seconds=ms * skew[r] * (1 + 0.01 * rng.standard_normal()) / 1e3)
               for arm, chunks in arms.items() for chunk, ms in chunks.items()
               for r in range(rounds)]
    return schema.make_rows(records)


def _line_colors(ax) -> dict[str, str]:
    """Each legend entry's colour in a seaborn axes."""
    legend = ax.get_legend()
    return {t.get_text(): to_hex(h.get_color()) for t, h in
            zip(legend.get_texts(), legend.legend_handles) if hasattr(h, "get_color")}


# ----------------------------------------------------------------------------------- colours

def test_every_catalogue_arm_has_its_own_colour_and_a_twin_a_lighter_one():
    names = [a.name for a in catalogue.ARMS] + [catalogue.prompt_arm(a.name, True)
                                                for a in catalogue.arms(catalogue.PROMPT)]
    colours = {name: plots.arm_color(name) for name in names}
    assert len(set(colours.values())) == len(set(names))  # no two arms share a colour
    assert plots.UNKNOWN_ARM_COLOR not in colours.values()
    twin = plots.arm_color(catalogue.aa_name("seed_pageable"))
    assert twin not in colours.values() and twin != plots.arm_color("seed_pageable")
    assert plots.arm_color("not-an-arm") == plots.UNKNOWN_ARM_COLOR


def test_an_arm_keeps_its_colour_across_figures_and_panels():
    # notebook 03's two time panels once coloured `fused` green on the left, blue on the right:
    # seaborn colours by position among the arms drawn, and the panels drew different arms
    frame = _prompt_rows({"fused": {64: 2.0, 256: 1.5, 1024: 1.4},
                          "fused+overlap": {64: 2.1, 256: 1.6, 1024: 1.4},
                          "logsoftmax": {64: 3.0, 256: 2.5, 1024: 2.4}})
    time_fig = plots.prompt_time(frame)
    left, right = (_line_colors(ax) for ax in time_fig.axes[:2])
    assert left["fused"] == right["fused"] == plots.arm_color("fused")
    assert left == right
    # another figure that shows only two of these arms, in another order
    only = frame[frame["arm"].isin(["logsoftmax", "fused"])].iloc[::-1]
    other = plots.prompt_time(only)
    assert _line_colors(other.axes[0])["fused"] == plots.arm_color("fused")
    assert _line_colors(other.axes[0])["logsoftmax"] == plots.arm_color("logsoftmax")


def test_the_copy_and_step_figures_colour_arms_from_the_palette():
    compared = pd.DataFrame([
        dict(rows=16, vocab=V, baseline="pageable_fresh", candidate=c, speedup=s, ci_low=s * 0.9,
             ci_high=s * 1.1, saved_ms=s) for c, s in (("pageable_reused", 1.4),
                                                        ("raw_ceiling", 2.0))])
    ax = plots.speedups(compared)
    handles, labels = ax.get_legend_handles_labels()
    found = {label: to_hex(handle[0].get_color()) for handle, label in zip(handles, labels)}
    assert found == {"pageable_reused": plots.arm_color("pageable_reused"),
                     "raw_ceiling": plots.arm_color("raw_ceiling")}
    bars = plots.saved_ms(compared)
    faces = {to_hex(p.get_facecolor()) for p in bars.patches if p.get_height()}
    assert faces == {plots.arm_color("pageable_reused"), plots.arm_color("raw_ceiling")}
    assert bars.get_ylabel() == "ms saved per call (mean)"  # compare's saved_ms is a mean


# -------------------------------------------------------------------- one statistic per claim

def test_the_chunk_recommendation_quotes_the_means_its_table_and_figure_show():
    frame = _prompt_rows({"fused+overlap": {64: 2.0, 256: 1.2, 1024: 1.0},
                          "fused": {64: 2.2, 256: 1.3, 1024: 1.1}})
    timed = timings.ok_timings(frame)
    means = timed.groupby(["arm", "chunk"])["seconds"].mean()
    assert not np.allclose(means, timed.groupby(["arm", "chunk"])["seconds"].median())
    rec = prompt_analysis.recommend_chunk(frame)
    table = prompt_analysis.prompt_time_relative(frame).set_index(["arm", "chunk"])
    arm = rec["arm"]
    assert rec["mean_seconds"] == pytest.approx(table.loc[(arm, rec["chunk"]), "mean_seconds"])
    assert rec["best_seconds"] == pytest.approx(table.loc[(arm, rec["best_chunk"]),
                                                          "mean_seconds"])
    # the sentence quotes the fastest time in ms, as the table shows it (3 significant digits)
    quoted = float(re.search(r"fastest \(([\d.]+) ms", rec["reason"]).group(1))
    shown = tables.readable(table.reset_index())
    column = next(c for c in shown.columns if c.startswith("mean"))
    row = shown[(shown["arm"] == arm) & (shown["chunk C (rows)"] == str(rec["best_chunk"]))]
    assert quoted == pytest.approx(float(row[column].iloc[0]), rel=5e-3)
    assert "mean" in column
    # the figure: the left panel's line for that arm is at the table's means, in ms
    fig = plots.prompt_time(frame)
    line = next(line for line in fig.axes[0].get_lines() if len(line.get_xdata()) == 3
                and to_hex(line.get_color()) == plots.arm_color(arm))
    drawn = dict(zip(line.get_xdata(), line.get_ydata()))
    assert drawn == pytest.approx({c: 1e3 * table.loc[(arm, c), "mean_seconds"]
                                   for c in (64, 256, 1024)})
    assert "mean" in fig.axes[0].get_ylabel() and "mean" in fig.axes[1].get_ylabel()


def test_the_overlap_table_uses_means_too():
    frame = _prompt_rows({"fused": {256: 2.0}, "fused+overlap": {256: 1.5}})
    out = prompt_analysis.overlap_effect(frame).set_index(["method", "chunk"])
    timed = timings.ok_timings(frame)
    means = timed.groupby("arm")["seconds"].mean()
    assert out.loc[("fused", 256), "plain_mean_s"] == pytest.approx(means["fused"])
    assert out.loc[("fused", 256), "overlap_saves_mean_ms"] == pytest.approx(
        1e3 * (means["fused"] - means["fused+overlap"]))


# --------------------------------------------------------------------------------- tables

def test_tables_show_no_raw_none_booleans_or_backticks():
    frame = pd.DataFrame({"arm": ["`fused`", "logsoftmax"], "noisy": [True, None],
                          "bitwise_equal": [1.0, 0.0], "n_rounds": [np.int64(2), np.int64(3)],
                          "note": ["see `x`", None]})
    shown = tables.readable(frame)
    cells = shown.to_numpy().ravel().tolist()
    assert not any(c in ("None", "True", "False", "nan") for c in cells)
    assert not any("`" in c for c in cells)
    assert shown.iloc[0].tolist() == ["fused", "yes", "yes", "2", "see x"]
    assert shown.iloc[1].tolist() == ["logsoftmax", "", "no", "3", ""]


def test_the_machine_table_says_sizes_and_missing_values_in_words():
    rows = machine.readable_rows({"host": {"memory_total_bytes": 2 * 2**30, "cpu_model": None},
                                  "torch": {"cuda_available": False}})
    assert ("host", "memory total", "2.0 GiB") in rows
    assert ("host", "cpu model", "not reported") in rows
    assert ("torch", "cuda available", "no") in rows


def test_the_machine_table_gives_each_size_in_its_unit_and_no_dotted_keys():
    """Before: the report showed a 4096-byte page as "0.0 GiB", a 256 MiB buffer as 268435456
    and keys such as "fresh fill.stages.zero fill.seconds"."""
    rows = machine.readable_rows({"machine": {"fresh_fill": {
        "bytes": 2**28, "page_bytes": 4096, "refill_gbps": 31.1,
        "stages": {"zero_fill": {"seconds": 0.052112, "minor_faults": 65560}}}}})
    assert [row for row in rows if row[0] == "machine"] == [
        ("machine", "fresh fill, size", "256.0 MiB"),
        ("machine", "fresh fill, page", "4 KiB"),
        ("machine", "fresh fill, refill (GB/s)", "31.1"),
        ("machine", "fresh fill, zero fill, time", "52.1 ms"),
        ("machine", "fresh fill, zero fill, minor faults", "65560")]


# ------------------------------------------------------------------------- captions in words

def test_every_figure_a_notebook_saves_has_a_caption_in_words():
    import json

    from stagelab.core import paths
    from stagelab.present import report

    saved = []
    for notebook in sorted(paths.NOTEBOOKS_DIR.glob("*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
                       if c["cell_type"] == "code")
        saved += [f"figures/{notebook.stem}_{name}.png"
                  for name in re.findall(r'save_figure\([^"]*"(\w+)"\)', code)]
    assert len(saved) >= 10
    for figure in saved:
        assert figure.removeprefix("figures/").removesuffix(".png") in report.FIGURE_CAPTIONS
        caption = report.figure_caption(figure)
        assert "figures/" not in caption and ".png" not in caption and "_" not in caption, caption
    assert report.figure_caption("figures/01_d2h_staging_new_one.png") == (
        "New one, from notebook 01_d2h_staging")


def test_the_landing_page_captions_figures_in_words(tmp_path):
    from stagelab.present import report

    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "03_prompt_logprobs_time.png").write_bytes(b"png")
    (tmp_path / "manifest.json").write_text('{"run_id": "r", "status": "ok", "notebooks": []}')
    page = report.write_index(tmp_path).read_text()
    caption = re.search(r"<figcaption class='muted'>(.*?)</figcaption>", page).group(1)
    assert caption == report.FIGURE_CAPTIONS["03_prompt_logprobs_time"]
    assert "figures/" not in caption


def test_the_speedup_figure_says_why_it_is_empty():
    ax = plots.speedups(pd.DataFrame())
    assert len(ax.texts) == 1 and "No pair of arms" in ax.texts[0].get_text()  # why, no bars
    assert not ax.patches


def test_a_whole_number_in_a_unit_column_is_still_converted():
    # an int of bytes is MiB like any other (the counts rule is for columns of no known unit)
    shown = tables.readable(pd.DataFrame({"peak_host_bytes": [np.int64(2**20 * 3)],
                                          "seconds": [np.int64(2)], "samples": [np.int64(7)]}))
    assert shown.iloc[0].tolist() == ["3.00", "2000", "7"]
    assert list(shown.columns) == ["peak host (MiB)", "seconds (ms)", "samples"]


def test_a_low_and_high_pair_reads_as_one_range_where_the_low_one_was():
    shown = tables.readable(pd.DataFrame({
        "name": ["a", "b"], "predicted_ms": [1.0, 2.0], "low_ms": [0.5, None],
        "high_ms": [1.5, 3.0], "saving_low_ms": [0.25, 0.1], "saving_high_ms": [0.75, 0.2],
        "margin_high_ms": [1.0, 2.0], "flow_ms": [4.0, 5.0]}))
    assert list(shown.columns) == ["name", "predicted (ms)", "model's interval (ms)",
                                   "saving interval (ms)", "margin high (ms)", "flow (ms)"]
    assert shown.iloc[0].tolist()[2:4] == ["0.500 – 1.50", "0.250 – 0.750"]
    assert shown.iloc[1, 2] == ""  # a missing end leaves the range empty, not half a range


def test_the_prediction_check_is_a_table_per_level_in_reading_order_the_ratio_not_in_ms():
    from stagelab.analyse import predict_check

    def entry(name, **extra):
        return {"name": name, "predicted_ms": 2.0, "low_ms": 1.0, "high_ms": 3.0,
                "measured_ms": 2.5, "error": -0.2, "outside": False, **extra}

    cell = {"rows": 2, "vocab": 1000, "k": 2, "stages": [entry("copy")],
            "arms": [entry("seed_pageable")], "questions": [entry("reuse", error_ms=-0.5)],
            "reuse_ratio": {"predicted": 1.1, "low": 1.0, "high": 1.2, "measured": 1.05,
                            "error": 0.05, "outside": False}}
    check = {"cells": [{key: cell[key] for key in sorted(cell)}]}  # as verdict.json sorts them
    assert list(predict_check.check_table(check).columns) == [
        "rows", "vocab", "k", "level", "name", "predicted_ms", "low_ms", "high_ms",
        "measured_ms", "error", "outside", "error_ms"]
    titled = predict_check.check_tables(check)
    assert list(titled) == [predict_check.LEVEL_TITLES[level]
                            for level in ("stage", "arm", "question", "ratio")]
    assert "error_ms" not in titled[predict_check.LEVEL_TITLES["stage"]]  # only a saving has it
    ratio = tables.readable(titled[predict_check.LEVEL_TITLES["ratio"]])
    assert not [c for c in ratio.columns if "(ms)" in c], list(ratio.columns)
    html = tables.sections(titled).to_html()
    assert html.count("<h4>") == 4 and html.count("<table") == 4


def test_the_key_plot_draws_a_lever_shown_for_context_in_its_arm_colour():
    lever = {"rows": 64, "vocab": V, "k": 5, "candidate": "seed_pageable_reused",
             "speedup": 1.4, "ci_low": 1.3, "ci_high": 1.5}
    ax = plots.verdict_key({"decisive": [{"rows": 64, "vocab": V, "k": 5, "speedup": None,
                                          "reason": "not measured"}], "step_levers": [lever]})
    drawn = {to_hex(line.get_color()) for line in ax.get_lines() if len(line.get_xdata()) == 1}
    assert drawn == {plots.arm_color("seed_pageable_reused")}


# ------------------------------------------------------------- plots that match their captions

def _memory_rows() -> pd.DataFrame:
    records = [dict(arm=arm, chunk=chunk, rows=1024, vocab=V, dtype="float32",
                    metric=metric, bytes=int(factor * chunk * V * 4), status="ok")
               for arm in ("fused", "fused+overlap") for chunk in (64, 256)
               for metric, factor in (("peak_host_bytes", 1.1), ("predicted_peak_bytes", 1.0))]
    return schema.make_rows(records)


def test_the_memory_plot_draws_measured_solid_and_the_model_dashed_for_every_arm():
    """Before: the model was drawn solid and the measurement dashed (the docs say the opposite),
    the overlapped arm had no model line, and the legend read predicted_peak and peak_host."""
    ax = plots.prompt_memory(_memory_rows())
    lines = {(to_hex(line.get_color()), line.get_linestyle()) for line in ax.get_lines()}
    for arm in ("fused", "fused+overlap"):
        assert {(plots.arm_color(arm), "-"), (plots.arm_color(arm), "--")} <= lines
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["fused", "fused+overlap", "measured", "model"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "256"]  # ticks at the chunks
    assert "solid" in report_caption("03_prompt_logprobs_memory")


def report_caption(stem: str, gpu: bool = True) -> str:
    from stagelab.present import report

    return report.figure_caption(f"figures/{stem}.png", gpu)


def test_a_figure_without_data_is_a_sentence_and_legends_name_a_twin_in_words(tmp_path):
    """Before: an empty framed box said "NVMLError_LibraryNotFound"; a legend read
    seed_pageable~aa; the bandwidth caption named a PCIe line a CPU run does not draw."""
    from stagelab.run import context

    empty = schema.make_rows([dict(arm="pageable_fresh", metric="pcie_tx_bytes_per_s",
                                   status="unavailable", note="NVMLError_LibraryNotFound")])
    figure = plots.pcie(empty).figure
    assert plots.empty_reason(figure) == "PCIe throughput not measured: NVMLError_LibraryNotFound"
    assert plots.empty_reason(plots.prompt_memory(_memory_rows()).figure) is None
    ctx = context.notebook_context("01_d2h_staging", tmp_path)
    ctx.save_figure(figure, "pcie")
    assert not (tmp_path / "figures" / "01_d2h_staging_pcie.png").exists()
    compared = pd.DataFrame([dict(rows=16, vocab=V, baseline="seed_pageable",
                                  candidate="seed_pageable~aa", speedup=1.0, ci_low=0.99,
                                  ci_high=1.01, saved_ms=0.0)])
    labels = plots.speedups(compared).get_legend_handles_labels()[1]
    assert labels == ["seed_pageable (A/A twin)"]
    assert "dashed" not in report_caption("01_d2h_staging_bandwidth", gpu=False)
    assert "dashed: the PCIe link" in report_caption("01_d2h_staging_bandwidth")


def test_a_saved_figure_is_drawn_once_and_shown_as_the_very_png_saved(tmp_path, monkeypatch):
    """Before: the PNG was saved, and the inline backend drew the open figure again at the
    cell's end (a second render: 1.6 s of notebook 05's prediction figure on this machine)."""
    import IPython.display
    import matplotlib.pyplot as plt

    from stagelab.run import context

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objects: shown.extend(objects))
    figure = plots.prompt_memory(_memory_rows()).figure
    context.notebook_context("03_prompt_logprobs", tmp_path).save_figure(figure, "memory")
    saved = (tmp_path / "figures" / "03_prompt_logprobs_memory.png").read_bytes()
    assert [type(item).__name__ for item in shown] == ["Image"] and shown[0].data == saved
    # before: a notebook's figures had no alt text in its page; the caption is the alt text
    assert shown[0].metadata["alt"] == report_caption("03_prompt_logprobs_memory")
    assert saved.startswith(b"\x89PNG") and figure.number not in plt.get_fignums()


def test_a_rate_column_reads_gb_per_s_and_a_filtered_frame_shows_no_index_column():
    """Before: the one-pass table's header read "read gb per (ms)" (a ``*_gb_per_s`` column
    taken for seconds) and notebook 05's filtered tables showed a leaked ``index`` column."""
    frame = pd.DataFrame({"rows": [1, 2, 3], "read_gb_per_s": [1234.5, 2.0, 3.0],
                          "pinned_gbps": [50.0, 51.0, 52.0]})
    shown = tables.readable(frame[frame["rows"] > 1])
    assert list(shown.columns) == ["n (rows)", "read (GB/s)", "pinned (GB/s)"]
    assert list(shown["read (GB/s)"]) == ["2.00", "3.00"]
    named = tables.readable(frame.set_index("rows"))
    assert list(named.columns)[0] == "n (rows)"  # a named index is a column


def test_stages_are_named_in_words_in_every_table():
    """Before: the prediction tables named stages device/alloc/host_gather beside tables and
    legends that say log-softmax/zero-fill/host top-K."""
    frame = pd.DataFrame({"name": ["device", "alloc", "host_gather", "seed_pinned"],
                          "dominant_term": ["copy", "free", "alloc", "copy"],
                          "device_ms": [1.0, 2.0, 3.0, 4.0]})
    shown = tables.readable(frame)
    assert list(shown["name"]) == ["log-softmax", "zero-fill", "host top-K", "seed_pinned"]
    assert list(shown["dominant term"]) == ["copy", "free", "zero-fill", "copy"]
    assert "log-softmax (ms)" in shown.columns
    raw = set(catalogue.STAGES) - set(catalogue.STAGE_WORDS.values())
    assert not raw & set(shown.to_numpy().ravel()), raw


def test_a_notebook_figure_keeps_its_alt_text_in_the_exported_page(tmp_path):
    """Before: 10 of a quick run's 20 images (every notebook figure) had no alt text."""
    import base64

    import nbformat

    from stagelab.present import report

    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
    output = nbformat.v4.new_output("display_data", data={"image/png": png},
                                    metadata={"image/png": {"alt": "Where the step goes"}})
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[output])])
    path = tmp_path / "nb.ipynb"
    nbformat.write(notebook, str(path))
    images = re.findall(r"<img\b[^>]*>", report.notebook_body(path))
    assert len(images) == 1 and 'alt="Where the step goes"' in images[0], images


def test_a_memory_goal_is_met_whatever_the_timings_and_a_timing_goal_says_its_trust():
    """Before: memory goals read "met on untrustworthy timings", though memory is no timing; and
    in JupyterLab a timing goal on a busy machine read plain "met"."""
    goals = pd.DataFrame([
        {"goal": "fused peak extra memory, chunk 512", "target": "<= 1.10 x", "measured": "1.0 x",
         "status": "met", "note": ""},
        {"goal": "chunked time, chunk 512", "target": "<= 1.05 x", "measured": "1.01 x",
         "status": "met", "note": ""}])
    untrusted = tables.show(goals, untrusted=True).to_html()
    assert untrusted.count(">met on untrustworthy timings<") == 1
    assert re.search(r">\s*met\s*<", untrusted)  # the memory goal's own
    trusted = tables.show(goals).to_html()
    assert trusted.count(tables.GOAL_MET_CLASS) == 1  # only the timing goal is qualified later


def test_a_goals_table_says_under_it_what_a_met_timing_goal_rests_on():
    """Issue 45: in JupyterLab goals said "met" with no trust qualifier; the goals table now
    carries its caption wherever it shows, and other tables none."""
    goals = pd.DataFrame([{"goal": "chunked time, chunk 512", "target": "<= 1.05 x",
                           "measured": "1.01 x", "status": "met", "note": ""}])
    assert "<caption>" in tables.show(goals).to_html()
    assert tables.GOALS_CAPTION in tables.show(goals).to_html()
    assert "not trustworthy" in tables.show(goals, untrusted=True).to_html()
    assert "<caption>" not in tables.show(pd.DataFrame({"rows": [1]})).to_html()


def test_a_long_table_is_folded_under_a_line_that_counts_its_rows():
    """Notebook 05's page was 35,000 px tall with 116-row tables: a table past FOLD_ROWS is
    folded in a <details>, every row still in it."""
    long = pd.DataFrame({"rows": range(tables.FOLD_ROWS + 1)})
    folded = tables.show_folded(long, "Every flip").to_html()
    assert folded.startswith("<details class='folded'><summary>Every flip: "
                             f"{tables.FOLD_ROWS + 1} rows (click to open)</summary>")
    assert folded.count("<tr>") == tables.FOLD_ROWS + 2  # the header and every row
    short = tables.show_folded(long.head(tables.FOLD_ROWS), "Every flip").to_html()
    assert "<details" not in short
