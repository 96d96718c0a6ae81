"""The shared-prefix forward (``learner.shared_prefix``) equals the plain forward: log-probs, GRPO gradients,
learner steps; and it falls back to the plain forward where sharing does not pay or cannot work."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from dreamgym.grpo import policy_loss
from dreamgym.models import build_tiny_model
from learner.model import load_causal_lm, token_logprobs
from learner.shared_prefix import pad_batch, prefix_token_logprobs

PREFIX = 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def _qwen2() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).train()


def _rows(prefix: int = PREFIX, tails: tuple[int, ...] = (3, 12, 7, 1), seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    head = [rng.randrange(3, 250) for _ in range(prefix)]
    return [head + [rng.randrange(3, 250) for _ in range(n)] for n in tails]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logprobs_and_grpo_gradients_equal_the_full_forward(tiny: Path, arch: str) -> None:
    """Right-padded suffixes of different lengths (one a single token): every log-prob, and the gradient of a GRPO
    loss whose mask includes each row's first suffix token (a column computed by the prefix pass)."""
    rows = _rows()
    ids, att = pad_batch(rows, pad_id=0)
    mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
    for r, s in enumerate(rows):
        mask[r, PREFIX - 1: len(s) - 1] = True  # targets: every suffix token
    mask[0, 5] = True  # and one prefix token of one row
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand_as(mask).contiguous()
    weights = torch.full(mask.shape, 1.0 / float(mask.sum()))
    logps, grads = [], []
    for shared in (False, True):
        model = load_causal_lm(tiny) if arch == "llama" else _qwen2()
        full = token_logprobs(model, ids, att, 0.7)
        if shared:
            out = prefix_token_logprobs(model, ids, att, 0.7)
            assert out.fallback is None and out.prefix_len == PREFIX
            assert out.forwarded_tokens == PREFIX + sum(len(s) - PREFIX for s in rows)
            valid = att[:, 1:].bool()
            torch.testing.assert_close(out.logprobs[valid], full.detach()[valid], atol=1e-5, rtol=0)
            logp = prefix_token_logprobs(model, ids, att, 0.7, mask).logprobs
        else:
            logp = token_logprobs(model, ids, att, 0.7, mask)
        policy_loss(logp, logp.detach(), adv, weights, mask).loss.backward()
        logps.append(logp.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(logps[1], logps[0], atol=1e-5, rtol=0)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-4, atol=1e-7, msg=n)


def test_falls_back_to_the_plain_forward(tiny: Path) -> None:
    """A short common prefix, one row, or gradient checkpointing in training: the plain forward runs, the reason
    is given, and the result is the plain forward's."""
    model = load_causal_lm(tiny)
    ids, att = pad_batch(_rows(prefix=8), pad_id=0)
    out = prefix_token_logprobs(model, ids, att)
    assert out.fallback is not None and "fewer than 32 tokens" in out.fallback and out.prefix_len == 0
    assert out.forwarded_tokens == int(att.sum())
    torch.testing.assert_close(out.logprobs, token_logprobs(model, ids, att))
    one = prefix_token_logprobs(model, *pad_batch(_rows()[:1], pad_id=0))
    assert one.fallback is not None and "one row" in one.fallback
    model.gradient_checkpointing_enable()
    ids, att = pad_batch(_rows(), pad_id=0)
    ckpt = prefix_token_logprobs(model, ids, att)
    assert ckpt.fallback is not None and "checkpointing" in ckpt.fallback
    model.eval()  # in eval mode the cache is kept: sharing works again
    assert prefix_token_logprobs(model, ids, att).fallback is None


def _prefix_groups(seed: int) -> list:
    """Two GRPO groups of one-step episodes whose prompts share a 40-token head (the windowed prompt's system
    text and worked example) and differ after it; rewards mixed in each group."""
    from dreamgym.token_groups import one_step_group
    from dreamgym.types import Task

    rng = random.Random(seed)
    head = [1] + [rng.randrange(10, 250) for _ in range(PREFIX - 1)]
    groups = []
    for g in range(2):
        task_tail = [rng.randrange(10, 250) for _ in range(rng.randrange(2, 9))]
        turns = [(head + task_tail + [rng.randrange(10, 250) for _ in range(rng.randrange(1, 15))],
                  [rng.randrange(10, 250) for _ in range(rng.randrange(2, 7))], None) for _ in range(4)]
        groups.append(one_step_group(Task(f"t{g}", "twx:coin", f"t{g}"), turns, [1.0, 0.0, 0.0, 1.0]))
    return groups


def test_learner_steps_with_and_without_the_shared_prefix_agree(tiny: Path) -> None:
    """Two mini-batches (learner ``pi_old`` through ``sequence_logprobs``), the KL penalty (reference forward) and
    a budget that splits the batch: the same losses and weights with ``learner.shared_prefix`` on and off, and
    fewer processed tokens with it on (the shared head counted once per micro-batch)."""
    from dreamgym.config import LearnerConfig
    from learner.learner import Learner

    metrics, weights = [], []
    for shared in (False, True):
        cfg = LearnerConfig(lr=1e-3, device="cpu", precision="float32", mini_batches=2, kl_coef=0.05,
                            micro_batch_tokens=160, shared_prefix=shared)
        learner = Learner(cfg, tiny, seed=0)
        metrics.append([learner.step(_prefix_groups(s)) for s in range(2)])
        weights.append({n: p.detach().clone() for n, p in learner.model.named_parameters()})
    for off, on in zip(*metrics, strict=True):
        assert on["loss"] == pytest.approx(off["loss"], rel=1e-4, abs=1e-6)
        assert on["kl_ref"] == pytest.approx(off["kl_ref"], rel=1e-3, abs=1e-7)
        assert on["processed_tokens"] < 0.8 * off["processed_tokens"]
    for n, w in weights[0].items():
        torch.testing.assert_close(weights[1][n], w, rtol=1e-4, atol=1e-6, msg=n)


def test_micro_batches_group_sequences_by_shared_prefix_and_count_it_once() -> None:
    """Two prompts (70 shared tokens, then 20 of their own) with replies of 5-10 tokens, interleaved: the plain
    packer takes them by length; the prefix packer puts each prompt's sequences together, costed
    ``P + (max_len - P) * count`` (``P`` at most the shortest row less one)."""
    from learner.batching import micro_batches, prefix_micro_batches

    head = list(range(100, 170))
    prompts = [head + [1] * 20, head + [2] * 20]
    seqs = [prompts[i % 2] + [7] * (5 + i) for i in range(6)]
    assert [len(b) for b in micro_batches([len(s) for s in seqs], 300)] == [3, 3]  # 100 * 3 > 300
    assert prefix_micro_batches(seqs, 300) == [[0, 2, 4, 1, 3, 5]]  # 70 + (100 - 70) * 6 = 250
    assert prefix_micro_batches(seqs, 150) == [[0, 2, 4], [1, 3, 5]]  # 94 + (99 - 94) * 3; 70 + 30 * 4 > 150
