"""`dreamgym serve-synthetic`: the synthetic environment served over HTTP, driven by the project's own AgentGym
client (``RemoteEnv``, ``remote:dreamgym``), by raw requests and, under ``/openenv``, by OpenEnv's own client
(``GenericEnvClient``).

Real components throughout: real twx:coin transitions collected here (TextWorldExpress), the real
``SyntheticEnv`` / ``ExperienceModel`` on the ``copy`` backend, the real server in a subprocess on loopback with a
token. Every served trajectory is checked against the same ``SyntheticEnv`` built in this process and played with
the same actions: the server adds transport, never a different simulator, and never crosses sessions."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from experience_data import collect_coin
from fastapi.testclient import TestClient
from openenv.core import GenericEnvClient
from test_remote_env import DREAMGYM, HOST, free_port, stop_server

from dreamgym.cli import main
from dreamgym.config import DreamGymConfig, validate_config
from dreamgym.envs.remote import RemoteEnv
from dreamgym.envs.server import Limits
from dreamgym.experience.serve import build_synthetic_app, open_synthetic
from dreamgym.types import Task

TOKEN = "serve-synthetic-token-51c2"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def synthetic_config(data: Path, **sections: Any) -> DreamGymConfig:
    """The server's config: twx:coin imitated by the copy backend over ``data``, 8-step episodes."""
    return validate_config({"env": {"name": "twx:coin", "max_steps": 8}, "train": {"offline_data": str(data)},
                            "experience_model": {"backend": "copy", "top_k": 3}, **sections})


@pytest.fixture(scope="module")
def coin_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return collect_coin(tmp_path_factory.mktemp("coin") / "train.parquet", "train", 24)


