"""Wire types: the records that cross process boundaries.

Plain dataclasses with documented fields and nothing imported from the rest of the package, so
every process (driver, rollout actors, replay shards, learner, environment servers) can pickle and
unpickle them without pulling in heavy dependencies.

Paper symbols: a task ``tau`` with instruction; an abstract state ``s_t``; an action ``a_t``; a
transition ``(s_t, a_t, s_{t+1}, r_{t+1})``; a GRPO group is ``n`` trajectories of one task.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
