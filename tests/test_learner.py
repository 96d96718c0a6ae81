"""The GRPO learner on a tiny random Llama, without Ray: steps, masking, micro-batching, LoRA, resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from grpo_helpers import random_groups

from dreamgym.config import LearnerConfig
from dreamgym.grpo import policy_loss
from dreamgym.models import build_tiny_model
from learner.batching import collate
from learner.learner import Learner, lr_factor
from learner.model import token_logprobs
from learner.sequences import build_batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def _cfg(**kw: object) -> LearnerConfig:
    return LearnerConfig.model_validate({"lr": 1e-3, "device": "cpu", **kw})


def _params(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters()}


def test_step_updates_weights_and_bumps_the_version(tiny: Path) -> None:
    learner = Learner(_cfg(), tiny, seed=0)
    before = _params(learner)
    m = learner.step(random_groups(0))
    assert m["version"] == 1 and learner.version.version == 1 and learner.optimizer_steps == 1
    assert m["groups"] == 3 and m["degenerate_groups"] == 0 and m["policy_tokens"] > 0
    assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_frac"] == 0.0  # on-policy: rho = 1
    assert any(not torch.equal(before[n], p) for n, p in learner.model.named_parameters())


def test_all_degenerate_groups_skip_the_step(tiny: Path) -> None:
    learner = Learner(_cfg(), tiny, seed=0)
    groups = random_groups(0)
    for g in groups:
        for t in g.trajectories:
            t.total_reward = 1.0
    before = _params(learner)
    m = learner.step(groups)
    assert m["skipped"] == 1 and m["degenerate_groups"] == 3 and learner.version.version == 0
    assert all(torch.equal(before[n], p) for n, p in learner.model.named_parameters())


def test_gradient_flows_only_through_policy_tokens(tiny: Path) -> None:
    learner = Learner(_cfg(), tiny, seed=0)
    batch = build_batch(random_groups(2))
    mb = collate(batch.sequences, list(range(len(batch.sequences))), learner.pad_id, "cpu")
    logp = token_logprobs(learner.model, mb.input_ids, mb.attention_mask)
    logp.retain_grad()
    policy_loss(logp, logp.detach(), mb.advantages, mb.weights, mb.mask).loss.backward()
    assert logp.grad is not None
    nonzero = logp.grad != 0
    assert torch.equal(nonzero, mb.mask & (mb.advantages != 0))

def test_logits_on_the_needed_columns_only_give_the_same_logprobs_and_gradient(tiny: Path) -> None:
    """``token_logprobs(..., needed)`` runs the LM head on the loss mask's columns only: the log-probs there and
    the gradient they give equal the every-position ones; the other entries are 0 (rows of unequal length)."""
    batch = build_batch(random_groups(4, n_groups=3))
    grads, logps = [], []
    for needed in (False, True):
        learner = Learner(_cfg(), tiny, seed=0)
        mb = collate(batch.sequences, list(range(len(batch.sequences))), learner.pad_id, "cpu")
        logp = token_logprobs(learner.model, mb.input_ids, mb.attention_mask, 0.7, mb.mask if needed else None)
        (logp * mb.mask).sum().backward()
        logps.append(logp.detach())
        grads.append({n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None})
    assert mb.mask.any(dim=0).sum() < mb.mask.shape[1]  # some columns are skipped
    torch.testing.assert_close(logps[0][mb.mask], logps[1][mb.mask])
    assert torch.all(logps[1][~mb.mask] == 0)
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-7)



def test_micro_batching_does_not_change_the_gradient(tiny: Path) -> None:
    grads = []
    for budget in (100_000, 16):
        learner = Learner(_cfg(micro_batch_tokens=budget, grad_clip=0.0), tiny, seed=0)
        learner.step(random_groups(3, n_groups=4))
        grads.append({n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-7)


def test_lr_schedule() -> None:
    assert [lr_factor(s, 2, 10, "constant", 0.1) for s in (0, 1, 2, 50)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(2, 2, 10, "linear", 0.1) == pytest.approx(1.0)
    assert lr_factor(10, 2, 10, "linear", 0.1) == pytest.approx(0.1)
    assert lr_factor(6, 2, 10, "cosine", 0.0) == pytest.approx(0.5)
    assert lr_factor(99, 2, 10, "cosine", 0.2) == pytest.approx(0.2)


def test_reference_model_only_when_kl_is_on(tiny: Path) -> None:
    assert Learner(_cfg(kl_coef=0.0), tiny).reference is None
    with_kl = Learner(_cfg(kl_coef=0.1), tiny)
    assert with_kl.reference is not None
    m = with_kl.step(random_groups(4))
    assert m["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # first step: policy == reference
    m = with_kl.step(random_groups(5))
    assert m["kl_ref"] > 0
    lora = Learner(_cfg(kl_coef=0.1, lora={"enabled": True, "r": 4}), tiny)
    assert lora.reference is None  # the base model with adapters disabled is the reference
    lora.step(random_groups(4))
    assert lora.step(random_groups(5))["kl_ref"] > 0


def test_lora_sync_weights_are_the_merged_model(tiny: Path) -> None:
    learner = Learner(_cfg(lr=1e-2, lora={"enabled": True, "r": 4, "alpha": 8}), tiny, seed=0)
    learner.step(random_groups(6))
    synced = dict(learner.sync_weights())
    merged = learner.model.merge_and_unload()
    reference = dict(merged.named_parameters())
    assert set(synced) == set(reference) | {"lm_head.weight"}  # tied head sent explicitly
    for n, p in reference.items():
        torch.testing.assert_close(synced[n], p.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(synced["lm_head.weight"], synced["model.embed_tokens.weight"])


def test_engine_behaviour_logprobs_with_mini_batches(tiny: Path) -> None:
    learner = Learner(_cfg(mini_batches=2, behaviour_logprobs="engine"), tiny, seed=0)
    m = learner.step(random_groups(7, n_groups=4))
    # the fake engine log-probs (-1 per token) are far from the model's: the ratio moves off 1 and clips
    assert m["optimizer_steps"] == 2 and m["version"] == 1
    assert m["ratio_mean"] != pytest.approx(1.0) and m["clip_frac"] > 0


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"mini_batches": 2, "kl_coef": 0.05, "schedule": "cosine", "warmup_steps": 1, "total_steps": 5,
         "lora": {"enabled": True, "r": 4, "dropout": 0.1}},
    ],
    ids=["full", "lora-dropout-minibatches-kl"],
)
def test_resume_takes_exactly_the_same_next_step(tiny: Path, tmp_path: Path, extra: dict) -> None:
    # The uninterrupted run finishes before the resumed one starts: both use torch's global RNG (dropout).
    cfg = _cfg(micro_batch_tokens=64, **extra)
    a = Learner(cfg, tiny, seed=3)
    a.step(random_groups(10))
    a.step(random_groups(11))
    ckpt = a.save_checkpoint(tmp_path / "step-000002")
    metrics_a = [a.step(random_groups(12)), a.step(random_groups(13))]
    params_a = _params(a)
    version_a = a.version
    del a

    b = Learner.from_checkpoint(cfg, ckpt)
    assert b.version.version == 2
    metrics_b = [b.step(random_groups(12)), b.step(random_groups(13))]
    params_b = _params(b)
    assert params_a.keys() == params_b.keys()
    for n in params_a:
        assert torch.equal(params_a[n], params_b[n]), n
    for ma, mb in zip(metrics_a, metrics_b, strict=True):
        for k in ("loss", "grad_norm", "lr", "kl_ref", "ratio_mean", "clip_frac"):
            assert ma[k] == mb[k], k
    assert b.version == version_a


def test_a_resumed_learner_saves_after_rotation_deleted_the_checkpoint_it_came_from(tiny: Path, tmp_path: Path) -> None:
    """A resumed run loads its weights from ``checkpoints/step-N/model``; ``learner.keep_checkpoints`` deletes that
    folder a few iterations later, and every later checkpoint and the final policy folder must still be written."""
    from learner.bc import save_policy
    from learner.checkpoint import prune_checkpoints

    cfg = _cfg()
    root = tmp_path / "checkpoints"
    a = Learner(cfg, tiny, seed=3)
    a.step(random_groups(10))
    first = a.save_checkpoint(root / "step-000001")
    del a
    b = Learner.from_checkpoint(cfg, first)
    b.step(random_groups(11))
    b.save_checkpoint(root / "step-000002")
    assert prune_checkpoints(root, keep=1) == [first]
    assert not first.exists()
    b.step(random_groups(12))
    third = b.save_checkpoint(root / "step-000003")
    c = Learner.from_checkpoint(cfg, third)
    assert c.version == b.version
    out = save_policy(b, tmp_path / "final")
    assert (out / "tokenizer_config.json").is_file()
