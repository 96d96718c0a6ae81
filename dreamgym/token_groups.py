"""GRPO groups of one-step episodes built straight from token ids, with no environment or model behind them.

The learner benchmarks, the GPU check and the learner tests need batches whose shape they choose (prompt and
reply lengths, rewards that give every group reward variance) rather than batches a policy happened to sample.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from dreamgym.types import Group, Task, Trajectory, Transition


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
    """A final real transition whose policy turn is ``prompt`` -> ``reply`` (log-probs -1 unless given)."""
    return Transition(
        episode_id=episode, step=step, task_id=task.task_id, env=task.env, instruction=task.instruction,
        state="", action="", next_state="", reward=reward, done=True, success=reward > 0, admissible_actions=None,
        source="real", policy=f"policy@v{version}", prompt_token_ids=list(prompt), action_token_ids=list(reply),
        action_logprobs=list(logprobs) if logprobs is not None else [-1.0] * len(reply), weight_version=version,
    )


def one_step_group(task: Task, turns: Sequence[tuple[Sequence[int], Sequence[int], Sequence[float] | None]],
                   rewards: Sequence[float]) -> Group:
    """One GRPO group of one-step episodes: ``turns[i] = (prompt ids, reply ids, log-probs or None)``."""
    trajs = []
    for i, ((prompt, reply, logprobs), r) in enumerate(zip(turns, rewards, strict=True)):
        tr = step_transition(task, 0, prompt, reply, r, logprobs=logprobs, episode=f"{task.task_id}-{i}")
        trajs.append(Trajectory(task, [tr], r > 0, r))
    return Group(task, trajs)


def random_groups(seed: int, n_groups: int = 3, group_size: int = 4, vocab: int = 200,
                  reply_len: int = 6) -> list[Group]:
    """``n_groups`` groups of random prompts (4-11 tokens) and replies (2-``reply_len`` tokens), rewards half 0
    and half 1 in a shuffled order: every group has reward variance, so every one carries a GRPO signal."""
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        task = Task(f"task-{g}", "twx:coin", f"task {g}")
        prompt = [1] + [rng.randrange(10, vocab) for _ in range(rng.randrange(4, 12))]
        rewards = [float(i % 2) for i in range(group_size)]
        rng.shuffle(rewards)
        turns = [(prompt, [rng.randrange(10, vocab) for _ in range(rng.randrange(2, reply_len + 1))], None)
                 for _ in rewards]
        groups.append(one_step_group(task, turns, rewards))
    return groups
