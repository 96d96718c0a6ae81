"""API keys reach the clients that use them and nothing a run writes.

Each key is set through each route (command line, environment variable, secrets file); the commands that
write a run directory or print the config run for real; every file they wrote, and what they printed, is
searched for the key. The clients are the real ones: ``openai.OpenAI`` objects and ``QdrantClient`` talking
to a loopback HTTP server that records the ``api-key`` header it receives."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from replay_fixtures import twx_parquet  # noqa: F401 - a fixture

from dreamgym.config import load_config, save_config
from dreamgym.errors import ConfigError, ReplayStorageUnavailableError
from dreamgym.secrets import MASK, SECRETS, resolve

DREAMGYM = Path(sys.executable).parent / "dreamgym"
#: One distinct value per secret field, so a leak names the field it came from.
KEYS = {field: f"sk-{field.replace('.', '-')}-9d2e71" for field in SECRETS}
ROUTES = ("cli", "env", "file")


@pytest.fixture(autouse=True)
def _no_inherited_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test without keys in the environment, and leave none behind: ``load_config`` publishes the
    keys it was given into ``os.environ`` (set-then-delete makes monkeypatch restore the variable's absence)."""
    for name in [s.env for s in SECRETS.values()] + ["DREAMGYM_SECRETS_FILE"]:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _give_keys(route: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Set every key through ``route``; returns the command-line overrides it needs."""
    if route == "cli":
        return [tok for field, key in KEYS.items() for tok in (f"--{field}", key)]
    if route == "env":
        for field, key in KEYS.items():
            monkeypatch.setenv(SECRETS[field].env, key)
        return []
    path = tmp_path / "secrets.yaml"
    path.write_text(yaml.safe_dump({SECRETS[field].key: key for field, key in KEYS.items()}))
    path.chmod(0o600)
    return ["--run.secrets_file", str(path)]


def _assert_no_key_in(texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for field, key in KEYS.items():
            assert key not in text, f"{field} leaked into {where}"


def _files(root: Path) -> dict[str, str]:
    return {str(p): p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file()}


# -- where keys are written or shown --------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_dreamgym_config_never_prints_a_key(route: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    over = _give_keys(route, tmp_path, monkeypatch)
    r = subprocess.run([str(DREAMGYM), "config", *over], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    _assert_no_key_in({"stdout": r.stdout, "stderr": r.stderr})
    shown = yaml.safe_load(r.stdout)
    if route == "cli":  # given in the config: shown as set, hidden
        assert shown["replay"]["api_key"] == MASK and shown["env"]["token"] == MASK
        assert shown["experience_model"]["annotate"]["teacher_api_key"] == MASK


@pytest.fixture(scope="module")
def few_transitions(twx_parquet: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The first 8 rows of the shared ``twx:coin`` file: what a run directory holds does not depend on how many
    rows were seeded, and embedding them all cost ~10 s per route."""
    from dreamgym.data.transitions import TransitionWriter, read_transitions

    path = tmp_path_factory.mktemp("secrets-data") / "coin-8.parquet"
    with TransitionWriter(path) as w:
        w.write(read_transitions(twx_parquet).slice(0, 8).to_pylist())
    return path


@pytest.mark.parametrize("route", ROUTES)
def test_run_directory_holds_no_key(route: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    few_transitions: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real ``dreamgym seed-replay`` run (config.yaml, metrics.jsonl, the replay store), plus the metric sinks
    a training run opens on the same directory."""
    from dreamgym.cli import main
    from dreamgym.progress import MetricSinks

    over = _give_keys(route, tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    code = main(["seed-replay", "--data", str(few_transitions), "--path", str(tmp_path / "replay"),
                 "--run.out_dir", str(runs), *over])
    assert code == 0
    (run_dir,) = runs.iterdir()
    cfg = load_config(run_dir / "config.yaml", over)
    sinks = MetricSinks(run_dir, tensorboard=True, config=cfg.model_dump(mode="json"))
    sinks.log(1, {"reward": 0.5})
    sinks.close()
    save_config(cfg, run_dir / "config-again.yaml")
    out = capsys.readouterr()
    files = _files(run_dir)
    assert any(name.endswith("metrics.jsonl") for name in files) and any("tfevents" in name for name in files)
    _assert_no_key_in({**files, "stdout": out.out, "stderr": out.err})
    # ...and each key still reaches the code that uses it
    for field, key in KEYS.items():
        section, *rest = field.split(".")
        value = getattr(cfg, section)
        for part in rest:
            value = getattr(value, part)
        assert resolve(value, field) == key


# -- the keys reach the real clients ----------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_openai_clients_get_their_keys(route: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dreamgym.experience.annotate import annotator_from_config
    from dreamgym.experience.backends import open_client

    over = _give_keys(route, tmp_path, monkeypatch)
    cfg = load_config(overrides=[*over, "--experience_model.backend", "http", "--experience_model.url",
                                 "http://127.0.0.1:9/v1", "--experience_model.served_model_name", "m",
                                 "--experience_model.annotate.teacher_url", "http://127.0.0.1:9/v1",
                                 "--experience_model.annotate.teacher_model", "m"])
    client = open_client(cfg.experience_model)
    assert client.client.api_key == KEYS["experience_model.api_key"]  # type: ignore[attr-defined]
    teacher = annotator_from_config(cfg.experience_model.annotate)
    assert teacher.client.client.api_key == KEYS["experience_model.annotate.teacher_api_key"]  # type: ignore[union-attr]


@pytest.fixture
def qdrant_door() -> Iterator[tuple[str, list[str | None]]]:
    """A loopback HTTP server that records each request's ``api-key`` header and answers 503."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("api-key"))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")  # loopback http on purpose
@pytest.mark.parametrize("route", ROUTES)
def test_qdrant_client_sends_its_key(route: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     qdrant_door: tuple[str, list[str | None]]) -> None:
    from dreamgym.replay.storage import open_store

    url, seen = qdrant_door
    over = _give_keys(route, tmp_path, monkeypatch)
    cfg = load_config(overrides=[*over, "--replay.backend", "server", "--replay.url", url])
    with pytest.raises(ReplayStorageUnavailableError) as err:
        open_store(cfg.replay, 8, 0)
    assert seen and seen[0] == KEYS["replay.api_key"]
    assert KEYS["replay.api_key"] not in str(err.value)


# -- saved configs, resumes and bad input --------------------------------------------------------------


def test_a_saved_config_needs_the_key_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run reads config.yaml, which holds the placeholder: the key must come from env or file."""
    cfg = load_config(overrides=["--replay.backend", "server", "--replay.url", "http://127.0.0.1:6333",
                                 "--replay.api_key", "sk-given-once"])
    save_config(cfg, tmp_path / "config.yaml")
    assert "sk-given-once" not in (tmp_path / "config.yaml").read_text()
    monkeypatch.delenv("DREAMGYM_QDRANT_API_KEY")  # set by load_config for this process's workers
    resumed = load_config(tmp_path / "config.yaml")
    with pytest.raises(ConfigError, match=r"^replay.api_key is set, but its value is not stored in saved configs "
                                          r"and did not reach this process: set DREAMGYM_QDRANT_API_KEY, add "
                                          r"'qdrant_api_key' to the secrets file \(DREAMGYM_SECRETS_FILE\)"):
        resolve(resumed.replay.api_key, "replay.api_key")
    monkeypatch.setenv("DREAMGYM_QDRANT_API_KEY", "sk-given-once")
    assert resolve(resumed.replay.api_key, "replay.api_key") == "sk-given-once"


def test_cli_keys_reach_workers_through_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(overrides=["--experience_model.api_key", "0123"])  # a key that YAML would read as 123
    assert cfg.experience_model.api_key is not None
    assert cfg.experience_model.api_key.get_secret_value() == "0123"
    assert os.environ["DREAMGYM_EXPERIENCE_API_KEY"] == "0123"
    dumped = cfg.model_dump(mode="json")  # what Ray actors receive
    assert dumped["experience_model"]["api_key"] == MASK
    assert resolve(load_config(overrides=dumped).experience_model.api_key, "experience_model.api_key") == "0123"


def test_a_rejected_key_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"replay": {"api_key": ["sk-in-a-list-5521"]}})
    assert "replay.api_key" in str(err.value) and "sk-in-a-list-5521" not in str(err.value)


def test_secrets_file_mistakes_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^secrets file not found: .*nope.yaml"):
        load_config(overrides=["--run.secrets_file", str(tmp_path / "nope.yaml")])
    typo = tmp_path / "typo.yaml"
    typo.write_text("qdrant_apikey: sk-typo-3321\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) qdrant_apikey; valid keys: ") as err:
        load_config(overrides=["--run.secrets_file", str(typo)])
    assert "sk-typo-3321" not in str(err.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("qdrant_api_key: [sk-broken-1\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML$") as err:
        load_config(overrides=["--run.secrets_file", str(broken)])
    assert "sk-broken-1" not in str(err.value)


def test_wandb_key_comes_from_the_secrets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dreamgym.secrets import export_wandb_key

    path = tmp_path / "secrets.yaml"
    path.write_text("wandb_api_key: wb-key-6610\n")
    monkeypatch.setenv("DREAMGYM_SECRETS_FILE", str(path))
    monkeypatch.setenv("WANDB_API_KEY", "")
    export_wandb_key()
    assert os.environ["WANDB_API_KEY"] == "wb-key-6610"
    monkeypatch.setenv("WANDB_API_KEY", "wb-from-env")  # the environment wins
    export_wandb_key()
    assert os.environ["WANDB_API_KEY"] == "wb-from-env"
