"""The ``copy`` experience-model backend (the study's ``copy-sim`` control) and the rule counters of the
``no-rules`` arm, on real code paths: a real Qdrant (local mode) replay collection of real ``twx:coin``
transitions, the real ``SyntheticEnv`` and ``ExperienceModel`` (parser, admissible checks, reward rule)."""

from __future__ import annotations

import pytest
from replay_fixtures import *  # noqa: F403 - the replay fixtures (encoder, twx_data, make_buffer)
from test_experience_model import VALID, _query, _scripted

from dreamgym.config import ExperienceModelConfig, validate_config
from dreamgym.errors import ConfigError
from dreamgym.experience.backends import open_client
from dreamgym.experience.copy_client import NO_DEMONSTRATION, CopyTop1Client
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.prompts import format_reply
from dreamgym.experience.setup import build_model
from dreamgym.experience.synthetic_env import SyntheticEnv
from dreamgym.types import Task


def test_copy_backend_answers_with_the_top1_transition_of_a_real_replay_collection(twx_data, make_buffer) -> None:
    ts, vecs = twx_data
    buf = make_buffer("local")
    buf.add(ts, vecs)
    cfg = ExperienceModelConfig(backend="copy", top_k=3)
    client = open_client(cfg)
    assert isinstance(client, CopyTop1Client)
    model = build_model(cfg, client)
    env = SyntheticEnv(model, lambda s, a, k: buf.retrieve(s, a, k), "twx:coin", top_k=3, max_steps=5)
    checked = paid = 0
    for t in ts[::7][:12]:
        task = Task(task_id=t.task_id, env="twx:coin", instruction=t.instruction, params={"initial_state": t.state})
        obs = env.reset(task)
        top = buf.retrieve(obs.state, t.action, 1)[0].transition
        res = env.step(t.action)
        assert res.info["valid"] and not res.info["settled"], res.info
        assert res.observation.state == env.abstract_state(top.next_state)
        assert (res.reward, res.done, res.success) == (top.reward, top.done, top.success and top.done)
        checked += 1
        paid += top.reward > 0
    assert checked == 12 and client.calls == 12
    st = model.stats  # each copied reply keeps coin's reward rule: the first reply is the final one
    assert (st.model_calls, st.valid, st.invalid, st.first_parsed, st.first_rule_ok) == (12, 12, 0, 12, 12)
    assert st.first_final == st.first_final_agree == 12
    # an empty store: no demonstration to copy, an invalid transition that names why
    empty = SyntheticEnv(model, lambda s, a, k: [], "twx:coin", top_k=3)
    empty.reset(Task(task_id="t", env="twx:coin", instruction="x", params={"initial_state": "You are in the hall."}))
    res = empty.step("look around")
    assert not res.info["valid"] and res.info["invalid_reason"] == NO_DEMONSTRATION and res.done


def test_copy_backend_needs_retrieval_and_the_copy_sim_arm_starts_no_model(tmp_path) -> None:
    from dreamgym.placement import plan_placement
    from dreamgym.study.arms import arm_seed_config, fine_tunes_experience_model

    with pytest.raises(ConfigError, match="backend 'copy' copies the top-1 retrieved transition: it needs"):
        validate_config({"experience_model": {"backend": "copy", "top_k": 0}})
    cfg = validate_config({"train": {"iterations": 4, "experience_sft": True}})
    c = arm_seed_config(cfg, "copy-sim", 0, tmp_path / "offline.parquet")
    assert c.experience_model.backend == "copy" and c.train.mode == "synthetic"
    assert not fine_tunes_experience_model(c) and c.curriculum.llm_variants == 0
    assert not [r for r in plan_placement(c).actors if r.role == "experience-replica"]


def test_no_rules_counts_what_the_rules_would_have_done_and_the_first_reply_is_scored() -> None:
    # coin's outcome rule: a reward without success is refused; the model's first reply breaks it
    broken = format_reply("You are in the kitchen.", 1.0, False, False, "paid for walking")
    client, seen = _scripted([broken, VALID])
    ruled = ExperienceModel(client)
    p = ruled.predict_one(_query())  # "go north" is admissible: the model answers, the rule resamples
    assert p.valid and p.success and p.attempts == 2
    st = ruled.stats
    assert (st.first_parsed, st.first_rule_ok, st.first_final, st.first_final_agree) == (1, 0, 1, 1)
    assert ruled.predict_one(_query(action="dance")).settled and ruled.stats.settled == 1
    assert ruled.stats.rule_shares()["settled_share"] == 0.5

    client, seen = _scripted([broken])
    free = ExperienceModel(client, inadmissible="model", check_reward_rule=False)
    preds = free.predict([_query(), _query(action="dance")])
    assert all(p.valid and p.reward == 1.0 and not p.settled for p in preds) and len(seen) == 2
    st = free.stats
    assert (st.settled, st.unsettled, st.rule_unenforced, st.first_parsed, st.first_rule_ok) == (0, 1, 2, 2, 0)
    shares = st.rule_shares()
    assert shares["settled_share"] == 0.0 and shares["would_settle_share"] == 0.5
    assert shares["first_reply_rule_agreement"] == 0.0 and shares["first_reply_final_agreement"] == 1.0
