"""The verdict in words and tables: its context sentences, the findings on the report's first
screen, and the tables notebook 04 shows, all read from the verdict (or its cells) alone."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from stagelab.analyse import carryover, prompt_analysis, step_analysis, summaries
from stagelab.analyse.verdict_decision import REUSED, _cell_name, _measured
from stagelab.core import catalogue, forward

# How the findings about other kept runs begin: they depend on what is kept when a verdict is
# made and decide nothing, so keep leaves them out of what it re-derives.
COMMITTED = "Committed reference evidence"
NOT_READ = "Not read as reference evidence"
ABOUT_OTHER_RUNS = (COMMITTED, NOT_READ)


def findings(verdict: dict[str, Any], tables: dict[str, pd.DataFrame]) -> list[str]:
    """Plain sentences of what this run measured, for the report's first screen."""
    out = []
    for cell in verdict["decisive"]:
        split = cell.get("stages_ms")
        if split:
            out.append(
                f"Seed's step at n={cell['rows']}, V={cell['vocab']}, K={cell['k']}: "
                f"{split['total']:.2f} ms on average, made of the queued forward "
                f"{split.get('forward', 0.0):.2f}, log-softmax "
                f"{split['device']:.2f}, zero-filled vector {split['alloc']:.2f}, copy "
                f"{split['copy']:.2f}, host top-K (C++) {split['host_gather']:.2f}, free "
                f"{split['free']:.2f} and unattributed {split['unattributed']:.2f} ms (time "
                "outside the timed stages; negative where stages overlap, as the vector's "
                "zero-fill and the log-softmax do on a GPU).")
    step = tables.get("step")
    if step is not None:
        for lever in verdict["step_levers"]:
            if _measured(lever.get("speedup")) and lever["candidate"] == REUSED:
                out.append(f"Reuse lever at step level (grow-only pageable vs fresh vector) at "
                           f"n={lever['rows']}, V={lever['vocab']}, K={lever['k']}: "
                           f"{lever['speedup']:.2f}x (CI [{lever['ci_low']:.2f}, "
                           f"{lever['ci_high']:.2f}]), {lever['saved_ms']:.2f} ms per step.")
        flagged = summaries.sync_warnings(step)
        if flagged:
            out.append(flagged)
        backends = step_analysis.host_gather_backends(step)
        for _, row in backends.iterrows():
            out.append(f"Host top-K at n={row['rows']}, V={row['vocab']}, K={row['k']}: native "
                       f"C++ {row['native_ms']:.2f} ms, numpy {row['numpy_ms']:.2f} ms on "
                       f"average ({row['numpy_over_native']:.1f}x).")
    out.extend(_zero_fill_findings(verdict, step))
    for cell in (verdict.get("carry_over") or {}).get("cells", []):
        if cell["flagged"]:
            out.append(f"Carry-over at {_cell_name(cell)}: "
                       f"{carryover.words(cell, verdict['carry_over']['bar'] * 2)}.")
    clocks = verdict["clock_check"]
    if clocks["checked"]:
        out.append(f"Host clock vs CUDA events: {clocks['disagree']} of {clocks['checked']} "
                   "timed calls disagreed beyond the tolerance (flagged in the data).")
    prompt = verdict.get("prompt_logprobs")
    if prompt and prompt["recommendation"].get("chunk") is not None:
        rec = prompt["recommendation"]
        out.append(f"Prompt logprobs: chunk {rec['chunk']} recommended for {rec['arm']} "
                   f"({rec['reason']}).")
    out.extend(verdict["missing"])
    out.extend(f"{NOT_READ}: {why}." for why in verdict["reference_skipped"])
    for ref in verdict["reference"]:
        hardware = ref.get("hardware") or {}
        machine = hardware.get("gpu") or f"CPU only, {hardware.get('cpu') or 'unknown CPU'}"
        forced = (f", kept with --force although its status was {ref.get('status')}"
                  if ref.get("forced") else "")
        out.append(f"{COMMITTED} ({machine}; not this run{forced}): run "
                   f"{ref['run_id']} decided {(ref.get('overall') or {}).get('decision')}.")
    return out


