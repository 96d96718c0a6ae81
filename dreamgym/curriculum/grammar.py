"""Validation of generated task instructions: format, duplicates, and the environment's task grammar.

A text variant is accepted only if

- **format**: after the reply is parsed it is one line of natural language, within the length range,
  without markup, template leftovers or runs of non-words (``check_format``);
- **not a duplicate**: no task of the pool has the same normalised instruction, and its word-set
  Jaccard similarity to the parent and to every pool task of the environment stays below
  ``duplicate_similarity`` (environments such as TextWorldExpress give every seed of a game the same
  instruction, so a paraphrase of it is no new task);
- **within the task grammar** (``TaskGrammar``): at least ``min_known_words`` of its content words are
  words the environment itself uses (its instructions, observations and admissible actions, gathered
  by resetting real tasks with ``environment_vocabulary``), and it keeps at least one content word of
  its parent, so it stays a task of the same kind in the same world. This is a vocabulary grammar, not
  a parser: it rejects variants that name objects, places or actions the environment has never shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dreamgym.words import jaccard as word_set_jaccard

if TYPE_CHECKING:
    from dreamgym.envs.base import Environment
    from dreamgym.types import Task

_WORD = re.compile(r"[a-z][a-z'-]*")
#: A token of natural language: a word (possibly quoted or punctuated) or a number/price.
_WORDLIKE = re.compile(r"[\"'(]?(?:[A-Za-z][A-Za-z'-]*|\$?\d+(?:[.,]\d+)*)[\"')]?[.,;:!?]?[\"')]?")

#: Function words that carry no task content (they never count against the grammar).
_STOPWORDS_TEXT = """
a an the and or but if then than so as of to in on at by for with from into onto out up down over under
about after before again all any both each few more most other some such no nor not only own same too very
can will just should now is are was were be been being have has had do does did doing it its it's this that
these those there here what which who whom when where why how your you i me my we our they them their he
she his her once until while also every one two three four five six seven eight nine ten first second
third next last let's lets let must may might need needs make sure try using use get gets without within
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())


def words(text: str) -> list[str]:
    """Lower-case word tokens."""
    return _WORD.findall(text.lower())


def content_words(text: str) -> set[str]:
    """Words that are not stop words and have at least three letters."""
    return {w for w in words(text) if len(w) >= 3 and w not in STOPWORDS}


def jaccard(a: str, b: str) -> float:
    """Word-set Jaccard similarity of two instructions, over this module's words (letters, apostrophes and
    hyphens: "don't" and "living-room" stay one word, unlike the retrieval's ``dreamgym.words``)."""
    return word_set_jaccard(frozenset(words(a)), frozenset(words(b)))


def _stem(w: str) -> str:
    """A crude plural/verb-form stem so 'coins'/'coin' and 'opens'/'open' match."""
    for suffix in ("ies", "es", "s", "ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            return w[: -len(suffix)]
    return w


def check_format(text: str, min_chars: int, max_chars: int) -> str | None:
    """``None`` if ``text`` looks like a task instruction, else why not."""
    if not text.strip():
        return "empty"
    if "\n" in text.strip():
        return "more than one line"
    n = len(text)
    if n < min_chars:
        return f"too short ({n} < {min_chars} characters)"
    if n > max_chars:
        return f"too long ({n} > {max_chars} characters)"
    if re.search(r"[<>{}\[\]|\\]|https?://", text):
        return "contains markup, brackets or a URL"
    tokens = text.split()
    if len(tokens) < 4:
        return f"only {len(tokens)} words"
    wordlike = sum(1 for t in tokens if _WORDLIKE.fullmatch(t))
    if wordlike < 0.8 * len(tokens):
        return f"not natural language ({wordlike}/{len(tokens)} tokens are words)"
    return None


@dataclass
class TaskGrammar:
    """The vocabulary grammar of one environment's tasks (see the module docstring)."""

    vocabulary: set[str] = field(default_factory=set)
    """Content words the environment uses; empty disables the vocabulary check."""
    min_known: float = 0.8
    """Share of a variant's content words that must be in ``vocabulary``."""

    def __post_init__(self) -> None:
        self._stems = {_stem(w) for w in self.vocabulary}

    def extend(self, texts: Iterable[str]) -> None:
        for t in texts:
            for w in content_words(t):
                self.vocabulary.add(w)
                self._stems.add(_stem(w))

    def unknown_words(self, text: str) -> list[str]:
        return sorted(w for w in content_words(text) if w not in self.vocabulary and _stem(w) not in self._stems)

    def check(self, instruction: str, parent: Task) -> str | None:
        """``None`` if ``instruction`` is within the grammar as a variant of ``parent``, else why not."""
        mine = content_words(instruction)
        if not mine:
            return "no content words"
        parent_stems = {_stem(w) for w in content_words(parent.instruction)}
        if parent_stems and not parent_stems & {_stem(w) for w in mine}:
            return "shares no content word with its parent task"
        if self.vocabulary:
            unknown = self.unknown_words(instruction)
            known_share = 1 - len(unknown) / len(mine)
            if known_share < self.min_known:
                return f"uses words the environment does not know: {', '.join(unknown[:8])}"
        return None


def environment_vocabulary(env: Environment, tasks: Sequence[Task], resets: int = 8) -> set[str]:
    """Content words of ``tasks``' instructions plus, for the first ``resets`` of them, the first
    observation and the admissible actions the real environment shows after ``reset``."""
    vocab: set[str] = set()
    for t in tasks:
        vocab |= content_words(t.instruction)
    for t in list(tasks)[:resets]:
        obs = env.reset(t)
        vocab |= content_words(obs.text) | content_words(obs.instruction)
        for a in obs.admissible_actions or env.admissible_actions() or []:
            vocab |= content_words(a)
    return vocab
