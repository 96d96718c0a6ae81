"""GRPO, the exact variant this project runs.

For a task ``q`` the policy samples a group of ``G`` trajectories ``o_1..o_G`` with episode
rewards ``r_1..r_G``. Every policy token ``t`` of trajectory ``i`` (its replies only; prompts and
observations are masked out) gets the same group-relative advantage

    A_i = (r_i - mean(r)) / (std(r) + eps)         (GRPO; std = sqrt(reward_variance), ddof = 0)
    A_i =  r_i - mean(r)                           (Dr. GRPO: ``scale_by_std=False``)

A group whose rewards are all equal has ``A_i = 0`` for every ``i`` and carries no signal: it is
counted (``degenerate``) and dropped before the forward pass, so it costs no compute and does not
dilute the token mean. The per-token loss is the PPO clipped surrogate with separate clip bounds
(DAPO's clip-higher) plus an optional k3 KL penalty to a frozen reference policy:

    rho_t  = exp(log pi_theta(o_t) - log pi_old(o_t))
    L_t    = -min(rho_t A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) A_i)
           + beta * (exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1)     (k3)

``beta = 0`` disables the penalty and the learner keeps no reference model. With one optimizer
step per batch (``mini_batches = 1``) ``pi_old = pi_theta`` detached, so ``rho = 1``, clipping never
binds and the gradient is exactly the group-baselined REINFORCE gradient; with more mini-batches
``pi_old`` is the policy before the batch's first update (or the engine's sampling log-probs).

Aggregation (how the ``L_t`` become one scalar) is a fixed weight per token, ``L = sum_t w_t L_t``,
computed once per batch so micro-batching and gradient accumulation give the same gradient:

- ``token-mean`` (default; DAPO, Dr. GRPO's recommendation): ``w_t = 1 / N`` with ``N`` the number
  of policy tokens in the batch. Every token counts equally, so long replies are not down-weighted.
- ``seq-mean-token-mean`` (original GRPO): ``w_t = 1 / (B * |o_i|)``: mean over a trajectory's
  tokens, then over the ``B`` trajectories. Biased towards short replies.
- ``seq-mean-token-sum-norm`` (Dr. GRPO): ``w_t = 1 / (B * L_max)`` with a constant ``L_max``.

Why this variant: token-mean with clip-higher and no KL is the common, stable default for
agentic RL from a small instruct model (DAPO, Dr. GRPO); std scaling stays on by default as in
the DreamGym paper's GRPO, and every alternative is one config switch (``learner.*``).

Engine/learner mismatch (``learner.tis``, shared with PPO): the engines sample in bf16, the learner
recomputes log-probs in fp32, so ``pi_old`` (learner) is not exactly the sampling policy ``mu`` (engine).
With the switch on, each policy token's weight becomes ``w_t * min(exp(log pi_old - log mu), C)``
(truncated importance sampling, ``C = tis_cap``; ``tis_weights``). The gap is always measured as the k3
estimate of ``KL(mu || pi_old)`` on the sampled tokens (``engine_gap``).

This module needs no torch import: the loss uses tensor methods only, so the advantage math can be
used by the driver and the curriculum (reward variance) without torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import Tensor

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


# ----------------------------------------------------------------------------------------------
# Advantages


def reward_variance(rewards: Sequence[float]) -> float:
    """The reward variance of one group, the paper's ``V_tau = (1/n) sum_i (r_i - mean r)^2``.

    The population variance (ddof = 0) over the ``n`` rewards; 0 for an empty group (and, as the formula
    gives, for a single reward). ``std(r)`` of the GRPO advantage is its square root; the curriculum
    scores tasks by it (``dreamgym.curriculum.scoring``).
    """
    n = len(rewards)
    if n == 0:
        return 0.0
    mean = sum(rewards) / n
    return sum((r - mean) ** 2 for r in rewards) / n


def group_advantages(rewards: Sequence[float], scale_by_std: bool = True, eps: float = 1e-6) -> list[float] | None:
    """``A_i`` for one group, or ``None`` when the group is degenerate (all rewards equal)."""
    g = len(rewards)
    if g == 0:
        return None
    mean = sum(rewards) / g
    std = math.sqrt(reward_variance(rewards))
    if std <= 1e-12 * max(1.0, abs(mean)):
        return None
    scale = 1.0 / (std + eps) if scale_by_std else 1.0
    return [(r - mean) * scale for r in rewards]


@dataclass
class BatchAdvantages:
    """Advantages of a batch of groups, with the degenerate groups dropped."""

    kept: list[int] = field(default_factory=list)
    """Indices of the groups that carry signal."""
    advantages: list[list[float]] = field(default_factory=list)
    """``advantages[k][i]``: ``A_i`` of trajectory ``i`` of group ``kept[k]``."""
    degenerate: int = 0
    """Groups dropped because all their rewards were equal."""


def batch_advantages(
    group_rewards: Sequence[Sequence[float]], scale_by_std: bool = True, eps: float = 1e-6
) -> BatchAdvantages:
    out = BatchAdvantages()
    for k, rewards in enumerate(group_rewards):
        adv = group_advantages(rewards, scale_by_std, eps)
        if adv is None:
            out.degenerate += 1
        else:
            out.kept.append(k)
            out.advantages.append(adv)
    return out


# ----------------------------------------------------------------------------------------------
# Aggregation weights


def token_weights(num_tokens: Sequence[int], agg: LossAgg = "token-mean", max_tokens: int = 1024) -> list[float]:
    """The weight ``w_t`` shared by every policy token of each trajectory (``num_tokens[i]`` tokens)."""
    b = len(num_tokens)
    total = sum(num_tokens)
    if b == 0 or total == 0:
        return [0.0] * b
    if agg == "token-mean":
        return [1.0 / total] * b
    if agg == "seq-mean-token-mean":
        return [1.0 / (b * n) if n else 0.0 for n in num_tokens]
    if agg == "seq-mean-token-sum-norm":
        return [1.0 / (b * max_tokens)] * b
    raise ValueError(f"unknown loss aggregation {agg!r}")


# ----------------------------------------------------------------------------------------------
# The loss


@dataclass
class LossTerms:
    """The loss of a micro-batch and the sums the learner turns into metrics."""

    loss: Tensor
    """``sum_t w_t L_t`` over the micro-batch (add micro-batches, then step)."""
    tokens: float
    """Policy tokens in the micro-batch."""
    clipped: float
    """Tokens where the clipped branch was the active one (``rho`` outside the band, in the
    direction the advantage pushes)."""
    ratio_sum: float
    """Sum of ``rho_t`` (for the mean ratio)."""
    kl_old_sum: float
    """Sum of the k3 estimate between ``pi_theta`` and ``pi_old`` (how far the batch has moved)."""
    kl_ref_sum: float
    """Sum of the k3 estimate of ``KL(pi_theta || pi_ref)`` (0 without a reference)."""


def k3(logp: Tensor, logq: Tensor) -> Tensor:
    """Schulman's k3 estimator of ``KL(p || q)`` on tokens sampled from ``p``: ``e^d - d - 1``, ``d = log q - log p``.

    Unbiased, always >= 0; with ``p = pi_theta`` and ``q = pi_ref`` it is GRPO's KL penalty."""
    d = logq - logp
    return d.exp() - d - 1.0


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossTerms:
    """GRPO loss of a micro-batch; all tensors are ``[B, T]`` over target positions.

    ``logp``: ``log pi_theta`` (requires grad); ``old_logp``: ``log pi_old`` (no grad);
    ``advantages``: ``A_i`` broadcast over the trajectory's tokens; ``weights``: ``w_t``;
    ``mask``: 1 at policy tokens, 0 at prompt/observation/padding positions.
    """
    mask = mask.to(logp.dtype)
    ratio = (logp - old_logp).exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -unclipped.minimum(clipped)
    kl_ref_sum = 0.0
    if ref_logp is not None and kl_coef > 0.0:
        kl_ref = k3(logp, ref_logp)
        per_token = per_token + kl_coef * kl_ref
        kl_ref_sum = float((kl_ref.detach() * mask).sum())
    loss = (per_token * weights * mask).sum()
    is_clipped = (clipped.detach() < unclipped.detach()).to(mask.dtype) * mask
    return LossTerms(
        loss=loss,
        tokens=float(mask.sum()),
        clipped=float(is_clipped.sum()),
        ratio_sum=float((ratio.detach() * mask).sum()),
        kl_old_sum=float((k3(logp.detach(), old_logp) * mask).sum()),
        kl_ref_sum=kl_ref_sum,
    )


# ----------------------------------------------------------------------------------------------
# Engine/learner mismatch


def tis_weights(learner_logp: Tensor, engine_logp: Tensor, cap: float) -> Tensor:
    """Truncated importance weights ``min(exp(log pi_old - log mu), cap)`` per token (no grad)."""
    return (learner_logp.detach() - engine_logp).exp().clamp(max=cap)


def engine_gap(learner_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> tuple[float, float, float]:
    """``(sum, max, count)`` over ``mask`` of the per-token k3 estimate of ``KL(mu || pi_old)``: the tokens
    were sampled by the engine ``mu``, so ``k3(log mu, log pi_old)``."""
    mask = mask.bool()
    n = float(mask.sum())
    if n == 0:
        return 0.0, 0.0, 0.0
    kl = k3(engine_logp, learner_logp.detach())[mask]
    return float(kl.sum()), float(kl.max()), n