def _zero_fill_findings(verdict: dict[str, Any], step: pd.DataFrame | None) -> list[str]:
    """The zero-fill cost from the seed's native vector (the step's ``alloc`` stage) and the
    shares of the step, each with its CI, at the largest cell measured; where the native step was
    not timed, the copy-level stand-in (a zero-filled torch buffer), labelled as such."""
    shares = step_analysis.stage_shares(step) if step is not None else pd.DataFrame()
    if not shares.empty:
        big = shares.assign(size=shares["rows"] * shares["vocab"]).sort_values("size").iloc[-1]
        if big["zero_fill_s_low"] is None or pd.isna(big["zero_fill_s_low"]):
            cost = f"{1e3 * big['zero_fill_s']:.2f} ms per step (one round: no CI)"
        else:
            cost = (f"{1e3 * big['zero_fill_s']:.2f} ms per step (CI "
                    f"{1e3 * big['zero_fill_s_low']:.2f}-{1e3 * big['zero_fill_s_high']:.2f})")
        size = int(big["rows"]) * int(big["vocab"]) * 4
        side = "above" if size > THRESHOLD_BYTES else "at or below"
        return [f"Zero-fill of the seed's fresh native vector (a value-initialised "
                f"std::vector, the step's alloc stage) at n={int(big['rows'])}, "
                f"V={int(big['vocab'])}, K={int(big['k'])}: {cost}; the vector is "
                f"{size / 2 ** 20:.1f} MiB, {side} glibc's largest mmap threshold (32 MiB): "
                f"{GLIBC_THRESHOLD_WORDS}, so a jump in zero-fill cost between sizes may be that "
                f"boundary. The copy is "
                f"{step_analysis.share_words(big, 'copy_share')} of the seed's step; alloc + copy + "
                f"free, which pinning removes or shrinks, "
                f"{step_analysis.share_words(big, 'pinning_share')}."]
    zero_fill = [c for c in verdict["copy_cells"]
                 if c["candidate"] == catalogue.ZERO_FILL_LEVER and _measured(c.get("speedup"))]
    if not zero_fill:
        return []
    big = max(zero_fill, key=lambda c: c["rows"] * c["vocab"])
    return [f"Zero-fill and free of a fresh {big['rows']} x {big['vocab']} fp32 buffer at the "
            f"copy level (a zero-filled torch buffer standing in for the seed's vector, whose "
            f"step was not timed) cost {big['saved_ms']:.2f} ms per copy: it takes "
            f"{big['speedup']:.2f}x the time of an uninitialised one (CI [{big['ci_low']:.2f}, "
            f"{big['ci_high']:.2f}])."]


def calibration_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """The calibration rows of a verdict, or one line saying why there are none."""
    if not verdict["calibration"]:
        return pd.DataFrame([{"calibration": "not simulated: no decisive cell has two rounds of "
                                             "the seed's step, or no trials were asked for"}])
    return pd.DataFrame(verdict["calibration"])


OVERLAP_WORDS = {
    forward.QUEUED: ("the forward is queued without a wait before each timed step, so the seed's "
                     "host allocation (the fresh vector and its zero-fill) runs while the device "
                     "works, as in an engine that launches its forward asynchronously and first "
                     "waits at the logprobs copy; the copy itself cannot start before the "
                     "forward ends"),
    forward.WAITED: ("the device is waited on just before the seed's host allocation (outside "
                     "every timed stage, inside the timed call, in every arm alike), so the "
                     "fresh vector's zero-fill is paid in full after the forward, as in an "
                     "engine that waits (a synchronised copy, a pinned result read) before it "
                     "allocates: the other bound"),
}
# Which order the seed's sampler has, read from what this suite holds of the seed: its issue
# (shared/seed/000_536b2d57bdbc1ec4.txt) names the lines; sampler.cpp itself is not here.
SEED_OVERLAP = {
    "order": "unknown",
    "lead": forward.WAITED,
    "source": "the seed issue's line references (src/vllm/v1/sample/sampler.cpp); the sampler's "
              "code is not part of this suite",
    "words": ("The seed's sampler's overlap order is unknown: this suite holds the seed issue, "
              "not sampler.cpp. The issue places the processed_out vector at "
              "src/vllm/v1/sample/sampler.cpp:289, its copy at :293 and its b.Synchronize(q) at "
              ":296, and the raw_logprobs vector at :405, its copy from logits.data at :412 and "
              "its synchronize at :414, with the pinned greedy-argmax scratch (AllocPinned) at "
              ":225-255. Read in line order, raw_logprobs is allocated after the wait at :296 "
              "(the waited order), and processed_out after the greedy-argmax read if that read "
              "comes first; whether one step runs them in that order, or both at all, cannot be "
              "told from the issue, so the recommendation is given under both orders."),
}


