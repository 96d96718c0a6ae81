"""Wire types: the records that cross process boundaries.

Plain dataclasses with documented fields and nothing imported from the rest of the package, so
every process (driver, rollout actors, replay shards, learner, environment servers) can pickle and
unpickle them without pulling in heavy dependencies.

Paper symbols: a task ``tau`` with instruction; an abstract state ``s_t``; an action ``a_t``; a
transition ``(s_t, a_t, s_{t+1}, r_{t+1})``; a GRPO group is ``n`` trajectories of one task.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

#: ``train.invalid_episodes``: what becomes of an episode an invalid synthetic transition ended.
InvalidEpisodes = Literal["drop", "truncate"]

#: Where a transition came from. ``real``: a real environment; ``synthetic``: the experience model.
SOURCES = ("real", "synthetic")


@dataclass(frozen=True)
class Task:
    """One task ``tau``: what the agent must do, and how the environment reproduces it."""

    task_id: str
    """Stable id, unique within its environment (e.g. ``twx:coin/train/seed=7/numLocations=3``)."""
    env: str
    """Environment spec that runs it, ``family:name`` (e.g. ``twx:coin``, ``sciworld:boil``)."""
    instruction: str
    """The natural-language goal shown to the agent (empty until the environment tells it)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Environment parameters that reproduce it (game parameters, seed, variation, split, file)."""
    origin: str = "seed"
    """``seed`` for tasks from the environment or a task file, ``generated`` for curriculum tasks."""
    kind: str = ""
    """How a generated task was made (empty for seed tasks): ``param`` (a real parameter change,
    checked in and runnable by the real environment) or ``llm`` (an instruction written by the
    experience model for the parent's world; runs in synthesis, the real game keeps its own goal)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Task:
        return Task(**d)


@dataclass
class Observation:
    """What the agent sees after ``reset`` or ``step``."""

    text: str
    """The environment's raw observation text (may contain HTML or boilerplate)."""
    state: str
    """The compact abstract state ``s_t`` (normalised text) the experience model predicts."""
    admissible_actions: list[str] | None = None
    """Valid actions in this state where the environment knows them; ``None`` where it does not."""
    instruction: str = ""
    """The task instruction (repeated so a consumer needs only the observation)."""


@dataclass
class StepResult:
    """The result of ``step(action)``: next observation, reward ``r``, termination and outcome."""

    observation: Observation
    reward: float
    """Reward for this step, in [0, 1] for the adapters shipped here."""
    done: bool
    """The episode ended (goal reached, failure state, or the environment's own step limit)."""
    success: bool = False
    """The task was accomplished (only meaningful when ``done``)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Environment-specific extras (raw score, whether the action was admissible, ...)."""


@dataclass
class Transition:
    """One step ``(s_t, a_t) -> (s_{t+1}, r_{t+1}, done)``, the row of the offline data and the
    unit the replay buffer stores and retrieves."""

    episode_id: str
    step: int
    """0-based index of the step inside its episode."""
    task_id: str
    env: str
    instruction: str
    state: str
    action: str
    next_state: str
    reward: float
    done: bool
    success: bool
    admissible_actions: list[str] | None
    source: str = "real"
    """``real`` or ``synthetic`` (see ``SOURCES``)."""
    policy: str = ""
    """Which policy produced the action (``gold``, ``random``, ``policy@v3``, ...)."""
    valid: bool = True
    """False for synthetic transitions whose experience-model reply could not be parsed."""
    # -- policy tokens (set by policy rollouts; ``None`` for scripted policies and offline data) --
    action_parsed: bool = True
    """False when the policy's reply had no ``<action>...</action>`` tag; ``action`` then holds the
    stripped raw reply, which is what the environment received."""
    prompt_token_ids: list[int] | None = None
    """Token ids of the agent prompt the policy engine was given at this step."""
    action_token_ids: list[int] | None = None
    """Token ids the policy sampled for its reply (reasoning and action); the tokens GRPO trains on."""
    action_logprobs: list[float] | None = None
    """Log-probability of each sampled token under the sampling policy (after temperature)."""
    weight_version: int | None = None
    """The policy weight version that sampled this step's reply."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Trajectory:
    """One episode of a task: its transitions in order and the episode outcome."""

    task: Task
    transitions: list[Transition]
    success: bool
    total_reward: float
    weight_version: int = 0
    """The policy weight version that sampled the actions (for staleness accounting)."""


@dataclass
class Group:
    """A GRPO group: ``n`` trajectories of the same task under the same policy version."""

    task: Task
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float]:
        return [t.total_reward for t in self.trajectories]


@dataclass(frozen=True)
class WeightVersion:
    """A version of the policy weights, bumped by every learner step and carried by rollouts."""

    version: int
    step: int


@dataclass
class AgentTurn:
    """What the agent sees when it must act: the input of one policy decision."""

    task: Task
    observation: Observation
    history: list[tuple[str, str]] = field(default_factory=list)
    """Earlier steps of the episode as ``(action, observation state after it)``, oldest first."""
    context_token_ids: list[int] | None = None
    """The previous step's prompt ids followed by its sampled reply ids (``None`` on the first step, or when
    that step has no tokens, e.g. a scripted policy's). A ``chat``-style prompt extends it."""


@dataclass
class ActionSample:
    """One reply sampled by a policy engine, parsed into the action the environment receives."""

    text: str
    """The raw reply (reasoning, if any, and the tagged action)."""
    action: str
    """The action sent to the environment: the tag's content, or the stripped reply if unparsable."""
    parsed: bool
    """Whether the reply contained a well-formed action tag."""
    prompt_token_ids: list[int]
    """The prompt as token ids (chat template applied)."""
    token_ids: list[int]
    """The sampled reply tokens."""
    logprobs: list[float]
    """Log-probability of each sampled token under the sampling distribution (after temperature)."""
    weight_version: int
    """The weight version of the engine when it sampled this reply."""
    finish_reason: str = ""
    """``stop`` (end of sequence or the closing action tag) or ``length`` (hit ``max_tokens``)."""


@dataclass
class Demonstration:
    """One of the top-k demonstrations retrieved for a query ``(s_t, a_t)``: a real transition
    ``(s, a) -> (s', r, done, success)``, its similarity to the query and the metadata it was stored with.

    The replay buffer returns these, and so does the experience model's in-memory
    ``TransitionIndex``; the experience model's prompt shows them as evidence (``ExperienceQuery``)."""

    transition: Transition
    score: float
    """Similarity to the query, higher is closer: for the replay buffer the dot product of the unit
    vectors ``phi(s, a)``; for ``TransitionIndex`` its token-overlap score. Informational only."""
    id: str
    """The point id: a UUID derived from the transition's content (``dreamgym.replay.records.point_id``)."""
    iteration: int = -1
    """Training iteration that produced it (``-1`` for offline seed data)."""
    policy_version: int = -1
    """Policy weight version that sampled its action (``-1`` where unknown, e.g. offline data)."""

    # The transition's fields read through: the experience model's prompt builder reads these.
    @property
    def state(self) -> str:
        return self.transition.state

    @property
    def action(self) -> str:
        return self.transition.action

    @property
    def next_state(self) -> str:
        return self.transition.next_state

    @property
    def reward(self) -> float:
        return self.transition.reward

    @property
    def done(self) -> bool:
        return self.transition.done

    @property
    def success(self) -> bool:
        return self.transition.success
