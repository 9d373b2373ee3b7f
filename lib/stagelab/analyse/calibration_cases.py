"""The rule's cases: families of simulated cells that the rule must decide right, each rate with
its 95 % Wilson interval and whether its requirement is met on it (:func:`cases`), and the table
that ``scripts/calibrate_rule.py`` writes into docs/decision-rule.md (:func:`with_table`).

The cases: null cells beside saving cells, heavy tails shared by every arm, one-arm stalls, a
regressing cell, the three questions' split near and far from the bar, and the noise a GPU node
makes (issue 49): carry-over both ways, noise that persists within an arm across rounds, rare
stalls, a bimodal baseline, and the cheaper answers where the saving that decides them is 0.5
and 0.8 delta, at 160 rounds and until resolved up to the gate's cap (:func:`gate_cap`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from stagelab.analyse import sequence
from stagelab.analyse.calibration import (
    NOISES,
    Noise,
    family_port_rate,
    recommendation_rates,
    wilson,
)
from stagelab.core import catalogue, paths


def gate_cap(path: Path = paths.PROFILES_FILE) -> int:
    """The gate profile's cap on a step cell's rounds (``max_rounds`` of notebook 02 in
    ``profiles.json``): the rounds until resolved that a real gate run can reach."""
    profile = json.loads(path.read_text())["profiles"]["gate"]
    return int(profile["notebooks"][catalogue.notebook_of(catalogue.STEP).name]["max_rounds"])


CASE_ROUNDS, CASE_CELLS = 160, 6  # the families
T3_SHARED = Noise("t(3) 3 % on every arm", 0.03, t_df=3.0)
T3_SHARED_5 = Noise("t(3) 5 % on every arm", 0.05, t_df=3.0)
RARE_STALLS = Noise("candidate stalls 1 % at 4x", stall_rate=0.01)


def _noise_cases(delta: float) -> list[tuple[str, str, str, Any]]:
    """The noise a GPU node makes (issue 49): carry-over both ways, noise that persists within
    an arm, rare stalls, a bimodal baseline."""
    bar, saving2 = 1 / (1 - delta), 1 / (1 - 2 * delta)
    out: list[tuple[str, str, str, Any]] = []
    for tax in (0.02, 0.05, 0.10):
        out.append((f"carry-over: the call after the candidate {tax:.0%} slower, 6 cells at the "
                    "bar", "family PORT", "<= 0.05",
                    ([bar] * 6, Noise(f"carry {tax}", carry_over=tax))))
        out.append((f"carry-over: the call after the fresh vector {tax:.0%} slower, 6 cells at "
                    "the bar", "family CLOSE", "<= 0.05",
                    ([bar] * 6, Noise(f"carry back {tax}", carry_over=tax,
                                      carry_after="baseline"))))
    for phi in (0.3, 0.7):
        out.append((f"AR(1) within each arm across rounds, phi {phi}, 6 cells at the bar",
                    "family PORT", "<= 0.05", ([bar] * 6, Noise(f"ar {phi}", arm_ar1=phi))))
    for every in (200, 1000):
        out.append((f"candidate 3x slower in 1 of {every} rounds, mean at the bar, 6 cells",
                    "family PORT", "<= 0.05",
                    ([bar] * 6, Noise(f"stall {every}", stall_rate=1 / every, stall_factor=3))))
    out.append(("candidate 3x slower in 1 of 200 rounds, mean at the bar, 1 cell", "PORT", "",
                ([bar], Noise("stall 200", stall_rate=1 / 200, stall_factor=3))))
    for rounds_hit, words in ((False, "calls"), (True, "rounds")):
        bimodal = Noise(f"bimodal {words}", regime_share=0.3, regime_rounds=rounds_hit)
        out.append((f"fresh vector 1.5x slower in 30 % of its {words}, 6 cells saving 2 delta",
                    "family PORT", ">= 0.80", ([saving2] * 6, bimodal)))
        out.append((f"fresh vector 1.5x slower in 30 % of its {words}, 6 cells at the bar",
                    "family PORT", "<= 0.05", ([bar] * 6, bimodal)))
    return out


def _judged(rate: float, trials: int, requirement: str) -> tuple[float, float, bool | None]:
    """A case's Wilson interval and whether its requirement (``>= x`` or ``<= x``, a share; ''
    for none) is met on it: None where nothing is required, or too few trials to show a rate
    under 5 %."""
    low, high = wilson(round(rate * trials), trials)
    if not requirement:
        return low, high, None
    sign, bound = requirement.split()
    if sign == "<=":
        return low, high, (None if wilson(0, trials)[1] > float(bound) else high <= float(bound))
    return low, high, low >= float(bound)


def _case_specs(delta: float) -> list[tuple[str, str, str, Any]]:
    """(case, what is counted, requirement, how to simulate it: a family's speedups and noise,
    or a (reuse, pinning) split and the change counted)."""
    saving, bar = 1 / (1 - 3 * delta), 1 / (1 - delta)
    pin2, pin08, pin05 = 1 / (1 - 2 * delta), 1 / (1 - 0.8 * delta), 1 / (1 - 0.5 * delta)
    return [
        ("4 cells saving 3 delta beside 2 with no effect, lognormal 2 %", "family PORT", ">= 0.80",
         ([saving] * 4 + [1.0] * 2, NOISES[0])),
        ("4 cells saving 3 delta beside 2 with no effect, lognormal 5 %", "family PORT", ">= 0.80",
         ([saving] * 4 + [1.0] * 2, NOISES[1])),
        ("6 cells saving 3 delta, t(3) 3 % on every arm", "family PORT", ">= 0.80",
         ([saving] * 6, T3_SHARED)),
        ("6 cells saving 3 delta, t(3) 5 % on every arm", "family PORT", ">= 0.80",
         ([saving] * 6, T3_SHARED_5)),
        ("6 cells at the bar, lognormal 2 %", "family PORT", "<= 0.05", ([bar] * 6, NOISES[0])),
        ("net loss: 5 % faster, 4x in 2 % of the candidate's rounds, 6 cells", "family PORT",
         "<= 0.05", ([1.05 / 1.06] * 6, NOISES[-2])),
        ("candidate stalls 2 % at 4x, at the bar, 1 cell", "PORT", "<= 0.05", ([bar], NOISES[-2])),
        ("candidate stalls 1 % at 4x, equal means, 6 cells", "family PORT", "<= 0.05",
         ([1.0] * 6, RARE_STALLS)),
        ("candidate stalls 1 % at 4x, equal means, 1 cell", "PORT", "<= 0.05",
         ([1.0], RARE_STALLS)),
        ("1 cell 1.5 delta slower beside 5 saving 3 delta, lognormal 2 %", "family PORT",
         "<= 0.05", ([1 / (1 + 1.5 * delta)] + [saving] * 5, NOISES[0])),
        ("reuse 3 delta, pinning 2 delta: the pinned scratch", "recommended", ">= 0.80",
         ((saving, pin2), sequence.PORT_PINNED)),
        ("reuse 3 delta, pinning 2 delta: a reused buffer", "recommended", "<= 0.05",
         ((saving, pin2), sequence.PORT_REUSED)),
        ("reuse 3 delta, pinning at the bar: the pinned scratch", "recommended", "<= 0.05",
         ((saving, bar), sequence.PORT_PINNED)),
        ("reuse 3 delta, pinning 0.5 delta: a reused buffer", "recommended", ">= 0.50",
         ((saving, pin05), sequence.PORT_REUSED)),
        ("reuse 3 delta, pinning 0.8 delta: a reused buffer", "recommended", "",
         ((saving, pin08), sequence.PORT_REUSED)),
        ("reuse 0.5 delta, no pinning effect: close", "recommended", ">= 0.50",
         ((pin05, 1.0), sequence.CLOSE_CHANGE)),
        ("reuse 0.8 delta, no pinning effect: close", "recommended", "",
         ((pin08, 1.0), sequence.CLOSE_CHANGE)),
        ("reuse 3 delta, no pinning effect: a reused buffer", "recommended", ">= 0.80",
         ((saving, 1.0), sequence.PORT_REUSED)),
        ("reuse 3 delta, pinning 2 delta, deferring its wait 2 delta: pinned and deferred",
         "recommended", ">= 0.80", ((saving, pin2, pin2), sequence.PORT_PINNED_DEFERRED)),
        ("reuse 3 delta, pinning 2 delta, deferring its wait at the bar: pinned and deferred",
         "recommended", "<= 0.05", ((saving, pin2, bar), sequence.PORT_PINNED_DEFERRED)),
        ("reuse 3 delta, pinning 2 delta, no deferring effect: the pinned scratch",
         "recommended", ">= 0.80", ((saving, pin2, 1.0), sequence.PORT_PINNED)),
    ] + _noise_cases(delta)


# the cases whose rows until resolved are simulated beside the fixed ones: those near the bar,
# where the stop rule looks at the effect (optional stopping) or the cap decides reachability,
# and a 2 delta saving under a bimodal baseline, whose cells mostly run to the cap (the stop rule
# reads no regimes); far from the bar a cell stops at its first check, and the fixed row is the
# same sample
STOPPING_MATTERS = ("at the bar", "0.5 delta", "0.8 delta", "saving 2 delta")


def cases(trials: int = 200, *, delta: float = 0.02, seed: int = 0, rounds: int = CASE_ROUNDS,
          max_rounds: int | None = None, until_resolved: bool = True,
          only: Sequence[str] | None = None) -> pd.DataFrame:
    """The issue's cases, each over ``trials`` simulated families of six cells (one where said)
    at ``rounds`` fixed rounds and, with ``until_resolved``, for the cases near the bar
    (:data:`STOPPING_MATTERS`), with rounds until resolved up to ``max_rounds`` (optional
    stopping, measured); ``only``: the cases to run, by name (each keeps its own seed). The
    cases: :func:`_case_specs`. One row per case and rounds: the share counted, its Wilson interval, the
    median rounds run, the requirement and whether it is met on the interval."""
    if trials < 1:
        raise ValueError(f"trials must be positive, got {trials}")
    max_rounds = gate_cap() if max_rounds is None else max_rounds
    rows = []
    for n, (case, counted, requirement, spec) in enumerate(_case_specs(delta)):
        if only is not None and case not in only:
            continue
        stopping = until_resolved and any(word in case for word in STOPPING_MATTERS)
        for cap in (rounds, max_rounds) if stopping else (rounds,):
            what, detail = spec
            if counted == "recommended":
                rate = recommendation_rates(*what, rounds=rounds, trials=trials,
                                            cells=CASE_CELLS, delta=delta, seed=seed + n,
                                            max_rounds=cap).get(detail, 0.0)
                median = math.nan
            else:
                found = family_port_rate(detail, what, rounds=rounds, trials=trials, delta=delta,
                                         seed=seed + n, max_rounds=cap)
                rate = found["family_close" if counted == "family CLOSE" else "family_port"]
                median = found["median_rounds"]
            low, high, met = _judged(rate, trials, requirement)
            rows.append({"case": case, "counted": counted,
                         "rounds": (f"{rounds}" if cap == rounds
                                    else f"until resolved, {rounds}-{cap}"),
                         "median_rounds": median, "trials": trials, "rate": rate,
                         "rate_low": low, "rate_high": high,
                         "requirement": requirement or "none (reported)", "met": met})
    return pd.DataFrame(rows)


TABLE_BEGIN, TABLE_END = "<!-- cases table: begin -->", "<!-- cases table: end -->"
CASE_COLUMNS = ("case", "rounds", "median_rounds", "trials", "rate", "requirement", "met",
                "trials_needed")
Z95 = 1.959963984540054  # the two-sided 95 % normal quantile of the Wilson interval
MOST_TRIALS = 10_000_000  # beyond this, "trials needed" says none would do


def _wilson_edges(rate: float, trials: int) -> tuple[float, float]:
    """The Wilson 95 % interval of a rate observed as ``rate`` over ``trials`` (closed form,
    the rate kept as it is: smooth in ``trials``, for the search of :func:`trials_needed`)."""
    z2 = Z95 ** 2
    centre = (rate + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z95 * math.sqrt(rate * (1 - rate) / trials + z2 / (4 * trials ** 2)) / (1 + z2 / trials)
    return centre - half, centre + half


def trials_needed(rate: float, requirement: str) -> int | None:
    """The fewest trials at which a case observed at ``rate`` would be judged met on its Wilson
    interval (``<= x``: its high end within x; ``>= x``: its low end): what a row of fewer trials
    lacks to show its rate. None where nothing is required, or where the rate itself lies on the
    wrong side of (or at) the requirement: no number of trials shows it met."""
    if not requirement or requirement.startswith("none") or not math.isfinite(rate):
        return None
    sign, text = requirement.split()
    bound = float(text)
    if (rate >= bound) if sign == "<=" else (rate <= bound):
        return None

    def shown(trials: int) -> bool:
        low, high = _wilson_edges(rate, trials)
        return high <= bound if sign == "<=" else low >= bound

    high = 1
    while not shown(high):
        high *= 2
        if high > MOST_TRIALS:
            return None
    low = high // 2
    while high - low > 1:  # shown(high), not shown(low) (or low == 0)
        middle = (low + high) // 2
        low, high = (low, middle) if shown(middle) else (middle, high)
    return high


def with_trials_needed(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its ``trials_needed`` column computed from each row's rate and
    requirement (:func:`trials_needed`)."""
    needed = [trials_needed(float(r.rate), str(r.requirement)) for r in table.itertuples()]
    return table.assign(trials_needed=pd.array(needed, dtype="Int64"))


