"""The experience model's library parts, on real data and real code paths (no vLLM engine here).

Backends in this file: ``FunctionClient`` (a scripted environment model in Python) and the HTTP client
against ``ScriptedOpenAIServer`` (a real OpenAI-compatible server on loopback whose replies the test
controls, including broken ones). The vLLM-backed tests are in ``test_experience_engine.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from experience_data import HALL, KITCHEN, TOY_ENV, collect_coin, toy_row, write_toy
from scripted_openai_server import ScriptedOpenAIServer

from dreamgym.data.transitions import iter_transitions, open_transitions
from dreamgym.experience.annotate import TeacherAnnotator, TemplateAnnotator, annotate_file, template_rationale
from dreamgym.experience.client import FunctionClient
from dreamgym.experience.evaluate import evaluate, format_table, token_f1
from dreamgym.experience.gym_env import TextGymEnv
from dreamgym.experience.http_client import OpenAIClient
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.parser import MalformedReply, parse_reply
from dreamgym.experience.prompts import PromptOptions, build_messages, format_reply
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.experience.retry import RetryPolicy
from dreamgym.experience.schema import Completion, ExperienceQuery, HistoryStep, Message, Sampling
from dreamgym.experience.synthetic_env import SyntheticEnv, synthetic_env_from_index
from dreamgym.types import Demonstration, Task, Transition

VALID = format_reply(KITCHEN, 1.0, True, True, "North of the hall is the kitchen.")


@pytest.fixture(scope="module")
def coin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real twx:coin data: 40 train-split episodes (the store) and 12 test-split episodes (held out)."""
    d = tmp_path_factory.mktemp("coin")
    return {"train": collect_coin(d / "train.parquet", "train", 40),
            "test": collect_coin(d / "test.parquet", "test", 12)}


def _demo(i: int) -> Demonstration:
    t = Transition(episode_id="e", step=0, task_id="coin/0", env="twx:coin", instruction="Find the coin.",
                   state=f"ds{i}", action="go north", next_state=f"dn{i}", reward=0.0, done=False, success=False,
                   admissible_actions=None)
    return Demonstration(t, score=0.0, id=f"demo-{i}")


def _query(**kw: Any) -> ExperienceQuery:
    base: dict[str, Any] = {
        "env": "twx:coin", "instruction": "Find the coin.", "state": HALL, "action": "go north",
        "history": [HistoryStep(f"a{i}", f"s{i}") for i in range(6)],
        "demonstrations": [_demo(i) for i in range(5)],
        "admissible_actions": ["go north", "look"],
    }
    base.update(kw)
    return ExperienceQuery(**base)


# ---------------------------------------------------------------------------------------------
# Prompt and parser


def test_prompt_carries_the_papers_inputs() -> None:
    opts = PromptOptions(history_steps=2, top_k=3)
    system, user = (m["content"] for m in build_messages(_query(), opts))
    assert "TextWorldExpress" in system
    assert "Unknown action: I'm not sure what you mean." in system  # the twx failure state
    assert "compass direction" in system  # the adapter's own state rules
    assert "<think>" in system and "<next_state>" in system and "from 0 to 1" in system
    assert user.startswith("Task: Find the coin.")
    assert "[3] State: ds2" in user and "[4]" not in user  # top-k demonstrations
    assert "Action: a5 -> State: s5" in user and "a3" not in user  # last H steps only
    assert "Valid actions: go north, look" in user and user.endswith("Action: go north")
    no_reasoning = build_messages(_query(), PromptOptions(reasoning=False))[0]["content"]
    assert "<think>" not in no_reasoning
    # The system prompt is the same for every request of a family (the prefix cache serves it).
    assert build_messages(_query(state="other", action="look"), opts)[0]["content"] == system


def test_reply_format_round_trips() -> None:
    p = parse_reply(VALID)
    assert (p.next_state, p.reward, p.done, p.success) == (KITCHEN, 1.0, True, True)
    assert p.reasoning == "North of the hall is the kitchen."
    # Generation stops on "</success>" (the stop string is not returned): still valid.
    assert parse_reply(VALID.removesuffix("</success>")).success is True
    bare = format_reply("s", 0.25, False, False, with_reasoning=False)
    assert parse_reply(bare, reasoning=False).reward == 0.25
    assert parse_reply(format_reply("s", -1, False, False, "r"), reward_range=(-1, 1)).reward == -1


