"""Benchmark of one weight sync of SmolLM2-135M-Instruct into a policy engine, printed as JSON.

A ``PolicyEngine`` actor (vLLM on CPU, fp32, in-process engine) serves SmolLM2; the learner (fp32)
takes one GRPO step on replies the engine sampled, then ``ObjectStoreWeightSync`` pushes the new
weights (``--pushes`` times, versions 1..n). Reported: the time of each push (``ray.put`` + load in
place + prefix-cache reset), and the largest difference between the engine's and the learner's
teacher-forced log-probs of a fixed sequence: as loaded from disk, stale (after the step, before the
sync) and after the sync. With ``--in-process`` the same is measured for ``InProcessWeightSync`` into
an engine in this process (after the actor is gone: one engine at a time).

    .venv/bin/python bench/bench_weight_sync.py [--pushes 3] [--in-process]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

QUESTION = "What is the capital of France? Answer in one word."


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _groups(samples: list[Any]) -> list[Any]:
    from dreamgym.token_groups import one_step_group
    from dreamgym.types import Task

    turns = [(s.prompt_token_ids, s.token_ids, s.logprobs) for s in samples]
    return [one_step_group(Task("q", "twx:coin", QUESTION), turns, [float(k % 2) for k in range(len(samples))])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pushes", type=int, default=3)
    ap.add_argument("--in-process", action="store_true")
    args = ap.parse_args()

    os.environ.setdefault("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1")  # read when Ray is imported
    import ray
    from transformers import AutoTokenizer

    from actors.policy_engine import create_policy_engines
    from actors.weight_sync import ObjectStoreWeightSync
    from dreamgym.config import EngineConfig, LearnerConfig, PolicyConfig
    from dreamgym.models import resolve_model
    from learner.learner import Learner

    path = resolve_model("smollm2-135m")
    pcfg = PolicyConfig(model=str(path), max_tokens=24, temperature=1.0,
                        engine=EngineConfig(dtype="float32", max_model_len=1024))
    tok = AutoTokenizer.from_pretrained(str(path))
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"]

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    (engine,) = create_policy_engines(pcfg)
    start_s = time.perf_counter() - t0
    learner = Learner(LearnerConfig(lr=1e-5, device="cpu", micro_batch_tokens=2048), path, seed=0)

    greedy = ray.get(engine.generate.remote([prompt], n=1, temperature=0.0, stop=None, parse=False))[0][0]
    samples = ray.get(engine.generate.remote([prompt], n=4, stop=None, parse=False))[0]
    seq = prompt + greedy.token_ids
    diff_loaded = _max_diff(ray.get(engine.score.remote([seq]))[0], learner.sequence_logprobs([seq])[0])
    step = learner.step(_groups(samples))
    new_lp = learner.sequence_logprobs([seq])[0]
    diff_stale = _max_diff(ray.get(engine.score.remote([seq]))[0], new_lp)

    sync = ObjectStoreWeightSync([engine], dtype="float32", timeout_s=300)
    reports = [sync.push(learner.sync_weights(), version=v) for v in range(1, args.pushes + 1)]
    diff_synced = _max_diff(ray.get(engine.score.remote([seq]))[0], new_lp)
    after = ray.get(engine.generate.remote([prompt], n=1, temperature=0.0, stop=None, parse=False))[0][0]
    result: dict[str, Any] = {
        "model": "smollm2-135m",
        "engine_dtype": "float32",
        "engine_start_s": start_s,
        "tensors": reports[0].num_tensors,
        "megabytes": reports[0].num_bytes / 1e6,
        "object_store_sync_s": [r.seconds for r in reports],
        "object_store_sync_median_s": statistics.median(r.seconds for r in reports),
        "engine_load_s": [r.details[0]["seconds"] for r in reports],
        "lm_head_retied": [r.details[0]["retied"] for r in reports],
        "sequence_tokens": len(seq),
        "logprob_max_abs_diff": {"loaded_from_disk": diff_loaded, "stale_after_step": diff_stale,
                                 "after_sync": diff_synced},
        "learner_step_s": step["seconds"],
        "greedy_answer_before": greedy.text,
        "greedy_answer_after_sync": after.text,
        "version_after": ray.get(engine.weight_version.remote()),
        "load_average": os.getloadavg(),
    }
    ray.kill(engine)
    ray.shutdown()

    if args.in_process:
        from dreamgym.vllm_engine import VllmPolicy
        from learner.weight_sync import InProcessWeightSync

        local = VllmPolicy(pcfg)
        inproc = InProcessWeightSync([local], dtype="float32")
        times = [inproc.push(learner.sync_weights(), version=v).seconds for v in range(1, args.pushes + 1)]
        result["in_process_sync_s"] = times
        result["in_process_logprob_max_abs_diff_after_sync"] = _max_diff(local.score([seq])[0], new_lp)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