def origin(table: pd.DataFrame) -> str:
    """Where a cases table came from, from its rows: the script and the commits its rows were
    simulated at (each row's trials are its own)."""
    commits = sorted(set(table["commit"].dropna().astype(str))) if "commit" in table else []
    return ("`python3 scripts/calibrate_rule.py` (each case rerun with `--only CASE --write`, "
            "its trials its own; `--render` redraws this table from docs/calibration.csv) at "
            f"commit {', '.join(commits) or 'unknown'}")


def merged(existing: pd.DataFrame, fresh: pd.DataFrame) -> pd.DataFrame:
    """``existing`` rows with every case that ``fresh`` holds replaced by its rows, in the
    order of :func:`_case_specs` (the cases no longer in the code dropped)."""
    kept = existing[~existing["case"].isin(set(fresh["case"]))]
    order = {spec[0]: n for n, spec in enumerate(_case_specs(0.02))}
    table = pd.concat([kept, fresh], ignore_index=True)
    table = table[table["case"].isin(order)]
    ranked = table.assign(_order=table["case"].map(order))
    return ranked.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def _needed_words(row: Any) -> str:
    """A row's trials needed in the table: the number, '' where nothing is required, 'none at
    this rate' where the rate itself is on the wrong side."""
    if str(row.requirement).startswith("none"):
        return ""
    return "none at this rate" if pd.isna(row.trials_needed) else f"{int(row.trials_needed):,}"


