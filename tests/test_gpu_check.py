"""``scripts/gpu-check.sh``: on this CPU machine ``--torch-only`` says it skipped (exit code 77, ``skipped: no
CUDA`` in its summary), and its checks themselves run on the CPU (``--allow-cpu``) and pass, so the script a GPU
machine runs is tested code. What only a GPU shows (CUDA kernels, bf16 on CUDA, NCCL) stays for that machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(out: Path, *args: str) -> tuple[int, dict]:
    env = {**os.environ, "OUT": str(out), "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), *args], capture_output=True, text=True,
                       env=env, timeout=600, cwd=REPO)
    summary = json.loads((out / "summary.json").read_text())
    return r.returncode, summary


def test_torch_only_without_cuda_says_skipped(tmp_path: Path) -> None:
    code, s = _run(tmp_path / "out", "--torch-only")
    assert code == 77 and s["status"] == "skipped: no CUDA" and s["exit_code"] == 77
    assert s["mode"] == "torch-only" and s["versions"]["torch"] and s["versions"]["python"]
    assert s["imported_ray_or_vllm"] == []


@pytest.mark.slow
def test_torch_only_checks_pass_on_cpu(tmp_path: Path) -> None:
    code, s = _run(tmp_path / "out", "--torch-only", "--allow-cpu")
    assert code == 0, s
    c = s["checks"]
    assert set(c) == {"logprobs", "grpo_step_bf16", "checkpoint_resume", "data_parallel"}
    assert c["data_parallel"]["backend"] == "gloo" and c["data_parallel"]["max_weight_diff"] <= 1e-4
    assert c["logprobs"]["max_abs_diff_float32"] <= 1e-3 and c["grpo_step_bf16"]["version"] == 1
    assert c["checkpoint_resume"]["max_param_diff"] == 0.0
    assert all(isinstance(r["seconds"], float) for r in c.values())
    assert s["imported_ray_or_vllm"] == []  # the torch-only path needs neither


def test_full_mode_train_command_fits_the_gpus_it_finds() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    from dreamgym.config import load_config
    from dreamgym.memory_plan import context_problems, plan_memory
    from dreamgym.placement import plan_placement
    from dreamgym.sync_choice import sleeps_engines, weight_sync_of

    for gpus, sync in ((1, "ipc"), (2, "object_store"), (4, "nccl")):
        cmd = gpu_check.train_command(Path("/tmp/x"), gpus)
        cfg = load_config(None, cmd[cmd.index("train") + 1:])
        assert cfg.train.iterations == 3 and weight_sync_of(cfg) == sync
        assert sleeps_engines(cfg) is (gpus == 1)  # one GPU: the colocated layout, the engine asleep in each step
        plan = plan_placement(cfg)
        assert plan.problems(16, gpus, gpus) == []
        # issue 31, defect 2: every engine fits its model's context (the replicas asked 4096 of the tiny model's 2048)
        assert context_problems(cfg) == [], gpus
        memory = plan_memory(cfg, plan, gpus, gpu_gib=24.0)  # the smallest GPU it should pass on
        assert memory.problems() == [] and memory.not_planned == [], memory.table()
