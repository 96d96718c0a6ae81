"""Chat-style policy prompts with a real vLLM engine (in a Ray actor) playing real TextWorldExpress episodes.

Each step's prompt must be the previous prompt + the sampled reply + a short user turn, token for token, so
the learner's sequence builder makes ONE token sequence per episode (more only where the context cap forced
a restart) with the loss mask on the policy's replies only. The model is the tiny random Llama with the
byte-level BPE tokenizer (ChatML template): its replies are noise, which is fine: the environment answers an
unparsable reply like any invalid action, and every episode runs to ``max_steps``.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
import ray

from actors.policy_engine import create_policy_engines
from actors.rollout import engines_act
from dreamgym.agent_prompt import ChatPromptBuilder, turn_prompt
from dreamgym.config import EngineConfig, EnvConfig, PolicyConfig
from dreamgym.envs.registry import make_env
from dreamgym.models import build_tiny_model
from dreamgym.rollout import run_episodes
from dreamgym.types import AgentTurn, Observation, Trajectory
from learner.sequences import trajectory_sequences

pytestmark = [pytest.mark.ray, pytest.mark.engine]

MAX_STEPS = 4
MAX_TOKENS = 8
SHOWN, CHARS = 10, 300


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-bpe", seed=0)


def _engine(model: Path, max_model_len: int) -> ray.actor.ActorHandle:
    cfg = PolicyConfig(model=str(model), max_tokens=MAX_TOKENS, prompt_style="chat", chat_restart_steps=1,
                       worked_example=True, max_admissible_shown=SHOWN, observation_max_chars=CHARS,
                       engine=EngineConfig(dtype="float32", max_model_len=max_model_len, seed=0, kv_cache_gib=0.25))
    (handle,) = create_policy_engines(cfg)
    return handle


@pytest.fixture(scope="module")
def envs() -> Iterator[list]:
    made = [make_env(EnvConfig(name="twx:coin", params={"numLocations": 3, "includeDoors": 0}, max_steps=MAX_STEPS))
            for _ in range(2)]
    yield made
    for e in made:
        e.close()


def _play(handle: ray.actor.ActorHandle, envs: list) -> list[Trajectory]:
    tasks = envs[0].tasks(2, first=0, split="test")
    trajs, stats = run_episodes(envs, tasks, engines_act([handle]), source="real")
    assert stats.episodes == 2 and all(t.transitions for t in trajs)
    return trajs


def _check_mask(traj: Trajectory) -> list:
    seqs = trajectory_sequences(traj)
    masked = [i for s in seqs for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m]
    assert masked == [i for tr in traj.transitions for i in (tr.action_token_ids or [])]  # replies, nothing else
    assert sum(len(s) for s in seqs) <= sum(len(tr.prompt_token_ids or []) + len(tr.action_token_ids or [])
                                            for tr in traj.transitions)
    return seqs


def test_a_chat_episode_is_one_learner_sequence(ray_cluster: object, tiny_model: Path, envs: list) -> None:
    handle = _engine(tiny_model, max_model_len=2048)
    try:
        for traj in _play(handle, envs):
            steps = traj.transitions
            for prev, cur in pairwise(steps):
                context = list(prev.prompt_token_ids or []) + list(prev.action_token_ids or [])
                assert list(cur.prompt_token_ids or [])[: len(context)] == context  # literal extension
            (seq,) = _check_mask(traj)
            assert len(seq) == len(steps[-1].prompt_token_ids or []) + len(steps[-1].action_token_ids or [])
            assert seq.turn_starts and len(seq.turn_starts) == len(steps)
    finally:
        ray.kill(handle)


def test_the_context_cap_restarts_the_conversation_as_a_new_sequence(
    ray_cluster: object, tiny_model: Path, envs: list
) -> None:
    from transformers import AutoTokenizer

    builder = ChatPromptBuilder(AutoTokenizer.from_pretrained(tiny_model))
    cap = 950  # the first prompt (system, worked example, task, observation) is ~700 tiny-BPE tokens: a turn or two fit
    handle = _engine(tiny_model, max_model_len=cap)
    try:
        restarted = 0
        for traj in _play(handle, envs):
            seqs = _check_mask(traj)
            restarted += len(seqs) - 1
            assert all(len(s) <= cap for s in seqs)
            for prev, cur in pairwise(traj.transitions):
                context = list(prev.prompt_token_ids or []) + list(prev.action_token_ids or [])
                if list(cur.prompt_token_ids or [])[: len(context)] == context:
                    continue
                # a restart only where the conversation grown by this turn would leave no room for a reply
                turn = AgentTurn(traj.task, Observation(cur.state, cur.state, cur.admissible_actions))
                assert len(builder.extend(context, turn_prompt(turn, SHOWN, CHARS))) > cap - MAX_TOKENS
        assert restarted >= 1
    finally:
        ray.kill(handle)
