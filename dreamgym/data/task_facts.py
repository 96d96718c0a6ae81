"""What real transitions tell about tasks, with no real environment: the facts synthesis starts from.

DreamGym trains in the experience model; the real environment is needed only to evaluate and for real
iterations. Everything else a synthetic episode needs comes from the offline data: the tasks seen (with
their instructions), each task's initial state ``s_0`` (the most common step-0 state of its episodes) and
the valid actions recorded per state (and their union, the action space). ``OfflineTaskFacts`` collects them
in one pass; the rollout workers, the curriculum (its seed tasks in synthetic-only runs) and
``TransitionIndex`` share it.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path

from dreamgym.types import Task, Transition
from dreamgym.words import jaccard, words

SIMILAR_STATE_ACTIONS = 0.8
"""Default word-set Jaccard at which a state never recorded borrows a recorded state's valid actions
(``experience_model.similar_state_actions``)."""


class OfflineTaskFacts:
    """Tasks, initial states and valid actions per state, from real transitions."""

    def __init__(self, transitions: Iterable[Transition] = ()) -> None:
        self._tasks: OrderedDict[str, Task] = OrderedDict()
        self._initial: dict[str, Counter[str]] = {}
        self._admissible: dict[str, list[str]] = {}
        # admissible_like's index: the states with a list in recorded order, their word sets, and word -> states
        self._states: list[str] = []
        self._state_words: list[frozenset[str]] = []
        self._postings: dict[str, list[int]] = {}
        self._actions: frozenset[str] = frozenset()  # replaced, never mutated: rollout threads read it per step
        for t in transitions:
            self.add(t)

    @staticmethod
    def from_parquet(path: str | Path, env: str | None = None) -> OfflineTaskFacts:
        """The facts of a transitions file (only rows of ``env`` when given)."""
        from dreamgym.data.transitions import iter_transitions

        return OfflineTaskFacts(t for t in iter_transitions(path) if env is None or t.env == env)

    def add(self, t: Transition) -> None:
        if t.task_id not in self._tasks:
            self._tasks[t.task_id] = Task(task_id=t.task_id, env=t.env, instruction=t.instruction)
        if t.step == 0:
            self._initial.setdefault(t.task_id, Counter())[t.state] += 1
        if t.admissible_actions is not None:
            self.add_state(t.state, t.admissible_actions)

    def add_state(self, state: str, admissible: Iterable[str] | None) -> None:
        """Record the valid actions of ``state`` (the first list seen for a state is kept)."""
        if admissible is not None:
            acts = list(admissible)
            if state not in self._admissible:
                self._admissible[state] = acts
                # appended before the postings name it, so a reader in another thread never sees a dangling index
                state_words = words(state)
                self._state_words.append(state_words)
                self._states.append(state)
                for w in state_words or ("",):
                    self._postings.setdefault(w, []).append(len(self._states) - 1)
            if not self._actions.issuperset(acts):
                self._actions = self._actions.union(acts)

    def __len__(self) -> int:
        return len(self._tasks)

    def tasks(self, count: int | None = None, first: int = 0) -> list[Task]:
        """Tasks seen in the data, in first-seen order, each with its initial state in
        ``params['initial_state']`` (so a ``SyntheticEnv`` resets it without the real environment)."""
        out = []
        for task in list(self._tasks.values())[first: None if count is None else first + count]:
            init = self.initial_state(task)
            params = {**task.params, **({"initial_state": init} if init else {})}
            out.append(Task(task.task_id, task.env, task.instruction, params, task.origin))
        return out

    def initial_state(self, task: Task) -> str | None:
        """``s_0`` of ``task``: the most common first state of its episodes in the data."""
        init = self._initial.get(task.task_id)
        return init.most_common(1)[0][0] if init else None

    def admissible(self, state: str) -> list[str] | None:
        """The valid actions recorded for exactly this state, if it was seen."""
        acts = self._admissible.get(state)
        return list(acts) if acts is not None else None

    def admissible_like(self, state: str, min_similarity: float = 1.0) -> list[str] | None:
        """The valid actions of ``state``, or of the most similar recorded state when ``state`` was never seen
        (word-set Jaccard at least ``min_similarity``; ties go to the state recorded first). An experience
        model's state is mostly a near copy of a real one (a word changed, a room misnamed); without this its
        policy would act there with no list, a prompt it never meets in the real environment."""
        exact = self.admissible(state)
        if exact is not None or min_similarity >= 1.0:
            return exact
        mine = words(state)
        best, best_sim = None, min_similarity
        for i in sorted(self._candidates(mine, min_similarity)):  # recorded order: ties go to the first
            sim = jaccard(mine, self._state_words[i])
            if sim > best_sim or (sim == best_sim and best is None):
                best, best_sim = i, sim
        return None if best is None else list(self._admissible[self._states[best]])

    def _candidates(self, mine: frozenset[str], min_similarity: float) -> set[int]:
        """Recorded states that can reach ``min_similarity`` with ``mine``, from the word postings instead of a scan
        of every state (ALFWorld-sized data records tens of thousands). Jaccard ``>= t`` needs ``|A & B| >= t|A|``,
        so ``B`` holds at least one of any ``|A| - ceil(t|A|) + 1`` words of ``A``: the rarest ones are probed."""
        if min_similarity <= 0.0:
            return set(range(len(self._states)))
        if not mine:
            return set(self._postings.get("", ()))
        probe = len(mine) - math.ceil(min_similarity * len(mine) - 1e-9) + 1
        rarest = sorted(mine, key=lambda w: len(self._postings.get(w, ())))[:probe]
        return {i for w in rarest for i in self._postings.get(w, ())}

    def action_space(self) -> frozenset[str] | None:
        """Every action recorded as valid in some state (None when the data records no valid actions, e.g.
        WebArena): synthesis settles an action outside it as a failure in a state it has no list for."""
        return self._actions or None
