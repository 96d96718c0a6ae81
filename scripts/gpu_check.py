"""The GPU checks of ``scripts/gpu-check.sh`` (run it through the shell script; see its header).

``--torch-only``: the learner's CUDA paths on a tiny random Llama built here, needing CUDA PyTorch and the
learner's own Python dependencies (transformers, tokenizers, safetensors, pydantic, PyYAML) but no vLLM, no Ray
and no network:

- ``logprobs``: teacher-forced log-probs on CUDA (fp32 and bf16 autocast) against a CPU fp32 reference;
- ``grpo_step_bf16``: one GRPO step with bf16 autocast (fp32 master weights) moves the weights;
- ``checkpoint_resume``: save after one step, take two more; a learner resumed from the checkpoint takes the same
  two steps bit for bit (deterministic algorithms on);
- ``data_parallel``: two learner ranks in one process group (NCCL with a GPU each; gloo sharing one GPU) take
  the same GRPO step as one learner (loss and weights within 1e-5 / 1e-4).

Without ``--torch-only`` it then runs the ``gpu``-marked tests (``pytest -m gpu``) and a 3-iteration
``dreamgym train`` with CUDA engines and learner, each as a subprocess with a time limit.

It writes ``<out>/summary.json``: status, versions (Python, torch, CUDA, driver, GPU), per check pass/fail,
seconds and the measured differences. Exit codes: 0 all passed, 1 a check failed, 2 a dependency is missing,
77 skipped (no CUDA; the summary's status says ``skipped: no CUDA``). ``--allow-cpu`` runs the torch checks on
the CPU instead (the project's own test of this script).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXIT_OK, EXIT_FAILED, EXIT_MISSING, EXIT_SKIPPED = 0, 1, 2, 77
#: Python packages the torch-only checks import (the learner's own dependencies).
TORCH_ONLY_DEPS = ("torch", "transformers", "tokenizers", "safetensors", "pydantic", "yaml")
#: fp32 CUDA log-probs against the CPU fp32 reference (TF32 off); bf16 autocast is reported, bounded loosely.
FP32_TOL, BF16_TOL = 1e-3, 0.5
MIN_DRIVER = 580  # vLLM 0.33's CUDA 13 wheels


def driver_version() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                       text=True, timeout=30)
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def versions() -> dict[str, Any]:
    v: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                         "driver": driver_version()}
    for mod in ("torch", "transformers", "tokenizers", "pydantic", "vllm", "ray"):
        try:
            m = importlib.import_module(mod) if mod in ("torch", "transformers", "tokenizers", "pydantic") else None
            if m is None:  # vLLM and Ray are not imported here: their presence only
                import importlib.metadata as md

                v[mod] = md.version(mod)
            else:
                v[mod] = getattr(m, "__version__", "?")
        except Exception:
            v[mod] = None
    try:
        import torch

        v["torch_cuda"] = torch.version.cuda
        v["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            v["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            v["bf16_supported"] = torch.cuda.is_bf16_supported()
    except Exception:
        pass
    return v


# -- the tiny model and GRPO groups -------------------------------------------------------------------------
def random_groups(seed: int) -> list[Any]:
    from dreamgym.token_groups import random_groups as groups

    return groups(seed)


def learner_cfg(device: str, precision: str) -> Any:
    from dreamgym.config import LearnerConfig

    return LearnerConfig(lr=1e-3, device=device, precision=precision, micro_batch_tokens=64)  # type: ignore[arg-type]


def params(learner: Any) -> dict[str, Any]:
    return {n: p.detach().float().cpu().clone() for n, p in learner.model.named_parameters()}


# -- the checks ---------------------------------------------------------------------------------------------------
def check_logprobs(model: Path, device: str) -> dict[str, Any]:
    from learner.learner import Learner

    rng = random.Random(0)
    seqs = [[1] + [rng.randrange(10, 200) for _ in range(rng.randrange(8, 40))] for _ in range(8)]
    ref = Learner(learner_cfg("cpu", "float32"), model, seed=0).sequence_logprobs(seqs)
    out: dict[str, Any] = {}
    for precision, tol in (("float32", FP32_TOL), ("bf16-autocast", BF16_TOL)):
        lp = Learner(learner_cfg(device, precision), model, seed=0).sequence_logprobs(seqs)
        diff = max(abs(a - b) for r, x in zip(ref, lp, strict=True) for a, b in zip(r, x, strict=True))
        out[f"max_abs_diff_{precision}"] = diff
        out[f"tolerance_{precision}"] = tol
    out["passed"] = all(out[f"max_abs_diff_{p}"] <= out[f"tolerance_{p}"] for p in ("float32", "bf16-autocast"))
    return out


def check_grpo_step(model: Path, device: str) -> dict[str, Any]:
    import math

    import torch

    from learner.learner import Learner

    learner = Learner(learner_cfg(device, "bf16-autocast"), model, seed=0)
    before = params(learner)
    m = learner.step(random_groups(0))
    after = params(learner)
    moved = max(float((after[n] - before[n]).abs().max()) for n in before)
    master = next(learner.model.parameters()).dtype
    out = {"loss": m.get("loss"), "grad_norm": m.get("grad_norm"), "version": m.get("version"),
           "max_weight_change": moved, "master_dtype": str(master), "tokens_per_s": m.get("tokens_per_s"),
           "device": str(next(learner.model.parameters()).device)}
    out["passed"] = (m.get("version") == 1 and math.isfinite(m.get("loss", math.nan)) and m.get("grad_norm", 0) > 0
                     and moved > 0 and master == torch.float32)
    return out


def check_resume(model: Path, device: str, work: Path) -> dict[str, Any]:
    import torch

    from learner.learner import Learner

    cfg = learner_cfg(device, "bf16-autocast")
    a = Learner(cfg, model, seed=3)
    a.step(random_groups(10))
    ckpt = a.save_checkpoint(work / "step-000001")
    ma = [a.step(random_groups(11)), a.step(random_groups(12))]
    pa = params(a)
    del a
    if device == "cuda":
        torch.cuda.empty_cache()
    b = Learner.from_checkpoint(cfg, ckpt)
    mb = [b.step(random_groups(11)), b.step(random_groups(12))]
    pb = params(b)
    diff = max(float((pa[n] - pb[n]).abs().max()) for n in pa)
    keys = ("loss", "grad_norm", "lr")
    metric_diff = max(abs(x[k] - y[k]) for x, y in zip(ma, mb, strict=True) for k in keys)
    return {"max_param_diff": diff, "max_metric_diff": metric_diff, "resumed_version": b.version.version,
            "passed": diff == 0.0 and metric_diff == 0.0 and b.version.version == 3}


def _data_parallel_rank(rank: int, world: int, port: int, model: Path, device: str, backend: str, own_gpu: bool,
                        results: Any) -> None:
    """One rank of ``check_data_parallel`` (a spawned process): join the group, take one GRPO step."""
    if own_gpu:  # before CUDA is initialised in this process: rank r sees only GPU r, as a Ray actor would
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    from learner.data_parallel import init_group
    from learner.learner import Learner

    try:
        init_group("127.0.0.1", port, rank, world, backend, 120.0)
        learner = Learner(learner_cfg(device, "float32").model_copy(update={"data_parallel": world}), model, seed=0)
        m = learner.step(random_groups(0))
        # numpy, pickled by value: a shared-memory tensor would not outlive this process
        weights = {n: t.numpy() for n, t in params(learner).items()} if rank == 0 else None
        results.put({"rank": rank, "loss": m["loss"], "params": weights})
    except Exception as e:
        results.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


def check_data_parallel(model: Path, device: str) -> dict[str, Any]:
    """Two learner ranks in one process group take the same GRPO step as one learner (fp32).

    With 2+ GPUs: NCCL, one GPU per rank (the cluster layout). With one GPU the two ranks share it over gloo
    (NCCL refuses two ranks on one device): the learner's data-parallel CUDA path (shares, bucketed gradient
    all-reduce of CUDA tensors, metric reduction) runs, NCCL itself does not."""
    import socket

    import torch
    import torch.multiprocessing as mp

    from learner.learner import Learner

    gpus = torch.cuda.device_count() if device == "cuda" else 0
    own_gpu = gpus >= 2
    backend = "nccl" if own_gpu else "gloo"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_data_parallel_rank, args=(r, 2, port, model, device, backend, own_gpu, results))
             for r in range(2)]
    for proc in procs:
        proc.start()
    got = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    errors = [g["error"] for g in got if "error" in g]
    if errors:
        return {"passed": False, "backend": backend, "error": "; ".join(errors)}
    one = Learner(learner_cfg(device, "float32"), model, seed=0)
    m = one.step(random_groups(0))
    ref = params(one)
    rank0 = next(g for g in got if g["rank"] == 0)
    weight_diff = max(float((torch.from_numpy(rank0["params"][n]) - ref[n]).abs().max()) for n in ref)
    loss_diff = max(abs(g["loss"] - m["loss"]) for g in got)
    out = {"backend": backend, "ranks": 2, "gpus": gpus, "loss_one_learner": m["loss"], "max_loss_diff": loss_diff,
           "max_weight_diff": weight_diff, "weight_tolerance": 1e-4}
    out["passed"] = loss_diff <= 1e-5 * max(1.0, abs(m["loss"])) and weight_diff <= 1e-4
    return out


def run_subprocess(cmd: list[str], timeout_s: float, log: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=REPO,
                               env={**os.environ, **(env or {})})
            rc: int | str = r.returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {timeout_s:g} s"
    tail = log.read_text(errors="replace")[-3000:]
    return {"command": " ".join(cmd), "returncode": rc, "log": str(log), "log_tail": tail,
            "seconds": round(time.perf_counter() - t0, 1), "passed": rc == 0}


def train_command(out: Path, gpus: int) -> list[str]:
    """A 3-iteration ``dreamgym train`` with CUDA engines and learner on the tiny model (s2r: synthesis and real).

    With 3+ GPUs: a whole GPU each and the NCCL weight sync (NCCL needs its ranks on distinct GPUs). With one GPU:
    the one-GPU colocated layout (the learner and the policy engine in one bundle, the engine asleep during each
    learner step, the weights by CUDA IPC), the experience-model replica beside them. With two the engines and the
    learner share the GPUs (fractional GPUs) and the weights go through the object store.
    """
    share = gpus < 3
    g = "0.3" if share else "1"
    one_gpu = gpus == 1
    o = {
        "--run.out_dir": str(out / "runs"), "--run.name": "gpu-check",
        "--policy.model": "tiny", "--policy.engine.device": "cuda", "--policy.engine.dtype": "bfloat16",
        "--policy.engine.gpu_memory_utilization": "0.2", "--policy.engine.num_gpus": g,
        "--experience_model.model": "tiny", "--experience_model.engine.device": "cuda",
        # the tiny model's context is 2048 tokens (max_position_embeddings); the replicas' default is 4096
        "--experience_model.engine.max_model_len": "2048",
        "--experience_model.engine.gpu_memory_utilization": "0.2", "--experience_model.engine.num_gpus": g,
        "--learner.device": "cuda", "--learner.num_gpus": g, "--learner.precision": "bf16-autocast",
        "--learner.weight_sync": "auto" if one_gpu else "object_store" if share else "nccl",
        "--train.colocate": "true" if one_gpu else "false",
        "--train.iterations": "3", "--train.synthetic_iterations": "2", "--train.experience_sft": "false",
        "--train.eval.tasks": "4", "--collect.episodes": "20", "--curriculum.llm_variants": "0",
    }
    return [sys.executable, "-m", "dreamgym.cli", "train", *[x for kv in o.items() for x in kv]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch-only", action="store_true", help="only the learner's CUDA paths (no vLLM, no Ray)")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out", help="output folder")
    p.add_argument("--allow-cpu", action="store_true", help="run the torch checks on the CPU (self-test)")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    summary: dict[str, Any] = {"mode": "torch-only" if args.torch_only else "full", "checks": {}}

    def finish(status: str, code: int) -> int:
        summary["status"] = status
        summary["exit_code"] = code
        summary["seconds"] = round(time.perf_counter() - t_start, 1)
        summary["imported_ray_or_vllm"] = sorted(m for m in ("ray", "vllm") if m in sys.modules)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        print(f"gpu-check: {status} ({summary['seconds']} s); summary in {out / 'summary.json'}")
        return code

    missing = [m for m in TORCH_ONLY_DEPS if importlib.util.find_spec(m) is None]
    summary["versions"] = versions()
    if missing:
        return finish(f"failed: missing Python packages {', '.join(missing)} (the learner's dependencies; install "
                      "them, or put a folder with them on PYTHONPATH)", EXIT_MISSING)
    import torch

    if torch.cuda.is_available():
        device = "cuda"
        drv = summary["versions"].get("driver")
        summary["checks"]["driver"] = {"version": drv, "minimum": MIN_DRIVER,
                                       "passed": drv is not None and int(drv.split(".")[0]) >= MIN_DRIVER}
    elif args.allow_cpu:
        device = "cpu"
    else:
        return finish("skipped: no CUDA", EXIT_SKIPPED)
    summary["device"] = device
    # Exact resume needs deterministic kernels; fp32 log-probs are compared without TF32.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from dreamgym.models import build_tiny_model

    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    model = build_tiny_model(work / "tiny", seed=0)
    checks: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("logprobs", lambda: check_logprobs(model, device)),
        ("grpo_step_bf16", lambda: check_grpo_step(model, device)),
        ("checkpoint_resume", lambda: check_resume(model, device, work)),
        ("data_parallel", lambda: check_data_parallel(model, device)),
    ]
    for name, fn in checks:
        t0 = time.perf_counter()
        try:
            res = fn()
        except Exception as e:
            res = {"passed": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        res["seconds"] = round(time.perf_counter() - t0, 2)
        summary["checks"][name] = res
        print(f"gpu-check: {name}: {'passed' if res['passed'] else 'FAILED'} ({res['seconds']} s)", flush=True)
    if not args.torch_only:
        summary["checks"]["pytest_gpu"] = run_subprocess(
            [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/"], 1800,
            out / "pytest-gpu.log")
        gpus = torch.cuda.device_count() if device == "cuda" else 0
        summary["checks"]["train_3_iterations"] = run_subprocess(train_command(out, gpus), 1800, out / "train.log",
                                                                 {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"})
    failed = [n for n, r in summary["checks"].items() if not r.get("passed")]
    if failed:
        return finish(f"failed: {', '.join(failed)}", EXIT_FAILED)
    return finish("passed" + (" (on CPU: --allow-cpu)" if device == "cpu" else ""), EXIT_OK)


if __name__ == "__main__":
    sys.exit(main())
