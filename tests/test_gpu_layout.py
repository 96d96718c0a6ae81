"""The GPU layout, checked on CPU (issue 31): which weight sync a layout gets, the configurations the ``gpu``-marked
tests and ``scripts/gpu-check.sh`` build, and the per-GPU memory plan of ``train --dry-run``. Pure: no Ray, no
engine, no GPU; what only a GPU shows stays with ``scripts/gpu-check.sh``."""

from __future__ import annotations

import pytest

from dreamgym.config import load_config
from dreamgym.errors import ConfigError
from dreamgym.placement import choose_weight_sync

# (requested, engine device, learner device, learner GPUs, engine GPUs) -> chosen, or the refusal's reason
WEIGHT_SYNC_TABLE = [
    (("auto", "cpu", "cpu", 0.0, 1.0), "object_store"),
    (("auto", "cpu", "cuda", 1.0, 1.0), "object_store"),
    (("nccl", "cpu", "cuda", 1.0, 1.0), "policy engines run on 'cpu'"),
    (("auto", "cuda", "cpu", 0.0, 1.0), "object_store"),
    (("auto", "cuda", "auto", 0.0, 1.0), "object_store"),  # no GPU reserved: the learner actor sees none
    (("nccl", "cuda", "cpu", 0.0, 1.0), "the learner has no GPU"),
    (("nccl", "cuda", "cuda", 0.0, 1.0), "the learner has no GPU"),
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
