"""Normalisation of raw observations into the compact abstract state the experience model predicts.

The paper replaces raw pages with a compact textual state: markup, scripts and boilerplate are
stripped so the experience model spends its tokens on what changes. This does the generic part for
every environment: HTML to text, entity unescaping, whitespace collapsing, optional boilerplate
patterns, a length cap.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from html.parser import HTMLParser

_SKIP_TAGS = {"script", "style", "head", "noscript", "svg"}
_BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "table", "section"}
_TAG_RE = re.compile(r"<\s*/?\s*[a-zA-Z][^>]*>")


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS and self._skip:
            self._skip -= 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_to_text(raw: str) -> str:
    """Visible text of an HTML fragment (block elements become line breaks)."""
    parser = _TextExtractor()
    parser.feed(raw)
    parser.close()
    return "".join(parser.parts)


def normalise_state(raw: str, max_chars: int = 2_000, boilerplate: Iterable[str] = ()) -> str:
    """Compact abstract state of a raw observation.

    HTML is reduced to its visible text, lines matching any ``boilerplate`` regex are dropped,
    runs of spaces collapse to one, blank lines disappear, and the result is cut at ``max_chars``
    (with a trailing ``...`` marking the cut).
    """
    text = html_to_text(raw) if _TAG_RE.search(raw) else html.unescape(raw)
    patterns = [re.compile(p) for p in boilerplate]
    lines = []
    for line in text.splitlines():
        line = " ".join(line.split())
        if line and not any(p.search(line) for p in patterns):
            lines.append(line)
    state = "\n".join(lines)
    if len(state) > max_chars:
        state = state[: max_chars - 3].rstrip() + "..."
    return state
