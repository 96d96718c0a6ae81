"""The HTTP round trip for real: `dreamgym serve-env` serving a TextWorldExpress coin game in a
subprocess on loopback, driven through ``RemoteEnv`` and through raw AgentGym-style requests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from dreamgym.config import EnvConfig
from dreamgym.envs.registry import make_env
from dreamgym.envs.remote import RemoteEnv
from dreamgym.errors import ConfigError, EnvironmentSpecError, EnvironmentUnavailableError, RemoteEnvironmentError

DREAMGYM = Path(sys.executable).parent / "dreamgym"
HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`dreamgym serve-env --env twx:coin` as a subprocess; yields its base URL, stops it by its pid."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve-env") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(DREAMGYM), "serve-env", "--env", "twx:coin", "--host", HOST, "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, cwd=log.parent,
        )
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"serve-env exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if requests.get(url + "/", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"serve-env did not answer within 90 s:\n{log.read_text()}")
            time.sleep(0.2)
        assert "serving twx:coin on " + url in log.read_text()
        yield url
    finally:
        stop_server(proc)


@pytest.fixture
def remote(server: str) -> Iterator[RemoteEnv]:
    env = make_env(EnvConfig(name="remote:dreamgym", url=server, timeout_s=30))
    assert isinstance(env, RemoteEnv)
    yield env
    env.close()


def test_gold_actions_win_through_the_server(remote: RemoteEnv) -> None:
    tasks = remote.tasks(2, first=0)
    assert [t.env for t in tasks] == ["remote:dreamgym"] * 2
    assert all(t.task_id.startswith("twx:coin/train/seed=") for t in tasks)
    for task in tasks:
        obs = remote.reset(task)
        assert "coin" in obs.instruction and obs.state and obs.admissible_actions
        gold = remote.gold_actions()
        assert gold, "a dreamgym server answers the expert plan"
        total = 0.0
        for i, action in enumerate(gold):
            assert action in (remote.admissible_actions() or [])
            result = remote.step(action)
            total += result.reward
            assert result.done == (i == len(gold) - 1)
        assert result.success and result.done and total == pytest.approx(1.0)
        assert result.info["admissible"] is True and result.info["truncated"] is False


def test_admissible_actions_match_a_local_game(remote: RemoteEnv) -> None:
    from dreamgym.envs.textworld_express import TextWorldExpressEnv

    local = TextWorldExpressEnv("coin")  # the server's config: default parameters, train split
    try:
        local_task = local.tasks(1, first=5)[0]
        remote_task = remote.tasks(1, first=5)[0]
        assert (remote_task.task_id, remote_task.instruction, remote_task.params) == (
            local_task.task_id, local_task.instruction, local_task.params)
        lo, ro = local.reset(local_task), remote.reset(remote_task)
        assert (ro.text, ro.state, ro.admissible_actions) == (lo.text, lo.state, lo.admissible_actions)
        for action in local.gold_actions() or []:
            ls, rs = local.step(action), remote.step(action)
            assert (rs.observation.state, rs.reward, rs.done, rs.success) == (
                ls.observation.state, ls.reward, ls.done, ls.success)
            assert remote.admissible_actions() == (None if rs.done else local.admissible_actions())
    finally:
        local.close()


def test_an_inadmissible_action_is_answered(remote: RemoteEnv) -> None:
    remote.reset(remote.tasks(1, first=1)[0])
    result = remote.step("fly to the moon")
    assert not result.done and not result.success and result.reward == 0.0
    assert result.info["admissible"] is False
    assert result.observation.text  # the game's own "unknown action" answer
    gold = remote.gold_actions() or []
    for action in gold:  # the episode goes on
        result = remote.step(action)
    assert result.success


def test_agentgym_style_requests(server: str) -> None:
    """An AgentGym client's calls: index resets, env_idx, bare GET endpoints, close."""
    created = requests.post(server + "/create", timeout=30).json()
    env_idx = created["env_idx"]
    assert created["id"] == env_idx
    reply = requests.post(server + "/reset", json={"env_idx": env_idx, "data_idx": 4}, timeout=30).json()
    assert reply["task"]["params"]["seed"] == 4 and reply["available_actions"]
    assert requests.get(server + "/observation", params={"env_idx": env_idx}, timeout=30).json() == reply["observation"]
    assert requests.get(server + "/instruction_text", params={"id": env_idx}, timeout=30).json() == reply["instruction"]
    step = requests.post(server + "/step", json={"id": env_idx, "action": "look around"}, timeout=30).json()
    assert {"observation", "state", "reward", "done", "success", "info"} <= set(step)
    assert env_idx in requests.get(server + "/list_envs", timeout=30).json()
    assert requests.post(server + "/close", json={"id": env_idx}, timeout=30).json() == {"id": env_idx, "closed": True}