def start_synthetic(data: Path, log: Path, *extra: str, token: str | None = TOKEN) -> tuple[subprocess.Popen, str]:
    """`dreamgym serve-synthetic` with the copy backend in a subprocess (``token`` from its environment); waits
    until it serves and returns it with its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DREAMGYM_SECRETS_FILE", "DREAMGYM_SERVE_ENV_TOKEN")}
    if token:
        env["DREAMGYM_SERVE_ENV_TOKEN"] = token
    with log.open("w") as out:
        proc = subprocess.Popen([str(DREAMGYM), "serve-synthetic", "--env", "twx:coin", "--offline-data", str(data),
                                 "--backend", "copy", "--experience_model.top_k", "3", "--env.max_steps", "8",
                                 "--port", str(port), *extra],
                                stdout=out, stderr=subprocess.STDOUT, cwd=log.parent, env=env)
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 90
    while f"serving synthetic:twx:coin on {url}, {'token required' if token else 'no token'}" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            pytest.fail(f"serve-synthetic did not start:\n{log.read_text()}")
        time.sleep(0.2)
    return proc, url


@pytest.fixture(scope="module")
def served(coin_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_synthetic(coin_data, tmp_path_factory.mktemp("serve-synthetic") / "server.log")
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def local(coin_data: Path) -> Iterator[Any]:
    """The same synthetic environment in this process: the reference every served trajectory must equal."""
    parts = open_synthetic(synthetic_config(coin_data))
    yield parts
    parts.close()


def play(env: Any, task: Task, actions: list[str]) -> list[tuple[Any, ...]]:
    """Reset ``task`` and take ``actions`` (until done): what a step changed, in a form both envs share."""
    obs = env.reset(task)
    out: list[tuple[Any, ...]] = [("reset", obs.state, tuple(obs.admissible_actions or ()))]
    for a in actions:
        r = env.step(a)
        out.append((a, r.observation.state, r.reward, r.done, r.success, r.info["valid"], r.info["settled"],
                    tuple(r.info["demonstration_ids"]), tuple(r.info["demonstration_scores"]),
                    tuple(r.observation.admissible_actions or ())))
        if r.done:
            break
    return out


Trace = tuple[list[tuple[Any, ...]], list[str]]


def assert_sessions_match_in_process(session: Callable[[int], Trace], tasks: list[Task], local: Any,
                                     coin_data: Path) -> None:
    """Run ``session(i)`` for every task at once; each served trajectory must equal the in-process environment's
    for the same actions (no crossed state), and the sessions must not all start from one state."""
    with ThreadPoolExecutor(len(tasks)) as pool:
        results = list(pool.map(session, range(len(tasks))))
    cfg = synthetic_config(coin_data)
    for task, (trace, actions) in zip(tasks, results, strict=True):
        assert trace == play(local.make(cfg), task, actions), task.task_id
    assert len({trace[0][1] for trace, _ in results}) > 1, "the sessions started from different states"


def winning_episode(data: Path) -> tuple[str, list[str]]:
    """A successful real episode of the data: its task id and its actions."""
    from dreamgym.data.transitions import iter_transitions

    episodes: dict[str, list[Any]] = {}
    for t in iter_transitions(data):
        episodes.setdefault(t.episode_id, []).append(t)
    for steps in episodes.values():
        if steps[-1].success:
            return steps[0].task_id, [t.action for t in sorted(steps, key=lambda t: t.step)]
    raise AssertionError("the collected data has no successful episode")


def test_agentgym_protocol_with_the_copy_backend(served: str, local: Any, coin_data: Path) -> None:
    """``RemoteEnv`` reads tasks, plays a winning real episode to its end and an inadmissible action; every reply
    equals the in-process environment's, and the step info and ``/metrics`` say what the simulator did."""
    remote = RemoteEnv("dreamgym", served, timeout_s=30, token=TOKEN)
    try:
        assert remote.server_info["synthetic"] == {"imitates": "twx:coin", "backend": "copy", "model": "copy-top-1",
                                                   "transitions": local.index.size, "tasks": len(local.index.tasks()),
                                                   "top_k": 3, "model_timeout_s": 600.0}
        tasks = remote.tasks(100)
        assert [t.task_id for t in tasks] == [t.task_id for t in local.index.tasks()]
        task_id, actions = winning_episode(coin_data)
        task = next(t for t in tasks if t.task_id == task_id)
        here = local.make(synthetic_config(coin_data))
        served_steps = play(remote, task, actions)
        assert served_steps == play(here, next(t for t in local.index.tasks() if t.task_id == task_id), actions)
        last = served_steps[-1]
        assert last[2] == 1.0 and last[3] and last[4], "the copied real episode wins the coin"
        # one step in detail: the reasoning, the retrieved evidence, no rule, no retry
        remote.reset(task)
        settled = remote.step("fly to the moon")  # no real state accepts it: a rule settles it, no model call
        assert settled.info["settled"] and settled.reward == 0.0 and not settled.done and settled.info["attempts"] == 0
        r = remote.step(actions[0])
        assert r.info["reasoning"].startswith("Copied from the most similar stored transition")
        assert len(r.info["demonstration_ids"]) == 3 and r.info["retries"] == 0 and not r.info["settled"]
        assert r.info["demonstration_scores"] == sorted(r.info["demonstration_scores"], reverse=True)
    finally:
        remote.close()
    m = requests.get(served + "/metrics", headers=AUTH, timeout=30).json()
    assert m["steps"] >= len(actions) + 2 and m["reward_paid"] >= 1.0 and m["successes"] >= 1
    assert m["rule_settled"] >= 1 and 0 < m["rule_settled_share"] < 1 and m["invalid_transitions"] == 0
    assert m["latency_s"]["p50"] > 0 and m["latency_s"]["max"] >= m["latency_s"]["p95"] >= m["latency_s"]["p50"]
    assert m["model"]["model_calls"] >= len(actions) + 1 and m["model"]["settled"] >= 1 and m["model"]["reasons"] == {}
    assert m["sessions"]["live"] == 0 and m["sessions"]["max"] == 256