@pytest.mark.parametrize(("text", "reason"), [
    ("", "empty"),
    ("Sure! " + VALID, "prefix-text"),
    (VALID.replace("<think>North of the hall is the kitchen.</think>", "<think> </think>"), "empty:<think>"),
    (VALID.replace("<reward>1</reward>\n", ""), "missing:<reward>"),
    (VALID.replace("<reward>1</reward>", "<reward>lots</reward>"), "reward:not-a-number"),
    (VALID.replace("<reward>1</reward>", "<reward>7</reward>"), "reward:out-of-range"),
    (VALID.replace("<reward>1</reward>", "<reward>nan</reward>"), "reward:not-a-number"),
    (VALID.replace("<done>true</done>", "<done>yes</done>"), "done:not-a-bool"),
    (VALID.replace("<done>true</done>", "<done>false</done>"), "success-without-done"),
    (VALID.replace("<reward>1</reward>", "<reward>0</reward>"), "success-without-reward"),
    (VALID.replace("<next_state>You are in the kitchen.</next_state>", "<next_state>\n</next_state>"),
     "empty:<next_state>"),
    (VALID + "\nand then more", "trailing-text"),
    (VALID + "<reward>0</reward>", "duplicate:<reward>"),
    (VALID.replace("<next_state>You are in the kitchen.</next_state>\n<reward>1</reward>",
                   "<reward>1</reward>\n<next_state>You are in the kitchen.</next_state>"), "order:<next_state>"),
    ("<think>hm</think>\n<next_state>half a state", "unclosed:<next_state>"),
])
def test_parser_is_strict(text: str, reason: str) -> None:
    with pytest.raises(MalformedReply) as e:
        parse_reply(text)
    assert e.value.reason == reason


# ---------------------------------------------------------------------------------------------
# Retry policy and invalid-transition accounting


def test_retry_changes_sampling_as_documented() -> None:
    r = RetryPolicy(max_attempts=4, temperature_decay=0.5, escape_temperature=0.8, max_tokens_cap=100)
    greedy = Sampling(temperature=0.0, max_tokens=40)
    junk = Completion("junk")
    # greedy would repeat itself -> escape temperature, then decay, then greedy again below 0.05
    assert [s.temperature for s in r.schedule(greedy, [junk] * 3)] == [0.0, 0.8, 0.4, 0.2]
    assert r.next_sampling(Sampling(temperature=0.06), junk).temperature == 0.0
    # cut by the token limit -> more tokens (capped), same temperature
    cut = Completion("<think>long", finish_reason="length")
    assert [s.max_tokens for s in r.schedule(greedy, [cut] * 3)] == [40, 80, 100, 100]
    assert r.schedule(greedy, [cut] * 3)[-1].temperature == 0.8  # the cap reached: rule 3 applies
    assert r.should_retry(1, junk) and not r.should_retry(4, junk)
    assert not r.should_retry(1, Completion("", finish_reason="error:http-400"))
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def _scripted(replies: list[str]) -> tuple[FunctionClient, list[Sampling]]:
    seen: list[Sampling] = []

    def fn(messages: list[Message], s: Sampling) -> str:
        seen.append(s)
        return replies[min(len(seen) - 1, len(replies) - 1)]

    return FunctionClient(fn), seen


def test_model_retries_malformed_replies_then_marks_invalid() -> None:
    client, seen = _scripted(["garbage", "<think>x</think>", VALID])
    model = ExperienceModel(client, retry=RetryPolicy(max_attempts=3))
    p = model.predict_one(_query(admissible_actions=None))
    assert p.valid and p.attempts == 3 and p.success
    assert [s.temperature for s in seen] == [0.0, 0.7, 0.35]
    assert all(s.stop == ("</success>",) for s in seen)
    st = model.stats
    assert (st.queries, st.model_calls, st.retries, st.valid, st.invalid, st.recovered) == (1, 3, 2, 1, 0, 1)
    assert st.reasons == {"missing:<think>": 1, "missing:<next_state>": 1}

    client, _ = _scripted(["<think>x</think><next_state>s</next_state><reward>2</reward>"])
    model = ExperienceModel(client, retry=RetryPolicy(max_attempts=2))
    preds = model.predict([_query(admissible_actions=None), _query(admissible_actions=None, action="look")])
    assert [p.valid for p in preds] == [False, False]
    assert preds[0].invalid_reason == "missing:<done>" and preds[0].next_state == "" and preds[0].attempts == 2
    assert model.stats.invalid == 2 and model.stats.invalid_rate == 1.0 and model.stats.model_calls == 4


def test_inadmissible_action_is_settled_by_the_admissible_list() -> None:
    client, seen = _scripted([VALID])
    model = ExperienceModel(client)
    p = model.predict_one(_query(action="dance"))
    assert p.settled and p.valid and p.reward == 0.0 and not p.done
    assert p.next_state == "Unknown action: I'm not sure what you mean."
    assert seen == [] and model.stats.settled == 1
    # Without a list, or with inadmissible='model', the model decides.
    assert model.predict_one(_query(action="dance", admissible_actions=None)).success
    assert ExperienceModel(client, inadmissible="model").predict_one(_query(action="dance")).success


def test_an_action_no_real_state_accepts_is_settled_where_the_state_has_no_list() -> None:
    """A state the experience model wrote has no admissible list; the environment's action space (every action
    real data accepted somewhere) still rules out prose and paraphrases, which the model used to pay for."""
    client, seen = _scripted([VALID, VALID])
    model = ExperienceModel(client)
    space = frozenset({"go north", "take coin", "look"})
    for prose in ("You take the coin and it is yours", "take the coin"):
        p = model.predict_one(_query(action=prose, admissible_actions=None, action_space=space))
        assert p.settled and p.reward == 0.0 and not p.success and "of this environment" in p.reasoning
    assert seen == [] and model.stats.settled == 2
    # An action some real state accepts goes to the model (it knows whether this state accepts it).
    assert model.predict_one(_query(action="take coin", admissible_actions=None, action_space=space)).success
    assert len(seen) == 1
    # The state's own list comes first: "look" is in the space but not valid here.
    assert model.predict_one(_query(action="look", admissible_actions=["go north"], action_space=space)).settled


