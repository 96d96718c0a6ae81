"""Running scripted episodes in a real environment and turning them into transitions.

The library half of ``dreamgym collect``: no Ray here. ``actors/collect.py`` spreads
``collect_range`` calls over workers and streams their batches to Parquet.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dreamgym.envs.base import Environment
from dreamgym.policies import ScriptedPolicy
from dreamgym.types import Task, Transition


@dataclass
class EpisodeStats:
    episodes: int = 0
    transitions: int = 0
    successes: int = 0

    def add(self, other: EpisodeStats) -> None:
        self.episodes += other.episodes
        self.transitions += other.transitions
        self.successes += other.successes


def run_episode(
    env: Environment, task: Task, policy: ScriptedPolicy, rng: random.Random, episode_id: str
) -> list[Transition]:
    """Play one episode of ``task`` to its end (the environment enforces the step budget)."""
    obs = env.reset(task)
    policy.begin(env, obs, rng)
    instruction = obs.instruction or task.instruction
    out: list[Transition] = []
    # The adapter ends the episode at max_steps; the extra bound only guards a misbehaving server.
    for step in range(env.max_steps + 1):
        action = policy.act(obs, rng)
        res = env.step(action)
        out.append(
            Transition(
                episode_id=episode_id,
                step=step,
                task_id=task.task_id,
                env=task.env,
                instruction=instruction,
                state=obs.state,
                action=action,
                next_state=res.observation.state,
                reward=float(res.reward),
                done=bool(res.done),
                success=bool(res.success and res.done),
                admissible_actions=obs.admissible_actions,
                source="real",
                policy=policy.name,
            )
        )
        obs = res.observation
        if res.done:
            break
    return out


def episode_rng(run_seed: int, episode_index: int) -> random.Random:
    """The RNG of one episode: a function of the run seed and the episode's index only."""
    return random.Random(run_seed * 1_000_003 + episode_index)


def collect_range(
    env: Environment, policy: ScriptedPolicy, first: int, count: int, split: str, run_seed: int, run_tag: str
) -> tuple[list[Transition], EpisodeStats]:
    """Episodes of tasks ``first .. first+count-1`` of ``split``, one episode each."""
    transitions: list[Transition] = []
    stats = EpisodeStats()
    for i, task in enumerate(env.tasks(count, first=first, split=split)):
        index = first + i
        episode = run_episode(env, task, policy, episode_rng(run_seed, index), f"{run_tag}/{index}")
        transitions += episode
        stats.episodes += 1
        stats.transitions += len(episode)
        stats.successes += int(bool(episode) and episode[-1].success)
    return transitions, stats
