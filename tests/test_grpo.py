"""GRPO math: group advantages, degenerate groups, aggregation weights, the clipped loss and k3 KL."""

from __future__ import annotations

import math

import pytest
import torch

from dreamgym.curriculum.scoring import reward_variance as curriculum_reward_variance
from dreamgym.grpo import batch_advantages, group_advantages, k3, policy_loss, reward_variance, token_weights


def test_group_advantages_std_scaled_and_dr_grpo() -> None:
    r = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    mean = 3 / 8
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / 8)  # ddof = 0
    adv = group_advantages(r, scale_by_std=True, eps=1e-6)
    assert adv == pytest.approx([(x - mean) / (std + 1e-6) for x in r])
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    assert group_advantages(r, scale_by_std=False) == pytest.approx([x - mean for x in r])


def test_reward_variance_is_the_one_v_tau_of_grpo_and_the_curriculum() -> None:
    # the population variance (ddof = 0): p (1 - p) for {0, 1} rewards; 0 for one reward or none
    assert reward_variance([0.0, 1.0]) == 0.25
    assert reward_variance([0.0, 1.0, 1.0, 1.0]) == pytest.approx(0.1875)
    assert reward_variance([0.3, 0.3]) == 0.0 and reward_variance([0.5]) == 0.0 and reward_variance([]) == 0.0
    assert curriculum_reward_variance is reward_variance
    # GRPO's std is its square root
    r = [0.2, 0.9, 0.4]
    std = math.sqrt(reward_variance(r))
    mean = sum(r) / 3
    assert group_advantages(r, eps=0.0) == pytest.approx([(x - mean) / std for x in r])


def test_degenerate_groups_are_counted_and_dropped() -> None:
    assert group_advantages([1.0, 1.0, 1.0]) is None
    assert group_advantages([0.0, 0.0]) is None
    assert group_advantages([]) is None
    b = batch_advantages([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.2]])
    assert b.degenerate == 2
    assert b.kept == [1, 3]
    assert b.advantages[0] == pytest.approx([-1.0, 1.0], abs=1e-5)


def test_token_weights_for_each_aggregation() -> None:
    n = [2, 6]
    assert token_weights(n, "token-mean") == pytest.approx([1 / 8, 1 / 8])
    assert token_weights(n, "seq-mean-token-mean") == pytest.approx([1 / 4, 1 / 12])
    assert token_weights(n, "seq-mean-token-sum-norm", max_tokens=10) == pytest.approx([1 / 20, 1 / 20])
    # Each aggregation is a mean in its own sense: weights x counts sum to 1 for the first two.
    for agg in ("token-mean", "seq-mean-token-mean"):
        assert sum(w * c for w, c in zip(token_weights(n, agg), n, strict=True)) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        token_weights(n, "sum")  # type: ignore[arg-type]


def _t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_on_policy_loss_is_weighted_reinforce() -> None:
    logp = _t([-1.0, -2.0, -0.5]).requires_grad_(True)
    adv = _t([2.0, 2.0, -1.0])
    w = _t([0.25, 0.25, 0.5])
    mask = _t([1.0, 1.0, 0.0])
    terms = policy_loss(logp, logp.detach(), adv, w, mask)
    assert float(terms.loss.detach()) == pytest.approx(-(0.25 * 2 + 0.25 * 2))
    terms.loss.backward()
    # d/d logp of -w A rho at rho = 1 is -w A; masked positions get no gradient.
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -0.5, 0.0])
    assert terms.tokens == 2 and terms.clipped == 0 and terms.ratio_sum == pytest.approx(2.0)


def test_clipping_uses_separate_low_and_high_bounds() -> None:
    old = _t([0.0, 0.0, 0.0, 0.0])
    logp = torch.log(_t([1.5, 0.5, 1.1, 0.5])).requires_grad_(True)  # ratios rho
    adv = _t([1.0, -1.0, 1.0, 1.0])
    w = torch.ones(1, 4)
    mask = torch.ones(1, 4)
    terms = policy_loss(logp, old, adv, w, mask, clip_low=0.2, clip_high=0.28)
    # token 0: rho 1.5, A > 0 -> min(1.5, 1.28) = 1.28, the clipped branch;
    # token 1: rho 0.5, A < 0 -> min(-0.5, -0.8) = -0.8, the clipped branch;
    # token 2: rho 1.1, inside the band; token 3: rho 0.5, A > 0 -> min(0.5, 0.8) = 0.5, unclipped.
    expected = -(1.28 * 1.0) - (0.8 * -1.0) - (1.1 * 1.0) - (0.5 * 1.0)
    assert float(terms.loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert terms.clipped == 2
    terms.loss.backward()
    assert logp.grad is not None
    g = logp.grad[0].tolist()
    assert g[0] == 0.0 and g[1] == 0.0  # clipped tokens carry no gradient
    assert g[2] == pytest.approx(-1.1) and g[3] == pytest.approx(-0.5)


def test_k3_kl_penalty() -> None:
    logp = _t([-1.0, -2.0])
    assert k3(logp, logp).abs().max() == 0.0
    ref = _t([-1.5, -1.0])
    kl = k3(logp, ref)
    d = ref - logp
    assert kl[0].tolist() == pytest.approx((d.exp() - d - 1)[0].tolist())
    assert bool((kl >= 0).all())
    lp = logp.clone().requires_grad_(True)
    w = torch.ones(1, 2)
    base = policy_loss(lp, lp.detach(), torch.zeros(1, 2), w, torch.ones(1, 2))
    with_kl = policy_loss(lp, lp.detach(), torch.zeros(1, 2), w, torch.ones(1, 2), ref_logp=ref, kl_coef=0.1)
    assert float(base.loss.detach()) == 0.0
    assert float(with_kl.loss.detach()) == pytest.approx(0.1 * float(kl.sum()), rel=1e-6)
    assert with_kl.kl_ref_sum == pytest.approx(float(kl.sum()), rel=1e-6)
    # kl_coef = 0 ignores the reference entirely
    off = policy_loss(lp, lp.detach(), torch.zeros(1, 2), w, torch.ones(1, 2), ref_logp=ref, kl_coef=0.0)
    assert float(off.loss.detach()) == 0.0 and off.kl_ref_sum == 0.0