def cases_markdown(table: pd.DataFrame, source: str | None = None) -> str:
    """The cases table as the docs show it: one row per case and rounds, the rate with its 95 %
    Wilson interval, the trials its requirement needs at that rate (:func:`trials_needed`), and
    where it came from (``source``, else :func:`origin` of the rows)."""
    table = with_trials_needed(table)
    lines = [f"Generated by {source or origin(table)}; do not edit.", "",
             "| case | rounds | median rounds | trials | rate [Wilson 95 %] | requirement | met "
             "| trials needed |",
             "|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        median = "" if pd.isna(row.median_rounds) else f"{row.median_rounds:.0f}"
        met = {True: "met", False: "**not met**"}.get(row.met, "not judged")
        lines.append(f"| {row.case} | {row.rounds} | {median} | {row.trials} | {row.rate:.1%} "
                     f"[{row.rate_low:.1%}, {row.rate_high:.1%}] | {row.requirement} | {met} "
                     f"| {_needed_words(row)} |")
    return "\n".join(lines)


def with_table(page: str, table: pd.DataFrame, source: str | None = None) -> str:
    """``page`` with the text between its table markers replaced by :func:`cases_markdown`;
    ValueError where the markers are missing."""
    if TABLE_BEGIN not in page or TABLE_END not in page:
        raise ValueError(f"page: the markers {TABLE_BEGIN!r} and {TABLE_END!r} are missing")
    head, rest = page.split(TABLE_BEGIN, 1)
    body = cases_markdown(table, source)
    return f"{head}{TABLE_BEGIN}\n{body}\n{TABLE_END}{rest.split(TABLE_END, 1)[1]}"
