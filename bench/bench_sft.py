"""The experience-model fine-tune (``train.experience_sft``), this tree against a baseline commit, side by side.

Both arms fine-tune the default config's experience model (``dreamgym/configs/train.yaml``:
``experience_model.train``, SmolLM2-135M, 4 examples a step, at most 80 examples, fp32 on an AVX2 CPU) on the same
offline data, with the same seed, so the same examples in the same batches: the default config's offline
collection (``collect``: 100 mixed gold/random coin episodes, played in-process, the same episodes
``dreamgym train`` collects through Ray) annotated with template rationales, as ``dreamgym train``'s SFT task
does (``actors.train_setup.experience_sft``: step budget ``env.max_steps``, ``learner.threads`` torch threads).

Each arm is ``learner.sft_experience.train_experience_model`` in its own process, importing its own tree
(``PYTHONPATH``; the baseline is a temporary git worktree, ``bench_iteration.baseline_tree``), with timers
around its phases: ``startup`` (imports, config), ``examples`` (``build_examples``: retrieval of the
demonstrations through the replay encoder, tokenisation), ``model_load``, ``steps`` (``sft_step``: forward,
backward, optimizer), ``save`` and ``other`` (tokenizer, optimizer set-up). Per step: tokens in the batch, the
padded tokens the baseline's forward ran, the batch's shared token prefix and the reply (loss) tokens.

The JSON carries the loss curves of both arms step by step, the largest difference of the saved weights, and
``ratios.sft_wall`` (current / baseline wall seconds of the whole fine-tune, ``train_experience_model``;
``process_wall`` adds the arm's interpreter start and imports). ``--steps`` fewer than the config's
20 keeps a run short on a shared machine (the same steps for both arms; the per-step and fixed costs are
reported so the 20-step figure follows).

    .venv/bin/python bench/bench_sft.py [--baseline-commit 6a3c005] [--steps 20] [--smoke] [--out FILE] [-- overrides]

Prints the JSON and writes it to ``bench/results/sft-<host>-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_iteration import DEFAULT_CONFIG, REPO, baseline_tree
from benchlib import load_average, write_result

T0 = time.perf_counter()


def prepare_data(work: Path) -> dict[str, Any]:
    """The default config's offline data, annotated as ``dreamgym train``'s SFT task annotates it."""
    from dreamgym.collect import collect_range
    from dreamgym.config import load_config
    from dreamgym.data.transitions import TransitionWriter, transitions_to_batch
    from dreamgym.envs.registry import make_env
    from dreamgym.experience.annotate import annotate_file, annotator_from_config
    from dreamgym.policies import make_policy

    cfg = load_config(REPO / DEFAULT_CONFIG)
    c, t0 = cfg.collect, time.perf_counter()
    env, policy = make_env(cfg.env), make_policy(c.policy, c.gold_fraction)
    tag = f"{cfg.env.name}/{c.policy}/seed{cfg.run.seed}"
    with TransitionWriter(work / "offline.parquet") as writer:
        for s in range(0, c.episodes, c.episodes_per_batch):
            n = min(c.episodes_per_batch, c.episodes - s)
            writer.write(transitions_to_batch(collect_range(env, policy, c.first_seed + s, n, cfg.env.split,
                                                            cfg.run.seed, tag)[0]))
    env.close()
    em = cfg.experience_model
    counts = annotate_file(work / "offline.parquet", work / "offline_annotated.parquet",
                           annotator_from_config(em.annotate, cfg.env.max_steps))
    return {"episodes": c.episodes, "rows": counts["rows"], "seconds": round(time.perf_counter() - t0, 2),
            "data": str(work / "offline_annotated.parquet")}


# -- one arm, in its own process ---------------------------------------------------------------------
def _lcp(rows: list[list[int]]) -> int:
    n = min(len(r) for r in rows)
    for r in rows[1:]:
        k = 0
        while k < n and r[k] == rows[0][k]:
            k += 1
        n = k
    return n


def run_arm(tree: Path, data: Path, steps: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """``train_experience_model`` of the tree this process imports, with phase timers (see the module doc)."""
    import torch

    import learner.model
    import learner.sft_experience as sft
    from dreamgym.config import load_config

    cfg = load_config(tree / DEFAULT_CONFIG, ["--experience_model.train.max_steps", str(steps), *overrides])
    t = cfg.experience_model.train  # as actors.train_setup.experience_sft sets it for `dreamgym train`
    t.data, t.step_budget, t.log_every = data, cfg.env.max_steps, 1
    t.threads = t.threads or cfg.learner.threads
    phases = {"startup": time.perf_counter() - T0, "examples": 0.0, "model_load": 0.0, "steps": 0.0, "save": 0.0}
    per_step: list[dict[str, Any]] = []

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name] += time.perf_counter() - t0
        return wrapper

    def step(model: Any, opt: Any, params: Any, batch: list[Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        res = sft_step(model, opt, params, batch, *args, **kwargs)
        dt_s = time.perf_counter() - t0
        phases["steps"] += dt_s
        rows = [ex.prompt_ids + ex.reasoning_ids + ex.outcome_ids for ex in batch]
        per_step.append({"seconds": round(dt_s, 3), "tokens": sum(map(len, rows)),
                         "padded_tokens": max(map(len, rows)) * len(rows), "shared_prefix": _lcp(rows),
                         "prompt_tokens": sum(len(ex.prompt_ids) for ex in batch),
                         "reply_tokens": sum(len(r) for r in rows) - sum(len(ex.prompt_ids) for ex in batch)})
        return res

    sft_step = sft.sft_step
    sft.sft_step = step
    sft.build_examples = timed("examples", sft.build_examples)
    sft.save_model = timed("save", sft.save_model)
    learner.model.load_causal_lm = timed("model_load", learner.model.load_causal_lm)
    t0 = time.perf_counter()
    summary = sft.train_experience_model(cfg, out)
    train_wall = time.perf_counter() - t0
    phases["other"] = train_wall - sum(phases[k] for k in ("examples", "model_load", "steps", "save"))
    history = json.loads((out / "dreamgym_sft.json").read_text())["history"]
    return {"wall_seconds": round(time.perf_counter() - T0, 2), "fine_tune_seconds": round(train_wall, 2),
            "phases": {k: round(v, 2) for k, v in phases.items()},
            "step_seconds_median": round(statistics.median(s["seconds"] for s in per_step), 3),
            "per_step": per_step, "loss": [h["loss"] for h in history],
            "reasoning_nll": [h["reasoning_nll"] for h in history], "state_nll": [h["state_nll"] for h in history],
            "summary": summary, "seed": cfg.run.seed, "torch_threads": torch.get_num_threads()}


def measure(tree: Path, label: str, data: Path, steps: int, work: Path, timeout_s: float,
            overrides: list[str]) -> dict[str, Any]:
    """One arm in a subprocess that imports ``tree``; its result, the load averages around it."""
    out, result = work / label, work / f"{label}.json"
    env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
    load_before = os.getloadavg()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--arm", str(tree), "--data", str(data),
           "--steps", str(steps), "--model-out", str(out), "--result", str(result), "--", *overrides]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the {label} arm exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True,
                            check=False).stdout.strip()
    return {"commit": commit, **json.loads(result.read_text()), "model": str(out),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": load_average()}


def weight_gap(a: Path, b: Path) -> dict[str, float]:
    """The largest absolute difference of the two saved models' weights, and the largest weight."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    gap = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    return {"max_abs_diff": gap, "max_abs_weight": max(float(v.abs().max()) for v in wa.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline-commit", default="6a3c005", help="the old arm's commit (a temporary worktree)")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per arm (the default config's 20)")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="per arm")
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/sft-<host>-<date>.json)")
    ap.add_argument("--smoke", action="store_true", help="the tiny random model, 2 steps: the bench works (no figure)")
    ap.add_argument("overrides", nargs="*", help="extra `--section.field VALUE` overrides for both arms (after `--`)")
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # internal: run one arm of this tree
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    # the tiny tokenizer spells the same prompt in ~3x the tokens
    smoke = ["--experience_model.train.base", "tiny", "--experience_model.train.max_seq_len", "4096"]
    overrides = [*(smoke if args.smoke else []), *args.overrides]
    if args.smoke:
        args.steps = 2
    if args.arm:
        res = run_arm(Path(args.arm), Path(args.data), args.steps, Path(args.model_out), overrides)
        Path(args.result).write_text(json.dumps(res))
        return

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    work = Path(tempfile.mkdtemp(prefix="bench-sft-"))
    out: dict[str, Any] = {
        "bench": "sft", "host": socket.gethostname(), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "avx512_bf16": "avx512_bf16" in cpuinfo, "load_average_start": list(os.getloadavg())},
        "config": DEFAULT_CONFIG, "overrides": overrides, "smoke": args.smoke, "steps": args.steps,
    }
    try:
        out["data"] = prepare_data(work)
        data = Path(out["data"]["data"])
        with baseline_tree(args.baseline_commit, work) as tree:
            base = measure(tree, "baseline", data, args.steps, work, args.timeout_s, overrides)
        cur = measure(REPO, "current", data, args.steps, work, args.timeout_s, overrides)
        out["examples"] = cur["summary"]["examples"]
        out["seed"] = cur["seed"]
        out["weights"] = weight_gap(Path(base["model"]), Path(cur["model"]))
        out["arms"] = {"baseline": base, "current": cur}
        out["loss_curves"] = [{"step": i + 1, "baseline": b, "current": c}
                              for i, (b, c) in enumerate(zip(base["loss"], cur["loss"], strict=True))]
        fixed = {k: round(a["fine_tune_seconds"] - a["phases"]["steps"], 2)
                 for k, a in (("baseline", base), ("current", cur))}
        out["ratios"] = {
            # the fine-tune (train_experience_model: examples, model load, steps, save); process_wall adds the
            # arm's interpreter start and imports (~7 s, the same code in both arms)
            "sft_wall": round(cur["fine_tune_seconds"] / base["fine_tune_seconds"], 3),
            "process_wall": round(cur["wall_seconds"] / base["wall_seconds"], 3),
            "steps": round(cur["phases"]["steps"] / base["phases"]["steps"], 3),
            "step_median": round(cur["step_seconds_median"] / base["step_seconds_median"], 3),
            # the default config's 20 steps, from these per-step and fixed costs (equal to sft_wall at --steps 20)
            "sft_wall_at_20_steps": round((fixed["current"] + 20 * cur["phases"]["steps"] / args.steps)
                                          / (fixed["baseline"] + 20 * base["phases"]["steps"] / args.steps), 3),
        }
        out["fixed_seconds"] = fixed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_result(out, "sft", args.out)


if __name__ == "__main__":
    main()
