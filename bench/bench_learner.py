"""Benchmark of the GRPO learner: tokens/s and achieved FLOP/s against this machine's matmul peak.

In one run: the matmul peak is measured (fp32 and bf16, 2048^3, median of several), then full
learner steps (forward + backward through the GRPO loss, gradient clipping, AdamW) are timed for
a tiny random Llama and for SmolLM2-135M-Instruct, on a batch of single-step trajectories of
``--seq-len`` tokens (half prompt, half reply). Printed as JSON.

``--algorithms grpo,ppo`` adds PPO rows (``learner.algorithm: ppo``, the critic a value head on a copy of
the same model): ``tokens_per_s`` is still policy tokens per second of the whole step (critic included),
``critic_share`` the median fraction of the step spent on the critic (its value pass before the step plus
its forward/backward and AdamW step), and ``achieved_gflops`` counts the policy's FLOPs only.

FLOPs per trained token use the PaLM estimate ``6 N + 12 L d T`` (``N``: parameters that take part in
matmuls, i.e. a tied LM head once and no separate input embedding; ``L`` layers, ``d`` model width,
``T`` sequence length), counting every processed token (prompt tokens are trained through too).

    .venv/bin/python bench/bench_learner.py [--steps 3] [--seq-len 256] [--batch 4] [--skip-smollm2]
        [--algorithms grpo,ppo]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def matmul_peak_gflops(dtype: str, n: int = 2048, repeats: int = 5) -> float:
    import torch

    dt = getattr(torch, dtype)
    a = torch.randn(n, n, dtype=dt)
    b = torch.randn(n, n, dtype=dt)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def _batch(seq_len: int, batch: int, vocab: int, seed: int) -> list[Any]:
    import random

    from dreamgym.token_groups import one_step_group
    from dreamgym.types import Task

    rng = random.Random(seed)
    half = seq_len // 2
    turns = [([rng.randrange(3, vocab) for _ in range(half)], [rng.randrange(3, vocab) for _ in range(seq_len - half)],
              None) for _ in range(batch)]
    return [one_step_group(Task("bench", "twx:coin", "bench"), turns, [float(i % 2) for i in range(batch)])]


def bench_model(name: str, path: Path, precision: str, steps: int, seq_len: int, batch: int,
                algorithm: str = "grpo") -> dict[str, Any]:
    from dreamgym.config import LearnerConfig
    from learner.learner import Learner

    cfg = LearnerConfig(lr=1e-6, device="cpu", precision=precision, micro_batch_tokens=seq_len * batch,
                        algorithm=algorithm)
    learner = Learner(cfg, path, seed=0)
    mc = learner.model.config
    n_params = sum(p.numel() for p in learner.model.parameters())
    embed = mc.vocab_size * mc.hidden_size
    n_matmul = n_params if mc.tie_word_embeddings else n_params - embed
    flops_per_token = 6 * n_matmul + 12 * mc.num_hidden_layers * mc.hidden_size * seq_len
    learner.step(_batch(seq_len, batch, mc.vocab_size, 0))  # warm-up
    times, tokens, shares = [], [], []
    for s in range(steps):
        m = learner.step(_batch(seq_len, batch, mc.vocab_size, s + 1))
        times.append(m["seconds"])
        tokens.append(m["processed_tokens"])
        shares.append(m.get("critic_share", 0.0))
    tok_s = sum(tokens) / sum(times)
    return {
        "model": name,
        "algorithm": algorithm,
        "critic_share": statistics.median(shares),
        "precision": precision,
        "parameters": n_params,
        "matmul_parameters": n_matmul,
        "tokens_per_step": tokens[0],
        "step_seconds_median": statistics.median(times),
        "tokens_per_s": tok_s,
        "flops_per_token": flops_per_token,
        "achieved_gflops": tok_s * flops_per_token / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--algorithms", default="grpo", help="comma-separated: grpo, ppo")
    args = ap.parse_args()
    algorithms = [a for a in args.algorithms.split(",") if a]

    import torch

    from dreamgym.models import build_tiny_model, resolve_model

    # The peak is sampled around every measurement (the machine may be shared); the best sample counts.
    samples: dict[str, list[float]] = {"float32": [], "bfloat16": []}

    def sample_peak() -> None:
        for dt in samples:
            samples[dt].append(matmul_peak_gflops(dt))

    runs = [("tiny-llama", "float32", a) for a in algorithms]
    if not args.skip_smollm2:
        runs += [("smollm2-135m", p, a) for a in algorithms for p in ("float32", "bf16-autocast")
                 if a == "grpo" or p == "float32"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"tiny-llama": build_tiny_model(Path(tmp) / "tiny", seed=0)}
        if not args.skip_smollm2:
            paths["smollm2-135m"] = resolve_model("smollm2-135m")
        sample_peak()
        for name, precision, algorithm in runs:
            results.append(bench_model(name, paths[name], precision, args.steps, args.seq_len, args.batch,
                                       algorithm))
            sample_peak()
    peak = {dt: max(v) for dt, v in samples.items()}
    for r in results:
        ref = peak["bfloat16" if r["precision"] == "bf16-autocast" else "float32"]
        r["peak_gflops"] = ref
        r["fraction_of_peak"] = r["achieved_gflops"] / ref
    print(json.dumps({
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "processor": platform.processor() or platform.machine(),
        },
        "matmul_peak_gflops": peak,
        "matmul_peak_samples_gflops": samples,
        "load_average": os.getloadavg(),
        "batch": {"sequences": args.batch, "seq_len": args.seq_len, "steps_timed": args.steps},
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
