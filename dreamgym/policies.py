"""Scripted behaviour policies for offline data collection.

``gold`` follows the environment's expert plan, ``random`` picks a uniformly random admissible
action, ``mixed`` plays each episode as one or the other (gold with probability ``gold_fraction``).
Each policy is seeded per episode so collected data does not depend on how episodes were spread
over workers.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod

from dreamgym.envs.base import Environment
from dreamgym.errors import EnvironmentSpecError
from dreamgym.types import Observation


class ScriptedPolicy(ABC):
    name: str = ""

    def begin(self, env: Environment, obs: Observation, rng: random.Random) -> None:  # noqa: B027
        """Called after ``reset``; the policy may read the expert plan here."""

    @abstractmethod
    def act(self, obs: Observation, rng: random.Random) -> str: ...


class RandomPolicy(ScriptedPolicy):
    name = "random"

    def act(self, obs: Observation, rng: random.Random) -> str:
        if not obs.admissible_actions:
            raise EnvironmentSpecError(
                "the random policy needs the environment's admissible actions, but this environment gave none "
                "(env.admissible_actions is false, or the environment has no list of valid actions, like "
                "remote:webarena); set env.admissible_actions true, or use --policy gold where it has an expert plan"
            )
        return rng.choice(obs.admissible_actions)


class GoldPolicy(ScriptedPolicy):
    """Replays the expert plan; if the plan runs out before the episode ends, acts randomly."""

    name = "gold"

    def __init__(self) -> None:
        self._plan: list[str] = []
        self._fallback = RandomPolicy()

    def begin(self, env: Environment, obs: Observation, rng: random.Random) -> None:
        plan = env.gold_actions()
        if plan is None:
            raise EnvironmentSpecError(f"environment {env.spec!r} has no expert plan; use --policy random")
        self._plan = list(plan)

    def act(self, obs: Observation, rng: random.Random) -> str:
        return self._plan.pop(0) if self._plan else self._fallback.act(obs, rng)


class MixedPolicy(ScriptedPolicy):
    """Per episode: gold with probability ``gold_fraction``, otherwise random. An episode drawn gold in an
    environment without an expert plan for it (most AgentGym servers) is played randomly."""

    def __init__(self, gold_fraction: float) -> None:
        self.gold_fraction = gold_fraction
        self._gold = GoldPolicy()
        self._random = RandomPolicy()
        self._current: ScriptedPolicy = self._random

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"mixed:{self._current.name}"

    def begin(self, env: Environment, obs: Observation, rng: random.Random) -> None:
        self._current = self._gold if rng.random() < self.gold_fraction else self._random
        if self._current is self._gold and env.gold_actions() is None:
            self._current = self._random
        self._current.begin(env, obs, rng)

    def act(self, obs: Observation, rng: random.Random) -> str:
        return self._current.act(obs, rng)


def make_policy(name: str, gold_fraction: float = 0.5) -> ScriptedPolicy:
    if name == "gold":
        return GoldPolicy()
    if name == "random":
        return RandomPolicy()
    if name == "mixed":
        return MixedPolicy(gold_fraction)
    raise EnvironmentSpecError(f"unknown collection policy {name!r}; valid: gold, random, mixed")
