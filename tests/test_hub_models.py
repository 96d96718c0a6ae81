"""Hub ids (``org/name``) resolve through the standard Hugging Face cache: a cache folder built here
(``models--org--name/snapshots/<rev>/`` with ``refs/main``) for a tiny model, resolved with ``HF_HUB_OFFLINE=1``
and ``HF_HUB_CACHE`` / ``HF_HOME`` pointed at it (in a subprocess: huggingface_hub reads them at import)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dreamgym.models import build_tiny_model, hub_env, is_hub_id

REV = "0123456789abcdef0123456789abcdef01234567"

RESOLVE = ("import json, sys\n"
           "from dreamgym.models import resolve_model, ModelUnavailableError\n"
           "try:\n"
           "    print(json.dumps({'path': str(resolve_model(sys.argv[1]))}))\n"
           "except ModelUnavailableError as e:\n"
           "    print(json.dumps({'error': str(e)}))\n")


def _hf_cache(root: Path, repo: str, model: Path) -> Path:
    org, name = repo.split("/")
    base = root / f"models--{org}--{name}"
    snap = base / "snapshots" / REV
    snap.parent.mkdir(parents=True)
    shutil.copytree(model, snap)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(REV)
    return snap


def _resolve(repo: str, env: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    r = subprocess.run([sys.executable, "-c", RESOLVE, repo], capture_output=True, text=True, timeout=120,
                       env={**clean, **env})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def test_hub_id_resolves_from_the_hf_cache_offline(tmp_path: Path, tiny: Path) -> None:
    hub = tmp_path / "hub"
    snap = _hf_cache(hub, "tiny-org/tiny-chat", tiny)
    out = _resolve("tiny-org/tiny-chat", {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)})
    assert Path(out["path"]) == snap and (snap / "config.json").is_file()
    # HF_HOME: the hub cache is <HF_HOME>/hub
    home = tmp_path / "home"
    snap2 = _hf_cache(home / "hub", "tiny-org/tiny-chat", tiny)
    assert Path(_resolve("tiny-org/tiny-chat", {"HF_HUB_OFFLINE": "1", "HF_HOME": str(home)})["path"]) == snap2


def test_missing_hub_model_offline_names_the_cache(tmp_path: Path) -> None:
    out = _resolve("tiny-org/absent", {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)})
    assert "HF_HUB_OFFLINE=1 is set and the HF cache has no snapshot" in out["error"] and str(tmp_path) in out["error"]


def test_hub_ids_and_the_actor_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_hub_id("Qwen/Qwen2.5-7B-Instruct") and not is_hub_id("tiny") and not is_hub_id("/abs/folder")
    assert not is_hub_id("./rel/x")
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_id("org/name")  # an existing local folder wins
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert hub_env()["HF_HUB_OFFLINE"] == "0"  # not forced offline: a cluster node may download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/shared/hf")
    assert hub_env() == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": "/shared/hf"}
