"""GPU paths (marked gpu; skipped without CUDA): bf16 autocast learner steps and NCCL weight sync."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from grpo_helpers import random_groups

from dreamgym.config import DreamGymConfig, EngineConfig, LearnerConfig, PolicyConfig, load_config
from dreamgym.models import build_tiny_model

pytestmark = pytest.mark.gpu


# -- the configurations these tests build (``gpu_test_configs``: built and checked on CPU by tests/test_gpu_layout.py,
# so a config field renamed or refused does not break these tests unseen) ----------------------------------------
def bf16_learner_config() -> LearnerConfig:
    return LearnerConfig(lr=1e-3, device="cuda", precision="bf16-autocast")


def sft_config(data: Path, base: Path) -> DreamGymConfig:
    return load_config(None, {"experience_model": {"top_k": 1, "train": {
        "data": str(data), "store": str(data), "base": str(base), "method": "lora", "lr": 5e-2, "epochs": 12,
        "batch_size": 2, "device": "cuda", "precision": "auto", "gradient_checkpointing": True}}})


def nccl_policy_config(model: Path) -> PolicyConfig:
    return PolicyConfig(model=str(model), max_tokens=4, engine=EngineConfig(
        device="cuda", dtype="float32", max_model_len=256, gpu_memory_utilization=0.3))


def nccl_learner_config() -> LearnerConfig:
    return LearnerConfig(lr=1e-2, device="cuda", num_gpus=1, weight_sync="nccl")


def gpu_test_configs(model: Path) -> list[tuple[str, Any]]:
    """Every configuration this module's tests build, for ``model`` (the tiny model), by name."""
    return [("bf16_learner", bf16_learner_config()), ("sft", sft_config(model / "toy.parquet", model)),
            ("nccl_policy", nccl_policy_config(model)), ("nccl_learner", nccl_learner_config())]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def test_bf16_autocast_step_on_cuda(tiny: Path) -> None:
    import torch

    from learner.learner import Learner

    learner = Learner(bf16_learner_config(), tiny, seed=0)
    assert next(learner.model.parameters()).device.type == "cuda"
    assert next(learner.model.parameters()).dtype == torch.float32  # fp32 master weights
    m = learner.step(random_groups(0))
    assert m["version"] == 1 and m["grad_norm"] > 0


def test_experience_model_lora_fine_tune_on_cuda(tiny: Path, tmp_path: Path) -> None:
    """The GPU study's experience-model SFT: LoRA, bf16 autocast (precision auto), gradient checkpointing."""
    from experience_data import HALL, KITCHEN, toy_row, write_toy

    from learner.sft_experience import train_experience_model

    rows = [toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True, "The agent goes north."),
            toy_row("e0", 1, KITCHEN, "look", KITCHEN, 0.0, False, False, None)]
    data = write_toy(tmp_path / "toy.parquet", rows)
    s = train_experience_model(sft_config(data, tiny), tmp_path / "em")
    assert s["device"] == "cuda" and s["precision"] == "bf16" and s["loss_last"] < s["loss_first"]
    assert (tmp_path / "em" / "model.safetensors").is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.engine
def test_nccl_weight_sync_matches_learner(ray_cluster: object, tiny: Path) -> None:
    import ray
    import torch

    from actors.policy_engine import create_policy_engines
    from actors.weight_sync import NcclWeightSync
    from learner.learner import Learner

    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL sync needs one GPU for the learner and one for the engine")
    (engine,) = create_policy_engines(nccl_policy_config(tiny), weight_transfer_backend="nccl")
    try:
        engine_gpu = ray.get(engine.info.remote())["gpu_ids"]
        learner_gpu = next(i for i in range(torch.cuda.device_count()) if str(i) not in engine_gpu)
        torch.cuda.set_device(learner_gpu)
        learner = Learner(nccl_learner_config(), tiny, seed=0)
        learner.step(random_groups(1))
        sync = NcclWeightSync([engine], "127.0.0.1", _free_port(), timeout_s=120, dtype="float32")
        sync.push(learner.sync_weights(), version=learner.version.version)
        assert ray.get(engine.weight_version.remote()) == 1
        seq = [1, 20, 30, 40, 50, 60]
        engine_lp = ray.get(engine.score.remote([seq]))[0]
        learner_lp = learner.sequence_logprobs([seq])[0]
        assert max(abs(a - b) for a, b in zip(engine_lp, learner_lp, strict=True)) < 1e-2  # TF32 matmuls
        sync.close()
    finally:
        ray.kill(engine)
