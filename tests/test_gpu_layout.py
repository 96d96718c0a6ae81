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
from dreamgym.placement import plan_placement
from dreamgym.sync_choice import Colocation, choose_weight_sync, sleeps_engines, weight_sync_of

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


# The one-GPU colocated layout (CUDA IPC): one learner rank and one engine in one bundle of one GPU
ONE_GPU = Colocation(colocated=True)
WEIGHT_SYNC_TABLE += [
    (("auto", "cuda", "cuda", 0.5, 0.5, ONE_GPU), "ipc"),
    (("ipc", "cuda", "cuda", 0.5, 0.5, ONE_GPU), "ipc"),
    (("auto", "cuda", "cuda", 0.5, 0.5, Colocation()), "object_store"),  # fractions, not colocated: maybe two GPUs
    (("ipc", "cuda", "cuda", 0.5, 0.5, Colocation()), "share a GPU only with train.colocate true"),
    (("auto", "cuda", "cuda", 1.0, 1.0, ONE_GPU), "nccl"),  # colocated on a node, a GPU each
    (("ipc", "cuda", "cuda", 1.0, 1.0, ONE_GPU), r"num_gpus 1 \+ policy.engine.num_gpus 1 is more than one GPU"),
    (("ipc", "cpu", "cpu", 0.0, 1.0, ONE_GPU), "CUDA IPC needs the policy engine and the learner on a CUDA GPU"),
    (("ipc", "cuda", "cuda", 0.5, 0.5, Colocation(True, engines=2)), "policy.num_engines 2"),
    (("ipc", "cuda", "cuda", 0.5, 0.5, Colocation(True, learner_ranks=2)), "learner.data_parallel 2"),
    (("ipc", "cuda", "cuda", 0.5, 0.5, Colocation(True, max_staleness=1)), "train.max_staleness 1; set 0"),
    (("auto", "cuda", "cuda", 0.5, 0.5, Colocation(True, max_staleness=1)), "object_store"),
]


@pytest.mark.parametrize(("args", "expected"), WEIGHT_SYNC_TABLE)
def test_weight_sync_choice_table(args: tuple, expected: str) -> None:
    if expected in ("object_store", "nccl", "ipc"):
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


def test_one_gpu_colocated_layout_shares_one_bundle_and_sleeps_the_engine() -> None:
    """The commonest first GPU run: one GPU for the learner and the policy engine. ``auto`` picks CUDA IPC, both
    actors sit in one bundle (one device), the engine sleeps during learner steps, and the memory plan puts both
    on GPU 0; settings that contradict it are refused with the reason."""
    from dreamgym.memory_plan import plan_memory

    one_gpu = {"policy": {"engine": {"device": "cuda", "num_gpus": 0.5, "gpu_memory_utilization": 0.4}},
               "learner": {"device": "cuda", "num_gpus": 0.5}, "train": {"mode": "real", "colocate": True}}
    cfg = load_config(None, one_gpu)
    assert weight_sync_of(cfg) == "ipc" and sleeps_engines(cfg)
    plan = plan_placement(cfg)
    (group,) = plan.groups
    assert group.name == "colocated" and len(group.bundles) == 1 and group.bundles[0].gpus == 1.0
    assert [(a.role, a.bundles) for a in plan.actors if a.group] == [("learner", (0,)), ("policy-engine", (0,))]
    assert plan.problems(cluster_gpus=1, node_gpus=1) == []
    memory = plan_memory(cfg, plan, 1, 80)
    assert [h.actor for h in memory.gpus[0].holdings] == ["learner-0", "policy-engine-0"]
    with pytest.raises(ConfigError, match=r"train.sleep_engines false with learner.weight_sync 'ipc'"):
        load_config(None, {**one_gpu, "train": {**one_gpu["train"], "sleep_engines": False}})
    with pytest.raises(ConfigError, match=r"train.sleep_engines: a sleeping policy engine cannot serve rollouts"):
        load_config(None, {"train": {"sleep_engines": True, "max_staleness": 1}})
    with pytest.raises(ConfigError, match=r"learner.weight_sync 'ipc' .* share a GPU only with train.colocate true"):
        load_config(None, {**one_gpu, "learner": {**one_gpu["learner"], "weight_sync": "ipc"},
                           "train": {"mode": "real"}})
    # Not colocated, or a GPU each: no IPC, no sleep (unless asked for)
    assert weight_sync_of(load_config(None, {**one_gpu, "train": {"mode": "real"}})) == "object_store"
    whole = load_config(None, {**one_gpu, "policy": {"engine": {"device": "cuda", "num_gpus": 1}},
                               "learner": {"device": "cuda", "num_gpus": 1}})
    assert weight_sync_of(whole) == "nccl" and not sleeps_engines(whole)


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