# ---------------------------------------------------------------------------------------------
# Retrieval, SyntheticEnv, gymnasium


def test_transition_index_retrieves_similar_transitions(coin: dict[str, Path]) -> None:
    index = TransitionIndex.from_parquet(coin["train"])
    t = next(iter_transitions(coin["train"]))
    demos = index(t.state, t.action, 3)
    assert len(demos) == 3 and demos[0].state == t.state and demos[0].action == t.action
    assert demos[0].score >= demos[1].score >= demos[2].score
    assert len({(d.state, d.action, d.next_state) for d in demos}) == 3  # distinct
    # leave-one-episode-out never returns a transition seen only in that episode
    only_here = [e for e in index.entries if len(e.episodes) == 1]
    if only_here:
        e = only_here[0]
        eid = next(iter(e.episodes))
        got = index.search(e.t.state, e.t.action, 5, exclude_episode=eid)
        assert all((g.state, g.action, g.next_state) != (e.t.state, e.t.action, e.t.next_state) for g in got)
    task = index.tasks(1)[0]
    assert task.env == "twx:coin" and index.initial_state(task) == task.params["initial_state"]
    assert index.admissible(t.state) == t.admissible_actions


def _copy_top1(messages: list[Message], s: Sampling) -> str:
    """A scripted environment model: answer with the first demonstration of the prompt."""
    user = messages[-1]["content"]
    m = re.search(r"\[1\] State: .*?\nAction: .*?\nNext state: (.*?)\nReward: (\S+) Done: (\S+) Success: (\S+)",
                  user, re.S)
    assert m, "the prompt has no demonstration"
    state, r, d, s_ = m.groups()
    return format_reply(state, float(r), d == "true", s_ == "true", "copy the closest real transition")


def test_synthetic_env_never_pays_for_an_action_outside_the_action_space(coin: dict[str, Path]) -> None:
    """After the model writes a state real data never saw, the state has no admissible list: prose from the
    policy is settled by the action space (reward 0, counted inadmissible), a real command reaches the model."""
    index = TransitionIndex.from_parquet(coin["train"])
    assert {"take coin", "look around"} <= (index.action_space() or set())
    new_room = format_reply("You are in a greenhouse. You see a coin.", 0.0, False, False, "a new room")
    win = format_reply("You take the coin.", 1.0, True, True, "the coin is taken")
    client, seen = _scripted([new_room, win])
    env = synthetic_env_from_index(ExperienceModel(client), index, "twx:coin", max_steps=6)
    obs = env.reset(env.tasks(1)[0])
    obs = env.step(sorted(obs.admissible_actions or [])[0]).observation
    assert obs.admissible_actions is None and len(seen) == 1  # a state the model wrote
    for prose in ("You take the coin and it is yours", "take the coin"):
        res = env.step(prose)
        assert res.reward == 0.0 and not res.done and res.info["admissible"] is False and res.info["settled"]
    assert len(seen) == 1
    res = env.step("take coin")
    assert res.success and res.reward == 1.0 and len(seen) == 2


def test_a_state_the_model_wrote_borrows_the_list_of_the_most_similar_real_state(coin: dict[str, Path]) -> None:
    """The real game gives a list in every state; synthesis only knows lists of recorded states. A near copy (a
    room misnamed) shows the policy its original's list, a state like none recorded shows none, and an action
    settled as a failure keeps the list (the agent has not moved), as in the real game."""
    index = TransitionIndex.from_parquet(coin["train"])
    facts = index.facts
    t = next(t for t in iter_transitions(coin["train"]) if t.admissible_actions and "kitchen" in t.state)
    misnamed = t.state.replace("kitchen", "pantry", 1)
    assert facts.admissible(misnamed) is None
    assert facts.admissible_like(misnamed, 0.8) == t.admissible_actions
    assert facts.admissible_like(misnamed, 1.0) is None  # exact matches only
    assert facts.admissible_like("You are in a greenhouse full of orchids.", 0.8) is None
    assert facts.admissible_like(t.state, 0.8) == t.admissible_actions

    client, seen = _scripted([format_reply(misnamed, 0.0, False, False, "a near copy")])
    env = synthetic_env_from_index(ExperienceModel(client), index, "twx:coin", max_steps=6, use_retrieval=False)
    obs = env.reset(index.tasks(1)[0])
    obs = env.step(sorted(obs.admissible_actions or [])[0]).observation
    assert obs.state == misnamed and obs.admissible_actions == t.admissible_actions and len(seen) == 1
    res = env.step("dance")
    assert res.info["settled"] and res.observation.state.startswith("Unknown action")
    assert res.observation.admissible_actions == t.admissible_actions and len(seen) == 1


