"""Helpers shared by the learner and policy-engine tests: trajectories with real token ids."""

from __future__ import annotations

from collections.abc import Sequence

from dreamgym.token_groups import random_groups, step_transition
from dreamgym.types import ActionSample, Group, Task, Trajectory

__all__ = ["groups_from_samples", "random_groups", "step_transition"]


def groups_from_samples(
    tasks: Sequence[Task], samples: Sequence[Sequence[ActionSample]], reward: dict[str, str]
) -> list[Group]:
    """One-step episodes: reward 1 when the action names ``reward[task_id]`` (the right object)."""
    groups = []
    for task, group in zip(tasks, samples, strict=True):
        trajs = []
        for k, s in enumerate(group):
            r = 1.0 if reward[task.task_id] in s.action.split() else 0.0
            tr = step_transition(task, 0, s.prompt_token_ids, s.token_ids, r, s.logprobs, f"{task.task_id}-{k}",
                                 s.weight_version)
            tr.action, tr.action_parsed = s.action, s.parsed
            trajs.append(Trajectory(task, [tr], r > 0, r, s.weight_version))
        groups.append(Group(task, trajs))
    return groups