# -- the memory plan of train --dry-run (issue 31, defect 8) ---------------------------------------------------------
#: Qwen2.5-3B-Instruct's published config.json (the sizes only); 3.09 B parameters.
QWEN25_3B = {"model_type": "qwen2", "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
             "num_key_value_heads": 2, "intermediate_size": 11008, "vocab_size": 151936, "tie_word_embeddings": True,
             "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


def _model_folder(tmp_path: Path, cfg: dict) -> Path:
    """A model folder with a config.json only: the plan reads no weights."""
    import json

    folder = tmp_path / "qwen2.5-3b"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _layout(model: Path, gpus_each: float, **learner: object) -> DreamGymConfig:
    return load_config(None, {
        "policy": {"model": str(model), "engine": {"device": "cuda", "dtype": "bfloat16", "max_model_len": 8192,
                                                   "gpu_memory_utilization": 0.85, "num_gpus": gpus_each}},
        "learner": {"device": "cuda", "num_gpus": gpus_each, "precision": "bf16-autocast", **learner},
        "train": {"mode": "real"}})


def test_parameter_count_from_config_matches_the_published_size() -> None:
    from dreamgym.model_facts import facts_from_config

    assert abs(facts_from_config(QWEN25_3B).params / 1e9 - 3.09) < 0.01


def test_dry_run_prints_memory_per_gpu_and_refuses_a_plan_that_does_not_fit(tmp_path: Path, capsys) -> None:
    from dreamgym.commands.train import dry_run

    model = _model_folder(tmp_path, QWEN25_3B)
    # Fits: the learner and the engine on GPUs of their own (3B: fp32 weights + grads + AdamW ~46 GiB).
    assert dry_run(_layout(model, 1.0), 16, 2, 2, 80) == 0
    out = capsys.readouterr().out
    assert "GPU 0: " in out and "GPU 1: " in out and "AdamW fp32 23.0" in out and "bfloat16 sync copy 5.7" in out
    assert "gpu_memory_utilization 0.85 x 80" in out
    # Does not fit: both on one GPU (fractions are packed), 46.5 + 0.85 x 80 = 114.5 GiB on an 80 GiB GPU.
    assert dry_run(_layout(model, 0.5), 16, 1, 1, 80) == 2
    out = capsys.readouterr().out
    assert re.search(r"GPU 0 holds learner-0 46\.5 \+ policy-engine-0 68\.0 = 114\.5 GiB, more than its 80 GiB", out)
    # An engine whose budget leaves no room for one max_model_len sequence is refused with its arithmetic.
    tight = _layout(model, 1.0).model_copy(deep=True)
    tight.policy.engine.gpu_memory_utilization = 0.08
    assert dry_run(tight, 16, 2, 2, 80) == 2
    assert ("0.08 x 80 GiB = 6.4 GiB, less the bfloat16 weights 5.7 GiB and 1 GiB reserve, leaves -0.35 GiB of KV "
            "cache, less than one sequence of max_model_len 8192 (0.28 GiB)") in capsys.readouterr().out


def test_dry_run_plans_the_experience_model_fine_tune_that_runs_before_the_actors(tmp_path: Path, capsys) -> None:
    """A synthetic run fine-tunes the experience model first, on the learner's ranks: ``--dry-run`` shows that
    placement and its memory per GPU, and refuses it when one rank does not fit its GPU."""
    from dreamgym.commands.train import dry_run

    model = _model_folder(tmp_path, QWEN25_3B)

    def synthetic(method: str, gpu_memory_utilization: float) -> DreamGymConfig:
        engine = {"device": "cuda", "dtype": "bfloat16", "max_model_len": 8192,
                  "gpu_memory_utilization": gpu_memory_utilization}
        return load_config(None, {
            "policy": {"model": str(model), "engine": engine},
            "learner": {"device": "cuda", "num_gpus": 1, "data_parallel": 2, "precision": "bf16-autocast",
                        "lora": {"enabled": True}},
            "experience_model": {"model": str(model), "backend": "ray", "engine": engine,
                                 "train": {"base": str(model), "device": "cuda", "method": method}},
            "train": {"mode": "synthetic", "experience_sft": True}})

    cfg = synthetic("lora", 0.85)
    assert dry_run(cfg, 32, 8, 8, 80) == 0
    out = capsys.readouterr().out
    sft = out[out.index("before the run, the experience-model fine-tune"):]
    assert re.search(r"experience-sft\s+2\s+", sft), sft  # one rank per learner rank
    assert "experience-sft-0: " in sft and "experience-sft-1: " in sft and "(LoRA)" in sft
    # A full fine-tune of 3B (fp32 weights + grads + AdamW, ~46.5 GiB) does not fit a 40 GiB GPU.
    assert dry_run(synthetic("full", 0.5), 32, 8, 8, 40) == 2
    assert re.search(r"experience-model fine-tune: GPU 0 holds experience-sft-0 46\.5 = 46\.5 GiB, more than its "
                     r"40 GiB", capsys.readouterr().out)


# -- roles sharing a GPU start one after another (issue 31, defect 5) ------------------------------------------------
def test_processes_that_may_share_a_gpu_start_one_by_one_and_two_engines_that_cannot_fit_are_refused() -> None:
    """gpu-check's one- and two-GPU runs share GPUs (fractions: engines, replica and learner start one by one in
    ``actors.train_setup``); with a GPU each they start together. Two engines whose budgets add up past one GPU
    are refused by the memory plan, with the sum."""
    import sys

    from dreamgym.memory_plan import plan_memory
    from dreamgym.placement import shares_gpus

    sys.path.insert(0, str(TESTS.parent / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    for gpus, shared in ((1, True), (2, True), (4, False)):
        cmd = gpu_check.train_command(Path("/tmp/x"), gpus)
        assert shares_gpus(plan_placement(load_config(None, cmd[cmd.index("train") + 1:]))) is shared, gpus
    assert not shares_gpus(plan_placement(load_config(None, {})))  # CPU engines reserve no GPU
    two = load_config(None, {"policy": {"model": "tiny", "num_engines": 2, "engine": {
        "device": "cuda", "num_gpus": 0.5, "gpu_memory_utilization": 0.6}}, "learner": {"device": "cpu"},
        "train": {"mode": "real"}})
    plan = plan_placement(two)
    assert shares_gpus(plan)
    problems = plan_memory(two, plan, 1, gpu_gib=80).problems()
    assert problems == ["GPU 0 holds policy-engine-0 48.0 + policy-engine-1 48.0 = 96.0 GiB, more than its 80 GiB"]