def test_sixteen_concurrent_sessions_never_cross(served: str, local: Any, coin_data: Path) -> None:
    """16 clients play at once (a barrier lines up their steps), each its own task and its own random actions from
    the valid lists it is shown; each session's trajectory equals the in-process environment's for its actions."""
    tasks = local.index.tasks()[:16]
    assert len(tasks) == 16
    gate = threading.Barrier(16, timeout=60)

    def session(i: int) -> tuple[list[tuple[Any, ...]], list[str]]:
        rng = random.Random(i)
        env = RemoteEnv("dreamgym", served, timeout_s=60, token=TOKEN)
        try:
            gate.wait()
            obs = env.reset(tasks[i])
            trace: list[tuple[Any, ...]] = [("reset", obs.state, tuple(obs.admissible_actions or ()))]
            actions: list[str] = []
            valid = obs.admissible_actions or ["look around"]
            for _ in range(6):
                actions.append(rng.choice(valid))
                r = env.step(actions[-1])
                trace.append((actions[-1], r.observation.state, r.reward, r.done, r.success, r.info["valid"],
                              r.info["settled"], tuple(r.info["demonstration_ids"]),
                              tuple(r.info["demonstration_scores"]), tuple(r.observation.admissible_actions or ())))
                if r.done:
                    break
                valid = r.observation.admissible_actions or valid
            return trace, actions
        finally:
            env.close()

    assert_sessions_match_in_process(session, tasks, local, coin_data)
    assert requests.get(served + "/list_envs", headers=AUTH, timeout=30).json() == []


def test_bad_requests_get_one_clear_error_each(served: str) -> None:
    assert requests.get(served + "/metrics", timeout=30).status_code == 401  # the token guards every endpoint
    env_id = requests.post(served + "/create", headers=AUTH, timeout=30).json()["id"]
    try:
        r = requests.post(served + "/step", headers=AUTH, json={"id": env_id, "action": "x" * 70_000}, timeout=30)
        assert r.status_code == 413 and "over this server's limit of 65536 bytes" in r.json()["error"]
        r = requests.post(served + "/step", headers=AUTH, json={"id": env_id, "action": "x" * 3_000}, timeout=30)
        assert r.status_code == 422 and "action: String should have at most 2000 characters" in r.json()["error"]
        r = requests.post(served + "/step", headers=AUTH, json={"id": env_id, "action": "look around"}, timeout=30)
        assert r.status_code == 409 and "POST /reset first" in r.json()["error"]
        bad = {"task_id": "twx:coin/nope", "env": "twx:coin", "instruction": "x", "params": {}}
        r = requests.post(served + "/reset", headers=AUTH, json={"id": env_id, "task": bad}, timeout=30)
        assert r.status_code == 400 and "no initial state for task 'twx:coin/nope'" in r.json()["error"]
        r = requests.post(served + "/reset", headers=AUTH, json={"id": env_id, "data_idx": 10_000}, timeout=30)
        assert r.status_code == 400 and "data_idx=10000 is past the server's last task" in r.json()["error"]
    finally:
        requests.post(served + "/close", headers=AUTH, json={"id": env_id}, timeout=30)
    r = requests.post(served + "/step", headers=AUTH, json={"id": env_id, "action": "look around"}, timeout=30)
    assert r.status_code == 404 and f"unknown environment id {env_id}" in r.json()["error"]


def test_idle_sessions_are_closed_and_the_session_limit_holds(coin_data: Path) -> None:
    """In process (the app itself, no network): a session idle past the timeout is closed and says so; the 3rd
    session of a 2-session server is refused until one closes, over AgentGym's ``/create`` (429) and OpenEnv's
    WebSocket (its capacity error, with the pool's own text)."""
    app = build_synthetic_app(synthetic_config(coin_data), limits=Limits(max_envs=2, session_timeout_s=0.3))
    with TestClient(app) as client:
        a = client.post("/create").json()["id"]
        task = client.get("/tasks", params={"count": 1}).json()[0]
        assert client.post("/reset", json={"id": a, "task": task}).status_code == 200
        b = client.post("/create").json()["id"]
        r = client.post("/create")
        assert r.status_code == 429 and "holds 2 environments already" in r.json()["error"]
        with client.websocket_connect("/openenv/ws") as ws:  # OpenEnv's session on the same full pool
            error = ws.receive_json()["data"]
        assert error["code"] == "CAPACITY_REACHED" and "holds 2 environments already" in error["message"], error
        time.sleep(0.5)
        r = client.post("/step", json={"id": a, "action": "look around"})
        assert r.status_code == 404
        assert f"unknown environment id {a}: it was closed after" in r.json()["error"], r.json()
        assert client.get("/metrics").json()["sessions"]["expired"] == 2 and b not in client.get("/list_envs").json()
        assert client.post("/create").status_code == 200  # room again


