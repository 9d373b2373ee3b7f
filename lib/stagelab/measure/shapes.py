"""Real models' vocabulary and hidden sizes (``data/model_shapes.csv``), looked up by name or number.

Notebooks take sizes as a list whose items are either a model name from the table or a plain
vocabulary size; :func:`resolve_vocabs` turns such a list into ``(model, vocab, hidden)`` rows.
torch is imported only for a dtype (:func:`torch_dtype`, ``DTYPES``): the verdict's notebook
reads model shapes and never loads torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from stagelab.core import catalogue, forward, paths


@dataclass(frozen=True)
class ModelShape:
    """A model's name ('' when given as a number), vocabulary size and hidden size (0 if unknown),
    and its parameters in billions (0 if unknown; from the model card of the same repository).
    The default decode forward's time reads the model's other dimensions by name
    (:func:`stagelab.core.forward.model_dims`)."""

    model: str
    vocab: int
    hidden: int
    params_b: float = 0.0


def model_shapes(path: Path = paths.MODEL_SHAPES_FILE) -> dict[str, dict[str, str]]:
    """The table of real model shapes by model name, each row with its source column (read with
    the standard library: the measuring floor needs it)."""
    return forward.model_table(path)


def resolve_vocabs(items: Iterable[str | int], parameter: str = "models") -> list[ModelShape]:
    """Resolve model names or vocabulary sizes; a clear error names the bad item and the choices."""
    items = list(items)
    if not items:
        raise ValueError(f"{parameter} is empty: give model names or vocabulary sizes")
    table = model_shapes()
    shapes = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"{parameter}: {item!r} is neither a model name nor a size")
        if isinstance(item, int):
            if item <= 0:
                raise ValueError(f"{parameter}: vocabulary size {item} must be positive")
            shapes.append(ModelShape("", item, 0))
        elif isinstance(item, str) and item in table:
            row = table[item]
            shapes.append(ModelShape(item, int(row["vocab"]), int(row["hidden"]),
                                     float(row["params_b"])))
        else:
            raise ValueError(f"{parameter}: unknown model {item!r}; known: "
                             f"{', '.join(table)} (or give a vocabulary size as a number)")
    return shapes


def vocabs(items: Iterable[str | int], parameter: str = "models") -> list[int]:
    """The vocabulary sizes of model names or sizes (see :func:`resolve_vocabs`)."""
    return [shape.vocab for shape in resolve_vocabs(items, parameter)]


def positive_ints(values: Iterable[int], parameter: str) -> list[int]:
    """Check a list of sizes is non-empty and all positive integers; name the parameter if not."""
    values = list(values)
    if not values:
        raise ValueError(f"{parameter} is empty")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{parameter}: {value!r} is not a positive integer")
    return values


def _dtypes() -> dict[str, torch.dtype]:
    import torch

    return {name: getattr(torch, name) for name in catalogue.DTYPE_BYTES}


def __getattr__(name: str) -> Any:
    if name == "DTYPES":  # the supported dtypes by name, torch's
        return _dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def torch_dtype(name: str, parameter: str = "dtype") -> torch.dtype:
    """A supported floating dtype by name; a clear error names the parameter and the choices."""
    dtypes = _dtypes()
    if name not in dtypes:
        raise ValueError(f"{parameter}: unsupported dtype {name!r}; valid: {', '.join(dtypes)}")
    return dtypes[name]


def override(shape: ModelShape, vocab: int = 0, hidden: int = 0) -> ModelShape:
    """A model's shape with its vocabulary or hidden size replaced where given (0 keeps it)."""
    for name, value in (("vocab", vocab), ("hidden", hidden)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: {value!r} must be 0 (the model's) or a positive integer")
    shape = ModelShape(shape.model if not (vocab or hidden) else "", vocab or shape.vocab,
                       hidden or shape.hidden)
    if shape.hidden <= 0:
        raise ValueError("hidden: give a hidden size; this model has none in model_shapes.csv")
    return shape
