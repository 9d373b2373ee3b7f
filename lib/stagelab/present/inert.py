"""Text from a record made inert before it reaches Markdown: a record may come from a stranger
(a measured folder from another machine, a run someone sent), and a GPU name, a note or a
finding is data, never markup.

* :func:`markdown_text` for a value placed in Markdown prose (the README's Results): no raw
  HTML (``<`` and ``>`` escaped), no link or reference definition (``]`` before ``(``, ``[``
  or ``:`` escaped), no new line (a heading or list of its own), no control character;
* :func:`markdown_code` for a value placed in a code span: no backtick to leave it, one line;
* :func:`inert_notebook` for an executed notebook before its HTML export: every Markdown
  output (built from records by the analysis) is made inert the same way.

HTML pages escape with :func:`html.escape` where they are built. Torch-free.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")
_LINK_CLOSE = re.compile(r"\](?=[(\[:])")


def one_line(value: Any) -> str:
    """``value`` as text on one line: control characters and line breaks become one space."""
    return _CONTROL.sub(" ", "" if value is None else str(value))


def _inert(text: str) -> str:
    text = text.replace("<", "&lt;").replace(">", "&gt;")
    return _LINK_CLOSE.sub(r"\\]", text)


def markdown_text(value: Any) -> str:
    """A record's value for Markdown prose: one line, no HTML, no link."""
    return _inert(one_line(value))


def markdown_code(value: Any) -> str:
    """A record's value for a Markdown code span: one line, no backtick."""
    return one_line(value).replace("`", "'")


def inert_markdown(text: str) -> str:
    """A Markdown output (several lines of the analysis's own making, with records' values in
    them) with no raw HTML and no link: its line structure is kept."""
    return "\n".join(_inert(line) for line in str(text).split("\n"))


def inert_notebook(nb: Any) -> Any:
    """``nb`` (an nbformat node) with every ``text/markdown`` output made inert, in place."""
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            data = output.get("data") or {}
            if "text/markdown" in data:
                source = data["text/markdown"]
                text = "".join(source) if isinstance(source, list) else str(source)
                data["text/markdown"] = inert_markdown(text)
    return nb
