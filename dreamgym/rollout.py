"""Rollouts: many episodes at once against any ``Environment`` (real or synthetic).

No Ray here. ``run_episodes`` keeps one episode running on each environment instance it is given.
Real environments run in *lockstep*: each step gathers the agent turns ``(task, o_t, history)`` of all
running episodes, asks the policy for all their actions in one batched ``act(turns)`` call (a
``PolicyEngine``'s ``act``: one vLLM batch), then steps every environment with its action. Environments
that wait on a remote model (a ``SyntheticEnv`` over the experience-model router; ``threads`` above 1) run
*asynchronously*: every episode whose step has returned acts in the next policy batch while the other steps
are still in flight, so the experience model keeps all running episodes in its batch instead of idling
until the slowest reply (a long one, or a retried malformed one) of a lockstep step is done.
A finished episode's environment starts the next pending episode at once (continuous batching), so
the batches stay full while long and short episodes mix.

Each step becomes a ``Transition`` carrying the policy's tokens (prompt ids, reply ids, log-probs
under the sampling policy ``pi_old``) and the weight version that sampled it, so the learner can
build GRPO sequences from it. Episodes of the same task form a GRPO ``Group`` of ``n`` trajectories
(``group_trajectories``).

What is counted (``RolloutStats``):

- ``unparsable``: replies without a well-formed ``<action>`` tag (the environment still receives the
  stripped reply, as the agent-prompt contract says);
- ``invalid_actions``: actions outside the environment's admissible list, where it knows one;
- ``invalid_transitions``: synthetic steps whose experience-model reply could not be parsed
  (``info['valid'] is False``). Such a step ends its episode with reward 0 in ``SyntheticEnv``; the
  trajectory is marked ``invalid`` and ``group_trajectories`` leaves it out of its GRPO group, so a
  failure of the experience model never becomes a negative advantage for the policy.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dreamgym.envs.base import Environment
from dreamgym.types import (
    ActionSample,
    AgentTurn,
    Group,
    InvalidEpisodes,
    Observation,
    Task,
    Trajectory,
    Transition,
)

#: A batched policy: one ``ActionSample`` per agent turn, in order.
ActFn = Callable[[Sequence[AgentTurn]], list[ActionSample]]


@dataclass
class RolloutStats:
    """Counters of a batch of episodes (added up with ``+=``)."""

    episodes: int = 0
    steps: int = 0
    """Environment steps taken (= transitions produced)."""
    successes: int = 0
    reward_sum: float = 0.0
    """Sum of the episodes' total rewards."""
    unparsable: int = 0
    invalid_actions: int = 0
    """Actions outside the known admissible list."""
    actions_checked: int = 0
    """Steps whose admissible list was known (the denominator of ``invalid_actions``)."""
    invalid_transitions: int = 0
    """Synthetic steps whose experience-model reply was malformed after every retry."""
    invalid_episodes: int = 0
    """Episodes ended by an invalid transition (left out of GRPO groups)."""
    paid_episodes: int = 0
    """Valid episodes with a positive total reward (the synthetic reward rate of the simulator guard)."""
    outcome_agreements: int = 0
    """Valid episodes whose outcome and reward agree: a success exactly when the episode earned the full
    reward (1). A simulator that pays without success, or succeeds without paying, lowers it."""
    truncated_replies: int = 0
    """Replies cut by the policy's ``max_tokens``."""
    policy_tokens: int = 0
    """Reply tokens sampled by the policy."""
    act_seconds: float = 0.0
    """Wall time inside ``act`` (the policy engines)."""
    env_seconds: float = 0.0
    """Wall time inside ``reset``/``step`` (the environments: real engines or the experience model). Episodes
    run asynchronously (``threads`` above 1): wall time with at least one step in flight, which overlaps the
    policy calls made meanwhile (``act_seconds``)."""
    retrieval_seconds: float = 0.0
    """Synthetic steps: time spent retrieving demonstrations from the replay buffer, summed over the
    environments' threads (``env_seconds`` is wall time; their ratio splits it)."""
    model_seconds: float = 0.0
    """Synthetic steps: time spent waiting for the experience model, summed over the environments' threads."""
    seconds: float = 0.0
    """Wall time of the whole call."""

    def __iadd__(self, other: RolloutStats) -> RolloutStats:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)
        return self

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.episodes if self.episodes else 0.0

    def as_dict(self) -> dict[str, float]:
        d: dict[str, float] = asdict(self)
        d["success_rate"] = self.success_rate
        d["mean_reward"] = self.mean_reward
        d["unparsable_rate"] = self.unparsable / self.steps if self.steps else 0.0
        d["invalid_action_rate"] = self.invalid_actions / self.actions_checked if self.actions_checked else 0.0
        d["invalid_transition_rate"] = self.invalid_transitions / self.steps if self.steps else 0.0
        valid = self.episodes - self.invalid_episodes
        d["outcome_agreement_rate"] = self.outcome_agreements / valid if valid else 0.0
        d["episodes_per_s"] = self.episodes / self.seconds if self.seconds else 0.0
        d["steps_per_s"] = self.steps / self.seconds if self.seconds else 0.0
        return d


