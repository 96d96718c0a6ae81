"""Helpers shared by the learner and policy-engine tests: trajectories with real token ids."""

from __future__ import annotations

import random
from collections.abc import Sequence

from dreamgym.types import ActionSample, Group, Task, Trajectory, Transition


def step_transition(
    task: Task,
    step: int,
    prompt: Sequence[int],
    reply: Sequence[int],
    reward: float,
    logprobs: Sequence[float] | None = None,
    episode: str = "ep",
    version: int = 0,
) -> Transition:
    return Transition(
        episode_id=episode, step=step, task_id=task.task_id, env=task.env, instruction=task.instruction,
        state="", action="", next_state="", reward=reward, done=True, success=reward > 0, admissible_actions=None,
        source="real", policy=f"policy@v{version}", prompt_token_ids=list(prompt), action_token_ids=list(reply),
        action_logprobs=list(logprobs) if logprobs is not None else [-1.0] * len(reply), weight_version=version,
    )


def random_groups(
    seed: int, n_groups: int = 3, group_size: int = 4, vocab: int = 200, reply_len: int = 6
) -> list[Group]:
    """Single-step trajectories with random prompts/replies and 0/1 rewards (every group mixed)."""
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        task = Task(f"task-{g}", "twx:coin", f"task {g}")
        prompt = [1] + [rng.randrange(10, vocab) for _ in range(rng.randrange(4, 12))]
        rewards = [float(i % 2) for i in range(group_size)]
        rng.shuffle(rewards)
        trajs = []
        for i, r in enumerate(rewards):
            reply = [rng.randrange(10, vocab) for _ in range(rng.randrange(2, reply_len + 1))]
            tr = step_transition(task, 0, prompt, reply, r, episode=f"{g}-{i}")
            trajs.append(Trajectory(task, [tr], r > 0, r))
        groups.append(Group(task, trajs))
    return groups


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
