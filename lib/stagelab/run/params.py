"""Checks of notebook parameter values that need no notebook to run: a bad value is a bad request.

Validators are keyed by parameter name, and by ``(notebook, name)`` where a name means different
things in different notebooks (``arms``). Each raises ``ValueError`` with what is wrong and what
would be right; :func:`validate` turns that into a one-line :class:`~stagelab.core.errors.UserError`
naming ``notebook.parameter``, before any run folder exists.

Arm names, methods and dtypes are read from :mod:`stagelab.core.catalogue`, which names them once and
loads no torch: the plan of a run never stands on the measuring code.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from stagelab.core import catalogue, paths
from stagelab.core.errors import UserError

Validator = Callable[[Any, Mapping[str, Any]], None]


# ----------------------------------------------------------------------------- words for values

MAX_VALUE_DEPTH = 8  # a parameter is a number, a word, or a list of them: 8 is ample


def nesting_problem(text: str) -> str | None:
    """Why a ``--param`` value nests too deep to be parsed (lists and objects more than
    :data:`MAX_VALUE_DEPTH` deep: the parsers recurse, and a deep value would end in a
    RecursionError), counted on its brackets before any parse; None otherwise."""
    level = deepest = 0
    for char in text:
        level += (char in "[{") - (char in "]}")
        deepest = max(deepest, level)
        if deepest > MAX_VALUE_DEPTH:
            return f"nests lists or objects more than {MAX_VALUE_DEPTH} deep; not a parameter"
    return None


def describe_type(value: Any) -> str:
    """The kind of a value in words, e.g. ``'a str'``."""
    if value is None:
        return "null (None)"
    article = "an" if type(value).__name__[0] in "aeiou" else "a"
    return f"{article} {type(value).__name__}"


def number_hint(value: Any) -> str:
    """How to write an integral float as an int (``1e9`` is a float in JSON); else ''."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return f"; for a whole number write {int(value)}"
    return ""


# ------------------------------------------------------------------------------ value checks