@dataclass
class _Running:
    """One episode in progress on one environment slot."""

    index: int
    """Position of the episode in the request (results come back in request order)."""
    task: Task
    episode_id: str
    observation: Observation
    history: list[tuple[str, str]] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    total_reward: float = 0.0
    invalid: bool = False


def _transition(run: _Running, sample: ActionSample, result: Any, source: str, policy: str) -> Transition:
    obs = run.observation
    valid = bool(result.info.get("valid", True))
    has_tokens = bool(sample.token_ids)
    return Transition(
        episode_id=run.episode_id,
        step=len(run.transitions),
        task_id=run.task.task_id,
        env=run.task.env,
        instruction=run.task.instruction or obs.instruction,
        state=obs.state,
        action=sample.action,
        next_state=result.observation.state,
        reward=float(result.reward),
        done=bool(result.done),
        success=bool(result.success),
        admissible_actions=list(obs.admissible_actions) if obs.admissible_actions is not None else None,
        source=source,
        policy=policy,
        valid=valid,
        action_parsed=sample.parsed,
        prompt_token_ids=list(sample.prompt_token_ids) if has_tokens else None,
        action_token_ids=list(sample.token_ids) if has_tokens else None,
        action_logprobs=list(sample.logprobs) if has_tokens else None,
        weight_version=sample.weight_version,
    )


