"""Notebook parameters recorded by older runs, read in today's shape, in one place.

A run's manifest (and a measured folder's ``measured.json``) records each notebook's parameters
as that run's notebook declared them; a notebook's parameters cell changes shape over time.
Every reader of recorded parameters (the replay, ``keep``'s re-derivation, the runs listing)
passes them through :func:`current` first, so that only this module knows the older shapes.

Format history of the recorded parameters (newest last; each older one is still read):

- **one parameter per step condition** (2026-11-30 to 2026-12-05). Notebook 02 named each
  condition's values measured in a parameter of its own: ``log_softmax`` (a list of places,
  from 2026-11-30), ``seed_regimes`` (the fresh vector's allocator, from 2026-12-01),
  ``overlap_orders`` with ``overlap_only`` (the ``[n, model]`` cells the orders after the first
  are limited to, from 2026-12-02). Notebook 04 named the value decided the same way:
  ``log_softmax`` (a place) and ``overlap_order``. Read as today's ``conditions`` and
  ``condition_cells`` under the catalogue's condition names; an older record that names none
  measured and decided each condition at its deciding value, as today's default does.
- **one ``conditions`` mapping** (from 2026-12-06, current). Notebook 02: ``conditions``
  (condition name -> the values measured) and ``condition_cells`` (condition name -> the
  ``[n, model]`` cells its values after the first are limited to, or null). Notebook 04:
  ``conditions`` (condition name -> the value decided). A condition left out reads as its
  deciding value (:data:`stagelab.core.catalogue.CONDITIONS`); read as it stands.

Standard library only (the core floor): the measuring node reads recorded parameters too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stagelab.core import catalogue

STEP_NOTEBOOK = catalogue.notebook_of(catalogue.STEP).name
VERDICT_NOTEBOOK = catalogue.VERDICT_NOTEBOOK
CONDITIONS, CONDITION_CELLS = "conditions", "condition_cells"

# Per notebook, each older parameter that named one step condition's values, and that condition.
OLD_CONDITIONS: dict[str, dict[str, str]] = {
    STEP_NOTEBOOK: {"log_softmax": catalogue.LOG_SOFTMAX.name,
                    "seed_regimes": catalogue.ALLOCATOR.name,
                    "overlap_orders": catalogue.OVERLAP.name},
    VERDICT_NOTEBOOK: {"log_softmax": catalogue.LOG_SOFTMAX.name,
                       "overlap_order": catalogue.OVERLAP.name},
}
# Notebook 02's older parameter that limited one condition's later values to some cells.
OLD_CONDITION_CELLS = {"overlap_only": catalogue.OVERLAP.name}


def is_old(notebook: str, parameters: Mapping[str, Any]) -> bool:
    """Whether ``parameters`` hold a name of an older format for ``notebook``."""
    old = {*OLD_CONDITIONS.get(notebook, {}),
           *(OLD_CONDITION_CELLS if notebook == STEP_NOTEBOOK else ())}
    return any(name in parameters for name in old)


def current(notebook: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``parameters`` recorded for ``notebook`` in today's shape: each older condition parameter
    folded into ``conditions`` (and ``overlap_only`` into ``condition_cells``) under the
    catalogue's names, every condition named (:func:`every_condition`). A value given in
    today's shape wins over an older one for the same condition. Anything else, and every other
    notebook's parameters, as recorded."""
    found = dict(parameters)
    if notebook not in OLD_CONDITIONS or not (is_old(notebook, found) or CONDITIONS in found):
        return found
    conditions = _folded(found, OLD_CONDITIONS[notebook], found.get(CONDITIONS))
    found[CONDITIONS] = every_condition(notebook, conditions)
    if notebook == STEP_NOTEBOOK and (CONDITION_CELLS in found or "overlap_only" in found):
        cells = _folded(found, OLD_CONDITION_CELLS, found.get(CONDITION_CELLS))
        found[CONDITION_CELLS] = cells or None
    return found


def every_condition(notebook: str, conditions: Mapping[str, Any]) -> dict[str, Any]:
    """``conditions`` with each step condition it leaves out at its deciding value (notebook 02:
    the values measured, a list; notebook 04: the value decided), in the catalogue's order, so
    that two records that mean the same compare equal. A name no condition has is kept (the
    notebook's own check refuses it)."""
    def default(condition: catalogue.Condition) -> Any:
        return [condition.decides] if notebook == STEP_NOTEBOOK else condition.decides

    named = {c.name: conditions.get(c.name, default(c)) for c in catalogue.CONDITIONS}
    return {**named, **conditions}


def _folded(found: dict[str, Any], old: Mapping[str, str], given: Any) -> dict[str, Any]:
    """The older parameters ``old`` names, popped from ``found``, as a mapping by condition name
    (one recorded as null: its default, left out), under ``given`` (today's mapping, when the
    record has one too)."""
    folded = {}
    for name, condition in old.items():
        value = found.pop(name, None)
        if value is not None:
            folded[condition] = value
    return {**folded, **(given if isinstance(given, Mapping) else {})}
