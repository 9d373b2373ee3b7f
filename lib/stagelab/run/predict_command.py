"""``stagelab predict``: the verdict's three answers per GPU platform and decisive cell, before
any lease, from the cost model (:mod:`stagelab.analyse.predict_model`).

The host rates are, by default, those of each platform's usual hosts (``data/hosts.csv``, the
platform's ``host_classes``): nothing is measured here, so two calls print the same answers, and
every answer names the host it assumed and whether it flips across the host range. ``--host``
names one class, or ``this`` (this machine, measured now at the decisive cells' sizes, its load
watched as the timing notebooks watch it); ``--rates`` reads a folder that recorded them (a run
folder, a kept run or a ``stagelab measure`` folder). The GPU terms come from
``data/platforms.csv``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from stagelab.analyse import predict_model, predict_study, predict_tables, roofline
from stagelab.analyse.predict_study import host_choice, model_table, predictions
from stagelab.core import catalogue, forward, schema
from stagelab.core.errors import UserError
from stagelab.run import profiles


def decisive_cells(profile: str) -> list[predict_tables.Cell]:
    """The profile's decisive cells (its verdict notebook's rows x models x K), each with its
    model's forward dimensions."""
    values = profiles.profile_parameters(profile).get(catalogue.VERDICT_NOTEBOOK)
    if values is None:
        raise UserError(f"profile {profile!r} has no {catalogue.VERDICT_NOTEBOOK}: "
                        "no decisive cells")
    shapes = model_table()
    cells = []
    for model in values["decisive_models"]:
        vocab, dims = (shapes[model] if isinstance(model, str) and model in shapes
                       else (int(model), None))
        cells += [predict_tables.Cell(n, vocab, k, dims) for n in values["decisive_rows"]
                  for k in values["decisive_ks"]]
    return cells


def rates_measured_here(cells: list[predict_tables.Cell]) -> tuple[predict_tables.HostRates, str]:
    """The host rates of this machine, measured now at the cells' sizes (torch, no GPU), with
    the machine's load watched as the timing notebooks watch it: busy is said, never hidden."""
    from stagelab.measure import busy, hostrates

    rows = []
    with busy.LoadWatch() as watch:
        for rows_, vocab in sorted({(c.rows, c.vocab) for c in cells}):
            rows += hostrates.measure_rates(rows_, vocab, max(c.k for c in cells), repeats=3)
    return (predict_tables.host_rates(schema.make_rows(rows), origin="this machine, measured now"),
            f"host rates measured on this machine now (repeats=3 per size; {load_words(watch.summary)})")


def load_words(summary: Mapping[str, Any] | None) -> str:
    """The load while this machine was measured, in words: busy (and why), quiet, or unknown."""
    if not summary or summary.get("busy") is None:
        return "load unknown: " + str((summary or {}).get("unavailable") or "not read")
    if summary["busy"]:
        return ("BUSY while measured, so the host terms are inflated: "
                + "; ".join(summary["why"]))
    return f"quiet while measured (load average at most {summary['load_avg_max']:.2f})"


def across_hosts(answers: list[Mapping[str, Any]]) -> str:
    """One question's answers on several hosts in words (:func:`predict_study.across_hosts`),
    naming the hosts where every one gives the same."""
    decisions = {a["host"]: a["decision"] for a in answers}
    said = predict_study.across_hosts(decisions)
    return (f"{said} on every host ({', '.join(decisions)})" if len(set(decisions.values())) == 1
            else said)


NEAR_FLIP = 2.0  # the command prints flips within this factor of a knob's range (all in nb 05)
LINK_KNOBS = ("pinned_gbps", "pageable_gbps")  # unmeasured on most platforms: flips always shown


def flip_words(cell: Mapping[str, Any], question: str) -> list[str]:
    """The knobs whose flip value lies within :data:`NEAR_FLIP` of their range, and the link's
    wherever it flips (a decade either side), in words."""
    return [predict_model.sensitivity_words(row) for row in cell["sensitivity"]
            if row["question"] == question and row["flips_at"] is not None
            and (row["knob"] in LINK_KNOBS
                 or row["low"] / NEAR_FLIP <= row["flips_at"] <= row["high"] * NEAR_FLIP)]


def _ms(low: float, high: float) -> str:
    return f"[{low:.3g}, {high:.3g}] ms"


def format_platform(entry: Mapping[str, Any]) -> str:
    """One platform's prediction in plain lines: per cell, each host's arms and answers (with
    the host named where there are several), the answers across the host range, the flips."""
    p: predict_tables.Platform = entry["platform"]
    several = len(entry.get("hosts") or []) > 1
    lines = [f"{p.name}: {p.link}; pinned D2H {p.pinned_gbps[0]:.3g}-{p.pinned_gbps[1]:.3g} "
             f"GB/s, pageable {p.pageable_gbps[0]:.3g}-{p.pageable_gbps[1]:.3g} GB/s, HBM "
             f"{p.hbm_gbps:g} GB/s, {p.memory_gb:g} GB; hosts: {', '.join(entry.get('hosts') or [])}"]
    by_cell: dict[tuple[int, int, int], list[Mapping[str, Any]]] = {}
    for cell in entry["cells"]:
        by_cell.setdefault((cell["rows"], cell["vocab"], cell["k"]), []).append(cell)
    for (rows, vocab, k), predicted in by_cell.items():
        if not predicted[0]["fits"]:
            lines.append(f"  n={rows} V={vocab} K={k}: {predicted[0]['notes'][0]}")
            continue
        lines.append(f"  n={rows} V={vocab} K={k}:")
        lines += [line for cell in predicted for line in _cell_lines(cell, several)]
        if several:
            for question in predict_model.QUESTIONS:
                answers = [a for c in predicted for a in c["answers"] if a["question"] == question]
                lines.append(f"    across hosts: {question} {across_hosts(answers)}")
    for c in entry["crossings"]:
        sure = f"{c['port_from_nv']:,}" if c["port_from_nv"] else "never in the scan"
        maybe = f"{c['may_port_from_nv']:,}" if c["may_port_from_nv"] else "never in the scan"
        on = f", {c['host']}" if several else ""
        lines.append(f"  crossing ({c['question']}, V={c['vocab']}{on}): PORT for sure from n x V "
                     f"= {sure}; possibly from {maybe} (scanned {c['scanned_nv'][0]:,}-"
                     f"{c['scanned_nv'][1]:,})")
    return "\n".join(lines)