def run_episodes(
    envs: Sequence[Environment],
    tasks: Sequence[Task],
    act: ActFn,
    *,
    source: str = "real",
    policy_name: str = "policy",
    threads: int = 1,
    episode_prefix: str | None = None,
    on_step: Callable[[RolloutStats], None] | None = None,
) -> tuple[list[Trajectory], RolloutStats]:
    """Run one episode per entry of ``tasks`` (repeat a task ``n`` times for a GRPO group).

    ``envs``: the environment instances to run them on, one episode per instance at a time.
    ``act``: the batched policy. ``source``: ``real`` or ``synthetic`` (recorded on every transition).
    ``threads``: 1 steps the environments of a lockstep step one after another (real Java engines are fast);
    above 1 the episodes run *asynchronously* on that many threads (environments that wait on a remote model,
    e.g. a ``SyntheticEnv``): an episode whose step returned acts again at once (one policy batch with every
    other episode ready then) instead of waiting for the slowest step of the lockstep, so the experience model
    keeps every running episode's request in its batch while a long or retried reply is still decoding.
    Returns the trajectories in the order of ``tasks`` and the counters.
    """
    if not envs:
        raise ValueError("run_episodes needs at least one environment")
    t_start = time.perf_counter()
    stats = RolloutStats()
    prefix = episode_prefix or uuid.uuid4().hex[:8]
    pending = list(enumerate(tasks))[::-1]  # pop() takes them in order
    slots: list[_Running | None] = [None] * len(envs)
    results: list[Trajectory | None] = [None] * len(tasks)
    pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None
    # duck-typed environments (wrappers, test doubles) without ``step_seconds`` report no split
    seconds_before = [getattr(e, "step_seconds", dict)() for e in envs]

    def call_all(fns: list[Callable[[], Any]]) -> list[Any]:
        if pool is None or len(fns) == 1:
            return [f() for f in fns]
        return list(pool.map(lambda f: f(), fns))

    def start(slot_ids: list[int]) -> None:
        starts = []
        for s in slot_ids:
            if not pending:
                break
            i, task = pending.pop()
            starts.append((s, i, task))
        t0 = time.perf_counter()
        observations = call_all([lambda s=s, task=task: envs[s].reset(task) for s, _, task in starts])
        stats.env_seconds += time.perf_counter() - t0
        for (s, i, task), obs in zip(starts, observations, strict=True):
            slots[s] = _Running(i, task, f"{prefix}-{i}", obs)

    def decide(live: list[int]) -> list[ActionSample]:
        """One batched policy call for the episodes on slots ``live``."""
        turns = []
        for s in live:
            r = slots[s]
            assert r is not None
            turns.append(AgentTurn(task=r.task, observation=r.observation, history=list(r.history),
                                   context_token_ids=_context(r)))
        t0 = time.perf_counter()
        samples = act(turns)
        stats.act_seconds += time.perf_counter() - t0
        if len(samples) != len(turns):
            raise RuntimeError(f"act returned {len(samples)} samples for {len(turns)} turns")
        return samples

    def record(s: int, smp: ActionSample, res: Any) -> bool:
        """Count slot ``s``'s step; returns whether its episode ended (the slot is then free)."""
        run = slots[s]
        assert run is not None
        tr = _transition(run, smp, res, source, f"{policy_name}@v{smp.weight_version}")
        run.transitions.append(tr)
        run.total_reward += tr.reward
        run.history.append((smp.action, res.observation.state))
        run.observation = res.observation
        stats.steps += 1
        stats.policy_tokens += len(smp.token_ids)
        stats.unparsable += not smp.parsed
        stats.truncated_replies += smp.finish_reason == "length"
        admissible = res.info.get("admissible")
        if admissible is None and tr.admissible_actions is not None:
            admissible = smp.action in tr.admissible_actions
        if admissible is not None:
            stats.actions_checked += 1
            stats.invalid_actions += not admissible
        if not tr.valid:
            stats.invalid_transitions += 1
            run.invalid = True
        if not res.done:
            return False
        results[run.index] = _finish(run, res.success)
        stats.episodes += 1
        stats.successes += bool(res.success) and not run.invalid
        stats.reward_sum += run.total_reward
        stats.invalid_episodes += run.invalid
        full = abs(run.total_reward - 1.0) <= 1e-6
        stats.outcome_agreements += not run.invalid and bool(res.success) == full
        stats.paid_episodes += not run.invalid and run.total_reward > 0
        slots[s] = None
        return True

    def lockstep() -> None:
        while any(r is not None for r in slots):
            live = [s for s, r in enumerate(slots) if r is not None]
            samples = decide(live)
            t0 = time.perf_counter()
            step_results = [envs[s].step(smp.action) for s, smp in zip(live, samples, strict=True)]
            stats.env_seconds += time.perf_counter() - t0
            freed = [s for s, smp, res in zip(live, samples, step_results, strict=True) if record(s, smp, res)]
            if freed:
                start(freed)
            if on_step is not None:
                on_step(stats)

    def asynchronous(pool: ThreadPoolExecutor) -> None:
        inflight: dict[Future[Any], tuple[int, ActionSample]] = {}
        waiting_since: float | None = None
        while True:
            busy = {s for s, _ in inflight.values()}
            ready = [s for s, r in enumerate(slots) if r is not None and s not in busy]
            if ready:
                for s, smp in zip(ready, decide(ready), strict=True):
                    inflight[pool.submit(envs[s].step, smp.action)] = (s, smp)
            if not inflight:
                break
            if waiting_since is None:
                waiting_since = time.perf_counter()
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            freed = []
            for fut in done:
                s, smp = inflight.pop(fut)
                if record(s, smp, fut.result()):
                    freed.append(s)
            if not inflight:  # env_seconds: wall time with at least one step in flight
                stats.env_seconds += time.perf_counter() - waiting_since
                waiting_since = None
            if freed:
                start(freed)
            if on_step is not None:
                on_step(stats)

    try:
        start(list(range(len(envs))))
        if pool is None:
            lockstep()
        else:
            asynchronous(pool)
    finally:
        if pool is not None:
            pool.shutdown(wait=False)
    for env, before in zip(envs, seconds_before, strict=True):
        after = getattr(env, "step_seconds", dict)()
        stats.retrieval_seconds += after.get("retrieval", 0.0) - before.get("retrieval", 0.0)
        stats.model_seconds += after.get("model", 0.0) - before.get("model", 0.0)
    stats.seconds = time.perf_counter() - t_start
    return [t for t in results if t is not None], stats


def _context(run: _Running) -> list[int] | None:
    """The previous step's prompt + reply ids: a chat-style prompt extends them (``AgentTurn.context_token_ids``)."""
    if not run.transitions:
        return None
    last = run.transitions[-1]
    if last.prompt_token_ids is None or last.action_token_ids is None:
        return None
    return [*last.prompt_token_ids, *last.action_token_ids]


