"""PPO beside GRPO (``learner.algorithm: ppo``) and the engine/learner mismatch correction (``learner.tis``).

Tiny random Llamas, no Ray: the turn-level GAE against hand-computed numbers, the value and policy masks
at turn boundaries, micro-batching, exact resume with the critic, critic warm-up, groups of one, the
bf16-engine/fp32-learner gap, and a known-answer learning test with sampling from the learner's own model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from grpo_helpers import random_groups, step_transition
from pydantic import ValidationError

from dreamgym.config import LearnerConfig
from dreamgym.grpo import engine_gap, tis_weights
from dreamgym.models import build_tiny_model
from dreamgym.ppo import explained_variance, gae, normalize, turn_rewards, value_loss
from dreamgym.types import Group, Task, Trajectory
from learner.batching import collate
from learner.critic import assign_targets
from learner.learner import Learner
from learner.model import load_causal_lm, token_logprobs
from learner.sequences import build_ppo_batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def _cfg(**kw: object) -> LearnerConfig:
    return LearnerConfig.model_validate({"lr": 1e-3, "device": "cpu", "algorithm": "ppo", **kw})


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def multi_turn_group(seed: int, n: int = 2, turns: int = 3) -> Group:
    """Trajectories whose prompt at turn t+1 is the prompt at turn t + reply t + observation t+1 (one merged
    sequence each); reward 0.25 after the middle turn and 0/1 at the end."""
    import random

    rng = random.Random(seed)
    task = Task(f"multi-{seed}", "twx:coin", "multi")
    trajs = []
    for i in range(n):
        prompt = [1] + [rng.randrange(10, 200) for _ in range(5)]
        trs = []
        for t in range(turns):
            reply = [rng.randrange(10, 200) for _ in range(rng.randrange(2, 5))]
            r = (0.25 if t == 1 else 0.0) + (float(i % 2) if t == turns - 1 else 0.0)
            tr = step_transition(task, t, prompt, reply, r, episode=f"{seed}-{i}")
            tr.done = t == turns - 1
            trs.append(tr)
            prompt = prompt + reply + [rng.randrange(10, 200) for _ in range(rng.randrange(1, 4))]
        trajs.append(Trajectory(task, trs, i % 2 == 1, sum(tr.reward for tr in trs)))
    return Group(task, trajs)


# -- the pure math ------------------------------------------------------------------------------------


def test_gae_against_a_hand_computed_example() -> None:
    adv, ret = gae([0.0, 0.0, 1.0], [0.5, 0.2, 0.4], gamma=0.9, lam=0.8)
    # delta_2 = 1 - 0.4 = 0.6; delta_1 = 0.9 * 0.4 - 0.2 = 0.16; delta_0 = 0.9 * 0.2 - 0.5 = -0.32
    # A_2 = 0.6; A_1 = 0.16 + 0.72 * 0.6 = 0.592; A_0 = -0.32 + 0.72 * 0.592 = 0.10624
    assert adv == pytest.approx([0.10624, 0.592, 0.6])
    assert ret == pytest.approx([0.60624, 0.792, 1.0])
    # gamma = lambda = 1: reward-to-go minus the value (REINFORCE with a baseline)
    adv, ret = gae([0.0, 0.25, 1.0], [0.3, 0.1, 0.6], gamma=1.0, lam=1.0)
    assert adv == pytest.approx([1.25 - 0.3, 1.25 - 0.1, 1.0 - 0.6]) and ret == pytest.approx([1.25, 1.25, 1.0])
    # lambda = 0: one-step TD errors
    adv, _ = gae([0.0, 1.0], [0.5, 0.2], gamma=0.5, lam=0.0)
    assert adv == pytest.approx([0.5 * 0.2 - 0.5, 1.0 - 0.2])
    assert turn_rewards([0.0, 0.0], 1.0) == [0.0, 1.0]  # an episode-end reward lands on the last turn
    assert turn_rewards([0.5, 0.5], 1.0) == [0.5, 0.5]


def test_normalize_explained_variance_and_value_clipping() -> None:
    assert normalize([3.0]) == [3.0] and normalize([2.0, 2.0]) == [2.0, 2.0]
    z = normalize([1.0, 2.0, 3.0], eps=0.0)
    assert sum(z) == pytest.approx(0.0) and sum(x * x for x in z) / 3 == pytest.approx(1.0)
    assert explained_variance([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert explained_variance([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0)
    assert explained_variance([3.0, 2.0, 1.0], [1.0, 2.0, 3.0]) == pytest.approx(-3.0)
    v = torch.tensor([1.0, 0.0, 0.5], requires_grad=True)
    old = torch.tensor([0.5, 0.0, 0.5])
    ret = torch.tensor([0.0, 1.0, 0.5])
    mask = torch.tensor([1.0, 1.0, 0.0])
    terms = value_loss(v, old, ret, torch.full((3,), 0.5), mask, clip=0.2, coef=1.0)
    # turn 0: V moved 0.5 away from V_old; clipped V = 0.7, err max(1.0, 0.49) = 1.0 (unclipped active)
    # turn 1: err 1.0 both ways (V = V_old); masked turn 2 adds nothing
    assert float(terms.loss.detach()) == pytest.approx(0.5 * 0.5 * (1.0 + 1.0))
    assert terms.turns == 2 and terms.clipped == 0.0 and terms.sq_err_sum == pytest.approx(2.0)
    v2 = torch.tensor([0.0, 0.0, 0.0], requires_grad=True)  # moved towards the target past the clip
    old2 = torch.tensor([1.0, 0.0, 0.0])
    terms = value_loss(v2, old2, torch.tensor([0.0, 0.0, 0.0]), torch.ones(3), torch.tensor([1.0, 0.0, 0.0]), 0.2)
    assert float(terms.loss.detach()) == pytest.approx(0.5 * 0.8**2) and terms.clipped == 1.0
    terms.loss.backward()
    assert v2.grad is not None and float(v2.grad[0]) == 0.0  # the clipped branch has no gradient


# -- masks at turn boundaries -------------------------------------------------------------------------


def test_value_and_policy_masks_at_turn_boundaries() -> None:
    group = multi_turn_group(0, n=1, turns=3)
    traj = group.trajectories[0]
    batch = build_ppo_batch([group])
    assert len(batch.sequences) == 1  # the turns merged into one sequence
    seq = batch.sequences[0]
    values = [[0.5, 0.2, 0.4]]
    stats = assign_targets(batch, values, gamma=0.9, lam=0.8, norm_adv=False, eps=1e-6)
    rewards = [tr.reward for tr in traj.transitions]
    adv, ret = gae(rewards, values[0], 0.9, 0.8)
    assert stats["turns"] == 3 and stats["adv_mean"] == pytest.approx(sum(adv) / 3)
    mb = collate(batch.sequences, [0], pad_id=0, device="cpu")
    assert mb.value_mask is not None and mb.returns is not None and mb.old_values is not None
    # column j is the prediction of token j+1 from tokens <= j: the value of turn t sits at the column of its
    # first reply token, i.e. the hidden state of the last prompt/observation token before the reply
    starts = seq.turn_starts
    for t, tr in enumerate(traj.transitions):
        assert tr.prompt_token_ids == seq.input_ids[: starts[t]]  # the state is exactly the turn's prompt
        assert seq.input_ids[starts[t]: seq.turn_ends[t]] == tr.action_token_ids
    assert torch.nonzero(mb.value_mask[0]).flatten().tolist() == [s - 1 for s in starts]
    assert mb.returns[0, [s - 1 for s in starts]].tolist() == pytest.approx(ret)
    assert mb.old_values[0, [s - 1 for s in starts]].tolist() == pytest.approx(values[0])
    # the policy mask covers exactly the reply tokens, each with its own turn's advantage
    expected_mask = torch.zeros_like(mb.mask)
    expected_adv = torch.zeros_like(mb.advantages)
    for t in range(3):
        expected_mask[0, starts[t] - 1: seq.turn_ends[t] - 1] = True
        expected_adv[0, starts[t] - 1: seq.turn_ends[t] - 1] = adv[t]
    assert torch.equal(mb.mask, expected_mask)
    torch.testing.assert_close(mb.advantages * mb.mask, expected_adv)


def test_critic_and_policy_gradients_flow_only_through_their_positions(tiny: Path) -> None:
    learner = Learner(_cfg(), tiny, seed=0)
    assert learner.critic is not None
    batch = build_ppo_batch([multi_turn_group(1, n=2)])
    assign_targets(batch, learner.critic.turn_values(batch.sequences, learner.pad_id), 1.0, 0.95, True, 1e-6)
    mb = collate(batch.sequences, list(range(len(batch.sequences))), learner.pad_id, "cpu")
    assert mb.value_mask is not None and mb.returns is not None and mb.old_values is not None
    v = learner.critic.values(mb.input_ids, mb.attention_mask)
    v.retain_grad()
    value_loss(v, mb.old_values, mb.returns, torch.ones_like(v), mb.value_mask, clip=0.0).loss.backward()
    assert v.grad is not None
    assert torch.equal(v.grad != 0, mb.value_mask & (mb.returns != v.detach()))  # (V - R) at value positions
    assert int(mb.value_mask.sum()) == 6
    # the value at a turn's position does not see the reply (causal): changing reply tokens leaves it alone
    seq = batch.sequences[0]
    ids = mb.input_ids.clone()
    row = mb.index.index(0)
    ids[row, seq.turn_starts[1]] = (ids[row, seq.turn_starts[1]] + 1) % 200
    with torch.no_grad():
        v2 = learner.critic.values(ids, mb.attention_mask)
    assert float(v2[row, seq.turn_starts[1] - 1]) == pytest.approx(float(v.detach()[row, seq.turn_starts[1] - 1]))


# -- the PPO learner ----------------------------------------------------------------------------------


def test_config_validates_group_size_per_algorithm() -> None:
    assert _cfg(group_size=1).group_size == 1
    with pytest.raises(ValidationError, match=r"group_size 1 needs learner\.algorithm 'ppo'"):
        LearnerConfig(group_size=1)
    assert LearnerConfig().algorithm == "grpo" and LearnerConfig().tis is False
    with pytest.raises(ValidationError, match=r"behaviour_logprobs 'engine'"):
        LearnerConfig(tis=True, behaviour_logprobs="engine")


def test_ppo_steps_on_groups_of_one_and_reports_critic_metrics(tiny: Path) -> None:
    learner = Learner(_cfg(group_size=1), tiny, seed=0)
    assert learner.critic is not None
    groups = [Group(g.task, [t]) for g in random_groups(0) for t in g.trajectories[:1]]
    assert all(len(g.trajectories) == 1 for g in groups)
    before, critic_before = _params(learner.model), _params(learner.critic.model)
    m = learner.step(groups)
    assert m["version"] == 1 and learner.version.version == 1 and m["samples"] == 3 and m["turns"] == 3
    for k in ("value_loss", "explained_variance", "adv_mean", "adv_std", "value_mean", "critic_grad_norm",
              "engine_kl_mean", "engine_kl_max", "critic_share"):
        assert k in m and math.isfinite(m[k]), k
    assert m["value_mean"] == 0.0  # the zero-initialised head
    assert any(not torch.equal(before[n], p) for n, p in learner.model.named_parameters())
    assert any(not torch.equal(critic_before[n], p) for n, p in learner.critic.model.named_parameters())
    m2 = learner.step(groups)
    assert m2["value_mean"] != 0.0 and m2["version"] == 2
    m3 = learner.step([multi_turn_group(2, n=1, turns=3)])  # one multi-turn trajectory alone also trains
    assert m3["turns"] == 3 and m3["version"] == 3 and "loss" in m3


def test_critic_warmup_keeps_the_policy_still(tiny: Path) -> None:
    learner = Learner(_cfg(critic_warmup_steps=2, critic_lr=1e-2), tiny, seed=0)
    assert learner.critic is not None
    before = _params(learner.model)
    for k in range(2):
        m = learner.step(random_groups(k))
        assert m["critic_warmup"] == 1.0 and "loss" not in m and "value_loss" in m and m["version"] == k + 1
    assert all(torch.equal(before[n], p) for n, p in learner.model.named_parameters())
    assert learner.optimizer_steps == 0 and learner.critic.optimizer_steps == 2
    m = learner.step(random_groups(2))
    assert m["critic_warmup"] == 0.0 and "loss" in m and learner.optimizer_steps == 1
    assert any(not torch.equal(before[n], p) for n, p in learner.model.named_parameters())


def test_separate_smaller_critic_model(tiny: Path, tmp_path: Path) -> None:
    small = build_tiny_model(tmp_path / "small", hidden_size=32, num_heads=1, intermediate_size=64, seed=1)
    learner = Learner(_cfg(critic_model=str(small)), tiny, seed=0)
    assert learner.critic is not None and learner.critic.model.head.in_features == 32
    assert "value_loss" in learner.step(random_groups(0))
    word = build_tiny_model(tmp_path / "word", tokenizer="word", words=["a", "b"], seed=0)
    with pytest.raises(ValueError, match="share the policy's tokenizer"):
        Learner(_cfg(critic_model=str(word)), tiny, seed=0)


def test_micro_batching_does_not_change_policy_or_critic_gradients(tiny: Path) -> None:
    grads = []
    for budget in (100_000, 16):
        learner = Learner(_cfg(micro_batch_tokens=budget, grad_clip=0.0), tiny, seed=0)
        assert learner.critic is not None
        with torch.no_grad():  # a nonzero head, so the critic's backbone gets gradients in the first step
            learner.critic.model.head.weight.copy_(torch.randn(1, 64, generator=torch.Generator().manual_seed(0)))
        learner.step([multi_turn_group(3, n=2), *random_groups(3, n_groups=1)])
        g = {f"policy.{n}": p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}
        g |= {f"critic.{n}": p.grad.clone() for n, p in learner.critic.model.named_parameters() if p.grad is not None}
        grads.append(g)
    assert grads[0].keys() == grads[1].keys()
    assert any(k.startswith("critic.backbone") for k in grads[0])
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-5, msg=n)  # fp32 summation order


@pytest.mark.parametrize("extra", [{}, {"lora": {"enabled": True, "r": 4, "dropout": 0.1}, "kl_coef": 0.05}],
                         ids=["full", "lora-dropout-kl"])
def test_resume_with_the_critic_takes_exactly_the_same_next_step(tiny: Path, tmp_path: Path, extra: dict) -> None:
    cfg = _cfg(micro_batch_tokens=64, mini_batches=2, critic_warmup_steps=1, critic_lr=3e-3, schedule="cosine",
               warmup_steps=1, total_steps=6, tis=True, **extra)
    a = Learner(cfg, tiny, seed=3)
    a.step(random_groups(10))
    a.step([multi_turn_group(11), *random_groups(11)])
    ckpt = a.save_checkpoint(tmp_path / "step-000002")
    metrics_a = [a.step(random_groups(12)), a.step([multi_turn_group(13), *random_groups(13)])]
    assert a.critic is not None
    params_a, critic_a = _params(a.model), _params(a.critic.model)
    version_a = a.version
    del a

    b = Learner.from_checkpoint(cfg, ckpt)
    assert b.version.version == 2 and b.critic is not None and b.critic.steps == 2
    metrics_b = [b.step(random_groups(12)), b.step([multi_turn_group(13), *random_groups(13)])]
    for n, p in b.model.named_parameters():
        assert torch.equal(params_a[n], p.detach()), n
    for n, p in b.critic.model.named_parameters():
        assert torch.equal(critic_a[n], p.detach()), n
    for ma, mb in zip(metrics_a, metrics_b, strict=True):
        for k in ("loss", "grad_norm", "lr", "value_loss", "explained_variance", "adv_mean", "adv_std",
                  "critic_grad_norm", "tis_weight_mean", "engine_kl_mean"):
            assert ma[k] == mb[k], k
    assert b.version == version_a


# -- engine/learner mismatch --------------------------------------------------------------------------


def _bf16_engine_groups(model_path: Path, seed: int) -> list[Group]:
    """``random_groups`` whose behaviour log-probs come from a bf16 copy of the model (the "engine")."""
    engine = load_causal_lm(model_path).to(torch.bfloat16).eval()
    groups = random_groups(seed)
    for g in groups:
        for t in g.trajectories:
            tr = t.transitions[0]
            ids = torch.tensor([tr.prompt_token_ids + tr.action_token_ids])
            with torch.no_grad():
                lp = token_logprobs(engine, ids, torch.ones_like(ids))[0]
            tr.action_logprobs = lp[len(tr.prompt_token_ids) - 1:].tolist()
    return groups


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_bf16_engine_gap_is_reported_and_tis_corrects_it(tmp_path: Path, algorithm: str) -> None:
    # a larger init spread than the default tiny model, so bf16 rounding visibly moves the log-probs
    model = build_tiny_model(tmp_path / "m", init_std=0.2, seed=0)
    groups = _bf16_engine_groups(model, seed=5)
    learner = Learner(_cfg(algorithm=algorithm), model, seed=0)
    off = learner.step(groups)
    assert off["engine_kl_mean"] > 0 and off["engine_kl_max"] >= off["engine_kl_mean"]
    assert off["engine_tokens"] == off["policy_tokens"] and "tis_weight_mean" not in off

    # the correction weights themselves, on the same tokens
    fresh = Learner(_cfg(algorithm=algorithm), model, seed=0)
    batch = build_ppo_batch(groups)
    mb = collate(batch.sequences, list(range(len(batch.sequences))), fresh.pad_id, "cpu")
    with torch.no_grad():
        lp = token_logprobs(fresh.model, mb.input_ids, mb.attention_mask)
    w = tis_weights(lp, mb.behaviour_logprobs, cap=2.0)[mb.mask]
    assert not torch.allclose(w, torch.ones_like(w), rtol=0, atol=1e-4) and float(w.max()) <= 2.0
    gap_sum, gap_max, n = engine_gap(lp, mb.behaviour_logprobs, mb.mask)
    assert gap_sum / n == pytest.approx(off["engine_kl_mean"], rel=1e-5)
    assert gap_max == pytest.approx(off["engine_kl_max"], rel=1e-5)

    tis = Learner(_cfg(algorithm=algorithm, tis=True, tis_cap=2.0), model, seed=0)
    on = tis.step(groups)
    assert on["tis_weight_mean"] != pytest.approx(1.0, abs=1e-6)
    assert on["engine_kl_mean"] == pytest.approx(off["engine_kl_mean"])
    assert on["loss"] != off["loss"]
    # engine log-probs equal to the learner's: weights exactly 1, the same loss as without TIS
    for g in groups:
        for t in g.trajectories:
            tr = t.transitions[0]
            lp_l = fresh.sequence_logprobs([tr.prompt_token_ids + tr.action_token_ids])[0]
            tr.action_logprobs = lp_l[len(tr.prompt_token_ids) - 1:]
    same = Learner(_cfg(algorithm=algorithm, tis=True), model, seed=0).step(groups)
    assert same["tis_weight_mean"] == pytest.approx(1.0, abs=1e-6) and same["engine_kl_mean"] < 1e-9


# -- known answer ---------------------------------------------------------------------------------------

OBJECTS = ["apple", "ball", "cup", "key"]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_raises_reward_on_a_task_with_a_known_answer(tmp_path: Path, algorithm: str) -> None:
    """Reward 1 when a 2-token reply sampled from the learner's own model names the task's object (chance
    ~15% on a ~13-word vocabulary). GRPO: groups of 8 per task; PPO: groups of one, the critic the baseline."""
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path / "word", tokenizer="word", words=[*OBJECTS, "fetch"], punctuation=False,
                            seed=0)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    group_size = 8 if algorithm == "grpo" else 1
    learner = Learner(_cfg(algorithm=algorithm, lr=1e-2, critic_lr=1e-2, group_size=group_size), path, seed=0)
    gen = torch.Generator().manual_seed(0)
    tasks = [Task(f"fetch-{o}", "twx:fetch", f"fetch {o}") for o in OBJECTS]
    prompts = {t.task_id: [tok.bos_token_id, *tok.encode(t.instruction, add_special_tokens=False)] for t in tasks}
    answer = {t.task_id: tok.convert_tokens_to_ids(o) for t, o in zip(tasks, OBJECTS, strict=True)}

    def sample(prompt: list[int], n: int) -> tuple[list[list[int]], list[list[float]]]:
        ids = torch.tensor([prompt] * n)
        lps: list[torch.Tensor] = []
        learner.model.eval()
        with torch.no_grad():
            for _ in range(2):
                logits = learner.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1].float()
                logp = logits.log_softmax(-1)
                nxt = torch.multinomial(logp.exp(), 1, generator=gen)
                lps.append(logp.gather(1, nxt))
                ids = torch.cat([ids, nxt], dim=1)
        learner.model.train()
        return ids[:, len(prompt):].tolist(), torch.cat(lps, dim=1).tolist()

    rewards: list[float] = []
    for _ in range(60):
        groups = []
        for task in tasks:
            replies, lps = sample(prompts[task.task_id], 8)
            trajs = []
            for k, (reply, lp) in enumerate(zip(replies, lps, strict=True)):
                r = 1.0 if answer[task.task_id] in reply else 0.0
                tr = step_transition(task, 0, prompts[task.task_id], reply, r, lp, f"{task.task_id}-{k}")
                trajs.append(Trajectory(task, [tr], r > 0, r))
            groups += [Group(task, trajs[i: i + group_size]) for i in range(0, len(trajs), group_size)]
        m = learner.step(groups)
        rewards.append(m["reward_mean"])
        if len(rewards) >= 10 and sum(rewards[-5:]) / 5 >= 0.5:
            break
    first, last = rewards[0], sum(rewards[-5:]) / 5
    print(f"{algorithm}: mean reward untrained {first:.3f}, last 5 steps {last:.3f} after {len(rewards)} steps")
    assert first < 0.3, rewards
    assert last >= 0.5 and last >= first + 0.25, rewards