_LEVEL_WORD = {"arm": "step ", "question": "saving ", "stage": ""}


def _cell_lines(cell: Mapping[str, Any], several: bool) -> list[str]:
    on = f" ({cell['host']})" if several else ""
    lines = [f"    {arm:22} {a['mid_ms']:8.3f} ms {_ms(a['low_ms'], a['high_ms'])}{on}"
             for arm, a in cell["arms"].items()]
    for ans in cell["answers"]:
        lines.append(
            f"    {ans['question']:8} {ans['decision']:28} saving {ans['saving_ms']:.3g} ms "
            f"{_ms(ans['saving_low_ms'], ans['saving_high_ms'])} vs bar "
            f"{ans['bar_ms']:.3g} ms {_ms(ans['bar_low_ms'], ans['bar_high_ms'])}; "
            f"dominating term: {ans['dominant_term']}{on}")
        flips = flip_words(cell, ans["question"])
        if flips:
            lines.append(f"      sensitivity ({ans['question']}): {'; '.join(flips)}")
    lines.append(f"    falsified if a measured step or saving lies outside{on}: "
                 + "; ".join(f"{f['name']} {_LEVEL_WORD[f['level']]}"
                             f"{_ms(f['low_ms'], f['high_ms'])}"
                             for f in cell["falsification"]["figures"] if f["level"] != "stage"))
    lines += [f"    note: {note}" for note in cell["notes"]]
    return lines


def regime_lines(rates: predict_tables.HostRates | None) -> str:
    """The fresh vector's regime at each measured size, one line each (nothing for a class)."""
    lines: list[str] = []
    if rates is None:
        return ""
    for row in predict_tables.host_table(rates).to_dict("records"):
        if "regime" in row:
            lines.append(f"host: {row['bytes'] / 1e6:.1f} MB fresh vector "
                         f"{row['fresh_vector_ms']:.3g} ms ({row['regime']}: faults "
                         f"{row['faults_ms']:.3g} ms, warm fill {row['warm_fill_ms']:.3g} ms), "
                         f"C++ top-K {row.get('top_k_ms', float('nan')):.3g} ms")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``stagelab predict``: prints the predictions; 0, or 2 (UserError) for a bad request."""
    if not 0 < args.delta < 1:
        raise UserError(f"--delta {args.delta}: give a share in (0, 1)")
    table = predict_tables.load_platforms()
    try:
        chosen = ([predict_tables.platform_named(name, table) for name in args.platform]
                  if args.platform else list(table.values()))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    cells = decisive_cells(args.profile)
    choice = host_choice(getattr(args, "host", None), args.rates, cells,
                         getattr(args, "thp", None), getattr(args, "regime", None),
                         measure_here=rates_measured_here)
    found = predictions(chosen, cells, choice, args.delta)
    if getattr(args, "json", False):
        print(json.dumps(predicted_json(choice.words, found), indent=1, default=str))
        return 0
    print(f"Predicted, not measured: {choice.words}; GPU terms from data/platforms.csv "
          "(published figures, and ranges where none is published; docs/prediction.md says "
          "which are which); forward = (active bf16 weights + KV cache at "
          f"{forward.DEFAULT_CONTEXT} tokens, sliding windows counted) / HBM. Flips shown within "
          f"{NEAR_FLIP:g}x of a range (the link's anywhere), the others held at their best "
          "values.")
    print(f"The rule by which a run falsifies this prediction, {predict_model.FALSIFICATION_RULE}"
          " (each stage's interval too: --json).")
    lines = regime_lines(choice.rates)
    if lines:
        print(lines)
    for entry in found:
        print(format_platform(entry))
    for platform in chosen:
        words = roofline.one_pass_words(platform.name, [(c.rows, c.vocab, c.k) for c in cells])
        if words:
            print(f"{platform.name}:\n{words}")
    deferral = predict_model.where_deferral_matters(
        [cell for entry in found for cell in entry["cells"] if cell["fits"]])
    if deferral:
        print(deferral)
    return 0


def predicted_json(origin: str, found: list[dict[str, Any]]) -> dict[str, Any]:
    """``stagelab predict --json``: the answers and arms in the records notebook 05 writes to
    ``prediction.json`` (:func:`predict_study.answer_records`), labelled predicted."""
    return {"predicted": True, "origin": origin,
            "answers": predict_study.answer_records(found),
            "arms": predict_study.arm_records(found),
            "falsification": {"rule": predict_model.FALSIFICATION_RULE,
                              "figures": predict_study.stated_records(found)},
            "unfit": [{"platform": c["platform"], "rows": c["rows"], "vocab": c["vocab"],
                       "k": c["k"], "why": c["notes"][0]}
                      for e in found for c in e["cells"] if not c["fits"]]}

