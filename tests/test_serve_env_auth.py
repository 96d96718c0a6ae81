"""`dreamgym serve-env` binds to loopback by default and, given a token, refuses requests without it.

A real server in a subprocess (default host, token from ``DREAMGYM_SERVE_ENV_TOKEN``), raw requests
without and with the token, and ``RemoteEnv`` playing a step with the token from its config and from the
environment."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest
import requests
from test_remote_env import DREAMGYM, HOST, free_port, stop_server

from dreamgym.cli import build_parser
from dreamgym.config import EnvConfig
from dreamgym.envs.registry import make_env
from dreamgym.envs.remote import RemoteEnv
from dreamgym.errors import RemoteEnvironmentError

TOKEN = "serve-env-token-7f3a9c"


def test_serve_env_binds_loopback_unless_told() -> None:
    assert build_parser().parse_args(["serve-env"]).host == "127.0.0.1"
    assert build_parser().parse_args(["serve-env"]).token is None


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`dreamgym serve-env --env twx:coin` with no --host and the token in its environment."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve-env-auth") / "server.log"
    env = {**os.environ, "DREAMGYM_SERVE_ENV_TOKEN": TOKEN}
    env.pop("DREAMGYM_SECRETS_FILE", None)
    with log.open("w") as out:
        proc = subprocess.Popen([str(DREAMGYM), "serve-env", "--env", "twx:coin", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=log.parent, env=env)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 90
        while "serving twx:coin" not in log.read_text():
            if proc.poll() is not None:
                pytest.fail(f"serve-env exited with {proc.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"serve-env did not start within 90 s:\n{log.read_text()}")
            time.sleep(0.2)
        text = log.read_text()
        assert f"on {url}, token required" in text, text  # the default host is the loopback interface
        assert TOKEN not in text
        yield url
    finally:
        stop_server(proc)


def test_requests_without_the_token_get_401(guarded: str) -> None:
    r = requests.get(guarded + "/", timeout=30)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"error": "GET /: this server requires a token: send 'Authorization: Bearer <token>' "
                                 "(dreamgym clients: env.token or DREAMGYM_ENV_TOKEN)", "type": "Unauthorized"}
    r = requests.post(guarded + "/create", headers={"Authorization": "Bearer nope"}, timeout=30)
    assert r.status_code == 401 and "wrong token" in r.json()["error"]
    assert requests.get(guarded + "/list_envs", timeout=30).status_code == 401


def test_requests_with_the_token_work(guarded: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    hello = requests.get(guarded + "/", headers=auth, timeout=30)
    assert hello.status_code == 200 and hello.json()["env"] == "twx:coin"
    env_id = requests.post(guarded + "/create", headers=auth, timeout=30).json()["id"]
    assert requests.post(guarded + "/close", json={"id": env_id}, headers=auth, timeout=30).json()["closed"]


def _play_a_step(env: RemoteEnv) -> None:
    try:
        task = env.tasks(1)[0]
        obs = env.reset(task)
        result = env.step((obs.admissible_actions or ["look around"])[0])
        assert result.observation.text
    finally:
        env.close()


def test_remote_client_sends_the_token_from_config(guarded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DREAMGYM_ENV_TOKEN", raising=False)
    monkeypatch.delenv("DREAMGYM_SECRETS_FILE", raising=False)
    env = make_env(EnvConfig(name="remote:dreamgym", url=guarded, timeout_s=30, token=TOKEN))
    assert isinstance(env, RemoteEnv)
    _play_a_step(env)


def test_remote_client_sends_the_token_from_the_environment(guarded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DREAMGYM_ENV_TOKEN", TOKEN)
    env = make_env(EnvConfig(name="remote:dreamgym", url=guarded, timeout_s=30))
    assert isinstance(env, RemoteEnv)
    _play_a_step(env)


def test_remote_client_without_the_token_is_told_why(guarded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DREAMGYM_ENV_TOKEN", raising=False)
    monkeypatch.delenv("DREAMGYM_SECRETS_FILE", raising=False)
    with pytest.raises(RemoteEnvironmentError, match=r"HTTP 401\): GET /: this server requires a token"):
        make_env(EnvConfig(name="remote:dreamgym", url=guarded, timeout_s=30))
