"""The ``policy`` and ``learner`` config sections: defaults, validation, documentation, wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from dreamgym.config import explain, load_config
from dreamgym.errors import ConfigError


def test_defaults_and_overrides() -> None:
    cfg = load_config(overrides=["--learner.lora.enabled", "true", "--learner.clip_high", "0.3",
                                 "--policy.model", "tiny", "--policy.engine.dtype", "bfloat16"])
    assert cfg.learner.lora.enabled and cfg.learner.clip_high == 0.3
    assert cfg.policy.model == "tiny" and cfg.policy.engine.dtype == "bfloat16"
    assert cfg.learner.loss_agg == "token-mean" and cfg.learner.kl_coef == 0.0 and cfg.learner.scale_by_std


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--learner.fsdp", "true", "--learner.device", "cpu"], "fsdp needs device 'cuda'"),
        (["--learner.weight_sync", "nccl", "--learner.device", "cpu"], "weight_sync 'nccl'"),
        (["--learner.clip_low", "1.5"], "learner.clip_low"),
        (["--learner.loss_agg", "sum"], "learner.loss_agg"),
        (["--policy.temperature", "0"], "policy.temperature"),
        (["--learner.lora.rank", "8"], "learner.lora.rank: unknown key"),
    ],
)
def test_invalid_values_name_the_field(override: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=override)


def test_every_new_field_is_documented() -> None:
    rows = [r for r in explain() if r[0].startswith(("policy.", "learner."))]
    assert len(rows) > 40
    assert all(desc.strip() for _, _, desc in rows), [p for p, _, d in rows if not d.strip()]


def test_learner_and_sync_from_the_run_config(tmp_path: Path) -> None:
    from actors.weight_sync import ObjectStoreWeightSync, make_weight_sync
    from dreamgym.models import build_tiny_model
    from learner.learner import Learner

    model = build_tiny_model(tmp_path / "tiny")
    cfg = load_config(overrides={"policy": {"model": str(model), "temperature": 0.7}, "run": {"seed": 5},
                                 "learner": {"device": "cpu"}})
    learner = Learner.from_config(cfg)
    assert learner.temperature == 0.7 and learner.seed == 5 and learner.model_path == model
    sync = make_weight_sync(cfg, [])
    assert isinstance(sync, ObjectStoreWeightSync) and sync.dtype == "float32"


def test_an_eager_cpu_engine_runs_without_torch_compile() -> None:
    """vLLM wraps a few sampler ops in ``torch.compile``; an eager CPU engine (the default) runs them eagerly instead
    of compiling C++ in every new engine process (seconds each), a compiled or CUDA engine keeps them."""
    from dreamgym.experience.engine import EngineOptions
    from dreamgym.experience.engine import engine_env as replica_env
    from dreamgym.vllm_engine import engine_env

    assert engine_env("cpu", 2)["TORCHDYNAMO_DISABLE"] == "1" and engine_env("cpu", 2)["OMP_NUM_THREADS"] == "2"
    assert "TORCHDYNAMO_DISABLE" not in engine_env("cpu", 2, enforce_eager=False)
    assert "TORCHDYNAMO_DISABLE" not in engine_env("cuda", 2)
    assert replica_env(EngineOptions(model="m"))["TORCHDYNAMO_DISABLE"] == "1"
    assert "TORCHDYNAMO_DISABLE" not in replica_env(EngineOptions(model="m", enforce_eager=False))
