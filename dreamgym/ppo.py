"""PPO for multi-turn agents, the exact variant this project runs (``learner.algorithm: ppo``).

The unit of decision is the agent *turn*: turn ``t`` of an episode is the state ``s_t`` (everything the
policy saw up to its reply: prompt, earlier replies, observations) and the reply ``a_t`` (a run of
tokens). A critic ``V_phi`` scores each state once, at the *value position* of the turn: the last
token before the reply (the end of the prompt/observation), i.e. the state value before the reply.

Rewards are per turn: ``r_t`` is the reward the environment returned for turn ``t``
(``Transition.reward``); whatever of the episode's ``total_reward`` the steps do not account for is
added to the last turn, so an episode-end reward alone works too. Advantages are GAE over the turns of
one trajectory (not over tokens), the episode end bootstrapping with 0 (a truncated episode is treated
as terminal):

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)            (V(s_T) = 0)
    A_t     = delta_t + gamma * lambda * A_{t+1}            (A_T = 0)
    R_t     = A_t + V(s_t)                                   (the critic's regression target)

with ``V`` the critic *before* this step's update (``V_old``). Every reply token of turn ``t`` gets
``A_t``; prompt and observation tokens are masked out exactly as in GRPO (``learner.sequences``).
``gamma = lambda = 1`` makes ``A_t = sum_{k>=t} r_k - V(s_t)``, REINFORCE with a learned baseline.

Normalisation (``learner.norm_adv``): the ``A_t`` of all the batch's turns are whitened together,
``(A - mean) / (std + eps)`` (ddof = 0), once per step, before mini-batching; with fewer than two turns
(or zero spread) they are left as they are, so a batch of one trajectory still trains. The returns
``R_t`` are never normalised.

Policy loss: the same clipped surrogate, KL penalty and aggregation weights as GRPO
(``dreamgym.grpo.policy_loss``, ``token_weights``), with a per-token ``A_t`` instead of a per-trajectory
``A_i``. No trajectory or group is dropped: a group of any size (1 included) trains, since the baseline
is the critic, not the group.

Value loss, PPO2-style clipping around ``V_old`` (``learner.value_clip``; 0 disables it), averaged over
the turns of the mini-batch and scaled by ``learner.value_coef``:

    V_clip = V_old + clip(V - V_old, -c, c)
    L_V    = value_coef * mean_t 1/2 max((V - R)^2, (V_clip - R)^2)

The critic is a separate model with its own AdamW (``learner.critic_lr``), stepped once per mini-batch
beside the policy, so the two losses never share a gradient. ``explained_variance`` of ``V_old``
against ``R`` is the critic's health metric (1: perfect, 0: no better than a constant, < 0: worse).

Like ``dreamgym.grpo`` this module needs no torch import (the loss uses tensor methods only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def turn_rewards(step_rewards: Sequence[float], total_reward: float) -> list[float]:
    """``r_t`` per turn: the steps' rewards, with the part of ``total_reward`` they miss added to the last."""
    r = [float(x) for x in step_rewards]
    if r:
        r[-1] += float(total_reward) - sum(r)
    return r


def gae(
    rewards: Sequence[float], values: Sequence[float], gamma: float = 1.0, lam: float = 1.0
) -> tuple[list[float], list[float]]:
    """Turn-level GAE of one trajectory: ``(A_t, R_t)`` for ``t = 0..T-1`` (see the module docstring)."""
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards for {len(values)} values")
    n = len(rewards)
    adv = [0.0] * n
    running = 0.0
    for t in reversed(range(n)):
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    returns = [a + v for a, v in zip(adv, values, strict=True)]
    return adv, returns


def normalize(xs: Sequence[float], eps: float = 1e-6) -> list[float]:
    """``(x - mean) / (std + eps)`` over all ``xs`` (ddof = 0); unchanged with < 2 values or zero spread."""
    n = len(xs)
    if n < 2:
        return list(xs)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    if std <= 1e-12 * max(1.0, abs(mean)):
        return list(xs)
    return [(x - mean) / (std + eps) for x in xs]


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and population std of ``xs`` (0, 0 when empty)."""
    n = len(xs)
    if n == 0:
        return 0.0, 0.0
    mean = sum(xs) / n
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / n)


def explained_variance(values: Sequence[float], returns: Sequence[float]) -> float:
    """``1 - Var(R - V) / Var(R)``; 0 when ``Var(R) = 0`` (nothing to explain) or there are no turns."""
    if not returns:
        return 0.0
    _, std_r = mean_std(returns)
    if std_r <= 0.0:
        return 0.0
    _, std_d = mean_std([r - v for r, v in zip(returns, values, strict=True)])
    return 1.0 - (std_d / std_r) ** 2


@dataclass
class ValueTerms:
    """The value loss of a micro-batch and sums for metrics."""

    loss: Tensor
    """``value_coef * sum_t w_t * 1/2 max(...)`` over the micro-batch's value positions."""
    turns: float
    """Value positions (turns) in the micro-batch."""
    clipped: float
    """Turns where the clipped branch was the larger (active) one."""
    sq_err_sum: float
    """Sum of ``(V - R)^2`` (unclipped), for the mean squared error."""


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    weights: Tensor,
    mask: Tensor,
    clip: float = 0.2,
    coef: float = 1.0,
) -> ValueTerms:
    """Clipped value loss; all tensors have one shape (e.g. ``[B, T]`` over positions).

    ``values``: ``V_phi`` (requires grad); ``old_values``: ``V_old`` (no grad); ``returns``: ``R_t``;
    ``weights``: per-turn weight (``1 / turns`` of the mini-batch); ``mask``: 1 at value positions.
    """
    mask = mask.to(values.dtype)
    err = (values - returns) ** 2
    if clip > 0.0:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        err_clip = (v_clip - returns) ** 2
        per_turn = err.maximum(err_clip)
        is_clipped = float(((err_clip.detach() > err.detach()).to(mask.dtype) * mask).sum())
    else:
        per_turn = err
        is_clipped = 0.0
    loss = coef * 0.5 * (per_turn * weights * mask).sum()
    return ValueTerms(
        loss=loss,
        turns=float(mask.sum()),
        clipped=is_clipped,
        sq_err_sum=float((err.detach() * mask).sum()),
    )
