"""Can this run's timings be trusted? Two witnesses, read from the run folder's record alone.

* The machine's load while each timing notebook ran (``load`` in the manifest's notebook entries,
  recorded by the runner through :mod:`stagelab.measure.busy`): other processes taking cores, or a
  hypervisor stealing time.
* The A/A harness checks in ``verdict.json``: a baseline timed against itself whose paired CI
  lies wholly beyond 1 +- delta means the harness saw a difference between identical arms. The
  twins of a run are checked as one family (``harness``, Bonferroni), so that a quiet machine
  is not called busy in a third of its runs by chance.

Either one makes the timings untrustworthy; the report's first screen, the verdict box,
``compare``, the terminal and ``keep`` all say so from :func:`reasons`.

A run of few rounds (the smoke profile's 3) is neither: its A/A CIs are too few rounds to judge
whether identical arms differ, so they are not read as a trust check, and the run is labelled
"not a decision, not a trust check" (:func:`scope_label`) rather than untrustworthy; ``keep``
refuses it as evidence all the same. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stagelab.core import catalogue
from stagelab.core.records import RunFolder

# The notebooks whose timings the verdict, the findings and compare use.
TIMING_NOTEBOOKS = catalogue.measuring_notebooks()
DEFAULT_DELTA = 0.02
# An A/A check of fewer paired rounds judges nothing: the bootstrap over so few rounds is too
# narrow to tell a difference from chance (notebook 04's default min_samples, below which a
# decisive cell is INCONCLUSIVE, too few rounds).
MIN_TRUST_ROUNDS = 10
NOT_JUDGED = "not a decision, not a trust check"


def _judged(check: Mapping[str, Any]) -> bool:
    """Whether an A/A check has rounds enough to judge trust (unknown rounds: an older verdict,
    judged as it was)."""
    rounds = check.get("n_rounds")
    return rounds is None or rounds >= MIN_TRUST_ROUNDS


def too_few_rounds(verdict: Mapping[str, Any]) -> int | None:
    """The fewest paired rounds of the run's A/A checks when below :data:`MIN_TRUST_ROUNDS`
    (None when every check has enough, or none says)."""
    checks = [*((verdict.get("harness") or {}).get("checks") or []),
              *(c for c in verdict.get("decisive") or [] if c.get("twin_ci_low") is not None)]
    rounds = [c["n_rounds"] for c in checks if c.get("n_rounds")]
    fewest = min(rounds) if rounds else None
    return fewest if fewest is not None and fewest < MIN_TRUST_ROUNDS else None


def scope_label(verdict: Mapping[str, Any]) -> str:
    """What a few-round run can judge, in one line ('' for a run with rounds enough): neither
    the staging question nor whether its timings can be trusted."""
    fewest = too_few_rounds(verdict)
    if fewest is None:
        return ""
    return (f"{NOT_JUDGED.upper()}: {fewest} rounds per cell are too few to judge either the "
            f"change or the machine (a trust check needs {MIN_TRUST_ROUNDS} or more); a "
            "rehearsal of the suite, not evidence")


def load_reasons(manifest: Mapping[str, Any]) -> list[str]:
    """One sentence per timing notebook that ran on a busy machine, or whose load was watched
    but could not be read (a replay whose node recorded none, /proc unreadable): trust needs a
    measured load, and an unknown one is not a quiet one."""
    out = []
    for entry in manifest.get("notebooks") or []:
        load = entry.get("load")
        if entry.get("name") not in TIMING_NOTEBOOKS or not isinstance(load, Mapping):
            continue
        if load.get("busy"):
            out.append(f"{entry['name']} ran on a busy machine: {'; '.join(load['why'])}")
        elif load.get("busy") is None:
            why = load.get("unavailable") or "it was not recorded"
            out.append(f"{entry['name']}: the load of the machine that timed it is unknown "
                       f"({why}); trust needs a measured load")
    return out


def _cell(cell: Mapping[str, Any]) -> str:
    k = f", K={cell['k']}" if cell.get("k") is not None else ""
    return f"n={cell.get('rows')}, V={cell.get('vocab')}{k}"


def harness_reasons(verdict: Mapping[str, Any]) -> list[str]:
    """One sentence per A/A twin whose CI lies wholly outside 1 +- delta: from the verdict's
    ``harness`` block (every twin as one family, Bonferroni), or, in a verdict written before it,
    from each cell's own 95 % CI."""
    harness = verdict.get("harness")
    if harness is None:
        return _per_cell_harness_reasons(verdict)
    delta, level = harness["delta"], harness["confidence"]
    checked = [check for check in harness.get("checks") or [] if check.get("differs") is not None]
    judged = [check for check in checked if _judged(check)]
    return [f"the A/A check at {check['level']} level, {_cell(check)}, saw identical arms "
            f"differ: {check['twin_speedup']:.3f}x [{check['twin_ci_low']:.3f}, "
            f"{check['twin_ci_high']:.3f}] ({level:.1%} CI, Bonferroni over {len(checked)} "
            f"A/A checks), beyond 1 +- {delta:.0%}"
            for check in judged if check["differs"]]