def test_eval_experience_model_scores_the_served_simulator(served: str, coin_data: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``eval-experience-model --simulator URL``: held-out real transitions (the test split) scored against the
    served copy-top-1 simulator and the copy baseline over the same store: the two must agree on every metric
    (the server retrieves from its own copy of the store, the baseline from the eval's)."""
    import json

    heldout = collect_coin(tmp_path / "test.parquet", "test", 6)
    monkeypatch.setenv("DREAMGYM_ENV_TOKEN", TOKEN)
    out = tmp_path / "eval.json"
    assert main(["eval-experience-model", "--data", str(heldout), "--store", str(coin_data), "--simulator", served,
                 "--out", str(out), "--run.out_dir", str(tmp_path / "runs")]) == 0
    result = json.loads(out.read_text())
    model, base = result["model"], result["copy_baseline"]
    assert model["n"] == base["n"] == result["data"]["evaluated"] > 10 and model["invalid_rate"] == 0.0
    for key in ("reward_acc", "done_acc", "success_acc", "exact", "token_f1"):
        assert model[key] == base[key], key
    assert result["data"]["backend"] == "served:copy" and result["data"]["simulator"]["transitions"] > 0
    r = requests.post(served + "/predict", headers=AUTH, json={"env": "twx:coin", "state": 3}, timeout=30)
    assert r.status_code == 422 and r.json()["error"] == "POST /predict: 'instruction' must be a string"


def test_http_backend_and_a_bounded_wait_on_the_model(coin_data: Path) -> None:
    """``--backend http``: an OpenAI-compatible endpoint (a scripted one that copies the top demonstration) answers
    a step with its reasoning; once it stalls past ``experience_model.request_timeout_s`` the step is one 503 that
    names the endpoint, and the session goes on once the model answers again."""
    from scripted_openai_server import ScriptedOpenAIServer
    from test_train import _copy_top_demonstration

    stall = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        if stall.is_set():
            time.sleep(2.0)
        return _copy_top_demonstration(body)

    with ScriptedOpenAIServer(reply) as llm:
        cfg = validate_config({"env": {"name": "twx:coin", "max_steps": 8}, "train": {"offline_data": str(coin_data)},
                               "experience_model": {"backend": "http", "url": llm.url, "top_k": 2,
                                                    "max_attempts": 1, "request_timeout_s": 0.5}})
        with TestClient(build_synthetic_app(cfg)) as client:
            env_id = client.post("/create").json()["id"]
            task = client.get("/tasks", params={"count": 1}).json()[0]
            obs = client.post("/reset", json={"id": env_id, "task": task}).json()
            action = next(a for a in obs["available_actions"] if a != "take coin")
            r = client.post("/step", json={"id": env_id, "action": action})
            assert r.status_code == 200 and r.json()["info"]["reasoning"] == "copied from the closest real transition"
            stall.set()
            t0 = time.monotonic()
            r = client.post("/step", json={"id": env_id, "action": action})
            assert r.status_code == 503 and r.json()["type"] == "EnvironmentUnavailableError"
            assert f"lost the experience-model server at {llm.url}" in r.json()["error"]
            assert time.monotonic() - t0 < 10  # bounded: the OpenAI client's timeout and its 2 retries
            stall.clear()
            assert client.post("/step", json={"id": env_id, "action": action}).status_code == 200


@pytest.mark.parametrize(("args", "expected"), [
    (["--backend", "copy"], "serve-synthetic needs offline real transitions: --offline-data PATH.parquet"),
    (["--backend", "ray", "--offline-data", "DATA"], "experience_model.backend 'ray' is not one of copy"),
    (["--backend", "copy", "--offline-data", "DATA", "--env", "twx:twc"],
     "holds no transitions of 'twx:twc' (env.name); its rows are of: twx:coin"),
    (["--backend", "copy", "--offline-data", "/nonexistent.parquet"], "'/nonexistent.parquet' (train.offline_data) "
                                                                     "is not a file"),
])
def test_startup_errors_are_one_line(coin_data: Path, args: list[str], expected: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve-synthetic", "--port", str(free_port()), *[str(coin_data) if a == "DATA" else a for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dreamgym serve-synthetic: error: ") and expected in err and len(err.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(600)
def test_a_model_folder_served_on_vllm(coin_data: Path, tmp_path: Path) -> None:
    """``--backend local``: a model folder (the tiny random Llama) on a vLLM engine in the server's process. Its
    replies are not in the reply format, so each step is retried and ends as an invalid transition; the step's
    info and ``/metrics`` say so, by reason, and the next episode starts cleanly."""
    proc, url = start_synthetic(coin_data, tmp_path / "server.log", "--backend", "local", "--model", "tiny",
                                "--experience_model.top_k", "1", "--experience_model.demo_state_max_chars", "300",
                                "--experience_model.max_tokens", "16", "--experience_model.max_attempts", "2",
                                "--experience_model.engine.kv_cache_gib", "0.25",
                                "--experience_model.engine.max_model_len", "2048",
                                "--experience_model.engine.dtype", "float32")
    try:
        env = RemoteEnv("dreamgym", url, timeout_s=120, token=TOKEN)
        assert env.server_info["synthetic"]["backend"] == "local" and env.server_info["synthetic"]["model"] == "tiny"
        for task in env.tasks(2):
            obs = env.reset(task)
            r = env.step(obs.admissible_actions[0])
            assert r.done and not r.info["valid"] and r.info["truncated"] and r.reward == 0.0
            assert r.info["attempts"] == 2 and r.info["retries"] == 1 and r.info["invalid_reason"]
            assert len(r.info["demonstration_ids"]) == 1 and r.observation.state == obs.state
        env.close()
        m = requests.get(url + "/metrics", headers=AUTH, timeout=30).json()
        assert m["steps"] == m["invalid_transitions"] == sum(m["invalid_transitions_by_reason"].values()) == 2
        assert m["model"]["model_calls"] == sum(m["model"]["reasons"].values()) == 4 and m["model"]["retries"] == 2
        assert m["model"]["completion_tokens"] > 0
        # OpenEnv's own client on the same served model: the same retried, invalid step, counted by the same pool
        with TokenClient(url + "/openenv", TOKEN).sync() as oe:
            r = oe.reset(seed=1)
            first = r.observation["state"]
            r = oe.step({"action": r.observation["available_actions"][0]})
            info = r.observation["info"]
            assert r.done and r.reward == 0.0 and not info["valid"] and info["attempts"] == 2 and info["invalid_reason"]
            assert len(info["demonstration_ids"]) == 1 and r.observation["state"] == first
        m = requests.get(url + "/metrics", headers=AUTH, timeout=30).json()
        assert m["steps"] == m["invalid_transitions"] == 3 and m["model"]["model_calls"] == 6
    finally:
        stop_server(proc)


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(300)
def test_an_engine_that_cannot_start_is_one_line(coin_data: Path) -> None:
    """A model folder the engine refuses (a context longer than the model's) fails before the server listens, in one
    line that says why, not vLLM's traceback."""
    r = subprocess.run([str(DREAMGYM), "serve-synthetic", "--offline-data", str(coin_data), "--backend", "local",
                        "--model", "tiny", "--experience_model.engine.max_model_len", "4096",
                        "--port", str(free_port())], capture_output=True, text=True, timeout=240)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert last.startswith("dreamgym serve-synthetic: error: serve-synthetic: the experience model (local: tiny) did "
                           "not start: ValidationError: ") and "max_model_len (4096) is greater than" in last, last


# -- a peer trainer: `dreamgym train --train.mode real` whose "real" environment is the served simulator ----------


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(900)
def test_train_real_mode_against_the_served_simulator(coin_data: Path, ray_cluster, tmp_path: Path) -> None:
    """The project's own trainer as a peer: real-mode training with learner steps against the synthetic environment
    served by a second process, reached through ``remote:dreamgym``. Every step it took is in ``/metrics``, and
    every session it opened is closed. PPO with groups of one (as
    ``test_train.test_ppo_trains_in_both_phases_colocated``): the tiny random policy earns no reward, so GRPO groups
    would have no variance and no learner step; the critic's step always runs. (No token: a token given in the
    config reaches the actors of an already running Ray only through ``DREAMGYM_ENV_TOKEN`` in the workers'
    environment, and this cluster started before the test.)"""
    from test_train import tiny_config

    from actors.driver import run_train

    proc, url = start_synthetic(coin_data, tmp_path / "server.log", token=None)
    try:
        cfg = validate_config(tiny_config(
            tmp_path, env={"name": "remote:dreamgym", "url": url, "max_steps": 4},
            collect={"episodes": 0},
            learner={"algorithm": "ppo", "group_size": 1},
            curriculum={"seed_tasks": 4, "tasks_per_iteration": 4, "llm_variants": 0, "param_variants": 0},
            train={"mode": "real", "iterations": 2, "warm_start": {"method": "none"},
                   "eval": {"at_start": False, "tasks": 2}, "rollout": {"envs_per_worker": 4}}))
        s = run_train(cfg)
        assert s["iterations"] == 2 and s["learner_steps"] == 2 and s["real_transitions"] > 0
        assert s["synthetic_transitions"] == 0
        m = requests.get(url + "/metrics", timeout=30).json()
        assert m["steps"] >= s["real_transitions"] and m["model"]["queries"] == m["steps"]
        assert m["sessions"]["live"] == 0
    finally:
        stop_server(proc)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trl_grpo_trains_in_the_served_simulator(coin_data: Path, tmp_path: Path) -> None:
    """The peer-trainer example: TRL's ``GRPOTrainer`` (CPU, tiny policy) takes 2 steps whose rewards come from
    the served simulator over plain HTTP; every completion it scored is a step in ``/metrics``."""
    pytest.importorskip("trl")
    proc, url = start_synthetic(coin_data, tmp_path / "server.log")
    try:
        r = subprocess.run([sys.executable, "examples/trl_grpo_synthetic.py", "--url", url, "--token", TOKEN,
                            "--model", "tiny", "--steps", "2", "--generations", "4"],
                           cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=540)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        lines = r.stdout.strip().splitlines()
        assert lines[0].startswith("8 prompts from ") and lines[0].endswith("(synthetic:twx:coin)")
        assert [x.split(":")[0] for x in lines if x.startswith("step ")] == ["step 1", "step 2"]
        assert lines[-1].startswith("trained 2 GRPO steps; the simulator served 8 steps")  # 2 steps x 4 completions
    finally:
        stop_server(proc)


# -- the OpenEnv protocol (mounted under /openenv), driven by OpenEnv's own client ----------------------------

@pytest.fixture(scope="module")
def open_url(coin_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A tokenless server (OpenEnv's client sends no headers): its URL."""
    proc, url = start_synthetic(coin_data, tmp_path_factory.mktemp("openenv") / "server.log", token=None)
    try:
        yield url
    finally:
        stop_server(proc)


def play_openenv(env: Any, task: Task, actions: list[str]) -> list[tuple[Any, ...]]:
    """``play`` through an OpenEnv client: what each step changed, in ``play``'s form."""
    r = env.reset(task=task.to_dict())
    out: list[tuple[Any, ...]] = [("reset", r.observation["state"], tuple(r.observation["available_actions"] or ()))]
    for a in actions:
        r = env.step({"action": a})
        out.append(openenv_row(a, r))
        if r.done:
            break
    return out


def openenv_row(action: str, r: Any) -> tuple[Any, ...]:
    """One OpenEnv step result in ``play``'s form."""
    o, info = r.observation, r.observation["info"]
    return (action, o["state"], r.reward, r.done, o["success"], info["valid"], info["settled"],
            tuple(info["demonstration_ids"]), tuple(info["demonstration_scores"]), tuple(o["available_actions"] or ()))


def test_openenv_client_plays_an_episode_to_done(open_url: str, local: Any, coin_data: Path) -> None:
    """OpenEnv's client plays a winning real episode to done; every step equals the in-process environment's, the
    info says what the simulator did, ``state()`` follows the episode, and the session is a pool instance counted
    by ``/metrics`` (and gone once the client disconnects)."""
    task_id, actions = winning_episode(coin_data)
    task = next(t for t in local.index.tasks() if t.task_id == task_id)
    with GenericEnvClient(base_url=open_url + "/openenv").sync() as env:
        assert requests.get(open_url + "/list_envs", timeout=30).json() != []  # the session holds a pool instance
        steps = play_openenv(env, task, actions)
        assert steps == play(local.make(synthetic_config(coin_data)), task, actions)
        assert steps[-1][2:5] == (1.0, True, True), "the copied real episode wins the coin"
        state = env.state()
        assert state["step_count"] == len(actions) and state["task_id"] == task_id
        assert state["done"] and state["success"] and state["episode_id"]
        r = env.reset(task_index=0, episode_id="mine")  # a task by index, as AgentGym's data_idx
        assert r.observation["task"]["task_id"] == local.index.tasks()[0].task_id and not r.done
        assert env.state() == {**env.state(), "episode_id": "mine", "step_count": 0, "done": False}
        r = env.step({"action": "fly to the moon"})  # no real state accepts it: a rule settles it
        assert r.observation["info"]["settled"] and r.reward == 0.0 and not r.done
        with pytest.raises(RuntimeError, match="unknown argument"):
            env.reset(task_idx=1)
    m = requests.get(open_url + "/metrics", timeout=30).json()
    assert m["steps"] == len(actions) + 1 and m["successes"] == 1 and m["rule_settled"] == 1
    assert m["sessions"]["live"] == 0
    schema = requests.get(open_url + "/openenv/schema", timeout=30).json()
    assert schema["action"]["properties"]["action"]["maxLength"] == 2000


def test_sixteen_concurrent_openenv_sessions_never_cross(open_url: str, local: Any, coin_data: Path) -> None:
    """16 OpenEnv clients at once, each its own task and random valid actions; each trajectory equals the
    in-process environment's for its own actions."""
    tasks = local.index.tasks()[:16]
    gate = threading.Barrier(16, timeout=60)

    def session(i: int) -> tuple[list[tuple[Any, ...]], list[str]]:
        rng, actions = random.Random(i), []
        with GenericEnvClient(base_url=open_url + "/openenv").sync() as env:
            gate.wait()
            r = env.reset(task=tasks[i].to_dict())
            trace: list[tuple[Any, ...]] = [("reset", r.observation["state"],
                                             tuple(r.observation["available_actions"] or ()))]
            valid = r.observation["available_actions"] or ["look around"]
            for _ in range(6):
                actions.append(rng.choice(valid))
                r = env.step({"action": actions[-1]})
                trace.append(openenv_row(actions[-1], r))
                if r.done:
                    break
                valid = r.observation["available_actions"] or valid
            assert env.state()["step_count"] == len(actions)
            return trace, actions

    assert_sessions_match_in_process(session, tasks, local, coin_data)


class TokenClient(GenericEnvClient):
    """OpenEnv's client with a token: docs/howto/serve-synthetic.md's snippet (OpenEnv 0.3 sends no headers)."""

    def __init__(self, base_url: str, token: str) -> None:
        super().__init__(base_url=base_url)
        self._headers = {"Authorization": f"Bearer {token}"}

    async def connect(self) -> TokenClient:
        import websockets

        if self._ws is None:
            self._ws = await websockets.connect(self._ws_url, additional_headers=self._headers,
                                                open_timeout=self._connect_timeout, max_size=self._max_message_size)
        return self


def test_a_token_guards_the_openenv_websocket(served: str) -> None:
    """With a token, a WebSocket without it is refused and one with it plays; the HTTP routes answer 401 like
    every other route."""
    with pytest.raises(ConnectionError), GenericEnvClient(base_url=served + "/openenv").sync() as env:
        env.reset()
    with TokenClient(served + "/openenv", TOKEN).sync() as env:
        r = env.reset(seed=5)
        assert r.observation["task"]["task_id"] and r.observation["state"] and not r.done
        r = env.step({"action": r.observation["available_actions"][0]})
        assert r.observation["info"]["demonstration_ids"] and env.state()["step_count"] == 1
    assert requests.get(served + "/openenv/health", timeout=30).status_code == 401
    assert requests.get(served + "/openenv/health", headers=AUTH, timeout=30).json()["status"] == "healthy"
