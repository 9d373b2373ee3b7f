"""Profiles and the plan of a run: which notebooks, with which parameters, under which timeouts.

Everything here is checked before a run folder exists, so a refused request leaves nothing
behind: unknown profiles and notebooks, ``--param`` syntax, parameter names and types (against
each notebook's ``parameters`` cell) and values (:mod:`stagelab.run.params`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stagelab.core import catalogue, measured, paths
from stagelab.core.cells import notebook_parameters
from stagelab.core.errors import UserError
from stagelab.run import params

# Parameters the runner injects: every notebook declares run_dir, a measuring notebook measured
# (set by ``stagelab run --from``); a user may set neither.
INJECTED = ("run_dir", "measured")
# Generous defaults: the full profile's longest cell must fit (the profiles file may set its own).
DEFAULT_CELL_TIMEOUT_S = 1800
DEFAULT_START_TIMEOUT_S = 120


@dataclass
class NotebookPlan:
    """One notebook of a run and the parameters it will get."""

    name: str
    path: Path
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunPlan:
    """A checked request: the profile, its notebooks in order, and the kernel's time limits."""

    profile: str
    notebooks: list[NotebookPlan]
    cell_timeout_s: int = DEFAULT_CELL_TIMEOUT_S
    start_timeout_s: int = DEFAULT_START_TIMEOUT_S
    decides: bool = False  # meant to decide: its decisive arms must be able to run here


def load_profiles(path: Path | None = None) -> dict[str, Any]:
    """The profiles file (JSON, see docs/developing.md):
    ``{profile: {"description": str, "notebooks": {name: {param: value}}}}``."""
    path = path or paths.PROFILES_FILE
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        profiles = document["profiles"]
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise UserError(f"profiles file {path} cannot be read: {exc}") from exc
    if not isinstance(profiles, dict):
        raise UserError(f"profiles file {path}: 'profiles' must map names to profiles")
    return profiles


def profile_decides(profile: str, entry: dict[str, Any] | None = None) -> bool:
    """Whether ``profile`` is meant to decide (``"decides": true``): its decisive arms must be
    able to run where it measures, so a node without them refuses it rather than measure."""
    entry = load_profiles().get(profile, {}) if entry is None else entry
    decides = entry.get("decides", False)
    if not isinstance(decides, bool):
        raise UserError(f"profile {profile!r}: decides={decides!r} must be true or false")
    return decides


def profile_parameters(profile: str) -> dict[str, dict[str, Any]]:
    """Each notebook of ``profile`` with its effective parameters: the notebook's defaults, then
    the profile's values. UserError, naming the valid profiles, for an unknown one."""
    profiles = load_profiles()
    if profile not in profiles:
        raise UserError(f"unknown profile {profile!r}; valid: {', '.join(profiles)}")
    merged = {}
    for name, given in (profiles[profile].get("notebooks") or {}).items():
        notebook = paths.NOTEBOOKS_DIR / f"{name}.ipynb"
        defaults = notebook_parameters(notebook) if notebook.exists() else {}
        merged[name] = {**defaults, **(given or {})}
    return merged


def parse_value(text: str) -> Any:
    """A ``--param`` value: JSON (``20``, ``[16, 64]``, ``true``, ``"text"``, ``null``), where a
    bare word, alone or as an item of ``[a, b]``, is text (``models=[Qwen2.5-7B, 4096]``)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    inner = text.strip()
    if inner.startswith("[") and inner.endswith("]"):
        items = [item.strip() for item in inner[1:-1].split(",")]
        return [] if items == [""] else [parse_value(item) for item in items]
    if any(mark in inner for mark in '[]{}",'):
        raise ValueError("not valid JSON (quote text that holds brackets, braces, quotes or "
                         "commas)")
    return inner


def parse_overrides(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``NOTEBOOK.KEY=VALUE`` strings to ``{notebook: {key: value}}`` (see :func:`parse_value`)."""
    overrides: dict[str, dict[str, Any]] = {}
    for item in items:
        target, sep, text = item.partition("=")
        notebook, dot, key = target.partition(".")
        if not sep or not dot or not notebook or not key:
            raise UserError(f"--param {item!r}: expected NOTEBOOK.KEY=VALUE, "
                            f"e.g. {catalogue.measuring_notebooks()[0]}.rounds=20")
        deep = params.nesting_problem(text)
        if deep:
            raise UserError(f"--param {target}: its value {deep}")
        try:
            value = parse_value(text) if text else ""
        except ValueError as exc:
            raise UserError(f"--param {item!r}: {exc}") from exc
        overrides.setdefault(notebook, {})[key] = value
    return overrides


