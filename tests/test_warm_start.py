"""Behaviour cloning (the warm start) on real gold episodes of twx:coin and a tiny random Llama, without Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from dreamgym.collect import collect_range
from dreamgym.config import DreamGymConfig, EnvConfig
from dreamgym.envs.registry import make_env
from dreamgym.models import build_tiny_model
from dreamgym.policies import make_policy
from learner.bc import BehaviourCloning, bc_sequences, gold_episodes, run_bc, save_policy, tokenise_episode
from learner.learner import Learner


@pytest.fixture(scope="module")
def gold():
    env = make_env(EnvConfig(name="twx:coin"))
    try:
        transitions, _ = collect_range(env, make_policy("mixed", 0.5), 0, 12, "train", 0, "test")
    finally:
        env.close()
    return transitions


def test_gold_episodes_are_complete_successful_gold_runs(gold) -> None:
    episodes = gold_episodes(gold)
    assert episodes, "the mixed policy plays about half of the episodes gold"
    for ep in episodes:
        assert [t.step for t in ep] == list(range(len(ep)))
        assert ep[-1].success and all(t.policy.endswith("gold") for t in ep)
    assert len(gold_episodes(gold, limit=1)) == 1


@pytest.mark.slow
def test_cloning_lowers_the_gold_reply_nll(gold, tmp_path: Path) -> None:
    cfg = DreamGymConfig.model_validate({"policy": {"model": "tiny", "worked_example": True, "history_steps": 1},
                                         "learner": {"device": "cpu"}})
    model = build_tiny_model(tmp_path / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(str(model))
    trajs = [tokenise_episode(ep, tok, cfg.policy) for ep in gold_episodes(gold)]
    seqs = bc_sequences(trajs)
    # the loss mask covers exactly the gold replies "<action>...</action>"
    for s, traj in zip(seqs, [t for tr in trajs for t in tr.transitions], strict=True):
        masked = [i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m]
        assert tok.decode(masked) == f"<action>{traj.action}</action>"
        assert s.advantage == 1.0
    learner = Learner(cfg.learner, model, seed=0)
    bc = BehaviourCloning(learner, lr=1e-2)
    hist = run_bc(bc.step, trajs, steps=12, batch_episodes=4, seed=0)
    assert hist[-1]["nll"] < 0.7 * hist[0]["nll"], [round(h["nll"], 3) for h in hist]
    out = save_policy(learner, tmp_path / "cloned")
    assert (out / "config.json").is_file() and AutoTokenizer.from_pretrained(str(out)) is not None


@pytest.mark.slow
def test_cloning_runs_the_shared_prompt_prefix_once(gold, tmp_path: Path) -> None:
    """The warm start uses the RL learner's shared-prefix forward: the same loss and NLL as the plain forward,
    for fewer token positions run."""
    model = build_tiny_model(tmp_path / "tiny", seed=0)
    metrics = {}
    for shared in (False, True):
        cfg = DreamGymConfig.model_validate({"policy": {"model": "tiny", "worked_example": True, "history_steps": 1},
                                             "learner": {"device": "cpu", "shared_prefix": shared}})
        tok = AutoTokenizer.from_pretrained(str(model))
        trajs = [tokenise_episode(ep, tok, cfg.policy) for ep in gold_episodes(gold)][:4]
        metrics[shared] = BehaviourCloning(Learner(cfg.learner, model, seed=0), lr=1e-2).step(trajs)
    plain, shared = metrics[False], metrics[True]
    assert shared["nll"] == pytest.approx(plain["nll"], rel=1e-4)
    assert shared["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-3)
    assert shared["policy_tokens"] == plain["policy_tokens"]
    assert shared["processed_tokens"] < 0.8 * plain["processed_tokens"], (shared, plain)