def test_the_similar_state_index_finds_what_a_scan_of_every_state_finds(coin: dict[str, Path]) -> None:
    """``admissible_like`` probes word postings instead of scanning every recorded state (ALFWorld records tens of
    thousands). On perturbed coin states, and on states of random words where few words are shared, it picks the
    state a full scan picks (ties to the first recorded), at every threshold."""
    import random

    from dreamgym.data.task_facts import OfflineTaskFacts
    from dreamgym.words import jaccard, words

    rng = random.Random(0)
    coin_facts = TransitionIndex.from_parquet(coin["train"]).facts
    coin_states = list(dict.fromkeys(t.state for t in iter_transitions(coin["train"]) if t.admissible_actions))
    vocab = [f"w{i}" for i in range(40)]
    random_states = list(dict.fromkeys(" ".join(rng.sample(vocab, rng.randrange(3, 12))) for _ in range(300)))
    random_facts = OfflineTaskFacts()
    for k, st in enumerate(random_states):
        random_facts.add_state(st, [f"act {k}"])
    checked = found = 0
    for facts, states in ((coin_facts, coin_states), (random_facts, random_states)):
        for _ in range(80):
            tokens = rng.choice(states).split()
            for _ in range(rng.randrange(1, 4)):
                tokens[rng.randrange(len(tokens))] = rng.choice(["pantry", "xyzzy", "", *vocab])
            query = " ".join(tokens)
            if facts.admissible(query) is not None:
                continue
            best_sim, first = max((jaccard(words(query), words(st)), -k) for k, st in enumerate(states))
            for t in (0.5, 0.8, 0.95):
                expect = facts.admissible(states[-first]) if best_sim >= t else None
                assert facts.admissible_like(query, t) == expect, (query, t)
                checked += 1
                found += expect is not None
    assert checked > 300 and 0 < found < checked


def test_synthetic_env_runs_an_episode_with_retrieval(coin: dict[str, Path]) -> None:
    index = TransitionIndex.from_parquet(coin["train"])
    client = FunctionClient(_copy_top1)
    model = ExperienceModel(client, PromptOptions(top_k=2, history_steps=2))
    env = synthetic_env_from_index(model, index, "twx:coin", max_steps=6)
    assert env.spec == "synthetic:twx:coin" and "compass" in env.state_rules
    task = env.tasks(1)[0]
    obs = env.reset(task)
    assert obs.state == task.params["initial_state"] and obs.admissible_actions
    steps = 0
    res = None
    while True:
        valid = obs.admissible_actions or []
        action = "take coin" if "take coin" in valid else sorted(valid)[-1]
        res = env.step(action)
        steps += 1
        assert res.info["source"] == "synthetic" and res.info["valid"] and res.info["demonstrations"] == 2
        obs = res.observation
        if res.done:
            break
    assert steps <= 6
    if res.success:
        assert res.reward == 1.0 and not res.info["truncated"]
    else:
        assert res.info["truncated"] and steps == 6
    if steps > 1:
        assert client.calls >= 2  # the second prompt carried the history
    with pytest.raises(RuntimeError):
        env.step("look around")


def test_synthetic_env_ends_an_episode_on_an_invalid_transition() -> None:
    model = ExperienceModel(FunctionClient(lambda m, s: "not the format"), retry=RetryPolicy(max_attempts=2))
    env = SyntheticEnv(model, retrieve=lambda s, a, k: [], env=TOY_ENV)
    env.reset(Task("toy/0", TOY_ENV, "Go to the kitchen.", {"initial_state": HALL}))
    res = env.step("go north")
    assert res.done and not res.success and res.reward == 0.0
    assert res.info["valid"] is False and res.info["truncated"] and res.info["attempts"] == 2
    assert res.observation.state == HALL
    assert model.stats.invalid == 1
    with pytest.raises(Exception, match="initial state"):
        env.reset(Task("toy/1", TOY_ENV, "x"))
    with pytest.raises(Exception, match="imitates"):
        env.reset(Task("t", "twx:coin", "x", {"initial_state": "s"}))


def test_gymnasium_wrapper_steps_the_synthetic_env(tmp_path: Path) -> None:
    from gymnasium.utils.env_checker import check_env

    rows = [toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True, "r")]
    index = TransitionIndex.from_parquet(write_toy(tmp_path / "toy.parquet", rows))
    model = ExperienceModel(FunctionClient(_copy_top1), PromptOptions(top_k=1))
    genv = TextGymEnv(synthetic_env_from_index(model, index, TOY_ENV, max_steps=3))
    obs, info = genv.reset(seed=0)
    assert obs == HALL and genv.observation_space.contains(obs) and info["instruction"] == "Go to the kitchen."
    obs, reward, terminated, truncated, info = genv.step("go north")
    assert (obs, reward, terminated, truncated) == (KITCHEN, 1.0, True, False) and info["success"]
    check_env(genv, skip_render_check=True)


# ---------------------------------------------------------------------------------------------
# HTTP client against a server that returns broken text


def test_http_client_retries_broken_replies_and_counts_invalid() -> None:
    replies = iter(["I am a language model.", "<think>hm</think><next_state>kitchen", VALID])
    with ScriptedOpenAIServer(lambda body: next(replies)) as server:
        client = OpenAIClient(server.url)
        assert client.model == "scripted"
        model = ExperienceModel(client, sampling=Sampling(temperature=0.4, max_tokens=64))
        p = model.predict_one(_query(admissible_actions=None))
        client.close()
    assert p.valid and p.attempts == 3 and p.reward == 1.0
    sent = [(r["temperature"], r["max_tokens"], r["stop"]) for r in server.requests]
    assert sent == [(0.4, 64, ["</success>"]), (0.2, 64, ["</success>"]), (0.1, 64, ["</success>"])]
    assert server.requests[0]["messages"][0]["role"] == "system"
    assert model.stats.reasons == {"missing:<think>": 1, "unclosed:<next_state>": 1}


