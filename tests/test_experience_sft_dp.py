"""The experience-model fine-tune on the learner's ranks (``train.experience_sft`` with ``learner.data_parallel``).

Through ``actors.train_setup.experience_sft`` on a real local Ray: 2 rank actors in one gloo group take the same
steps as one process on the same examples: the same losses, and saved weights within the learner test's
``WEIGHT_TOL`` (only the order of floating-point sums differs: each rank sums its share's gradients, the ranks'
sums are then added).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from experience_data import HALL, KITCHEN, toy_row, write_toy
from test_learner_dp import METRIC_ATOL, METRIC_RTOL, WEIGHT_TOL

from dreamgym.config import DreamGymConfig, load_config, validate_config
from dreamgym.models import build_tiny_model
from dreamgym.placement import experience_sft_plan

REPO = Path(__file__).resolve().parents[1]
GARDEN = "You are in the garden. A coin lies on the grass."


def _cfg(base: Path, data_parallel: int, **train: Any) -> DreamGymConfig:
    # Full fine-tune, lr 1e-3 (as the learner test), 3 steps of 3 examples: shares of 2 and 1 examples, so the
    # ranks run different numbers of micro-batches. Word-overlap retrieval: no encoder to load. One torch thread
    # and a quarter CPU per rank (the test machine has two cores).
    return validate_config({
        "env": {"max_steps": 6},
        "experience_model": {"top_k": 1, "history_steps": 1, "train": {
            "base": str(base), "method": "full", "lr": 1e-3, "batch_size": 3, "epochs": 2,
            "max_steps": 3, "micro_batch_tokens": 64,
            "retrieval": "overlap", **train}},
        "learner": {"device": "cpu", "threads": 1, "num_cpus": 0.25, "data_parallel": data_parallel,
                    "dist_timeout_s": 120},
    })


def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_the_fine_tune_has_the_learners_ranks_and_placement() -> None:
    cfg = DreamGymConfig.model_validate({"learner": {"data_parallel": 3, "num_cpus": 2, "num_gpus": 1},
                                         "experience_model": {"train": {"device": "cuda"}},
                                         "train": {"colocate": True}})
    plan = experience_sft_plan(cfg)
    assert [(a.index, a.cpus, a.gpus, a.group, a.bundles) for a in plan.actors] == [
        (r, 2, 1, "experience-sft", (r,)) for r in range(3)]
    assert plan.group("experience-sft").strategy == "STRICT_PACK" and plan.total_gpus == 3
    # One rank, a CPU learner: one actor with its own reservation; a CUDA fine-tune asks for at least one GPU.
    one = experience_sft_plan(DreamGymConfig.model_validate({"experience_model": {"train": {"device": "cuda"}}}))
    assert [(a.cpus, a.gpus, a.group) for a in one.actors] == [(1, 1, None)] and not one.groups


@pytest.mark.parametrize(("name", "ranks"), [("study-gpu.yaml", 1), ("gpu-cluster.yaml", 4)])
def test_the_gpu_configs_fine_tune_their_experience_model_on_the_learners_gpus(name: str, ranks: int) -> None:
    cfg = load_config(REPO / "configs" / name)
    t = cfg.experience_model.train
    assert cfg.train.experience_sft and t.device == "cuda" and t.method == "lora"
    assert t.base == cfg.experience_model.model  # the served model is the one fine-tuned
    plan = experience_sft_plan(cfg)
    assert [a.gpus for a in plan.actors] == [1.0] * ranks == [cfg.learner.num_gpus] * cfg.learner.data_parallel
    assert plan.problems(node_gpus=8) == []  # a multi-rank fine-tune packed on the 8-GPU node


@pytest.mark.slow
def test_two_ranks_fine_tune_as_one_process(ray_cluster, tmp_path: Path) -> None:
    from actors.train_setup import experience_sft

    rows = [toy_row("e0", 0, HALL, "go north", KITCHEN, 0.0, False, False),
            toy_row("e0", 1, KITCHEN, "go east", GARDEN, 0.0, False, False),
            toy_row("e0", 2, GARDEN, "take coin", GARDEN + " You have the coin.", 1.0, True, True),
            toy_row("e1", 0, HALL, "look", HALL, 0.0, False, False),
            toy_row("e1", 1, HALL, "go north", KITCHEN, 0.0, False, False),
            toy_row("e2", 0, HALL, "go west", "You cannot go that way. " + HALL, 0.0, False, False)]
    data = write_toy(tmp_path / "offline.parquet", rows)
    base = build_tiny_model(tmp_path / "tiny", seed=0)
    lines: list[str] = []
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = experience_sft(_cfg(base, 1), data, tmp_path / "one", lines.append)
    two = experience_sft(_cfg(base, 2), data, tmp_path / "two", lines.append)
    assert "on 2 data-parallel ranks" in lines[-1]

    s1, s2 = (json.loads((d / "dreamgym_sft.json").read_text()) for d in (one, two))
    assert (s1["summary"]["data_parallel"], s2["summary"]["data_parallel"]) == (1, 2)
    assert s1["summary"]["examples"] == s2["summary"]["examples"] == 6 and s2["summary"]["steps"] == 3
    for h1, h2 in zip(s1["history"], s2["history"], strict=True):
        for key in ("loss", "reasoning_nll", "state_nll"):
            assert h2[key] == pytest.approx(h1[key], rel=METRIC_RTOL, abs=METRIC_ATOL), (h1["step"], key)

    w0, w1, w2 = _weights(base), _weights(one), _weights(two)
    moved, diff = _max_diff(w0, w1), _max_diff(w1, w2)
    print(f"loss {s1['history'][-1]['loss']:.8f} vs {s2['history'][-1]['loss']:.8f}; max |dw| one process vs "
          f"2 ranks {diff:.3g} (the fine-tune moved weights by up to {moved:.3g})")
    assert moved > 10 * WEIGHT_TOL and diff < WEIGHT_TOL
    # Rank 0 alone wrote the model and the progress file (one record per step).
    assert len((tmp_path / "two" / "experience_sft.jsonl").read_text().splitlines()) == 3
