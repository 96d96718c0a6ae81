"""``SyntheticEnv``: the environment protocol on top of the experience model and retrieval.

Rollout code steps it exactly like a real environment. Each ``step(a_t)``:

1. retrieves the top-k demonstrations for ``(s_t, a_t)`` with the given ``retrieve`` callable (the
   replay buffer, or a ``TransitionIndex``);
2. asks the experience model (reasoning, then ``s_{t+1}``, ``r``, done, success) with the task, the last
   ``H`` steps of history and the valid actions where known;
3. returns a ``StepResult`` whose ``info`` says ``source='synthetic'``, whether the prediction is
   ``valid``, the reasoning, the attempts and retries spent, whether a rule settled the step (``settled``) and
   the retrieved demonstrations (``demonstrations``: how many; ``demonstration_ids`` and
   ``demonstration_scores``: their point ids and similarities, most similar first).

An invalid prediction (every attempt malformed) ends the episode with reward 0, no success,
``info['valid'] = False`` and the state unchanged: rollout code copies ``info['valid']`` into
``Transition.valid`` so the learner never takes it as a valid transition. The step budget
(``max_steps``) truncates the episode as in real environments.

Initial states come from ``task.params['initial_state']`` or from ``initial_state(task)`` (e.g.
``TransitionIndex.initial_state``: the state real episodes of that task started from). Valid actions
of a state come from ``admissible(state)`` when given (e.g. ``TransitionIndex.admissible``: the list
recorded for that exact state in real data; the rollout workers and ``synthetic_env_from_index`` pass
``admissible_like``, which lends a state the model wrote the list of the most similar recorded state).
After an action settled as a failure the list stays as it was: the real game leaves the agent where it was.
A state with no list is checked against ``action_space()``, every action real data accepts: an action outside
it is settled as a failure with no model call, so the model never pays for text no real state accepts; inside
it, the model decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import ClassVar, Protocol

from dreamgym.data.task_facts import SIMILAR_STATE_ACTIONS
from dreamgym.envs.base import Environment
from dreamgym.errors import EnvironmentSpecError
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.retrieval import Retriever
from dreamgym.experience.schema import ExperienceQuery, HistoryStep, Prediction, valid_actions
from dreamgym.experience.templates import state_rules_for
from dreamgym.types import Demonstration, Observation, StepResult, Task


class SyntheticEnv(Environment):
    family: ClassVar[str] = "synthetic"

    def __init__(
        self,
        model: ExperienceModel,
        retrieve: Retriever | None,
        env: str,
        *,
        top_k: int | None = None,
        max_steps: int = 20,
        state_max_chars: int = 2_000,
        task_source: Callable[[int, int, str], list[Task]] | None = None,
        initial_state: Callable[[Task], str | None] | None = None,
        admissible: Callable[[str], list[str] | None] | None = None,
        action_space: Callable[[], Collection[str] | None] | None = None,
    ) -> None:
        """``env``: spec of the imitated real environment (``twx:coin``); tasks of that spec are accepted.
        ``retrieve=None`` runs without demonstrations (the "no replay retrieval" ablation). ``action_space``:
        every action real data accepts (``OfflineTaskFacts.action_space``), for states with no admissible list."""
        super().__init__(f"synthetic:{env}", max_steps=max_steps, state_max_chars=state_max_chars)
        self.imitated = env
        self.model = model
        self.retrieve = retrieve
        self._seconds = {"retrieval": 0.0, "model": 0.0}
        self.top_k = model.prompt.top_k if top_k is None else top_k
        self._task_source = task_source
        self._initial_state = initial_state
        self._admissible = admissible
        self._action_space = action_space
        self._task: Task | None = None
        self._state = ""
        self._valid: list[str] | None = None
        self._history: list[HistoryStep] = []
        self._done = True
        self._last_demos: list[Demonstration] = []
        self._return = 0.0

    @property
    def state_rules(self) -> str:  # type: ignore[override]
        return state_rules_for(self.imitated)

    # -- tasks ---------------------------------------------------------------------------------
    def tasks(self, count: int, first: int = 0, split: str = "train") -> list[Task]:
        if self._task_source is None:
            raise EnvironmentSpecError(
                "this SyntheticEnv has no task source: pass task_source= (e.g. TransitionIndex.tasks) or "
                "reset it with tasks from the real environment"
            )
        return self._task_source(count, first, split)

    # -- episode -------------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        if task.env not in (self.imitated, self.spec):
            raise EnvironmentSpecError(f"task {task.task_id!r} is for {task.env!r}; this SyntheticEnv imitates "
                                       f"{self.imitated!r}")
        state = task.params.get("initial_state")
        if state is None and self._initial_state is not None:
            state = self._initial_state(task)
        if not state:
            raise EnvironmentSpecError(
                f"no initial state for task {task.task_id!r}: give it params['initial_state'] or pass "
                "initial_state= (e.g. TransitionIndex.initial_state over real data with this task)"
            )
        self._task = task
        self._state = self.abstract_state(str(state))
        self._history = []
        self._return = 0.0
        self._done = False
        self._valid = self._admissible(self._state) if self._admissible else None
        return Observation(text=self._state, state=self._state, admissible_actions=self._valid,
                           instruction=task.instruction)

    def step(self, action: str) -> StepResult:
        # Retrieval and the model call timed apart (``step_seconds``): the rollout counters split a synthetic
        # step's cost between the replay buffer and the experience model (``RolloutStats.retrieval_seconds``).
        # Not in ``info``: a step's info must not change from one run to the next (gymnasium's checker).
        t0 = time.perf_counter()
        q = self.query(action)
        t1 = time.perf_counter()
        pred = self.model.predict_one(q)
        self._seconds["retrieval"] += t1 - t0
        self._seconds["model"] += time.perf_counter() - t1
        return self.apply(action, pred)

    def step_seconds(self) -> dict[str, float]:
        return dict(self._seconds)

    def query(self, action: str) -> ExperienceQuery:
        """The experience-model query for ``action`` in the current state (retrieval done here)."""
        if self._done or self._task is None:
            raise RuntimeError("step() called with no running episode: call reset(task) first")
        demos = []
        if self.retrieve is not None and self.top_k > 0:
            demos = list(self.retrieve(self._state, action, self.top_k))
            wrong = next((d for d in demos if not isinstance(d, Demonstration)), None)
            if wrong is not None:  # a user's retriever: say what the contract is, not an AttributeError later
                raise TypeError(f"the retriever given to SyntheticEnv returned a {type(wrong).__name__}; it must "
                                "return dreamgym.types.Demonstration objects (transition, score, id), e.g. "
                                "Demonstration(transition=t, score=s, id=dreamgym.replay.records.point_id(t))")
        self._last_demos = demos
        return ExperienceQuery(
            env=self.imitated, instruction=self._task.instruction, state=self._state, action=action,
            history=list(self._history), demonstrations=demos, admissible_actions=self._valid,
            reward_so_far=self._return, action_space=self._space(),
        )

    def _space(self) -> Collection[str] | None:
        return self._action_space() if self._action_space else None

    def apply(self, action: str, pred: Prediction) -> StepResult:
        """Advance the episode with the experience model's prediction for ``query(action)``."""
        assert self._task is not None
        valid = valid_actions(self._valid, self._space())  # as the model's settle judged it
        admissible = None if valid is None else action in valid
        info = {"source": "synthetic", "valid": pred.valid, "invalid_reason": pred.invalid_reason,
                "reasoning": pred.reasoning, "attempts": pred.attempts, "retries": max(pred.attempts - 1, 0),
                "settled": pred.settled, "admissible": admissible, "demonstrations": len(self._last_demos),
                "demonstration_ids": [d.id for d in self._last_demos],
                "demonstration_scores": [round(float(d.score), 4) for d in self._last_demos]}
        if not pred.valid:
            self._done = True
            info["truncated"] = True
            obs = Observation(text=self._state, state=self._state, admissible_actions=self._valid,
                              instruction=self._task.instruction)
            return StepResult(observation=obs, reward=0.0, done=True, success=False, info=info)
        self._state = self.abstract_state(pred.next_state)
        self._return += pred.reward
        self._history.append(HistoryStep(action=action, state=self._state))
        truncated = not pred.done and len(self._history) >= self.max_steps
        self._done = pred.done or truncated
        info["truncated"] = truncated
        if not pred.settled:  # a ruled-out action leaves the agent where it was, with the same valid actions
            self._valid = self._admissible(self._state) if self._admissible else None
        obs = Observation(text=self._state, state=self._state, admissible_actions=self._valid,
                          instruction=self._task.instruction)
        return StepResult(observation=obs, reward=pred.reward, done=self._done,
                          success=pred.success and pred.done, info=info)

    def admissible_actions(self) -> list[str] | None:
        return None if self._valid is None else list(self._valid)

    def close(self) -> None:
        """Nothing to release: the experience model's client is shared and closed by its owner."""