def condition_notes(verdict: dict[str, Any]) -> list[str]:
    """Each step condition's note, in the catalogue's order (none in a verdict of format 1)."""
    return [block["note"] for block in (verdict.get("conditions") or {}).values()]


# A log-softmax place said with the copy's side, where a value is named without its cells (on a
# CPU run "host" is the same processor as "device": only the side of the copy differs).
SIDE_WORDS = {catalogue.DEVICE: " (the log-softmax before the copy)",
              catalogue.HOST: " (the log-softmax after the copy)"}


def condition_note(condition: catalogue.Condition, under: dict[str, dict[str, Any]],
                   decided: str, flips: dict[str, list[str]]) -> str:
    """The recommendation under each value of a step condition, the decided one first, and the
    cells another value flips, in sentences (the seed's overlap order after the overlap's)."""
    def one(value: str) -> str:
        found = under[value]
        if not found["cells"]:
            return f"{value}{SIDE_WORDS.get(value, '')}: not measured in this run"
        cells = ", ".join(found["cells"])
        if found["decision"] is None:
            return f"{value} ({cells}): {found['reason']}"
        return f"{value} ({cells}): {found['decision']}, {found['change']}"

    others = [value for value in under if value != decided]
    flipped = "".join(f"; {value} changes the answer at {', '.join(flips[value])}"
                      for value in others if flips.get(value))
    seed = f" {SEED_OVERLAP['words']}" if condition is catalogue.OVERLAP else ""
    return (f"{condition.name}: recommendation under {one(decided)} (decided); "
            + "; ".join(one(value) for value in others) + f"{flipped}.{seed}")


GLIBC_THRESHOLD_WORDS = ("glibc maps a block above its mmap threshold fresh every step (zero "
                         "pages faulted in, then unmapped); the threshold starts at 128 KiB and "
                         "rises to each mapped block freed, up to 32 MiB on a 64-bit machine, so "
                         "in a loop a vector up to 32 MiB reuses the heap and a larger one is "
                         "mapped fresh every step")
THRESHOLD_BYTES = 32 * 2 ** 20


def _fault_path(kind: str, rate: float | None, bare_metal: list[float] | None) -> str:
    """On a VM, the sentence that names its fault path beside bare metal's fill range ('' on
    bare metal, or where the fill was not measured)."""
    if "vm" not in kind.split() or rate is None:
        return ""
    low, high = bare_metal or (4.0, 10.0)
    return (f"The measuring machine is a VM: each first-touch page fault goes through its memory "
            f"virtualisation (a nested page walk, the hypervisor's fault path), {rate:.2f} GB/s "
            f"here against {low:g}-{high:g} GB/s typical of bare metal, so the size of a margin "
            "in cells whose fresh vector faults afresh is partly a property of this VM's fault "
            "path, not of an engine's production host.")


# How a step condition's decided value reads in the context sentence where it says more than
# the condition's catalogue words (a CPU run's place of the log-softmax, the overlap order's
# detail); any other condition is said in its catalogue words.
CONTEXT_CLAUSES: dict[str, Callable[[str, bool], str]] = {
    catalogue.LOG_SOFTMAX.name:
        lambda place, on_cpu: f"the log-softmax runs on the {catalogue.log_softmax_place(place, on_cpu)}",
    catalogue.OVERLAP.name: lambda order, _: f"overlap order {order}: {OVERLAP_WORDS[order]}",
}


def context_clause(condition: catalogue.Condition, value: str, on_cpu: bool) -> str:
    """One step condition's decided ``value`` as the context sentence says it."""
    clause = CONTEXT_CLAUSES.get(condition.name)
    return clause(value, on_cpu) if clause else condition.words[value]


def context_words(forwards: list[float], delta: float, decided: Mapping[str, str],
                  on_cpu: bool = False) -> str:
    """The context in one sentence, stated next to every verdict: the forward, what delta is a
    share of, and each step condition's decided value (``decided``, by condition name)."""
    forward = ("no device work before the step (forward_ms = 0: a CPU run, or the upper bound "
               "of the saving)" if forwards == [0.0] else
               f"forward_ms = {', '.join(f'{f:g}' for f in forwards)} ms of device work queued "
               "before each step")
    clauses = "; ".join(context_clause(condition, decided[condition.name], on_cpu)
                        for condition in catalogue.CONDITIONS)
    return (f"Context: {forward}; delta = {delta:.0%} of the decode step (forward + logprobs "
            f"step); {clauses}.")