def test_http_client_invalid_after_last_attempt_and_refusals_not_retried() -> None:
    def reply(body: dict[str, Any]) -> Any:
        user = body["messages"][-1]["content"]
        if "Action: too long" in user:
            return ("", "http-400")
        if "Action: cut" in user:
            return ("<think>a very long thought", "length")
        return "<think>x</think><next_state>y</next_state><reward>0.5</reward><done>maybe</done><success>false"

    with ScriptedOpenAIServer(reply) as server:
        client = OpenAIClient(server.url, concurrency=4)
        model = ExperienceModel(client, sampling=Sampling(max_tokens=32),
                                retry=RetryPolicy(max_attempts=3, max_tokens_cap=100))
        preds = model.predict([_query(admissible_actions=None), _query(action="too long", admissible_actions=None),
                               _query(action="cut", admissible_actions=None)])
        client.close()
    assert [p.valid for p in preds] == [False, False, False]
    assert preds[0].invalid_reason == "done:not-a-bool" and preds[0].attempts == 3
    assert preds[1].invalid_reason == "error:http-400" and preds[1].attempts == 1
    assert preds[2].invalid_reason == "truncated"
    cut = [r["max_tokens"] for r in server.requests if r["messages"][-1]["content"].endswith("Action: cut")]
    assert cut == [32, 64, 100]
    assert model.stats.invalid == 3 and model.stats.model_calls == 7


def test_http_client_reports_an_unreachable_server() -> None:
    from dreamgym.experience.http_client import ExperienceBackendError

    with pytest.raises(ExperienceBackendError, match="no OpenAI-compatible server"):
        OpenAIClient("http://127.0.0.1:9/v1", max_retries=0, timeout_s=2)


# ---------------------------------------------------------------------------------------------
# Annotation


def test_template_annotation_writes_the_optional_columns(coin: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "annotated.parquet"
    s = annotate_file(coin["train"], out, TemplateAnnotator(step_budget=20), batch_size=50)
    assert s["rows"] == s["template"] == pq.ParquetFile(coin["train"]).metadata.num_rows
    pf = open_transitions(out)  # checked against the transitions schema
    assert {"reasoning", "reasoning_source"} <= set(pf.schema_arrow.names)
    rows = pf.read().to_pylist()
    assert all(r["reasoning_source"] == "template" and r["reasoning"] for r in rows)
    win = next(r for r in rows if r["success"])
    assert "reward is 1" in win["reasoning"] and "success" in win["reasoning"]
    move = next(r for r in rows if r["action"].startswith("move") and r["state"] != r["next_state"]
                and r["state"].startswith("You are in"))
    assert "takes the agent from the" in move["reasoning"]
    bad = toy_row("e", 0, HALL, "fly", HALL, 0.0, False, False)
    assert "not one of the valid actions" in template_rationale(bad)


def test_teacher_annotation_over_http_with_template_fallback(tmp_path: Path) -> None:
    rows = [toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True),
            toy_row("e0", 1, KITCHEN, "look", KITCHEN, 0.0, False, False)]
    src = write_toy(tmp_path / "toy.parquet", rows)

    def reply(body: dict[str, Any]) -> str:
        user = body["messages"][-1]["content"]
        assert "TRUE outcome" in user
        return "" if "Action: look" in user else "<think>The kitchen lies north, so going north reaches it.</think>"

    with ScriptedOpenAIServer(reply) as server:
        annotator = TeacherAnnotator(OpenAIClient(server.url))
        s = annotate_file(src, tmp_path / "out.parquet", annotator)
    assert (s["teacher"], s["template"]) == (1, 1) and annotator.fallbacks == 1
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert out[0]["reasoning"] == "The kitchen lies north, so going north reaches it."
    assert out[0]["reasoning_source"] == "teacher" and out[1]["reasoning_source"] == "template"


# ---------------------------------------------------------------------------------------------
# Evaluation and the copy baseline


def test_copy_baseline_and_a_copying_model_agree(coin: dict[str, Path]) -> None:
    opts = PromptOptions(top_k=2, history_steps=2)
    model = ExperienceModel(FunctionClient(_copy_top1), opts)
    r = evaluate(coin["test"], coin["train"], opts, model.predict, limit=60, batch_size=16)
    base, m = r["copy_baseline"], r["model"]
    assert r["data"]["evaluated"] == 60 and r["data"]["unseen"] <= 60
    assert base["reward_acc"] >= 0.95 and base["done_acc"] >= 0.95 and base["token_f1"] > 0.7
    for key in ("reward_acc", "done_acc", "success_acc", "exact", "token_f1", "reward_rate"):
        assert m[key] == base[key], key
    assert m["invalid_rate"] == 0.0 and m["transitions_per_s"] > 0
    # coin pays on one step of a successful episode: rare, and the copying model pays about as often
    assert 0 < base["true_reward_rate"] < 0.5 and abs(m["reward_rate"] - m["true_reward_rate"]) <= 0.05
    table = format_table(r)
    assert "copy_baseline" in table and "model" in table and "unseen (s,a)" in table
    assert len(table.splitlines()) <= 20
    assert token_f1("a b c", "a b d") == pytest.approx(2 / 3)


