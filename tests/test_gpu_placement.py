"""GPU-only checks of issue 11 (marked gpu; skipped without CUDA, and each skips without the GPUs it needs):
two policy engines in one NCCL weight-sync group (distinct rank offsets; both load the learner's weights), and a
tensor-parallel engine placed in its placement group's bundles. They run through ``dreamgym.placement`` and
``actors.placement`` as ``dreamgym train`` does, on a Ray node of this machine's GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from grpo_helpers import random_groups
from placed_actors import placed_learner_and_engines

from dreamgym.config import DreamGymConfig, load_config
from dreamgym.models import build_tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.engine]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 4 heads, 2 KV heads: splits over 2 tensor-parallel workers.
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", num_heads=4, num_kv_heads=2, seed=0)


def gpu_config(tiny: Path, engines: int, tp: int) -> DreamGymConfig:
    return load_config(overrides={
        "policy": {"model": str(tiny), "num_engines": engines, "max_tokens": 4,
                   "engine": {"device": "cuda", "dtype": "float32", "max_model_len": 256, "tensor_parallel_size": tp,
                              "gpu_memory_utilization": 0.3, "num_cpus": 0.25, "start_timeout_s": 600}},
        "learner": {"device": "cuda", "num_gpus": 1, "num_cpus": 0.25, "weight_sync": "nccl", "sync_timeout_s": 180,
                    "lr": 1e-2},
        "train": {"colocate": True}})


def gpu_test_configs(model: Path) -> list[tuple[str, Any]]:
    """Every configuration this module's tests build (checked on CPU by tests/test_gpu_layout.py), by name."""
    return [("two_engines", gpu_config(model, 2, 1)), ("tensor_parallel", gpu_config(model, 1, 2))]


#: GPUs each configuration of ``gpu_test_configs`` needs (the tests skip with fewer).
GPUS_NEEDED = {"two_engines": 3, "tensor_parallel": 3}


def _run_sync(ray_cluster: object, tiny: Path, engines: int, tp: int) -> None:
    import ray

    with placed_learner_and_engines(gpu_config(tiny, engines, tp)) as (learner, engs):
        ray.get(learner.step.remote(random_groups(1)))
        rep = ray.get(learner.sync.remote(engs), timeout=300)
        assert rep["engines"] == engines and rep["version"] == 1
        assert [ray.get(e.weight_version.remote()) for e in engs] == [1] * engines
        seq = [1, 20, 30, 40, 50, 60]
        scores = [ray.get(e.score.remote([seq]))[0] for e in engs]
        for s in scores[1:]:  # every engine holds the same new weights
            assert max(abs(a - b) for a, b in zip(scores[0], s, strict=True)) < 1e-3


def test_two_engines_sync_over_nccl_with_distinct_ranks(ray_cluster: object, tiny: Path) -> None:
    if _gpus() < 3:
        pytest.skip("needs 3 GPUs: the learner and two engines (NCCL ranks on distinct GPUs)")
    _run_sync(ray_cluster, tiny, engines=2, tp=1)


def test_tensor_parallel_engine_in_its_bundles_syncs_over_nccl(ray_cluster: object, tiny: Path) -> None:
    if _gpus() < 3:
        pytest.skip("needs 3 GPUs: the learner and a 2-GPU tensor-parallel engine")
    _run_sync(ray_cluster, tiny, engines=1, tp=2)