# ------------------------------------------------------------------------- tables to show

DECISIVE_COLUMNS = ["rows", "vocab", "k", "decision", "speedup", "ci_low", "ci_high",
                    "min_speedup", "logprobs_only_min_speedup", "median_speedup", "port_bound",
                    "twin_speedup", "twin_ci_low", "twin_ci_high", "saved_ms", "step_ms",
                    "forward_ms", "log_softmax", "n_rounds", "reason", "note"]


def decisive_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """The decisive cells with their evidence and the seed step's stage split (ms); where the
    log-softmax ran, in words (before: a bare "device", read as a stage and, on a CPU run, as a
    device there is none of)."""
    on_cpu = not (verdict.get("hardware") or {}).get("gpu")
    rows = [{**{c: cell.get(c) for c in DECISIVE_COLUMNS},
             "log_softmax": _place(cell.get("log_softmax"), on_cpu),
             **{f"{stage}_ms": ms for stage, ms in (cell.get("stages_ms") or {}).items()}}
            for cell in verdict["decisive"]]
    return pd.DataFrame(rows, columns=None if rows else DECISIVE_COLUMNS)


def _place(value: str | None, on_cpu: bool) -> str | None:
    """Where a decisive cell's log-softmax ran, in words; None where the cell does not say."""
    if not isinstance(value, str):
        return None
    if on_cpu:
        return catalogue.log_softmax_place(value, on_cpu)
    return f"{value}{SIDE_WORDS.get(value, '')}"


QUESTION_COLUMNS = ["question", "family", "rows", "vocab", "k", "decision", "speedup", "ci_low",
                    "ci_high", "tail_speedup", "tail", "n_rounds"]


def questions_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """The three questions (bundle, reuse alone, pinning alone) per decisive cell, each with its
    family's answer and the cell's speedup, CI, p99 tail speedup and its test (heavier, not
    heavier, unresolved)."""
    rows = [{"question": answer["words"], "family": answer["decision"] or "not measured",
             **{key: cell.get(key) for key in QUESTION_COLUMNS[2:]}}
            for answer in (verdict.get("questions") or {}).values() for cell in answer["cells"]]
    return pd.DataFrame(rows, columns=QUESTION_COLUMNS)


def levers_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """Every step-level lever against the seed's step, per cell."""
    return pd.DataFrame(verdict["step_levers"])


def copy_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """The copy-level comparisons (the mechanism), per cell; a candidate not paired with the
    baseline noted in its first clause ("pinned_grow_only unavailable"), its full reason being
    the decisive table's and notebook 01's (in every row, it made the table too wide)."""
    frame = pd.DataFrame(verdict["copy_cells"])
    if "note" in frame and "n_rounds" in frame:
        unpaired = frame["n_rounds"].fillna(0).eq(0) & frame["note"].notna()
        frame.loc[unpaired, "note"] = frame.loc[unpaired, "note"].astype(str).str.split(
            ": ", n=1).str[0]
    return frame


def prompt_sentence(verdict: dict[str, Any]) -> str:
    """The prompt-logprob recommendation in one sentence, or why there is none."""
    prompt = verdict.get("prompt_logprobs")
    if not prompt:
        return "Notebook 03's data is missing from this run."
    return prompt_analysis.recommendation_sentence(prompt["recommendation"])


def chunk_answer(verdict: dict[str, Any] | None) -> str | None:
    """The prompt-logprob chunk question's answer as the first screen and the terminal say it:
    the recommended chunk, or no recommendation with why and what would give one, in plain text
    (no Markdown); None where notebook 03 did not run."""
    prompt = (verdict or {}).get("prompt_logprobs")
    if not prompt or not prompt.get("recommendation"):
        return None
    return prompt_analysis.recommendation_sentence(prompt["recommendation"]).replace("**", "")


def reference_table(verdict: dict[str, Any]) -> pd.DataFrame:
    """Committed reference verdicts from other machines, labelled; empty when there are none."""
    return pd.DataFrame([{"path": r["path"], "gpu": (r["hardware"] or {}).get("gpu"),
                          "cpu": (r["hardware"] or {}).get("cpu"),
                          "decision": (r["overall"] or {}).get("decision"),
                          "summary": (r["overall"] or {}).get("summary")}
                         for r in verdict["reference"]],
                        columns=["path", "gpu", "cpu", "decision", "summary"])

