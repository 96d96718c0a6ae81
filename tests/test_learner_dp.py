"""The data-parallel learner (``learner.data_parallel``): 2 learner actors in one gloo group on a real local Ray.

On the same batches, the 2-rank group's step equals the single actor's: the same loss and metrics, and
updated weights within ``WEIGHT_TOL`` (fp32; only the order of floating-point sums differs: each rank
sums its share's gradients, the ranks' sums are then added). A checkpoint written by the group and
loaded into a fresh 2-rank group takes the same next step as the uninterrupted group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from grpo_helpers import random_groups

from actors.learner_group import LearnerGroup, create_learner_group, learner_handles
from dreamgym.config import DreamGymConfig, LearnerConfig
from dreamgym.models import build_tiny_model
from dreamgym.placement import plan_placement
from learner.data_parallel import shard

#: Max abs difference of any updated weight (fp32, lr 1e-3; seen: 8.4e-6). The gradients differ only by the
#: order of floating-point sums (ulps), but AdamW divides by ``sqrt(v) + eps``, which magnifies ulps of the
#: gradients that are near zero; still 20x below the step's own change (up to 2e-3 per weight).
WEIGHT_TOL = 1e-4
#: Tolerances of the loss and the other batch metrics (the second mini-batch's loss is computed after the
#: first AdamW step, so it inherits the weights' difference: seen 6e-8 on a loss of 6e-3).
METRIC_RTOL, METRIC_ATOL = 1e-5, 1e-6


def _cfg(model: Path, data_parallel: int) -> DreamGymConfig:
    # Two mini-batches and a small micro-batch budget: shuffled parts, learner pi_old and several micro-batches
    # per rank all take part. One torch thread and a quarter CPU per actor (the test machine has two cores).
    return DreamGymConfig.model_validate({
        "policy": {"model": str(model)},
        "learner": {"device": "cpu", "lr": 1e-3, "mini_batches": 2, "micro_batch_tokens": 64, "threads": 1,
                    "num_cpus": 0.25, "data_parallel": data_parallel, "dist_timeout_s": 120},
    })


def _params(handle: Any) -> dict[str, torch.Tensor]:
    return ray.get(handle.parameters.remote())


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_same_step(one: dict[str, float], two: dict[str, float]) -> None:
    for key in ("loss", "grad_norm", "clip_frac", "ratio_mean", "kl_old", "policy_tokens", "processed_tokens",
                "optimizer_steps", "version", "samples", "sequences"):
        assert two[key] == pytest.approx(one[key], rel=METRIC_RTOL, abs=METRIC_ATOL), key


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def test_shard_is_a_balanced_partition() -> None:
    lengths = [9, 3, 7, 7, 1, 12, 5]
    shares = [shard(lengths, r, 3) for r in range(3)]
    assert sorted(i for s in shares for i in s) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(lengths)
    assert shard([4], 1, 2) == []  # fewer sequences than ranks: an empty share


def test_placement_counts_every_rank() -> None:
    cfg = DreamGymConfig.model_validate({"learner": {"data_parallel": 3, "num_cpus": 2, "num_gpus": 1}})
    assert [(a.index, a.cpus, a.gpus) for a in plan_placement(cfg).role("learner")] == [(0, 2, 1), (1, 2, 1), (2, 2, 1)]
    cfg = DreamGymConfig.model_validate({"learner": {"data_parallel": 2, "num_gpus": 1},
                                         "policy": {"num_engines": 1, "engine": {"device": "cuda", "num_gpus": 1}},
                                         "train": {"colocate": True}})
    plan = plan_placement(cfg)
    assert [a.bundles for a in plan.role("learner")] == [(0,), (1,)]
    assert plan.role("policy-engine")[0].bundles == (2,)
    assert plan.group("colocated").gpus == 3 == plan.total_gpus


def test_config_refuses_what_is_not_data_parallel_yet() -> None:
    with pytest.raises(ValueError, match="grpo"):
        LearnerConfig(algorithm="ppo", data_parallel=2)


@pytest.mark.ray
@pytest.mark.slow
def test_two_ranks_match_one_actor_and_resume(ray_cluster, tiny: Path, tmp_path: Path) -> None:
    batch1, batch2 = random_groups(0, n_groups=4), random_groups(1, n_groups=4)
    single = create_learner_group(_cfg(tiny, 1))
    group = create_learner_group(_cfg(tiny, 2))
    resumed = None
    try:
        assert not isinstance(single, LearnerGroup) and isinstance(group, LearnerGroup)
        infos = [ray.get(h.info.remote()) for h in group.handles]
        assert [(i["rank"], i["world_size"]) for i in infos] == [(0, 2), (1, 2)]
        before = _params(single)
        assert _max_diff(before, _params(group.handles[0])) == 0.0

        # Step 1 on the same batch: same loss, same weights (and the two replicas equal).
        m1, g1 = ray.get(single.step.remote(batch1)), ray.get(group.step.remote(batch1))
        _assert_same_step(m1, g1)
        w1, r0, r1 = _params(single), _params(group.handles[0]), _params(group.handles[1])
        moved = _max_diff(before, w1)
        diff1 = _max_diff(w1, r0)
        print(f"step 1: loss {m1['loss']:.8f} vs {g1['loss']:.8f}, max |dw| single vs group {diff1:.3g} "
              f"(the step moved weights by up to {moved:.3g}), rank 0 vs 1 {_max_diff(r0, r1):.3g}")
        assert moved > 10 * WEIGHT_TOL and diff1 < WEIGHT_TOL and _max_diff(r0, r1) == 0.0

        # The group checkpoints (rank 0 writes), then both take step 2.
        ckpt = Path(ray.get(group.save_checkpoint.remote(str(tmp_path / "checkpoints" / "step-000001"))))
        assert (ckpt / "learner.json").is_file()
        m2, g2 = ray.get(single.step.remote(batch2)), ray.get(group.step.remote(batch2))
        _assert_same_step(m2, g2)
        w2, r0 = _params(single), _params(group.handles[0])
        diff2 = _max_diff(w2, r0)
        print(f"step 2: loss {m2['loss']:.8f} vs {g2['loss']:.8f}, max |dw| single vs group {diff2:.3g}")
        assert diff2 < WEIGHT_TOL

        # A fresh 2-rank group resumed from the checkpoint takes the same step 2 as the uninterrupted group.
        for h in learner_handles(single):
            ray.kill(h)
        single = None
        resumed = create_learner_group(_cfg(tiny, 2), ckpt)
        assert int(ray.get(resumed.version.remote())) == 1
        rg2 = ray.get(resumed.step.remote(batch2))
        _assert_same_step(g2, rg2)
        rw = [_params(h) for h in resumed.handles]
        diff3 = _max_diff(r0, rw[0])
        print(f"resume: loss {g2['loss']:.8f} vs {rg2['loss']:.8f}, max |dw| uninterrupted vs resumed {diff3:.3g}, "
              f"resumed rank 0 vs 1 {_max_diff(rw[0], rw[1]):.3g}")
        assert diff3 < WEIGHT_TOL and _max_diff(rw[0], rw[1]) == 0.0
    finally:
        for h in [*learner_handles(single), *learner_handles(group), *learner_handles(resumed)]:
            ray.kill(h)


def test_a_group_that_does_not_form_fails_in_bounded_time() -> None:
    """Rank 0 alone (rank 1 never comes): a clear error after ``timeout_s``, not a hang."""
    import socket
    import time

    import torch.distributed as dist

    from learner.data_parallel import init_group

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 0/2: the gloo group at 127\.0\.0\.1:\d+ did not form within"):
        init_group("127.0.0.1", port, 0, 2, "gloo", timeout_s=3.0)
    assert time.monotonic() - t0 < 60 and not dist.is_initialized()
