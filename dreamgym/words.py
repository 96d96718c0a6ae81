"""Word-set similarity of texts: the lexical retrieval's score and the state matching of synthesis share it."""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> frozenset[str]:
    """The lower-case words of ``text``, as a set."""
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Word-set Jaccard similarity (two empty sets are identical)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)