def test_fidelity_scores_the_first_reply_apart_from_the_rules(tmp_path: Path) -> None:
    """The first reply is what the model said (recorded while predicting); after the rules, retries and the reward
    rule fixed it and the admissible list settled the inadmissible action; the rules alone get only that one."""
    from dreamgym.experience.fidelity import rules_only

    failure = "Invalid action."  # the toy family's failure state
    store = write_toy(tmp_path / "store.parquet", [toy_row("s0", 0, HALL, "go north", KITCHEN, 1.0, True, True)])
    heldout = write_toy(tmp_path / "heldout.parquet", [
        toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True),  # seen (s, a)
        toy_row("e1", 0, HALL, "look", HALL, 0.0, False, False),  # unseen
        toy_row("e2", 0, HALL, "dance", failure, 0.0, False, False)])  # unseen, not in the admissible list
    unpaid_win = format_reply(KITCHEN, 1.0, False, False, "paid but not done: the outcome rule refuses it")
    replies = {"go north": [unpaid_win, VALID], "look": ["garbage", format_reply(HALL, 0.0, False, False, "x")],
               "dance": [VALID]}
    asked: dict[str, int] = {}

    def fn(messages: list[Message], s: Sampling) -> str:
        action = messages[-1]["content"].rsplit("Action: ", 1)[1].strip()
        asked[action] = asked.get(action, 0) + 1
        return replies[action][min(asked[action], len(replies[action])) - 1]

    opts = PromptOptions(top_k=1, history_steps=2)
    model = ExperienceModel(FunctionClient(fn), opts, inadmissible="model")
    r = evaluate(heldout, store, opts, model.predict, fidelity=True)
    f = r["fidelity"]
    assert asked == {"go north": 2, "look": 2, "dance": 1}  # every query went to the model, once per attempt
    assert (f["seen"]["copy_top1"]["n"], f["unseen"]["copy_top1"]["n"], f["all"]["rules_only"]["n"]) == (1, 2, 3)
    first, after, rules = f["all"]["model_first_reply"], f["all"]["model_after_rules"], f["all"]["rules_only"]
    # first replies: go north right state, wrong done; look unparsable; dance a made-up win
    assert (first["next_state_exact"], first["reward_acc"], first["done_acc"]) == (0.3333, 0.3333, 0.0)
    assert first["invalid_rate"] == 0.3333
    assert (after["next_state_exact"], after["reward_acc"], after["done_acc"], after["invalid_rate"]) == (1, 1, 1, 0)
    assert r["model"]["exact"] == 1.0  # the eval's model row is the outcome after the rules
    assert (f["ruled_out"]["rules_only"]["n"], f["admissible"]["rules_only"]["next_state_exact"]) == (1, 0.5)
    # rules alone: the settled dance, and "nothing changes" is right for look
    assert (rules["next_state_exact"], rules["reward_acc"], rules["done_acc"]) == (0.6667, 0.6667, 0.6667)
    assert rules_only(ExperienceQuery(TOY_ENV, "Go.", HALL, "look", admissible_actions=None)).next_state == HALL
    # A settling model has no first reply for the ruled-out step: refused with what to set.
    with pytest.raises(ValueError, match="inadmissible='model'"):
        evaluate(heldout, store, opts, ExperienceModel(FunctionClient(fn), opts).predict, fidelity=True)