def _int(value: Any, minimum: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{value!r} is not {what}{number_hint(value)}")


def positive_int(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """An integer >= 1."""
    _int(value, 1, "a positive integer")


def non_negative_int(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """An integer >= 0."""
    _int(value, 0, "an integer >= 0")


def _items(value: Any) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{value!r} is {describe_type(value)}; give a list{number_hint(value)}")
    if not value:
        raise ValueError(f"{value!r} is empty; give at least one value")
    return list(value)


def _between(low: float, high: float, closed_low: bool) -> Validator:
    def validator(value: Any, _: Mapping[str, Any] | None = None) -> None:
        ok_low = value >= low if closed_low else value > low
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (ok_low and value < high):
            bracket = "[" if closed_low else "("
            raise ValueError(f"{value!r} is not in {bracket}{low}, {high}){number_hint(value)}")
    validator.__doc__ = f"A number between {low} and {high}."
    return validator


def _one_of(value: Any, valid: Iterable[str], what: str) -> None:
    valid = list(valid)
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


def _subset(registry: Callable[[], Iterable[str]], what: str) -> Validator:
    def validator(value: Any, _: Mapping[str, Any] | None = None) -> None:
        items = _items(value)
        valid = list(registry())
        for item in items:
            _one_of(item, valid, what)
        if len(set(items)) != len(items):
            raise ValueError(f"{items!r} names an {what} twice")
    validator.__doc__ = f"A non-empty list of known {what}s, each once."
    return validator


@lru_cache(maxsize=4)
def model_vocabs(path: Path = paths.MODEL_SHAPES_FILE) -> dict[str, int]:
    """The vocabulary size of each model of ``data/model_shapes.csv``."""
    with open(path, newline="", encoding="utf-8") as handle:
        return {row["model"]: int(row["vocab"]) for row in csv.DictReader(handle)}


def known_models() -> tuple[str, ...]:
    """The model names of ``data/model_shapes.csv``."""
    return tuple(model_vocabs())


def _once(values: list[Any], what: str, key: Callable[[Any], Any] = lambda v: v) -> None:
    """Refuse a list that names one value (or, through ``key``, one size) twice: a duplicate
    cell would be measured twice under one name and break the pairing by round."""
    seen: dict[Any, Any] = {}
    for value in values:
        if key(value) in seen:
            same = "" if seen[key(value)] == value else f" ({seen[key(value)]!r} and {value!r})"
            raise ValueError(f"{values!r} names the same {what} twice{same}; give each once")
        seen[key(value)] = value


def _vocab_of(value: Any) -> Any:
    return model_vocabs().get(value, value)


def _each_once(check: Callable[[Any], None], what: str,
               key: Callable[[Any], Any] = lambda v: v) -> Validator:
    def validator(value: Any, _: Mapping[str, Any] | None = None) -> None:
        items = _items(value)
        for item in items:
            check(item)
        _once(items, what, key)
    validator.__doc__ = f"A non-empty list, each item checked by {check.__name__}, each {what} once."
    return validator


def forward_ms(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """Device work queued before each step, in ms: a number >= 0, or null for the default (the
    model's weight bytes over the GPU's memory bandwidth; 0 on a CPU)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise ValueError(f"{value!r} is not a number of milliseconds >= 0 (or null for the "
                         f"default){number_hint(value)}")


def _condition_names(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a mapping by step condition name (:data:`stagelab.core.catalogue.CONDITIONS`)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is {describe_type(value)}; give an object {{condition: "
                         f"{what}}} with conditions among {_known_conditions()}")
    for name in value:
        _one_of(name, _known_conditions(), "step condition")
    return dict(value)


def _known_conditions() -> list[str]:
    return [condition.name for condition in catalogue.CONDITIONS]


def step_conditions(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """The step conditions' values measured: ``{condition: [value, ...]}``, each list non-empty
    and naming each of the condition's values at most once (one left out: its deciding value)."""
    for name, values in _condition_names(value, "[values]").items():
        condition = catalogue.condition(name)
        items = _items(values)
        for item in items:
            _one_of(item, condition.values, f"{name} value")
        _once(items, f"{name} value")


def condition_cells(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """Where each condition's values after the first are measured: null (every cell) or
    ``{condition: [[n, model or vocabulary], ...]}``, each pair once."""
    if value is None:
        return
    for cells in _condition_names(value, "[[n, model], ...]").values():
        items = _items(cells)
        for item in items:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ValueError(f"{item!r} is not a pair [n, model or vocabulary]")
            positive_int(item[0])
            model_or_vocab(item[1])
        _once(items, "cell", lambda pair: (pair[0], _vocab_of(pair[1])))


def decided_conditions(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """The value the verdict decides under, per step condition: ``{condition: value}``."""
    for name, item in _condition_names(value, "value").items():
        _one_of(item, catalogue.condition(name).values, f"{name} value")


def max_rounds(value: Any, values: Mapping[str, Any]) -> None:
    """The cap of rounds until resolved: an integer, at least ``rounds``."""
    _int(value, 1, "a positive integer")
    rounds = values.get("rounds")
    if isinstance(rounds, int) and value < rounds:
        raise ValueError(f"{value} is below rounds ({rounds}): the cap must be at least rounds")


def positive_seconds(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """A positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{value!r} is not a positive number of seconds{number_hint(value)}")


def model_or_vocab(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """A model name of ``data/model_shapes.csv`` or a positive vocabulary size."""
    if isinstance(value, int) and not isinstance(value, bool):
        positive_int(value)
        return
    if not isinstance(value, str) or value not in known_models():
        raise ValueError(f"unknown model {value!r}; known: {', '.join(known_models())} "
                         f"(or a vocabulary size as a number){number_hint(value)}")


def dtype_name(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """A floating dtype the suite supports, by name."""
    _one_of(value, catalogue.DTYPE_BYTES, "dtype")


def _arms_of(experiment: str) -> Callable[[], Iterable[str]]:
    """The catalogue's arm names of one experiment, read when a value is checked."""
    return lambda: catalogue.arm_names(experiment)


def _aa_arm_in_arms(registry: Callable[[], Iterable[str]], what: str) -> Validator:
    def validator(value: Any, values: Mapping[str, Any]) -> None:
        _one_of(value, registry(), what)
        arms = values.get("arms")
        if value not in (registry() if arms is None else arms):  # None: every arm
            raise ValueError(f"{value!r} must be in arms (it is timed twice, as its own A/A "
                             f"twin); arms are {arms!r}")
    validator.__doc__ = (f"The A/A arm is a known {what} and among ``arms`` (None: every arm): "
                         "it is timed twice.")
    return validator


def booleans(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """A non-empty list of true/false."""
    for item in _items(value):
        if not isinstance(item, bool):
            raise ValueError(f"{item!r} is not true or false")


def prompt_tokens(value: Any, _: Mapping[str, Any] | None = None) -> None:
    """A prompt needs two tokens to score one position."""
    _int(value, 2, "an integer >= 2 (a prompt needs two tokens to score one position)")


# ----------------------------------------------------------------------------- the registries

VALIDATORS: dict[str, Validator] = {
    "models": _each_once(model_or_vocab, "vocabulary", _vocab_of),
    "model": model_or_vocab,
    "rows": _each_once(positive_int, "rows"),
    "chunks": _each_once(positive_int, "chunk"),
    "tiles": _each_once(positive_int, "tile"),
    "ks": _each_once(non_negative_int, "K"),
    "forward_ms": forward_ms,
    "max_rounds": max_rounds,
    "max_seconds": positive_seconds,
    "rounds": positive_int,
    "warmup": non_negative_int,
    "sources": positive_int,
    "tokens": prompt_tokens,
    "vocab": non_negative_int,
    "hidden": non_negative_int,
    "k": non_negative_int,
    "dtype": dtype_name,
    "logits_dtype": dtype_name,
    "overlaps": booleans,
    "min_samples": positive_int,
    "delta": _between(0.0, 1.0, closed_low=False),
    "confidence": _between(0.0, 1.0, closed_low=False),
    "decisive_rows": _each_once(positive_int, "rows"),
    "decisive_models": _each_once(model_or_vocab, "vocabulary", _vocab_of),
    "decisive_ks": _each_once(non_negative_int, "K"),
    "calibration_trials": non_negative_int,
}

_STAGING, _STEP, _PROMPT = (catalogue.notebook_of(experiment).name for experiment in
                            (catalogue.STAGING, catalogue.STEP, catalogue.PROMPT))
NOTEBOOK_VALIDATORS: dict[tuple[str, str], Validator] = {
    (_STAGING, "arms"): _subset(_arms_of(catalogue.STAGING), "arm"),
    (_STAGING, "aa_arm"): _aa_arm_in_arms(_arms_of(catalogue.STAGING), "arm"),
    (_STEP, "arms"): _subset(_arms_of(catalogue.STEP), "step arm"),
    (_STEP, "aa_arm"): _aa_arm_in_arms(_arms_of(catalogue.STEP), "step arm"),
    (_STEP, "conditions"): step_conditions,
    (_STEP, "condition_cells"): condition_cells,
    (catalogue.VERDICT_NOTEBOOK, "conditions"): decided_conditions,
    (_PROMPT, "methods"): _subset(_arms_of(catalogue.PROMPT), "method"),
}


def validator_for(notebook: str, name: str) -> Validator | None:
    """The check of one parameter of one notebook, if there is one."""
    return NOTEBOOK_VALIDATORS.get((notebook, name)) or VALIDATORS.get(name)


def validate(notebook: str, values: Mapping[str, Any], chosen: Iterable[str] = ()) -> None:
    """Check a notebook's effective parameters (defaults overlaid with the chosen ones).

    A default that is not a literal reads as None and is left to the notebook, unless chosen.
    Raises UserError ``notebook.parameter: what is wrong``.
    """
    chosen = set(chosen)
    for name, value in values.items():
        check = validator_for(notebook, name)
        if check is None or (value is None and name not in chosen):
            continue
        try:
            check(value, values)
        except ValueError as exc:
            message = str(exc).partition(WHOLE_HINT)[0]
            raise UserError(f"{notebook}.{name}: {message}"
                            f"{_whole_suggestion(check, name, value, values, notebook)}") from None
    check_top_k(notebook, values)


WHOLE_HINT = "; for a whole number write"  # number_hint's words, about one item of a list


def _whole(value: Any) -> Any:
    """The value with every integral float (``1e3``) written as an int, in lists too."""
    if isinstance(value, list):
        return [_whole(item) for item in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _whole_suggestion(check: Validator, name: str, value: Any, values: Mapping[str, Any],
                      notebook: str) -> str:
    """``; write X`` with the whole value corrected where that value passes the same checks,
    so that the suggestion is never refused in turn; '' otherwise."""
    fixed = _whole(value)
    if fixed == value and repr(fixed) == repr(value):
        return ""
    try:
        check(fixed, {**values, name: fixed})
        check_top_k(notebook, {**values, name: fixed})
    except (ValueError, UserError):
        return ""
    return f"; write {json.dumps(fixed)}"


# Each top-K parameter and the parameters that give its vocabularies (the first that is set).
TOP_K_VOCABS = {"ks": ("models",), "decisive_ks": ("decisive_models",), "k": ("vocab", "model")}


def _vocab(item: Any) -> int | None:
    if isinstance(item, bool):
        return None
    return item if isinstance(item, int) else model_vocabs().get(item)


def check_top_k(notebook: str, values: Mapping[str, Any]) -> None:
    """Refuse a top-K above the smallest vocabulary it is asked of (each value already checked
    alone): UserError ``notebook.parameter: ...``."""
    for k_name, vocab_names in TOP_K_VOCABS.items():
        ks = values.get(k_name)
        given = next((values[n] for n in vocab_names if values.get(n)), None)
        if ks is None or given is None:
            continue
        items = given if isinstance(given, (list, tuple)) else [given]
        sized = [(item, vocab) for item in items if (vocab := _vocab(item))]
        largest = max(ks) if isinstance(ks, (list, tuple)) else ks
        if not sized or not isinstance(largest, int):
            continue
        item, vocab = min(sized, key=lambda pair: pair[1])
        if largest > vocab:
            of = f"{item} ({vocab})" if item != vocab else str(vocab)
            raise UserError(f"{notebook}.{k_name}: top-K {largest} exceeds the vocabulary of "
                            f"{of}; K can be at most V")