def _type_ok(value: Any, default: Any) -> bool:
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def _beyond_int64(value: Any) -> bool:
    """Whether an integer in ``value`` (or in a list of it) does not fit a signed 64-bit int."""
    if isinstance(value, list):
        return any(_beyond_int64(item) for item in value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63


def check_parameters(notebook: str, given: Mapping[str, Any], declared: Mapping[str, Any],
                     source: str) -> None:
    """Raise UserError for an unknown or runner-owned parameter, or a type unlike the default's."""
    for key, value in given.items():
        where = f"{source}: {notebook}.{key}"
        if key in INJECTED:
            raise UserError(f"{where} is set by the runner (each run gets its own folder; "
                            "`stagelab run --from` names the measured one); remove it")
        if key not in declared:
            raise UserError(f"{source}: unknown parameter {notebook}.{key}; valid: "
                            f"{', '.join(k for k in declared if k not in INJECTED)}")
        default = declared[key]
        if value is None and default is not None:
            raise UserError(f"{where} is null (None); give a {type(default).__name__} "
                            f"like the default {default!r}")
        if not _type_ok(value, default):
            raise UserError(f"{where}={value!r} is "
                            f"{params.describe_type(value)}, expected {type(default).__name__} "
                            f"(default {default!r}){suggestion(notebook, key, value, declared)}")
        if _beyond_int64(value):
            raise UserError(f"{where}={value!r} holds an integer beyond 64 bits (|n| < 2**63): "
                            "no table, seed or size can hold it")


def suggestion(notebook: str, key: str, value: Any, declared: Mapping[str, Any]) -> str:
    """``; write X`` for a value of the parameter's type that every check of it accepts (a whole
    number for ``1e9``, a list of one for a bare number where a list is expected), or '' where
    no such value is near: a suggestion that would be refused in turn is never made."""
    whole = (int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**63
             else value)
    candidates = [[whole]] if isinstance(declared[key], list) and not isinstance(value, list) \
        else []
    for candidate in [*candidates, whole]:
        if candidate == value and type(candidate) is type(value):
            continue
        if not _type_ok(candidate, declared[key]):
            continue
        check = params.validator_for(notebook, key)
        try:
            if check is not None:
                check(candidate, {**declared, key: candidate})
            params.check_top_k(notebook, {**declared, key: candidate})
        except (ValueError, UserError):
            continue
        return f"; write {json.dumps(candidate)}"
    return ""


def _timeout(entry: Mapping[str, Any], key: str, default: int, profile: str) -> int:
    """A time limit in whole seconds; a fraction rounds up (papermill reads 0 as no limit)."""
    value = entry.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise UserError(f"profile {profile!r}: {key}={value!r} must be a positive number of "
                        f"seconds{params.number_hint(value)}")
    return math.ceil(value)


def _profile_entry(profiles: Mapping[str, Any], profile: str) -> Mapping[str, Mapping | None]:
    """A profile's notebooks and their parameters; UserError in one line for a wrong shape."""
    entry = profiles[profile] or {}
    if not isinstance(entry, Mapping):
        raise UserError(f"profile {profile!r} is {params.describe_type(entry)}; it must map "
                        "'notebooks' (and its description and timeouts)")
    notebooks = entry.get("notebooks") or {}
    if not isinstance(notebooks, Mapping):
        raise UserError(f"profile {profile!r}: 'notebooks' is {params.describe_type(notebooks)}; "
                        "it must map each notebook's name to its parameters")
    for name, given in notebooks.items():
        if given is not None and not isinstance(given, Mapping):
            raise UserError(f"profile {profile!r}: the parameters of {name} are "
                            f"{params.describe_type(given)}; they must map names to values")
    return notebooks


def plan_run(profile: str, only: Iterable[str] = (),
             overrides: Mapping[str, Mapping] | None = None, profiles_path: Path | None = None,
             notebooks_dir: Path | None = None) -> RunPlan:
    """Validate a request and return the notebooks to run, in the profile's order."""
    overrides = overrides or {}
    notebooks_dir = notebooks_dir or paths.NOTEBOOKS_DIR
    profiles = load_profiles(profiles_path)
    if profile not in profiles:
        raise UserError(f"unknown profile {profile!r}; valid: {', '.join(profiles)}")
    notebooks = _profile_entry(profiles, profile)
    entry = profiles[profile] or {}
    only = list(only)
    for name in [*only, *overrides]:
        if name not in notebooks:
            raise UserError(f"unknown notebook {name!r} in profile {profile!r}; valid: "
                            f"{', '.join(notebooks)}")
    for name in overrides:
        if only and name not in only:
            raise UserError(f"--param for {name}, which --only leaves out (--only "
                            f"{' '.join(only)}); add it to --only or drop the --param")
    plans = []
    for name, given in notebooks.items():
        if only and name not in only:
            continue
        path = Path(notebooks_dir) / f"{name}.ipynb"
        if not path.exists():
            raise UserError(f"profile {profile!r} names {name}, but {path} does not exist")
        declared = notebook_parameters(path)
        if "run_dir" not in declared:
            raise UserError(f"notebook {name} does not declare the parameter run_dir")
        check_parameters(name, given or {}, declared, f"profile {profile!r}")
        check_parameters(name, overrides.get(name, {}), declared, "--param")
        chosen = {**(given or {}), **overrides.get(name, {})}
        params.validate(name, {**declared, **chosen}, chosen)
        plans.append(NotebookPlan(name, path, chosen))
    decides = profile_decides(profile, entry)
    return RunPlan(profile, plans,
                   _timeout(entry, "cell_timeout_s", DEFAULT_CELL_TIMEOUT_S, profile),
                   _timeout(entry, "start_timeout_s", DEFAULT_START_TIMEOUT_S, profile), decides)


def resolve_measuring(profile: str, only: list[str], overrides: list[str]) -> tuple[
        dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The measuring notebooks' resolved parameters, and every notebook's (the preflight sizes
    its memory check from them), as ``stagelab measure`` and every fleet node resolve them;
    UserError for anything the run would refuse."""
    plan = plan_run(profile, only, parse_overrides(overrides))
    every = {}
    for notebook in plan.notebooks:
        declared = notebook_parameters(notebook.path)
        every[notebook.name] = {key: value for key, value in
                                {**declared, **notebook.parameters}.items()
                                if key not in INJECTED}
    measuring = {name: values for name, values in every.items() if name in measured.MEASURING}
    if not measuring:
        raise UserError(f"profile {profile!r}{' with --only' if only else ''} has no measuring "
                        f"notebook; measuring notebooks: {', '.join(measured.MEASURING)}")
    return measuring, every
