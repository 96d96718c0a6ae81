"""``remote:<dialect>`` against real AgentGym environment servers (TextCraft, ScienceWorld, BabyAI), each started
on a free loopback port by ``agentgym_servers`` and stopped by its pid. Skipped, with the reason, where the
servers are not available (``DREAMGYM_AGENTGYM_DIR``, see ``tests/agentgym_servers.py``)."""

from __future__ import annotations

import gc
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from agentgym_servers import AgentGymServer, skip_reason, start_server

from dreamgym.collect import collect_range
from dreamgym.config import EnvConfig, load_config
from dreamgym.curriculum.build import seed_tasks
from dreamgym.envs.registry import make_env
from dreamgym.envs.remote import RemoteEnv
from dreamgym.envs.remote_dialects import DIALECTS, TEXTCRAFT_GOALS
from dreamgym.errors import EnvironmentSpecError, EnvironmentUnavailableError, RemoteEnvironmentError
from dreamgym.policies import make_policy
from dreamgym.rollout import random_valid_act
from dreamgym.types import AgentTurn


@pytest.fixture(scope="module")
def textcraft(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentGymServer]:
    server = start_server("textcraft", tmp_path_factory.mktemp("textcraft"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def textcraft_available() -> None:
    """Skips before a Ray cluster is started for nothing (session fixtures come first, in argument order)."""
    reason = skip_reason("textcraft")
    if reason:
        pytest.skip(reason)


@pytest.fixture
def fresh_textcraft(tmp_path: Path) -> Iterator[AgentGymServer]:
    """A TextCraft server of this test alone (restarted, or counted from a known state)."""
    server = start_server("textcraft", tmp_path)
    yield server
    server.stop()


def textcraft_env(url: str, **kw) -> RemoteEnv:
    return RemoteEnv("textcraft", url, max_steps=kw.pop("max_steps", 30), **kw)


# -- valid actions, expert plan, collection (issue items 1 and 7) --------------------------------------------


def test_textcraft_reveals_valid_actions_and_an_expert_plan(textcraft: AgentGymServer) -> None:
    env = textcraft_env(textcraft.url)
    wins = 0
    for task in env.tasks(12, split="train"):
        obs = env.reset(task)
        actions = obs.admissible_actions
        assert actions and actions[0] == "inventory"
        assert obs.instruction.startswith("craft ") and "Goal:" not in obs.instruction
        assert any(a.startswith("craft ") for a in actions) and any(a.startswith("get ") for a in actions)
        plan = env.gold_actions()
        assert plan and set(plan) <= set(actions)
        for action in plan:
            result = env.step(action)
            # Every step of the plan is a command the server understands (it answers "Could not execute X"
            # to anything else) and finds the items for.
            assert not result.observation.text.startswith("Could not"), (action, result.observation.text)
            if result.done:
                break
        wins += result.success and result.reward == 1.0
        assert env.admissible_actions() is None  # the episode is over
    assert wins == 12
    env.close()


def test_random_baseline_sends_only_valid_actions(textcraft: AgentGymServer) -> None:
    """The random-valid-action baseline used to send ``look around`` (TextCraft answers "Could not execute")."""
    env = textcraft_env(textcraft.url, max_steps=15)
    act = random_valid_act(seed=3)
    replies = []
    for task in env.tasks(4, first=20, split="test"):
        obs = env.reset(task)
        while True:
            sample = act([AgentTurn(task=task, observation=obs, history=[])])[0]
            assert sample.action in obs.admissible_actions
            result = env.step(sample.action)
            replies.append(result.observation.text)
            obs = result.observation
            if result.done:
                break
    assert not [r for r in replies if r.startswith("Could not execute")]
    env.close()


@pytest.mark.parametrize("policy", ["random", "gold", "mixed"])
def test_collect_policies_against_textcraft(textcraft: AgentGymServer, policy: str) -> None:
    """``dreamgym collect``'s episode loop: random and mixed used to stop ("needs the environment's admissible
    actions"), gold had no expert plan."""
    env = textcraft_env(textcraft.url, max_steps=20)
    transitions, stats = collect_range(env, make_policy(policy, 0.5), 0, 6, "train", 0, f"t/{policy}")
    assert stats.episodes == 6 and transitions
    assert all(t.action in t.admissible_actions for t in transitions)
    if policy == "gold":
        assert stats.successes == 6
    env.close()


def test_mixed_policy_plays_randomly_where_there_is_no_plan(textcraft: AgentGymServer) -> None:
    class NoPlan(RemoteEnv):
        def gold_actions(self) -> list[str] | None:
            return None

    env = NoPlan("textcraft", textcraft.url, max_steps=5)
    _, stats = collect_range(env, make_policy("mixed", 1.0), 0, 2, "train", 0, "t")
    assert stats.episodes == 2
    with pytest.raises(EnvironmentSpecError, match="no expert plan"):
        collect_range(env, make_policy("gold"), 0, 1, "train", 0, "t")
    env.close()


# -- splits (issue item 5) ------------------------------------------------------------------------------------


def test_every_dialect_has_disjoint_train_and_test_tasks() -> None:
    for name, dialect in DIALECTS.items():
        if name == "dreamgym":  # its server splits its own tasks (tests/test_remote_env.py)
            continue
        assert {"train", "test"} <= set(dialect.splits), name
        seen: dict[str, set[int]] = {}
        for split, rule in dialect.splits.items():
            size = rule.size()
            n = 3000 if size is None else size
            indices = rule.indices(0, n)
            assert len(set(indices)) == n, (name, split)
            if size is not None and n:
                assert max(indices) < rule.stop  # an index past the end would wrap around to another split's task
            seen[split] = set(indices)
        splits = list(seen)
        for i, a in enumerate(splits):
            for b in splits[i + 1:]:
                assert not seen[a] & seen[b], (name, a, b)
    assert DIALECTS["textcraft"].splits["test"].size() + DIALECTS["textcraft"].splits["train"].size() == TEXTCRAFT_GOALS


def test_evaluation_tasks_never_overlap_training_tasks(textcraft: AgentGymServer) -> None:
    """``remote:textcraft/0`` used to be trained on and evaluated. Training tasks are the curriculum's seed tasks
    (``env.split``), held-out ones what ``train.eval`` asks the environment for (``actors/driver.py``)."""
    cfg = load_config(None, ["--env.name", "remote:textcraft", "--env.url", textcraft.url,
                             "--curriculum.seed_tasks", "400", "--train.eval.tasks", "100"])
    env = make_env(cfg.env)
    train = {t.params["index"] for t in seed_tasks(cfg, env)}
    ev = cfg.train.eval
    held_out = {t.params["index"] for t in env.tasks(ev.tasks, first=ev.first_seed, split=ev.split)}
    assert len(train) == 400 and len(held_out) == 100 and not train & held_out
    # Asking past the end of a split is refused (TextCraft wraps indices past its 544 goals around).
    with pytest.raises(EnvironmentSpecError, match="split 'test' holds 109 tasks"):
        env.tasks(110, split="test")
    env.close()


# -- dialect check (issue item 4) ------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["alfworld", "sciworld", "babyai", "webshop", "dreamgym"])
def test_a_wrong_dialect_is_refused_on_connect(textcraft: AgentGymServer, dialect: str) -> None:
    """``remote:alfworld`` against TextCraft used to reset every task to task 0 without a word."""
    with pytest.raises(RemoteEnvironmentError, match=r"remote:textcraft|dreamgym serve-env"):
        RemoteEnv(dialect, textcraft.url)
    # A server that names itself wrongly can still be used, on purpose.
    if dialect != "dreamgym":
        RemoteEnv(dialect, textcraft.url, params={"dialect_check": False}).close()


# -- environments closed on every path (issue item 2) ----------------------------------------------------------


def test_server_side_environments_are_closed_on_every_path(fresh_textcraft: AgentGymServer) -> None:
    server = fresh_textcraft
    task = textcraft_env(server.url).tasks(1)[0]
    assert server.live_envs() == []
    # Normal end.
    env = textcraft_env(server.url)
    env.reset(task)
    assert len(server.live_envs()) == 1
    env.close()
    assert server.live_envs() == []
    # Dropped without close(): the finalizer closes it.
    env = textcraft_env(server.url)
    env.reset(task)
    del env
    gc.collect()
    assert server.live_envs() == []
    # A process that exits without close().
    code = textwrap.dedent(f"""
        from dreamgym.envs.remote import RemoteEnv
        env = RemoteEnv("textcraft", {server.url!r})
        env.reset(env.tasks(1)[0])
        print("reset", env._env_id)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "reset" in out.stdout, out.stderr
    assert server.live_envs() == []
    # A failed episode: the policy stops after the reset (no valid actions asked for), the client closes.
    env = textcraft_env(server.url, admissible_actions=False)
    with pytest.raises(EnvironmentSpecError, match="admissible actions"):
        collect_range(env, make_policy("random"), 0, 1, "train", 0, "t")
    env.close()
    assert server.live_envs() == []


def test_collect_and_train_actors_close_their_environments(textcraft_available, ray_cluster,
                                                           fresh_textcraft: AgentGymServer, tmp_path: Path) -> None:
    """Collect workers and train's actors used to be ``ray.kill``ed without ``close``: one leaked server-side
    environment per actor (a JVM each on ScienceWorld)."""
    from actors.collect import CollectWorker, run_collect
    from actors.train_setup import Actors

    server = fresh_textcraft
    base = ["--run.out_dir", str(tmp_path / "runs"), "--env.name", "remote:textcraft", "--env.url", server.url,
            "--env.max_steps", "8", "--collect.workers", "2", "--collect.episodes_per_batch", "2"]
    s = run_collect(load_config(None, [*base, "--collect.episodes", "4", "--collect.policy", "mixed"]),
                    progress=False)
    assert s["episodes"] == 4
    assert server.live_envs() == []
    # A collection that fails in its workers.
    with pytest.raises(EnvironmentSpecError, match="admissible actions"):
        run_collect(load_config(None, [*base, "--collect.episodes", "4", "--env.admissible_actions", "false"]),
                    progress=False)
    assert server.live_envs() == []
    # The shutdown of a training run's actors.
    cfg = EnvConfig(name="remote:textcraft", url=server.url, max_steps=4)
    worker = CollectWorker.remote(cfg.model_dump(mode="json"), "random", 0.5, 0, "t")
    ray_cluster.get(worker.run.remote(0, 1))
    assert len(server.live_envs()) == 1
    Actors(workers=[worker]).shutdown()
    assert server.live_envs() == []


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.engine
@pytest.mark.timeout(1200)
def test_train_against_textcraft_then_a_dead_server_in_one_line(textcraft_available, ray_cluster,
                                                                 fresh_textcraft: AgentGymServer,
                                                                 tmp_path: Path) -> None:
    """A real ``dreamgym train --train.mode real`` (joining the session's Ray, as on a cluster) against TextCraft:
    a mixed collection first (its valid actions and expert plan come from the goal text), the held-out evaluation
    with its baseline, then real iterations. Once the first iteration is recorded the server is stopped: ``train``
    used to print Ray's whole remote traceback when the server died mid-run (``collect`` did not); the run ends with
    exit code 2 and one line naming the server. (That a finished run leaves no server-side environment behind is
    shown on ScienceWorld, ``test_real_mode_train_against_a_server``.)"""
    import json
    import time

    import yaml
    from test_train import tiny_config

    server = fresh_textcraft
    cfg = tiny_config(tmp_path / "runs", env={"name": "remote:textcraft", "url": server.url, "max_steps": 4},
                      collect={"episodes": 6, "workers": 1, "episodes_per_batch": 3},
                      curriculum={"seed_tasks": 2, "llm_variants": 0, "param_variants": 0},
                      ray={"address": ray_cluster.get_runtime_context().gcs_address},
                      train={"mode": "real", "iterations": 6, "warm_start": {"method": "none"},
                             "eval": {"tasks": 2}, "rollout": {"envs_per_worker": 3},
                             "report": {"progress": False, "markdown": False}})
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([str(Path(sys.executable).parent / "dreamgym"), "train", str(tmp_path / "train.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def records() -> list[dict]:
        metrics = list((tmp_path / "runs").glob("t-train-*/metrics.jsonl"))
        return [json.loads(x) for x in metrics[0].read_text().splitlines() if x.strip()] if metrics else []

    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if any(r.get("event") == "iteration" for r in records()):
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        server.stop()
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [x for x in err.strip().splitlines() if "Token authentication" not in x]
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith("dreamgym train: error: cannot reach the environment server for remote:textcraft")
    # Before the server died: the collected offline data, the evaluation beside its baseline, a real iteration.
    recs = records()
    assert next(r for r in recs if r["event"] == "replay_seed")["rows"] > 0
    start = next(r for r in recs if r["event"] == "eval")
    assert start["label"] == "start" and start["baseline_success_rate"] is not None
    assert next(r for r in recs if r["event"] == "iteration")["real_transitions"] > 0


# -- a restarted server (issue item 3) --------------------------------------------------------------------------


def test_a_restarted_server_never_gets_a_stale_id(fresh_textcraft: AgentGymServer) -> None:
    server = fresh_textcraft
    first, other = textcraft_env(server.url).tasks(2)
    bystander = textcraft_env(server.url)
    bystander.reset(first)  # id 0
    client = textcraft_env(server.url)
    client.reset(first)  # id 1
    assert client._env_id == 1
    bystander.close()
    server.restart()  # the new server knows no environment and hands out ids from 0 again

    # Idle through the restart: the next reset is answered "The id 1 is not valid": a new environment is made.
    obs = client.reset(other)
    assert obs.instruction and client._env_id == 0
    assert server.live_envs() == [0]

    # A server that goes away mid-episode: the step fails, and the id is forgotten.
    server.stop()
    with pytest.raises(EnvironmentUnavailableError, match="cannot reach"):
        client.step("inventory")
    server.start()
    # Meanwhile another client got ids 0 and 1 of the new server; the old client must take neither.
    others = [textcraft_env(server.url) for _ in range(2)]
    for env in others:
        env.reset(other)
    assert [e._env_id for e in others] == [0, 1]
    before = requests.get(server.url + "/observation", params={"id": 0}, timeout=10).json()
    client.reset(first)
    assert client._env_id == 2
    assert requests.get(server.url + "/observation", params={"id": 0}, timeout=10).json() == before
    client.close()  # closes its own environment only
    assert server.live_envs() == [0, 1]
    for env in others:
        env.close()
    assert server.live_envs() == []

    # Idle through a restart after which its id was handed out again before its next request: the server's
    # last observation for the id is not the client's, so the id is left to its new owner.
    client.reset(first)
    stale = client._env_id
    server.restart()
    newcomers = [textcraft_env(server.url) for _ in range(stale + 1)]
    for env in newcomers:
        env.reset(other)
    before = requests.get(server.url + "/observation", params={"id": stale}, timeout=10).json()
    client.reset(first)
    assert client._env_id == stale + 1
    assert requests.get(server.url + "/observation", params={"id": stale}, timeout=10).json() == before
    for env in [client, *newcomers]:
        env.close()
    assert server.live_envs() == []


# -- ScienceWorld: reward convention and JVMs (issue items 6 and 2) -----------------------------------------


def test_sciworld_rewards_match_the_local_adapter_and_jvms_are_closed(tmp_path: Path) -> None:
    server = start_server("sciworld", tmp_path)
    try:
        jvms = server.java_processes()
        env = RemoteEnv("sciworld", server.url, max_steps=10)
        task = env.tasks(1, split="test")[0]  # index 0: boil, variation 0
        obs = env.reset(task)
        assert obs.instruction.startswith("Your task is to boil")
        assert server.java_processes(expect=jvms + 1) == jvms + 1
        failed = env.step("focus on agent")  # focusing on the wrong thing fails the task: score -100
        assert failed.done and not failed.success
        assert failed.info["score"] == -100 and failed.info["task_failure"] is True
        assert failed.reward == 0.0  # the local adapter's convention: failure counts 0 (it was -1.0)
        held = env._env_id
        env.reset(env.tasks(1, first=1, split="test")[0])  # a finished episode's environment is still ours
        assert env._env_id == held and server.java_processes(expect=jvms + 1) == jvms + 1
        env.close()
        assert server.java_processes(expect=jvms) == jvms
    finally:
        server.stop()
    local = make_env(EnvConfig(name="sciworld:boil", admissible_actions=False, max_steps=10))
    try:
        local.reset(local.tasks(1)[0])
        result = local.step("focus on agent")
        assert (result.reward, result.done, result.success) == (failed.reward, failed.done, failed.success)
        assert result.info["task_failure"] == failed.info["task_failure"]
    finally:
        local.close()


# -- BabyAI (issue item 9) -----------------------------------------------------------------------------------


def test_babyai_dialect(tmp_path: Path) -> None:
    server = start_server("babyai", tmp_path)
    try:
        env = RemoteEnv("babyai", server.url, max_steps=20)
        assert [t.params["index"] for t in env.tasks(2, split="test")] == [0, 1]
        assert env.tasks(1, split="train")[0].params["index"] == 40
        obs = env.reset(env.tasks(1, split="test")[0])  # level 1 (GoToRedBallGrey), seed 0
        assert obs.instruction == "go to the red ball"
        assert obs.admissible_actions and "turn left" in obs.admissible_actions
        assert "check available actions" not in obs.admissible_actions
        assert "Available actions" not in obs.state and "Your goal" not in obs.state
        rng, total = random.Random(0), 0.0
        while True:
            goto = [a for a in obs.admissible_actions if a.startswith("go to red ball")]
            result = env.step(goto[0] if goto else rng.choice(obs.admissible_actions))
            assert "not recognized" not in result.observation.text
            total += result.reward
            obs = result.observation
            if result.done:
                break
        assert result.success and 0.5 < total <= 1.0 and result.reward == total
        held = env._env_id
        env.reset(env.tasks(1, first=1, split="test")[0])  # a finished episode's environment is still ours
        assert env._env_id == held and server.live_envs() == [held]
        env.close()
        assert server.live_envs() == []
        with pytest.raises(RemoteEnvironmentError, match="remote:babyai"):
            RemoteEnv("textcraft", server.url)
    finally:
        server.stop()


# -- real-mode training against the servers (issue items 1 and 2, end to end) -----------------------------------


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(1800)
def test_real_mode_train_against_a_server(ray_cluster, tmp_path: Path) -> None:
    """``dreamgym train --train.mode real`` for an iteration against a real AgentGym server, ScienceWorld, with no
    offline data at all (``collect.episodes 0``: it reveals no valid actions, so there is nothing to collect).
    Afterwards no server-side environment and no ScienceWorld JVM is left. (TextCraft, with a collection first:
    ``test_train_against_textcraft_then_a_dead_server_in_one_line``.)"""
    from test_train import tiny_config

    from actors.driver import run_train
    from dreamgym.config import validate_config

    (tmp_path / "server").mkdir()
    server = start_server("sciworld", tmp_path / "server")
    try:
        jvms = server.java_processes()
        cfg = validate_config(tiny_config(
            tmp_path, env={"name": "remote:sciworld", "url": server.url, "max_steps": 4},
            collect={"episodes": 0},
            curriculum={"seed_tasks": 2, "llm_variants": 0, "param_variants": 0},
            train={"mode": "real", "iterations": 1, "warm_start": {"method": "none"},
                   "eval": {"tasks": 1}, "rollout": {"envs_per_worker": 3}}))
        s = run_train(cfg)
        assert s["iterations"] == 1 and s["real_transitions"] > 0 and s["synthetic_transitions"] == 0
        assert s["offline_transitions"] == 0
        assert s["success_start"] is not None and s["baseline_success"] is not None
        assert server.live_envs() == []
        assert server.java_processes(expect=jvms) == jvms
    finally:
        server.stop()
