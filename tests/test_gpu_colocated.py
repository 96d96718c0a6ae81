"""GPU-only check of the one-GPU colocated layout (issue 31; marked gpu, skipped without CUDA): the learner and one
policy engine share one GPU (one bundle), the engine sleeps through the learner step, and the weights pass by CUDA
IPC. After the sync the engine's log-probs match the learner's within the engine dtype's rounding (bf16 1e-2, fp32
1e-3 nats per token) and differ from before the step (the weights moved). What runs on CPU instead: the choice,
placement and memory plan (``tests/test_gpu_layout.py``), sleep and wake on a CPU engine
(``tests/test_policy_engine.py``), the driver's cycle (``tests/test_train.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from grpo_helpers import random_groups
from placed_actors import placed_learner_and_engines

from dreamgym.config import DreamGymConfig, load_config
from dreamgym.models import build_tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.engine]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def ipc_config(tiny: Path, dtype: str) -> DreamGymConfig:
    return load_config(overrides={
        "policy": {"model": str(tiny), "max_tokens": 4,
                   "engine": {"device": "cuda", "dtype": dtype, "max_model_len": 256, "num_gpus": 0.5,
                              "gpu_memory_utilization": 0.3, "num_cpus": 0.25, "start_timeout_s": 600}},
        "learner": {"device": "cuda", "num_gpus": 0.5, "num_cpus": 0.25, "sync_timeout_s": 180, "lr": 1e-2},
        "train": {"mode": "real", "colocate": True}})


def gpu_test_configs(model: Path) -> list[tuple[str, Any]]:
    """Every configuration this module's tests build (checked on CPU by tests/test_gpu_layout.py), by name."""
    return [("ipc_bfloat16", ipc_config(model, "bfloat16")), ("ipc_float32", ipc_config(model, "float32"))]


@pytest.mark.parametrize(("dtype", "tolerance"), [("bfloat16", 1e-2), ("float32", 1e-3)])
def test_one_gpu_colocated_ipc_sync_with_the_engine_asleep_during_the_step(
        ray_cluster: object, tiny: Path, dtype: str, tolerance: float) -> None:
    import ray

    from actors.weight_sync import engine_transfer_backend
    from dreamgym.sync_choice import sleeps_engines

    cfg = ipc_config(tiny, dtype)
    assert engine_transfer_backend(cfg) == "ipc" and sleeps_engines(cfg)
    with placed_learner_and_engines(cfg, sleep_mode=True) as (learner, (engine,)):
        assert ray.get(learner.info.remote())["gpu_ids"] == ray.get(engine.info.remote())["gpu_ids"]  # one device
        seq = [1, 20, 30, 40, 50, 60]
        before = ray.get(engine.score.remote([seq]))[0]
        ray.get(engine.sleep.remote(1, 120))
        ray.get(learner.step.remote(random_groups(1)))
        assert ray.get(engine.wake_up.remote(["weights"]))["awake"] is False
        rep = ray.get(learner.sync.remote([engine]), timeout=300)
        assert rep["version"] == 1 and ray.get(engine.weight_version.remote()) == 1
        assert ray.get(engine.wake_up.remote(["kv_cache"]))["awake"] is True
        after = ray.get(engine.score.remote([seq]))[0]
        mine = ray.get(learner.sequence_logprobs.remote([seq]))[0]
        assert max(abs(a - b) for a, b in zip(after, mine, strict=True)) <= tolerance, (after, mine)
        assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 10 * tolerance  # the weights moved