class TaskFacts(Protocol):
    """What ``synthetic_env_from_index`` reads from an index of real data (``TransitionIndex`` has it)."""

    def __call__(self, state: str, action: str, k: int) -> Sequence[Demonstration]: ...
    def tasks(self, count: int | None = None, first: int = 0) -> list[Task]: ...
    def initial_state(self, task: Task) -> str | None: ...
    def admissible_like(self, state: str, min_similarity: float = 1.0) -> list[str] | None: ...
    def action_space(self) -> frozenset[str] | None: ...


def synthetic_env_from_index(
    model: ExperienceModel, index: TaskFacts, env: str, *, max_steps: int = 20, use_retrieval: bool = True,
    top_k: int | None = None, state_max_chars: int = 2_000, similar_state_actions: float = SIMILAR_STATE_ACTIONS,
) -> SyntheticEnv:
    """A ``SyntheticEnv`` whose retrieval, tasks, initial states and valid actions all come from one index
    of real transitions. ``use_retrieval=False``: no demonstrations (the "no replay retrieval" ablation).
    A state the model wrote borrows the valid actions of the most similar recorded state
    (``similar_state_actions``, as in training; ``1.0``: exact states only)."""
    return SyntheticEnv(
        model, index if use_retrieval else None, env, top_k=top_k, max_steps=max_steps,
        state_max_chars=state_max_chars,
        task_source=lambda count, first, split: index.tasks(count, first),
        initial_state=index.initial_state,
        admissible=lambda state: index.admissible_like(state, similar_state_actions),
        action_space=index.action_space,
    )


def step_batch(envs: Sequence[SyntheticEnv], actions: Sequence[str]) -> list[StepResult]:
    """Step many synthetic environments at once: one batched experience-model call, so a rollout worker
    running many episodes keeps the replicas' engines busy. All ``envs`` must share one model."""
    if not envs:
        return []
    model = envs[0].model
    if any(e.model is not model for e in envs):
        raise ValueError("step_batch needs environments that share one ExperienceModel")
    preds = model.predict([e.query(a) for e, a in zip(envs, actions, strict=True)])
    return [e.apply(a, p) for e, a, p in zip(envs, actions, preds, strict=True)]
