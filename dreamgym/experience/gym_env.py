"""A ``gymnasium.Env`` view of any DreamGym ``Environment`` (real or synthetic), with text spaces.

Gym and RLlib code can then step a ``SyntheticEnv`` (or a real adapter): observations are the abstract
state strings, actions are command strings, ``reset`` picks the next task (or ``options['task']``),
``terminated`` is the environment's own end and ``truncated`` the step budget or an invalid synthetic
transition. ``info`` carries the instruction, the valid actions where known and the step's own info.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from dreamgym.envs.base import Environment
from dreamgym.types import Task

#: Characters of the text spaces: printable ASCII and whitespace (states are normalised text).
CHARSET = frozenset(string.printable)


class TextGymEnv(gym.Env[str, str]):
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's attribute

    def __init__(self, env: Environment, tasks: list[Task] | None = None, max_state_chars: int | None = None,
                 max_action_chars: int = 256) -> None:
        self.env = env
        self.task_list = list(tasks) if tasks is not None else None
        n = max_state_chars or env.state_max_chars
        self.observation_space = spaces.Text(max_length=n, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=max_action_chars, min_length=1, charset=CHARSET)
        self._next = 0

    def _pick_task(self, options: dict[str, Any] | None) -> Task:
        if options and options.get("task") is not None:
            return options["task"]  # type: ignore[no-any-return]
        if self.task_list is None:
            self.task_list = self.env.tasks(64)
        if not self.task_list:
            raise ValueError("TextGymEnv has no tasks: pass tasks= or options={'task': ...}")
        i = int(self.np_random.integers(len(self.task_list)))
        return self.task_list[i]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = self._pick_task(options)
        obs = self.env.reset(task)
        return self._clip(obs.state), {"instruction": obs.instruction, "task_id": task.task_id,
                                       "admissible_actions": obs.admissible_actions}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        res = self.env.step(action)
        truncated = bool(res.info.get("truncated", False))
        info = dict(res.info)
        info.update(success=res.success, admissible_actions=res.observation.admissible_actions)
        return self._clip(res.observation.state), float(res.reward), res.done and not truncated, truncated, info

    def _clip(self, state: str) -> str:
        text = "".join(c if c in CHARSET else "?" for c in state)
        return text[: self.observation_space.max_length]

    def close(self) -> None:
        self.env.close()
