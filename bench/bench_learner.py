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

Each GRPO row is followed by an experience-model SFT row on the same model, precision, sequence length and
batch (``learner.sft_experience.sft_step``: half prompt, a quarter reasoning, a quarter outcome; one
micro-batch, as the learner's), and ``sft_vs_learner`` gives the SFT's tokens/s as a fraction of the
learner's (target at least 0.95); an ``sft-per-example`` row runs one example per forward, as the SFT did
before it was micro-batched. bf16 rows run only where bf16 is native (``--precisions`` overrides;
emulated bf16 is ~15x slower and says nothing about a GPU or an AMX CPU).

    .venv/bin/python bench/bench_learner.py [--steps 3] [--seq-len 256] [--batch 4] [--skip-smollm2]
        [--algorithms grpo,ppo] [--precisions float32,bf16-autocast]
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


def bench_sft(name: str, path: Path, precision: str, steps: int, seq_len: int, batch: int,
              per_example: bool = False) -> dict[str, Any]:
    """Experience-model SFT steps (``sft_step``, the code ``train_experience_model`` runs) on random examples.
    ``per_example``: one example per forward (``micro_batch_tokens`` = one sequence), as before micro-batching."""
    import random

    import torch

    from learner.model import load_causal_lm
    from learner.sft_experience import SFTExample, sft_step

    model = load_causal_lm(path, "cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    vocab = model.config.vocab_size
    prompt, reasoning = seq_len // 2, seq_len // 4

    def examples(seed: int) -> list[SFTExample]:
        rng = random.Random(seed)
        ids = [[rng.randrange(3, vocab) for _ in range(seq_len)] for _ in range(batch)]
        return [SFTExample(x[:prompt], x[prompt: prompt + reasoning], x[prompt + reasoning:]) for x in ids]

    bf16 = precision == "bf16-autocast"
    budget = seq_len if per_example else seq_len * batch
    sft_step(model, opt, params, examples(0), budget, bf16=bf16)  # warm-up
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        sft_step(model, opt, params, examples(s + 1), budget, bf16=bf16)
        times.append(time.perf_counter() - t0)
    return {"model": name, "algorithm": "sft-per-example" if per_example else "sft", "precision": precision,
            "micro_batch_tokens": budget, "tokens_per_step": seq_len * batch,
            "step_seconds_median": statistics.median(times), "tokens_per_s": seq_len * batch * steps / sum(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--algorithms", default="grpo", help="comma-separated: grpo, ppo")
    ap.add_argument("--precisions", default=None,
                    help="comma-separated: float32, bf16-autocast (default: bf16 too only where it is native)")
    args = ap.parse_args()
    algorithms = [a for a in args.algorithms.split(",") if a]

    import torch

    from dreamgym.hardware import native_bf16
    from dreamgym.models import build_tiny_model, resolve_model

    precisions = (args.precisions.split(",") if args.precisions
                  else ["float32", "bf16-autocast"] if native_bf16("cpu") else ["float32"])

    # The peak is sampled around every measurement (the machine may be shared); the best sample counts. Only the
    # precisions benchmarked: an emulated bf16 matmul of 2048^3 takes ~20 s on an AVX2-only CPU (0.8 GFLOP/s).
    samples: dict[str, list[float]] = {"bfloat16" if p == "bf16-autocast" else p: [] for p in ["float32", *precisions]}

    def sample_peak() -> None:
        for dt in samples:
            samples[dt].append(matmul_peak_gflops(dt))

    # An SFT row needs the GRPO row it is compared with.
    with_sft = [*algorithms, *(["sft", "sft-per-example"] if "grpo" in algorithms else [])]
    runs = [("tiny-llama", "float32", a) for a in with_sft]
    if not args.skip_smollm2:
        runs += [("smollm2-135m", p, a) for a in with_sft for p in precisions
                 if a in ("grpo", "sft", "sft-per-example") or p == "float32"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"tiny-llama": build_tiny_model(Path(tmp) / "tiny", seed=0)}
        if not args.skip_smollm2:
            paths["smollm2-135m"] = resolve_model("smollm2-135m")
        sample_peak()
        for name, precision, algorithm in runs:
            if algorithm.startswith("sft"):
                results.append(bench_sft(name, paths[name], precision, args.steps, args.seq_len, args.batch,
                                         per_example=algorithm == "sft-per-example"))
            else:
                results.append(bench_model(name, paths[name], precision, args.steps, args.seq_len, args.batch,
                                           algorithm))
            sample_peak()
    peak = {dt: max(v) for dt, v in samples.items()}
    grpo = {(r["model"], r["precision"]): r for r in results if r["algorithm"] == "grpo"}
    for r in results:
        ref = peak["bfloat16" if r["precision"] == "bf16-autocast" else "float32"]
        r["peak_gflops"] = ref
        if r["algorithm"].startswith("sft"):
            learner = grpo[(r["model"], r["precision"])]
            r["sft_vs_learner"] = r["tokens_per_s"] / learner["tokens_per_s"]
            r["achieved_gflops"] = r["tokens_per_s"] * learner["flops_per_token"] / 1e9
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
