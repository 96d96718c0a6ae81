"""The environment protocol shared by every environment, real or synthetic.

Rollout code only ever talks to an ``Environment``: it cannot tell a real TextWorldExpress game, an
environment server reached over HTTP and the experience model's ``SyntheticEnv`` apart. One
instance runs one episode at a time (``reset`` starts a new one); run many instances for
parallel episodes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from dreamgym.envs.abstract_state import normalise_state
from dreamgym.types import Observation, StepResult, Task


class Environment(ABC):
    """A text environment: ``reset(task) -> Observation``, ``step(action) -> StepResult``."""

    family: ClassVar[str] = ""
    """Spec prefix of the adapter (``twx``, ``sciworld``, ``alfworld``, ``remote``, ``synthetic``)."""

    state_rules: ClassVar[str] = (
        "The state is the text the environment shows after the action: what the agent sees, "
        "with markup and boilerplate removed."
    )
    """What the abstract state contains, for the experience model's prompt."""

    def __init__(self, spec: str, max_steps: int = 20, state_max_chars: int = 2_000) -> None:
        self.spec = spec
        self.max_steps = max_steps
        self.state_max_chars = state_max_chars

    # -- tasks ---------------------------------------------------------------------------------
    @abstractmethod
    def tasks(self, count: int, first: int = 0, split: str = "train") -> list[Task]:
        """``count`` reproducible tasks of this environment starting at seed/variation ``first``."""

    # -- episode -------------------------------------------------------------------------------
    @abstractmethod
    def reset(self, task: Task) -> Observation:
        """Start an episode of ``task`` and return the first observation."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply ``action``; an inadmissible action is not an error, the environment answers it."""

    def admissible_actions(self) -> list[str] | None:
        """Valid actions in the current state, ``None`` where the environment cannot tell."""
        return None

    def gold_actions(self) -> list[str] | None:
        """The expert's plan for the current episode from its start, where the environment has one."""
        return None

    def step_seconds(self) -> dict[str, float]:
        """Seconds this environment's steps have spent so far, by part (a ``SyntheticEnv``: ``retrieval`` and
        ``model``), for the rollout counters; empty where a step has no parts worth telling apart."""
        return {}

    def abstract_state(self, raw: str) -> str:
        """Normalise a raw observation into the compact abstract state ``s_t``."""
        return normalise_state(raw, max_chars=self.state_max_chars)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release engine resources (JVMs, sockets)."""

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