def _per_cell_harness_reasons(verdict: Mapping[str, Any]) -> list[str]:
    delta = (verdict.get("parameters") or {}).get("delta") or DEFAULT_DELTA
    out = []
    for kind, cells in (("step", verdict.get("decisive") or []),
                        ("copy", verdict.get("copy_cells") or [])):
        seen = set()
        for cell in cells:
            low, high = cell.get("twin_ci_low"), cell.get("twin_ci_high")
            if low is None or high is None or _cell(cell) in seen or not _judged(cell):
                continue
            seen.add(_cell(cell))
            if low > 1 + delta or high < 1 - delta:
                out.append(f"the A/A check at {kind} level, {_cell(cell)}, saw identical arms "
                           f"differ: {cell['twin_speedup']:.3f}x [{low:.3f}, {high:.3f}], "
                           f"beyond 1 +- {delta:.0%}")
    return out


def _read(path: Path) -> dict[str, Any]:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


def reasons(run_dir: Path, manifest: Mapping[str, Any] | None = None,
            verdict: Mapping[str, Any] | None = None) -> list[str]:
    """Why the run's timings are not trustworthy; empty when neither witness objects."""
    run_dir = Path(run_dir)
    folder = RunFolder(run_dir)
    manifest = manifest if manifest is not None else _read(folder.manifest_path)
    verdict = verdict if verdict is not None else _read(folder.verdict_path)
    return load_reasons(manifest) + harness_reasons(verdict)


def harness_checked(verdict: Mapping[str, Any]) -> bool:
    """Whether the verdict holds any A/A twin's check (none in an older verdict, or without a
    twin)."""
    if verdict.get("harness") is not None:
        return any(check.get("differs") is not None for check in verdict["harness"]["checks"])
    cells = [*(verdict.get("decisive") or []), *(verdict.get("copy_cells") or [])]
    return any(cell.get("twin_ci_low") is not None for cell in cells)


def load_known(manifest: Mapping[str, Any]) -> bool:
    """Whether the machine's load was recorded for every timing notebook the run has (not for
    older runs, runs by hand, or where /proc cannot be read)."""
    timing = [e for e in manifest.get("notebooks") or [] if e.get("name") in TIMING_NOTEBOOKS]
    return bool(timing) and all((e.get("load") or {}).get("busy") is not None for e in timing)


def headline(found: list[str]) -> str:
    """The one warning line for the terminal and the first screen ('' when trustworthy)."""
    if not found:
        return ""
    return ("TIMINGS NOT TRUSTWORTHY: " + "; ".join(found)
            + ". Run it again on a quiet machine before relying on these figures.")


def warning_markdown(run_dir: Path, verdict: Mapping[str, Any]) -> str:
    """The warning for a notebook's verdict box, in Markdown ('' when trustworthy): what a
    few-round run cannot judge, then why the timings are not trustworthy."""
    label = scope_label(verdict)
    parts = [f"**{label.partition(':')[0]}**:{label.partition(':')[2]}."] if label else []
    found = reasons(run_dir, verdict=verdict)
    if found:
        parts.append("**TIMINGS NOT TRUSTWORTHY**: run it again on a quiet machine before "
                     "relying on these figures.\n\n" + "\n".join(f"- {r}" for r in found))
    return "\n\n".join(parts)


# A run's trust in one word, for the report's header, every page's banner and `stagelab runs`.
TRUSTWORTHY = "trustworthy"
NOT_TRUSTWORTHY = "not trustworthy"
REHEARSAL = "rehearsal"  # too few rounds to judge: not a decision, not a trust check
LOAD_UNKNOWN = "load unknown"
NO_TIMINGS = "no timings"


def run_trust(run_dir: Path, manifest: Mapping[str, Any] | None = None,
              verdict: Mapping[str, Any] | None = None) -> str:
    """Whether a run's timings can be trusted, in one of the words above: a witness objects
    (:func:`reasons`), too few rounds to judge (:func:`scope_label`), a timing notebook's load
    not recorded, no timing notebook at all, or trustworthy."""
    folder = RunFolder(Path(run_dir))
    manifest = manifest if manifest is not None else _read(folder.manifest_path)
    verdict = verdict if verdict is not None else _read(folder.verdict_path)
    if reasons(run_dir, manifest, verdict):
        return NOT_TRUSTWORTHY
    if scope_label(verdict):
        return REHEARSAL
    if not any(e.get("name") in TIMING_NOTEBOOKS for e in manifest.get("notebooks") or []):
        return NO_TIMINGS
    return TRUSTWORTHY if load_known(manifest) else LOAD_UNKNOWN
