"""The rollout library (no Ray): lockstep episodes on real TextWorldExpress games and on a SyntheticEnv."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from dreamgym.config import EnvConfig
from dreamgym.envs.registry import make_env
from dreamgym.experience.client import FunctionClient
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.prompts import format_reply
from dreamgym.experience.synthetic_env import SyntheticEnv
from dreamgym.replay.records import point_id
from dreamgym.rollout import group_stats, group_trajectories, random_valid_act, repeat_tasks, run_episodes
from dreamgym.types import ActionSample, AgentTurn, Demonstration


@pytest.fixture(scope="module")
def coin_envs():
    envs = [make_env(EnvConfig(name="twx:coin", max_steps=8)) for _ in range(3)]
    yield envs
    for e in envs:
        e.close()


def _scripted_act(version: int = 3):
    """A policy that always answers the first admissible action, with fake token ids and log-probs."""
    calls: list[int] = []

    def act(turns: Sequence[AgentTurn]) -> list[ActionSample]:
        calls.append(len(turns))
        out = []
        for k, t in enumerate(turns):
            a = (t.observation.admissible_actions or ["look around"])[0]
            parsed = k % 2 == 0
            text = f"<action>{a}</action>" if parsed else a
            out.append(ActionSample(text=text, action=a, parsed=parsed, prompt_token_ids=[1, 2, 3], token_ids=[7, 8],
                                    logprobs=[-0.5, -0.25], weight_version=version, finish_reason="stop"))
        return out

    act.calls = calls  # type: ignore[attr-defined]
    return act


def test_lockstep_random_baseline_on_coin(coin_envs) -> None:
    tasks = coin_envs[0].tasks(4, first=0, split="test")
    trajs, stats = run_episodes(coin_envs, repeat_tasks(tasks, 2), random_valid_act(0))
    assert len(trajs) == 8 and stats.episodes == 8
    assert [t.task.task_id for t in trajs] == [t.task_id for t in repeat_tasks(tasks, 2)]
    assert stats.steps == sum(len(t.transitions) for t in trajs)
    assert all(1 <= len(t.transitions) <= 8 for t in trajs)
    assert stats.invalid_actions == 0 and stats.unparsable == 0 and stats.actions_checked == stats.steps
    assert stats.successes == sum(t.success for t in trajs)
    for t in trajs:
        assert [tr.step for tr in t.transitions] == list(range(len(t.transitions)))
        assert t.transitions[-1].done and t.total_reward == pytest.approx(sum(tr.reward for tr in t.transitions))
        assert len({tr.episode_id for tr in t.transitions}) == 1
    groups, dropped = group_trajectories(trajs)
    assert len(groups) == 4 and dropped == 0 and all(len(g.trajectories) == 2 for g in groups)
    assert group_stats(groups)["groups"] == 4


def test_transitions_carry_policy_tokens_and_counts(coin_envs) -> None:
    act = _scripted_act(version=3)
    tasks = coin_envs[0].tasks(2, first=5, split="test")
    trajs, stats = run_episodes(coin_envs[:2], repeat_tasks(tasks, 2), act)
    # at most two episodes run at once: every act call has at most two turns
    assert max(act.calls) <= 2
    tr = trajs[0].transitions[0]
    assert tr.prompt_token_ids == [1, 2, 3] and tr.action_token_ids == [7, 8] and tr.action_logprobs == [-0.5, -0.25]
    assert tr.weight_version == 3 and trajs[0].weight_version == 3 and tr.policy == "policy@v3"
    assert tr.source == "real" and tr.valid
    assert stats.unparsable == sum(not t.action_parsed for x in trajs for t in x.transitions) > 0
    assert stats.policy_tokens == 2 * stats.steps


def _copy_model(broken: bool = False, on_call=None) -> ExperienceModel:
    """An experience model whose reply copies the first demonstration's outcome (or is malformed); ``on_call()``
    runs first on every request (e.g. to record it and take a while, as a served model does)."""

    def reply(messages, sampling) -> str:
        if on_call is not None:
            on_call()
        if broken:
            return "the next state is probably a kitchen"
        user = messages[-1]["content"]
        block = user.split("[1] State:", 1)[1]
        nxt = block.split("Next state:", 1)[1].split("\n")[0].strip()
        tail = block.split("Reward:", 1)[1].split("\n")[0].split()
        return format_reply(nxt, float(tail[0]), tail[2] == "true", tail[4] == "true", "copied from [1]")

    return ExperienceModel(FunctionClient(reply))


def _synthetic_coin(real, tasks):
    """``SyntheticEnv`` factory over ``tasks``: demonstrations from random episodes in the real game."""
    demo_trajs, _ = run_episodes([real], tasks * 3, random_valid_act(1))
    demos = [t for tr in demo_trajs for t in tr.transitions]
    starts = {t.task_id: real.reset(t).state for t in tasks}
    valid = {t.state: t.admissible_actions for t in demos}

    def retrieve(state: str, action: str, k: int) -> list[Demonstration]:  # the Retriever contract
        same = [d for d in demos if d.state == state and d.action == action]
        return [Demonstration(transition=d, score=1.0 if same else 0.0, id=point_id(d)) for d in (same or demos)[:k]]

    def env(model: ExperienceModel) -> SyntheticEnv:
        return SyntheticEnv(model, retrieve, "twx:coin", top_k=2, max_steps=5,
                            initial_state=lambda t: starts[t.task_id], admissible=valid.get)

    return env


def test_synthetic_rollouts_and_invalid_transitions(coin_envs) -> None:
    real = coin_envs[0]
    tasks = real.tasks(2, first=0, split="train")
    env = _synthetic_coin(real, tasks)
    good = [env(_copy_model()) for _ in range(2)]
    trajs, stats = run_episodes(good, repeat_tasks(tasks, 2), random_valid_act(2), source="synthetic", threads=2)
    assert stats.episodes == 4 and stats.invalid_transitions == 0
    assert all(tr.source == "synthetic" and tr.valid for t in trajs for tr in t.transitions)
    assert len(group_trajectories(trajs)[0]) == 2
    # a synthetic step's time, split between retrieval and the experience model (the iteration benchmark's split)
    assert stats.model_seconds > 0 and stats.retrieval_seconds > 0
    assert stats.model_seconds + stats.retrieval_seconds <= 2 * stats.env_seconds + 1e-6  # 2 threads at most

    bad = [env(_copy_model(broken=True)) for _ in range(2)]
    trajs, stats = run_episodes(bad, repeat_tasks(tasks, 2), random_valid_act(2), source="synthetic", threads=2)
    # every episode ends at its first step with an invalid transition: counted, and never a GRPO sample
    assert stats.invalid_transitions == 4 and stats.invalid_episodes == 4 and stats.successes == 0
    assert all(len(t.transitions) == 1 and not t.transitions[0].valid for t in trajs)
    groups, dropped = group_trajectories(trajs)
    assert groups == [] and dropped == 4
    assert group_trajectories(trajs, invalid_episodes="truncate") == ([], 4)  # nothing valid to keep


def test_synthetic_episodes_step_asynchronously_and_never_wait_for_the_slowest(coin_envs) -> None:
    """With threads, an episode acts again as soon as its own step returns: the episodes on a fast simulator
    run several steps while one on a slow simulator is still on its first (in lockstep: one step each)."""
    real = coin_envs[0]
    tasks = real.tasks(3, first=10, split="train")
    env = _synthetic_coin(real, tasks)
    calls: list[str] = []
    lock = threading.Lock()

    def timed(kind: str, seconds: float):
        def on_call() -> None:
            with lock:
                calls.append(kind)
            time.sleep(seconds)
        return on_call

    envs = [env(_copy_model(on_call=timed("slow", 0.5))), env(_copy_model(on_call=timed("fast", 0.01)))]
    act = _scripted_act()
    episodes = repeat_tasks(tasks, 2)
    trajs, stats = run_episodes(envs, episodes, act, source="synthetic", threads=2)
    assert [t.task.task_id for t in trajs] == [t.task_id for t in episodes] and stats.episodes == 6
    assert stats.steps == sum(len(t.transitions) for t in trajs) == len(calls)
    for t in trajs:
        assert [tr.step for tr in t.transitions] == list(range(len(t.transitions)))
        assert t.transitions[-1].done and all(tr.valid for tr in t.transitions)
    slow = [i for i, c in enumerate(calls) if c == "slow"]
    before_second_slow = calls[: slow[1] if len(slow) > 1 else len(calls)]
    assert before_second_slow.count("fast") >= 3, calls
    assert 1 in act.calls  # the policy answered an episode on its own as soon as it was ready


def test_an_episode_an_invalid_transition_ended_is_truncated_or_dropped(coin_envs) -> None:
    """``train.invalid_episodes``: ``truncate`` keeps the valid prefix as an unsuccessful episode with the reward
    earned so far (a long, failing episode stays in its group); ``drop`` leaves the episode out."""
    from dataclasses import replace

    from dreamgym.rollout import learnable_part

    real = coin_envs[0]
    tasks = real.tasks(1, first=0, split="train")
    trajs, _ = run_episodes([real], tasks * 6, random_valid_act(3))
    long = next(t for t in trajs if len(t.transitions) >= 3)
    steps = [replace(tr, reward=0.5) for tr in long.transitions[:2]]
    steps.append(replace(long.transitions[2], valid=False, done=True))
    broken = replace(long, transitions=steps, success=True, total_reward=9.0)
    assert learnable_part(broken, "drop") is None
    cut = learnable_part(broken, "truncate")
    assert cut is not None and cut.transitions == steps[:2] and not cut.success and cut.total_reward == 1.0
    assert learnable_part(long, "truncate") is long  # a valid episode is left as it is
    others = [t for t in trajs if t is not long]
    groups, left_out = group_trajectories([broken, *others], invalid_episodes="truncate")
    assert left_out == 0 and len(groups[0].trajectories) == 6 and 1.0 in groups[0].rewards
    assert group_trajectories([broken, *others])[1] == 1



def test_a_retriever_that_returns_transitions_gets_a_clear_error(coin_envs) -> None:
    real = coin_envs[0]
    task = real.tasks(1, first=0, split="train")[0]
    first = real.reset(task)
    demo_trajs, _ = run_episodes([real], [task], random_valid_act(3))
    transitions = demo_trajs[0].transitions
    env = SyntheticEnv(_copy_model(), lambda s, a, k: transitions[:k], "twx:coin", top_k=1, max_steps=3,
                       initial_state=lambda _t: first.state)
    env.reset(task)
    with pytest.raises(TypeError, match=r"must return dreamgym\.types\.Demonstration"):
        env.step(first.admissible_actions[0])
