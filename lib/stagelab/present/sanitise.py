"""Nothing live from a run's notebooks: the HTML this project exports from an executed notebook
(a run's own, or one someone sent) keeps only markup from an allow-list.

A sent run's ``.ipynb`` may hold anything: a Markdown cell with a ``<script>``, a ``text/html``
output with an ``onerror``, an ``application/javascript`` output. So before the export every
output keeps only the kinds of data this project shows (:data:`SHOWN`: text, HTML, Markdown,
PNG and JPEG figures), and after it the whole page body is cleaned with bleach (the sanitiser
nbconvert itself uses) against an allow-list of tags and attributes: no script, no style, no
frame, no form, no event handler, no URL but a page's own, a web address or a figure's
``data:image`` (:func:`sanitised_html`). Torch-free.
"""

from __future__ import annotations

import re
from typing import Any

import bleach

# What an output may show; any other kind of data (JavaScript, widgets, SVG, PDF) is dropped.
SHOWN = frozenset({"text/plain", "text/html", "text/markdown", "image/png", "image/jpeg"})
TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del",
    "details", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5",
    "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "q", "s", "samp", "small", "span",
    "strong", "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr",
    "u", "ul", "var"})
PLAIN_ATTRIBUTES = frozenset({"class", "id", "title", "alt", "colspan", "rowspan", "scope",
                              "align"})
FIGURES = ("data:image/png;base64,", "data:image/jpeg;base64,")
PROTOCOLS = frozenset({"http", "https", "mailto", "data"})  # data: for a figure's src alone


LINK_SCHEMES = ("http", "https", "mailto")  # what a link may name besides the page's own
# What a browser removes from a URL before reading it: tab, newline and carriage return
# anywhere, C0 controls and spaces at either end ("da\tta:" is "data:" to it).
_URL_IGNORED = re.compile("[\t\n\r]")
_URL_EDGES = "".join(chr(c) for c in range(0x21))


def link_allowed(value: str) -> bool:
    """Whether a link's ``href`` names a page of the run (a relative name, a ``#`` fragment)
    or a web address, read as a browser reads it: no ``data:`` or ``javascript:`` hidden by a
    tab, and no protocol-relative ``//host`` (another site, whatever the page's scheme)."""
    url = _URL_IGNORED.sub("", value).strip(_URL_EDGES)
    if url[:2].replace("\\", "/") == "//":
        return False
    scheme, colon, _ = url.partition(":")
    if colon and not any(mark in scheme for mark in "/?#"):
        return scheme.lower() in LINK_SCHEMES
    return True


def _attribute_allowed(tag: str, name: str, value: str) -> bool:
    if name in PLAIN_ATTRIBUTES:
        return True
    if tag == "img" and name == "src":
        return value.startswith(FIGURES)
    if tag == "a" and name == "href":
        return link_allowed(value)
    return False


def sanitised_html(markup: str) -> str:
    """``markup`` with every tag and attribute outside the allow-list removed (a removed
    element's text stays, as text): what no browser can run."""
    return bleach.clean(markup, tags=TAGS, attributes=_attribute_allowed, protocols=PROTOCOLS,
                        strip=True, strip_comments=True)


def shown_outputs(nb: Any) -> Any:
    """``nb`` (an nbformat node) with every output's data of a kind outside :data:`SHOWN`
    dropped, and every attachment of a Markdown cell, in place."""
    for cell in nb.get("cells", []):
        cell.pop("attachments", None)
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            data = output.get("data")
            if isinstance(data, dict):
                for kind in [k for k in data if k not in SHOWN]:
                    del data[kind]
    return nb