def _finish(run: _Running, success: bool) -> Trajectory:
    versions = [t.weight_version for t in run.transitions if t.weight_version is not None]
    traj = Trajectory(task=run.task, transitions=run.transitions, success=bool(success) and not run.invalid,
                      total_reward=run.total_reward, weight_version=min(versions) if versions else 0)
    return traj


def is_valid(traj: Trajectory) -> bool:
    """False when an invalid synthetic transition ended the episode."""
    return all(t.valid for t in traj.transitions)


def learnable_part(traj: Trajectory, invalid_episodes: InvalidEpisodes = "drop") -> Trajectory | None:
    """What the learner and the replay buffer may take of an episode (``train.invalid_episodes``).

    An invalid synthetic transition (the experience model gave no usable reply within its attempts) ends the
    episode. ``drop``: the episode leaves the batch. ``truncate``: its valid prefix stays, as an episode that
    ended unsuccessfully with the reward it had earned; an episode invalid on its first step leaves. Dropping
    is biased: long episodes (most of them failures) meet an invalid reply more often, so the valid ones that
    remain are mostly successes and GRPO groups lose their reward variance."""
    if is_valid(traj):
        return traj
    if invalid_episodes == "drop":
        return None
    cut = next(i for i, t in enumerate(traj.transitions) if not t.valid)
    if cut == 0:
        return None
    kept = traj.transitions[:cut]
    return replace(traj, transitions=kept, success=False, total_reward=float(sum(t.reward for t in kept)))


def group_trajectories(trajectories: Sequence[Trajectory], min_size: int = 2,
                       invalid_episodes: InvalidEpisodes = "drop") -> tuple[list[Group], int]:
    """GRPO groups: the learnable part (``learnable_part``) of each task's trajectories (first-seen task order).
    Groups with fewer than ``min_size`` members are dropped. Returns the groups and how many trajectories were
    left out."""
    by_task: dict[str, Group] = {}
    dropped = 0
    for whole in trajectories:
        traj = learnable_part(whole, invalid_episodes)
        if traj is None:
            dropped += 1
            continue
        by_task.setdefault(traj.task.task_id, Group(task=traj.task, trajectories=[])).trajectories.append(traj)
    groups = []
    for g in by_task.values():
        if len(g.trajectories) >= min_size:
            groups.append(g)
        else:
            dropped += len(g.trajectories)
    return groups, dropped


def split_stale(groups: Sequence[Group], version: int, max_staleness: int) -> tuple[list[Group], list[Group]]:
    """``(fresh, stale)``: a group is stale when its oldest trajectory was sampled more than ``max_staleness``
    weight versions before ``version`` (the learner's current one); only fresh groups are learned from."""
    fresh, stale = [], []
    for g in groups:
        oldest = min(t.weight_version for t in g.trajectories)
        (fresh if version - oldest <= max_staleness else stale).append(g)
    return fresh, stale


def repeat_tasks(tasks: Sequence[Task], n: int) -> list[Task]:
    """Each task ``n`` times in a row: the episodes of ``n``-trajectory GRPO groups."""
    return [t for t in tasks for _ in range(n)]


def random_valid_act(seed: int = 0) -> ActFn:
    """The random-valid-action baseline: a uniformly random admissible action each step (no tokens).

    Where the environment does not know the admissible actions it answers ``look around``."""
    rng = random.Random(seed)

    def act(turns: Sequence[AgentTurn]) -> list[ActionSample]:
        out = []
        for turn in turns:
            actions = turn.observation.admissible_actions
            action = rng.choice(actions) if actions else "look around"
            out.append(ActionSample(text=action, action=action, parsed=True, prompt_token_ids=[], token_ids=[],
                                    logprobs=[], weight_version=-1))
        return out

    return act


def group_stats(groups: Sequence[Group]) -> dict[str, float]:
    """Reward variance facts of a batch of groups: how many carry GRPO signal."""
    if not groups:
        return {"groups": 0.0, "mixed_groups": 0.0, "mean_group_variance": 0.0, "min_group_size": 0.0}
    variances = []
    for g in groups:
        r = g.rewards
        m = sum(r) / len(r)
        variances.append(sum((x - m) ** 2 for x in r) / len(r))
    return {"groups": float(len(groups)), "mixed_groups": float(sum(v > 1e-12 for v in variances)),
            "mean_group_variance": sum(variances) / len(variances),
            "min_group_size": float(min(len(g.trajectories) for g in groups))}
