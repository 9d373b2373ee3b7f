"""A notebook's tagged ``parameters`` cell read as data: the names it declares and their
defaults, parsed (never run) with the standard library, so that the measuring node, the
runner and ``keep`` (which re-derives a run's verdict with the parameters it was run with)
read a notebook's defaults one way.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from stagelab.core.errors import UserError


def notebook_parameters(path: Path) -> dict[str, Any]:
    """The defaults of a notebook's ``parameters`` cell, as Python values (a default that is not
    a literal reads as None). Read with the standard library: the measuring floor needs it."""
    try:
        cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise UserError(f"notebook {path} cannot be read: {exc}") from exc
    tagged = [cell for cell in cells if cell.get("cell_type") == "code"
              and "parameters" in cell.get("metadata", {}).get("tags", [])]
    if not tagged:
        raise UserError(f"notebook {Path(path).name} has no cell tagged 'parameters'")
    source = tagged[0]["source"]
    tree = ast.parse(source if isinstance(source, str) else "".join(source))
    declared = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            declared[node.targets[0].id] = _literal(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            declared[node.target.id] = _literal(node.value)
    return declared


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None  # a computed default: any type is accepted