def test_bad_requests_get_clear_4xx(server: str) -> None:
    r = requests.post(server + "/step", json={"id": 987654, "action": "look around"}, timeout=30)
    assert r.status_code == 404 and "unknown environment id 987654" in r.json()["error"]
    r = requests.post(server + "/step", json={"action": "look around"}, timeout=30)
    assert r.status_code == 422 and "environment id is missing" in r.json()["error"]
    env_id = requests.post(server + "/create", timeout=30).json()["id"]
    try:
        r = requests.post(server + "/step", json={"id": env_id}, timeout=30)
        assert r.status_code == 422 and "action" in r.json()["error"]
        r = requests.post(server + "/step", json={"id": env_id, "action": "look around"}, timeout=30)
        assert r.status_code == 409 and "POST /reset first" in r.json()["error"]
        r = requests.post(server + "/reset", json={"id": env_id}, timeout=30)
        assert r.status_code == 422 and "task index" in r.json()["error"]
        bad_task = {"task_id": "x", "env": "twx:twc", "instruction": "", "params": {"seed": 1}}
        r = requests.post(server + "/reset", json={"id": env_id, "task": bad_task}, timeout=30)
        assert r.status_code == 400 and "this server runs 'twx:coin'" in r.json()["error"]
        r = requests.get(server + "/tasks", params={"count": 1, "split": "nope"}, timeout=30)
        assert r.status_code == 400 and "valid splits" in r.json()["error"]
    finally:
        requests.post(server + "/close", json={"id": env_id}, timeout=30)


def test_unknown_env_id_is_a_clear_client_error(server: str, remote: RemoteEnv) -> None:
    remote.reset(remote.tasks(1)[0])
    # The server forgets the instance (closed elsewhere, or the server restarted).
    env_id = requests.get(server + "/list_envs", timeout=30).json()[-1]
    requests.post(server + "/close", json={"id": env_id}, timeout=30)
    expected = rf"POST /step failed \(HTTP 404\): unknown environment id {env_id}"
    with pytest.raises(RemoteEnvironmentError, match=expected):
        remote.step("look around")


def test_unknown_task_is_forwarded_as_a_spec_error(remote: RemoteEnv) -> None:
    task = remote.tasks(1)[0]
    broken = type(task)(task_id="t", env=task.env, instruction="", params={"seed": 1, "numLocations": "many"})
    with pytest.raises(EnvironmentSpecError, match="numLocations"):
        remote.reset(broken)


def test_unreachable_server_is_one_clear_error() -> None:
    port = free_port()
    url = f"http://{HOST}:{port}"
    with pytest.raises(EnvironmentUnavailableError) as info:
        make_env(EnvConfig(name="remote:dreamgym", url=url, timeout_s=5))
    message = str(info.value)
    assert url in message and "Connection refused" in message
    assert f"dreamgym serve-env --env twx:coin --host 127.0.0.1 --port {port}" in message and "env.url" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no requests traceback attached


def test_remote_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"needs env\.url"):
        make_env(EnvConfig(name="remote:webshop"))
    with pytest.raises(ConfigError, match="must be an http"):
        make_env(EnvConfig(name="remote:webshop", url="127.0.0.1:36001"))
    with pytest.raises(EnvironmentSpecError, match="valid names: webshop, alfworld, webarena"):
        make_env(EnvConfig(name="remote:shopping", url="http://127.0.0.1:1"))


@pytest.mark.parametrize(("args", "expected"), [
    (["--env", "twx:nosuchgame"], "unknown TextWorldExpress game 'nosuchgame'"),
    (["--env", "twx:coin", "--port", "BUSY"], "cannot listen on 127.0.0.1:"),
])
def test_serve_env_startup_errors(server: str, args: list[str], expected: str) -> None:
    busy = server.rsplit(":", 1)[1]
    argv = [str(DREAMGYM), "serve-env", "--host", HOST, *[busy if a == "BUSY" else a for a in args]]
    if "--port" not in args:
        argv += ["--port", str(free_port())]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr


def test_parallel_clients_each_get_their_own_engine(server: str) -> None:
    """Two clients playing at once from two threads: the server steps their instances in parallel
    and each game stays its own (every gold path still wins)."""
    from concurrent.futures import ThreadPoolExecutor

    def play(first: int) -> list[bool]:
        with RemoteEnv("dreamgym", server, timeout_s=30) as env:
            outcomes = []
            for task in env.tasks(3, first=first):
                env.reset(task)
                result = None
                for action in env.gold_actions() or []:
                    result = env.step(action)
                outcomes.append(bool(result and result.success))
            return outcomes

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(play, [10, 20]))
    assert results == [[True] * 3, [True] * 3]


def stop_server(proc: subprocess.Popen) -> None:
    """End a served environment started by a test: this process only, killed if it does not stop in 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
