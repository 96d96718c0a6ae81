"""The GPU layout, checked on CPU (issue 31): which weight sync a layout gets, the configurations the ``gpu``-marked
tests and ``scripts/gpu-check.sh`` build, and the per-GPU memory plan of ``train --dry-run``. Pure: no Ray, no
engine, no GPU; what only a GPU shows stays with ``scripts/gpu-check.sh``."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from dreamgym.config import DreamGymConfig, load_config
from dreamgym.errors import ConfigError
from dreamgym.memory_plan import context_problems
from dreamgym.models import build_tiny_model
from dreamgym.placement import choose_weight_sync, plan_placement

TESTS = Path(__file__).parent

# (requested, engine device, learner device, learner GPUs, engine GPUs) -> chosen, or the refusal's reason
WEIGHT_SYNC_TABLE = [
    (("auto", "cpu", "cpu", 0.0, 1.0), "object_store"),
    (("auto", "cpu", "cuda", 1.0, 1.0), "object_store"),
    (("nccl", "cpu", "cuda", 1.0, 1.0), "policy engines run on 'cpu'"),
    (("auto", "cuda", "cpu", 0.0, 1.0), "object_store"),
    (("auto", "cuda", "auto", 0.0, 1.0), "object_store"),  # no GPU reserved: the learner actor sees none
    (("nccl", "cuda", "cpu", 0.0, 1.0), "the learner has no GPU"),
    (("nccl", "cuda", "cuda", 0.0, 1.0), "the learner reserves no GPU"),
    (("auto", "cuda", "cuda", 0.3, 0.3), "object_store"),  # fractions: Ray may pack them onto one GPU
    (("nccl", "cuda", "cuda", 0.3, 0.3), "NCCL refuses two ranks on one device"),
    (("auto", "cuda", "cuda", 1.0, 0.5), "nccl"),  # a whole GPU for the learner: nothing shares it
    (("auto", "cuda", "cuda", 0.5, 1.0), "nccl"),
    (("auto", "cuda", "auto", 1.0, 1.0), "nccl"),
    (("object_store", "cuda", "cuda", 1.0, 1.0), "object_store"),
    (("object_store", "cuda", "cuda", 0.3, 0.3), "object_store"),
]


@pytest.mark.parametrize(("args", "expected"), WEIGHT_SYNC_TABLE)
def test_weight_sync_choice_table(args: tuple, expected: str) -> None:
    if expected in ("object_store", "nccl"):
        assert choose_weight_sync(*args) == expected
    else:
        with pytest.raises(ConfigError, match=expected):
            choose_weight_sync(*args)


def test_auto_does_not_pick_nccl_for_a_learner_sharing_the_engines_gpu_and_explicit_nccl_is_refused() -> None:
    """Issue 31, defect 6: ``auto`` picked NCCL whenever the engines were on CUDA."""
    from actors.weight_sync import sync_backend

    shared = {"policy": {"engine": {"device": "cuda", "num_gpus": 0.3}}, "learner": {"device": "cuda", "num_gpus": 0.3}}
    assert sync_backend(load_config(None, shared)) == "object_store"
    no_gpu = {"policy": {"engine": {"device": "cuda"}}, "learner": {"device": "auto", "num_gpus": 0}}
    assert sync_backend(load_config(None, no_gpu)) == "object_store"
    own = {"policy": {"engine": {"device": "cuda"}}, "learner": {"device": "cuda", "num_gpus": 1}}
    assert sync_backend(load_config(None, own)) == "nccl"
    with pytest.raises(ConfigError, match=r"learner.weight_sync 'nccl' cannot work: .*fractions of a GPU"):
        load_config(None, {**shared, "learner": {**shared["learner"], "weight_sync": "nccl"}})


# -- every gpu-marked test's configuration, built here (issue 31, defect 3) -----------------------------------------
def gpu_test_modules() -> list[str]:
    """The test modules marked ``gpu`` (skipped on a machine without CUDA, so only this test sees them here)."""
    return sorted(p.stem for p in TESTS.glob("test_*.py") if re.search(r"pytest\.mark\.gpu\b", p.read_text()))


def test_every_gpu_test_configuration_builds_fits_its_model_and_places(tmp_path: Path) -> None:
    """Each ``gpu``-marked module exposes ``gpu_test_configs(model)``: the configurations its tests build. They are
    validated here on CPU, their engines checked against the tiny model's context, and the run configurations
    placed on the GPUs the tests ask for, so a GPU test cannot rot unseen (``test_gpu_learner`` passed fields
    ``PolicyConfig`` had stopped accepting)."""
    tiny = build_tiny_model(tmp_path / "tiny", num_heads=4, num_kv_heads=2, seed=0)
    modules = gpu_test_modules()
    assert {"test_gpu_learner", "test_gpu_placement"} <= set(modules)
    for name in modules:
        mod = importlib.import_module(name)
        assert hasattr(mod, "gpu_test_configs"), f"{name} is marked gpu but has no gpu_test_configs(model)"
        for label, cfg in mod.gpu_test_configs(tiny):
            assert context_problems(cfg) == [], f"{name}:{label}"
            if isinstance(cfg, DreamGymConfig):
                gpus = getattr(mod, "GPUS_NEEDED", {}).get(label, 1)
                assert plan_placement(cfg).problems(cluster_gpus=gpus, node_gpus=gpus) == [], f"{name}:{label}"