def test_cli_annotate_and_eval_baseline(
    coin: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dreamgym.cli import main

    out = tmp_path / "ann.parquet"
    assert main(["annotate", "--data", str(coin["train"]), "--out", str(out), "--run.out_dir", str(tmp_path)]) == 0
    assert "by template" in capsys.readouterr().out
    assert main(["eval-experience-model", "--data", str(coin["test"]), "--store", str(out), "--model", "none",
                 "--limit", "40", "--out", str(tmp_path / "e.json"), "--run.out_dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "copy_baseline" in text and "next-state exact" in text and (tmp_path / "e.json").is_file()
    assert main(["eval-experience-model", "--run.out_dir", str(tmp_path)]) == 2
    assert "needs held-out transitions" in capsys.readouterr().err


def test_config_section_is_documented_and_validated() -> None:
    from dreamgym.config import explain, load_config
    from dreamgym.errors import ConfigError

    rows = [r for r in explain() if r[0].startswith("experience_model.")]
    assert len(rows) > 50 and all(desc for _, _, desc in rows)
    cfg = load_config(None, ["--experience_model.replicas", "2", "--experience_model.train.method", "lora"])
    assert cfg.experience_model.replicas == 2 and cfg.experience_model.train.method == "lora"
    for bad in (["--experience_model.reward_max", "-1"], ["--experience_model.backend", "grpc"],
                ["--experience_model.url", "localhost:8000"], ["--experience_model.max_attempts", "0"]):
        with pytest.raises(ConfigError):
            load_config(None, bad)


# ---------------------------------------------------------------------------------------------
# SFT (tiny random model, no engine): masking and the LoRA path


def test_sft_masks_the_prompt_and_lora_saves_a_merged_folder(tmp_path: Path) -> None:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.config import load_config
    from dreamgym.models import build_tiny_model
    from learner.sft_experience import batch_nll, build_examples, example_nll, train_experience_model

    rows = [toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True, "The agent goes north."),
            toy_row("e0", 1, KITCHEN, "look", KITCHEN, 0.0, False, False, None)]
    data = write_toy(tmp_path / "toy.parquet", rows)
    base = build_tiny_model(tmp_path / "base")
    cfg = load_config(None, {"experience_model": {"top_k": 1, "history_steps": 1, "train": {
        "data": str(data), "store": str(data), "base": str(base), "method": "lora", "lr": 5e-2, "lora_r": 8,
        "batch_size": 2, "epochs": 12, "threads": 1}}})
    tok = AutoTokenizer.from_pretrained(base)
    examples, counts = build_examples(data, tok, cfg.experience_model, store=data)
    assert counts["examples"] == 2 and counts["template_reasoning"] == 1
    ex = examples[1]
    assert tok.decode(ex.prompt_ids).endswith("<|im_start|>assistant\n")
    assert "Recent history" in tok.decode(ex.prompt_ids)  # step 1 carries step 0 as history
    assert tok.decode(ex.reasoning_ids).startswith("<think>")
    assert ex.outcome_ids[-1] == tok.eos_token_id and "<next_state>" in tok.decode(ex.outcome_ids)

    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        nll_r, nll_o = example_nll(model, ex)
        ids = torch.tensor(ex.prompt_ids + ex.reasoning_ids + ex.outcome_ids)
        full = F.cross_entropy(model(input_ids=ids[None]).logits[0, :-1], ids[1:], reduction="none")
    completion = full[len(ex.prompt_ids) - 1:]
    assert float(nll_r + nll_o) == pytest.approx(float(completion.sum()), rel=1e-5)  # prompt tokens masked
    assert float(nll_r) == pytest.approx(float(completion[: len(ex.reasoning_ids)].sum()), rel=1e-5)
    # Right-padded into one forward, examples of different lengths keep their own losses (padding masked).
    assert len(examples[0]) != len(examples[1])
    with torch.no_grad():
        both_r, both_o = batch_nll(model, examples, pad_id=tok.eos_token_id)
        for i, one in enumerate(examples):
            one_r, one_o = example_nll(model, one)
            assert float(both_r[i]) == pytest.approx(float(one_r), rel=1e-4)
            assert float(both_o[i]) == pytest.approx(float(one_o), rel=1e-4)

    s = train_experience_model(cfg, tmp_path / "lora")
    assert s["method"] == "lora" and s["loss_last"] < s["loss_first"]
    saved = {p.name for p in (tmp_path / "lora").iterdir()}
    assert "model.safetensors" in saved and not any("adapter" in n for n in saved)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "lora")
    assert set(merged.state_dict()) == set(model.state_dict())


def test_a_cuda_fine_tune_without_a_gpu_stops_at_once_with_what_to_set(tmp_path: Path) -> None:
    import torch

    from dreamgym.config import load_config
    from dreamgym.errors import DreamGymError
    from dreamgym.models import build_tiny_model
    from learner.sft_experience import train_experience_model

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/test_gpu_learner.py fine-tunes on it")
    data = write_toy(tmp_path / "toy.parquet", [toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True, "r")])
    cfg = load_config(None, {"experience_model": {"train": {
        "data": str(data), "base": str(build_tiny_model(tmp_path / "base")), "device": "cuda"}}})
    with pytest.raises(DreamGymError, match=r"experience_model\.train\.device cpu"):
        train_experience_model(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_step_batch_steps_many_synthetic_envs_with_one_model_call(tmp_path: Path) -> None:
    from dreamgym.experience.synthetic_env import step_batch

    rows = [toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True, "r"),
            toy_row("e1", 0, HALL, "look", HALL, 0.0, False, False, "r")]
    index = TransitionIndex.from_parquet(write_toy(tmp_path / "toy.parquet", rows))
    batches: list[int] = []

    class Counting(FunctionClient):
        def complete(self, requests):  # type: ignore[no-untyped-def]
            batches.append(len(requests))
            return super().complete(requests)

    model = ExperienceModel(Counting(_copy_top1), PromptOptions(top_k=1))
    envs = [synthetic_env_from_index(model, index, TOY_ENV) for _ in range(3)]
    for e in envs:
        e.reset(e.tasks(1)[0])
    results = step_batch(envs, ["go north", "look", "dance"])  # 'dance' is settled: no model call
    assert batches == [2]
    assert [r.success for r in results] == [True, False, False] and results[2].info["settled"]
    assert results[1].observation.state == HALL and not results[1].done


