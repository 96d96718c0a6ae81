"""Trajectories -> token sequences with a loss mask over the policy's own tokens.

Each step of a policy rollout records the prompt the engine was given (``prompt_token_ids``) and
the reply it sampled (``action_token_ids``). A trajectory becomes one or more token sequences:

- When a step's prompt extends the previous sequence (a multi-turn chat where the prompt of step
  ``t+1`` is the prompt of step ``t`` + reply ``t`` + the next observation), the steps are merged
  into one sequence: ``prompt_0 | reply_0 | obs_1 | reply_1 | ...``.
- Otherwise (a fresh prompt per step, e.g. the windowed-history agent prompt), a new sequence
  starts: ``prompt_t | reply_t``.

The mask is True exactly at the positions of reply tokens (the policy's own tokens: reasoning,
action and the end-of-turn token it sampled); system/user prompts and observations are False.
The same group-relative advantage ``A_i`` applies to every masked token of trajectory ``i`` (GRPO).
Each step is one agent *turn*: its reply span is recorded (``turn_starts`` / ``turn_ends``), so PPO
(``dreamgym/ppo.py``) can give every reply token its turn's advantage ``A_t`` and read the critic's
value at the turn's last prompt/observation token (the target column of the turn's first reply token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dreamgym.grpo import BatchAdvantages, LossAgg, batch_advantages, token_weights
from dreamgym.ppo import turn_rewards
from dreamgym.types import Group, Trajectory


@dataclass
class TokenSequence:
    """One training sequence. Lists are aligned with ``input_ids``."""

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    """True where the token was sampled by the policy (its log-prob enters the loss)."""
    behaviour_logprobs: list[float] = field(default_factory=list)
    """The engine's sampling log-prob at masked positions, 0.0 elsewhere."""
    sample: int = 0
    """Index of the trajectory in the batch (the unit of per-sequence aggregation)."""
    advantage: float = 0.0
    """``A_i`` of the trajectory."""
    weight: float = 0.0
    """``w_t``, the aggregation weight of each of its masked tokens."""
    turn_starts: list[int] = field(default_factory=list)
    """Index in ``input_ids`` of the first reply token of each turn (step) in the sequence."""
    turn_ends: list[int] = field(default_factory=list)
    """One past the last reply token of each turn."""
    engine_logprobs: bool = True
    """Every step carried the engine's sampling log-probs (``behaviour_logprobs`` are real)."""
    token_advantages: list[float] | None = None
    """PPO: per-token advantages aligned with ``input_ids`` (``A_t`` on turn ``t``'s reply); ``None``: ``advantage``."""
    turn_returns: list[float] = field(default_factory=list)
    """PPO: the critic's target ``R_t`` per turn (aligned with ``turn_starts``)."""
    turn_old_values: list[float] = field(default_factory=list)
    """PPO: the critic's value ``V_old(s_t)`` per turn before the step."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)


def trajectory_sequences(traj: Trajectory, sample: int = 0) -> list[TokenSequence]:
    """Token sequences of one trajectory (see the module docstring for when steps merge)."""
    seqs: list[TokenSequence] = []
    cur: TokenSequence | None = None
    for tr in traj.transitions:
        has_logprobs = True
        if tr.prompt_token_ids is None or tr.action_token_ids is None:
            raise ValueError(
                f"step {tr.step} of episode {tr.episode_id!r} has no token ids: only trajectories sampled by a "
                "policy engine can be trained on"
            )
        prompt, reply = list(tr.prompt_token_ids), list(tr.action_token_ids)
        logprobs = list(tr.action_logprobs) if tr.action_logprobs is not None else [0.0] * len(reply)
        if tr.action_logprobs is None:
            has_logprobs = False
        if len(logprobs) != len(reply):
            raise ValueError(f"step {tr.step} of {tr.episode_id!r}: {len(logprobs)} log-probs for {len(reply)} tokens")
        n = len(cur.input_ids) if cur is not None else 0
        if cur is not None and len(prompt) >= n and prompt[:n] == cur.input_ids:
            new_prompt = prompt[n:]
        else:
            cur = TokenSequence(sample=sample)
            seqs.append(cur)
            new_prompt = prompt
        start = len(cur.input_ids) + len(new_prompt)
        cur.turn_starts.append(start)
        cur.turn_ends.append(start + len(reply))
        cur.engine_logprobs = cur.engine_logprobs and has_logprobs
        cur.input_ids += new_prompt + reply
        cur.loss_mask += [False] * len(new_prompt) + [True] * len(reply)
        cur.behaviour_logprobs += [0.0] * len(new_prompt) + logprobs
    return seqs


@dataclass
class GrpoBatch:
    """The sequences of one learner step and what was dropped on the way."""

    sequences: list[TokenSequence]
    num_samples: int
    """Trajectories that carry signal (in kept groups)."""
    advantages: BatchAdvantages
    rewards: list[float]
    """Episode rewards of all trajectories of all groups (degenerate ones included)."""


def build_batch(
    groups: Sequence[Group],
    scale_by_std: bool = True,
    eps: float = 1e-6,
    agg: LossAgg = "token-mean",
    max_response_tokens: int = 1024,
) -> GrpoBatch:
    """Advantages per group, degenerate groups dropped, sequences with ``A_i`` and ``w_t`` attached."""
    adv = batch_advantages([g.rewards for g in groups], scale_by_std, eps)
    seqs: list[TokenSequence] = []
    sample = 0
    for k, advantages in zip(adv.kept, adv.advantages, strict=True):
        for traj, a in zip(groups[k].trajectories, advantages, strict=True):
            for s in trajectory_sequences(traj, sample):
                s.advantage = a
                seqs.append(s)
            sample += 1
    assign_weights(seqs, agg, max_response_tokens)
    return GrpoBatch(seqs, sample, adv, [r for g in groups for r in g.rewards])


def assign_weights(seqs: Sequence[TokenSequence], agg: LossAgg, max_response_tokens: int) -> None:
    """Set ``w_t`` on every sequence from the policy-token counts of the trajectories among ``seqs``."""
    samples = sorted({s.sample for s in seqs})
    index = {s: i for i, s in enumerate(samples)}
    counts = [0] * len(samples)
    for s in seqs:
        counts[index[s.sample]] += s.num_policy_tokens
    weights = token_weights(counts, agg, max_response_tokens)
    for s in seqs:
        s.weight = weights[index[s.sample]]


@dataclass
class PpoBatch:
    """The sequences of one PPO step, every trajectory kept, with its turns located in them."""

    sequences: list[TokenSequence]
    num_samples: int
    """Trajectories (all of them: PPO drops nothing)."""
    rewards: list[float]
    """Episode rewards of all trajectories."""
    turns: list[list[tuple[int, int]]]
    """``turns[i][t]``: ``(index into sequences, turn index inside it)`` of turn ``t`` of trajectory ``i``."""
    turn_rewards: list[list[float]]
    """``r_t`` per turn of each trajectory (``dreamgym.ppo.turn_rewards``)."""


def build_ppo_batch(
    groups: Sequence[Group], agg: LossAgg = "token-mean", max_response_tokens: int = 1024
) -> PpoBatch:
    """Sequences of every trajectory with their turns and per-turn rewards, ``w_t`` attached (advantages
    come later, from the critic: ``learner.critic.assign_targets``)."""
    seqs: list[TokenSequence] = []
    turns: list[list[tuple[int, int]]] = []
    rewards: list[list[float]] = []
    sample = 0
    for g in groups:
        for traj in g.trajectories:
            where: list[tuple[int, int]] = []
            for s in trajectory_sequences(traj, sample):
                if s.turn_starts and s.turn_starts[0] < 1:
                    raise ValueError(f"episode of task {traj.task.task_id!r}: a turn with an empty prompt has no "
                                     "state to value")
                where += [(len(seqs), k) for k in range(len(s.turn_starts))]
                seqs.append(s)
            turns.append(where)
            rewards.append(turn_rewards([tr.reward for tr in traj.transitions], traj.total_reward))
            sample += 1
    assign_weights(seqs, agg, max_response_tokens)
    return PpoBatch(seqs, sample, [r for g in groups for r in g.rewards], turns, rewards)
