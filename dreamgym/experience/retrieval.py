"""Retrieval of top-k demonstrations: the ``retrieve(state, action, k)`` seam and a small in-memory index.

The experience model is grounded by real transitions similar to the query. Any callable
``retrieve(state, action, k)`` returning ``dreamgym.types.Demonstration`` records works, so the replay
buffer plugs in as it is (its ``retrieve`` returns them). ``TransitionIndex`` is the simple one shipped
here: token overlap over an offline transitions file, used by tests, by the retrieval-only copy
baseline and by small runs; its demonstrations carry the same content-derived ids as the buffer's.

Token-overlap score of a stored transition for a query ``(s, a)``::

    jaccard(words(s), words(s_stored)) + action_weight * jaccard(words(a), words(a_stored))
        + exact_action_bonus * [a == a_stored]

Identical stored transitions are kept once (with their count, used to break ties), so the k
demonstrations are distinct.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym.data.task_facts import OfflineTaskFacts
from dreamgym.replay.records import point_id
from dreamgym.types import Demonstration, Task, Transition
from dreamgym.words import jaccard, words

#: ``retrieve(state, action, k) -> demonstrations``, most similar first; the replay buffer or ``TransitionIndex``.
Retriever = Callable[[str, str, int], Sequence[Demonstration]]

@dataclass
class _Entry:
    t: Transition
    state_words: frozenset[str]
    action_words: frozenset[str]
    count: int
    episodes: set[str]
    _id: str | None = None

    @property
    def id(self) -> str:
        """The transition's point id (``point_id``), computed once, when first retrieved."""
        if self._id is None:
            self._id = point_id(self.t)
        return self._id


class TransitionIndex:
    """In-memory token-overlap retrieval over transitions, plus the task facts a ``SyntheticEnv`` needs
    (the tasks seen in the data, their initial states, valid actions of a known state)."""

    def __init__(
        self, transitions: Iterable[Transition], action_weight: float = 1.0, exact_action_bonus: float = 1.0,
        cache_size: int = 4096,
    ) -> None:
        self.action_weight = action_weight
        self.exact_action_bonus = exact_action_bonus
        entries: dict[tuple[Any, ...], _Entry] = {}
        self.facts = OfflineTaskFacts()
        """Tasks, initial states and valid actions of the indexed data."""
        self.size = 0
        for t in transitions:
            self.size += 1
            key = (t.state, t.action, t.next_state, t.reward, t.done, t.success)
            e = entries.get(key)
            if e is None:
                entries[key] = _Entry(t, words(t.state), words(t.action), 1, {t.episode_id})
            else:
                e.count += 1
                e.episodes.add(t.episode_id)
            self.facts.add(t)
        self.entries = list(entries.values())
        self._search = functools.lru_cache(maxsize=cache_size)(self._search_uncached)

    @staticmethod
    def from_parquet(path: str | Path, env: str | None = None, limit: int | None = None, **kw: Any) -> TransitionIndex:
        """Index a transitions file (only rows of ``env`` when given; the first ``limit`` rows)."""
        from dreamgym.data.transitions import iter_transitions

        def rows() -> Iterable[Transition]:
            n = 0
            for t in iter_transitions(path):
                if env is not None and t.env != env:
                    continue
                if limit is not None and n >= limit:
                    return
                n += 1
                yield t

        return TransitionIndex(rows(), **kw)

    # -- retrieval -----------------------------------------------------------------------------
    def _search_uncached(self, state: str, action: str, k: int, exclude_episode: str | None) -> tuple[_Entry, ...]:
        sw, aw = words(state), words(action)
        scored = []
        for e in self.entries:
            if exclude_episode is not None and e.episodes == {exclude_episode}:
                continue
            s = jaccard(sw, e.state_words) + self.action_weight * jaccard(aw, e.action_words)
            if action == e.t.action:
                s += self.exact_action_bonus
            scored.append((s, e.count, e))
        scored.sort(key=lambda x: (-x[0], -x[1]))
        return tuple(e for _, _, e in scored[:k])

    def search(self, state: str, action: str, k: int, exclude_episode: str | None = None) -> list[Demonstration]:
        """Top-``k`` distinct demonstrations for ``(state, action)``. ``exclude_episode`` leaves out
        transitions seen only in that episode (leave-one-episode-out, for training examples)."""
        sw, aw = words(state), words(action)
        out = []
        for e in self._search(state, action, k, exclude_episode):
            score = jaccard(sw, e.state_words) + self.action_weight * jaccard(aw, e.action_words)
            out.append(Demonstration(e.t, score, e.id))
        return out

    def __call__(self, state: str, action: str, k: int) -> list[Demonstration]:
        return self.search(state, action, k)

    # -- task facts ----------------------------------------------------------------------------
    def tasks(self, count: int | None = None, first: int = 0) -> list[Task]:
        """Tasks seen in the data (``OfflineTaskFacts.tasks``)."""
        return self.facts.tasks(count, first)

    def initial_state(self, task: Task) -> str | None:
        return self.facts.initial_state(task)

    def admissible(self, state: str) -> list[str] | None:
        return self.facts.admissible(state)

    def admissible_like(self, state: str, min_similarity: float = 1.0) -> list[str] | None:
        return self.facts.admissible_like(state, min_similarity)

    def action_space(self) -> frozenset[str] | None:
        return self.facts.action_space()