def test_sft_prompts_carry_the_demonstrations_the_served_model_sees(coin: dict[str, Path], tmp_path: Path) -> None:
    """SFT examples get the replay buffer's embedding top-k (what ``dreamgym train`` serves), with the example's
    own transition left out unless another episode also holds it."""
    from collections import defaultdict

    from dreamgym.config import ReplayConfig
    from dreamgym.data.transitions import iter_transitions
    from dreamgym.experience.evaluate import build_items
    from dreamgym.experience.prompts import PromptOptions
    from dreamgym.experience.retrieval import TransitionIndex
    from dreamgym.replay.buffer import ReplayBuffer
    from dreamgym.replay.records import point_id
    from learner.sft_experience import served_demonstrations

    store = list(iter_transitions(coin["train"]))[:150]
    items = build_items(store, TransitionIndex(store), PromptOptions(top_k=3))
    served_demonstrations(items, store, ReplayConfig(), 3)
    episodes_of: dict[str, set[str]] = defaultdict(set)
    for t in store:
        episodes_of[point_id(t)].add(t.episode_id)
    buf = ReplayBuffer.from_config(ReplayConfig(), root=tmp_path / "served")
    buf.add(store)
    left_out = 0
    for it in items[:40]:
        own = point_id(it.transition)
        alone = episodes_of[own] == {it.transition.episode_id}
        served = [d.id for d in buf.retrieve(it.transition.state, it.transition.action, 4)]
        assert [d.id for d in it.query.demonstrations] == [i for i in served if not (alone and i == own)][:3]
        left_out += alone and own in served
    buf.close()
    assert left_out > 0  # some examples would have found themselves at serving's top-k


def test_short_sft_samples_are_balanced_over_outcomes() -> None:
    """A few dozen examples of agent data still contain the rare rewarding, terminal steps."""
    import random

    from learner.sft_experience import SFTExample, balanced_sample

    outcomes = [(0.0, False, False)] * 88 + [(1.0, True, True)] * 10 + [(0.0, True, False)] * 2
    examples = [SFTExample([i], [], [i]) for i in range(len(outcomes))]
    picked = balanced_sample(examples, outcomes, 12, random.Random(0))
    by_id = {ex.prompt_ids[0]: o for ex, o in zip(examples, outcomes, strict=True)}
    got = [by_id[ex.prompt_ids[0]] for ex in picked]
    assert len({ex.prompt_ids[0] for ex in picked}) == 12
    assert got.count((1.0, True, True)) == 5 and got.count((0.0, True, False)) == 2
    assert balanced_sample(examples, outcomes, 12, random.Random(0)) == picked


def test_cited_rationales_name_the_demonstration_the_prompt_shows(coin: dict[str, Path], tmp_path: Path) -> None:
    """With ``cite_demonstrations`` a template rationale (here written by ``annotate_file``, as ``dreamgym train``
    does) opens with the prompt's first demonstration of the same action and what it paid; the rewarding steps of
    real coin data cite a rewarding ``take coin``. A teacher's reasoning is kept as written."""
    from transformers import AutoTokenizer

    from dreamgym.config import load_config
    from dreamgym.models import build_tiny_model
    from learner.sft_experience import build_examples

    base = build_tiny_model(tmp_path / "base")
    tok = AutoTokenizer.from_pretrained(base)
    cfg = load_config(None, {"experience_model": {"top_k": 2, "train": {  # cite_demonstrations: the default
        "base": str(base), "retrieval": "overlap", "max_seq_len": 4096}}})
    annotated = tmp_path / "annotated.parquet"
    annotate_file(coin["train"], annotated, TemplateAnnotator(step_budget=20))
    examples, _ = build_examples(annotated, tok, cfg.experience_model)
    cited = wins = 0
    for ex in examples:
        prompt, why = tok.decode(ex.prompt_ids), tok.decode(ex.reasoning_ids)
        action = re.search(r"\nAction: (.*)\n*<\|im_end\|>", prompt).group(1)  # the query's action, last
        shown = re.findall(r"\[(\d)\] State: .*?\nAction: (.*?)\n.*?Reward: (\S+) Done: \S+ Success: (\S+)",
                            prompt, re.S)
        same = [(i, r, s) for i, a, r, s in shown if a == action]
        if not same:
            assert why.startswith("<think>No demonstration shows")
            continue
        i, r, s = same[0]
        cited += 1
        assert why.startswith(f"<think>Demonstration [{i}] shows the same action, '{action}'")
        assert f"it paid reward {r}" in why and (", ending the episode with success" in why) == (s == "true")
        paid = re.search(r"<reward>(\S+)</reward>", tok.decode(ex.outcome_ids)).group(1)
        assert ("The same holds here." in why) == (paid == r and f"<success>{s}</success>" in tok.decode(
            ex.outcome_ids))
        wins += action == "take coin" and paid == "1"
    assert cited > len(examples) // 2 and wins > 0
    off = load_config(None, {"experience_model": {"top_k": 2, "train": {
        "base": str(base), "retrieval": "overlap", "max_seq_len": 4096, "cite_demonstrations": False}}})
    plain, _ = build_examples(coin["train"], tok, off.experience_model)
    assert not any("Demonstration [" in tok.decode(ex.reasoning_ids) for ex in plain)
    taught = [toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True, "The teacher's words."),
              toy_row("e1", 0, HALL, "go north", KITCHEN, 1.0, True, True)]
    teacher, _ = build_examples(write_toy(tmp_path / "taught.parquet", taught), tok, cfg.experience_model)
    assert sorted(tok.decode(ex.reasoning_ids) for ex in teacher)[1] == "<think>The teacher's words.</think>\n"
