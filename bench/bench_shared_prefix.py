"""The learner's shared-prefix forward (``learner.shared_prefix``) against the plain forward, side by side.

The trajectories are real windowed-prompt episodes of the config (default ``dreamgym/configs/train.yaml``:
TextWorldExpress ``coin``, 3 rooms): every step's prompt is rendered exactly as the policy engine renders it
(``dreamgym.agent_prompt.build_messages`` with the config's ``policy`` fields, the model's chat template, the
assistant header), the action is a uniformly random admissible one (seeded) and the reply is the tokens the
engine would have returned for it (``<action>...</action>``, generation stops after the closing tag). Episodes
are played in GRPO groups of ``learner.group_size``; groups without reward variance are dropped as the learner
drops them.

On the same groups, one fresh learner per setting (same seed, same initial weights) runs ``--steps`` GRPO steps
with ``learner.shared_prefix`` off (old) and on (new), alternating, at the config's ``micro_batch_tokens``.
Reported per setting: ``learner_tokens_per_action`` (``processed_tokens`` / policy actions), median step seconds,
micro-batches per step; ``ratios`` new / old; and ``prefix`` facts of the batch (the longest common prefix of all
sequences and of each micro-batch). The updated weights of both settings after the first step are compared
(``max_abs_weight_diff``).

    .venv/bin/python bench/bench_shared_prefix.py [--config dreamgym/configs/train.yaml] [--tasks 4] [--steps 3]
        [--measure-only]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from benchlib import write_result


def windowed_act(policy_cfg: Any, tokenizer: Any, seed: int) -> Any:
    """A ``run_episodes`` act function: the windowed prompt the engine would get, a random admissible action
    and the reply tokens the engine would have sampled for it (log-prob -1 each; the bench's learner uses its own
    ``pi_old``)."""
    from dreamgym.agent_prompt import ACTION_STOP, ACTION_TAG, build_messages
    from dreamgym.types import ActionSample, AgentTurn

    rng = random.Random(seed)
    c = policy_cfg

    def act(turns: Sequence[AgentTurn]) -> list[ActionSample]:
        out = []
        for turn in turns:
            messages = build_messages(turn, c.reasoning, c.history_steps, c.max_admissible_shown,
                                      c.observation_max_chars, c.worked_example)
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            actions = turn.observation.admissible_actions or ["look around"]
            action = rng.choice(actions)
            text = f"<{ACTION_TAG}>{action}{ACTION_STOP}"
            reply = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
            out.append(ActionSample(text=text, action=action, parsed=True, prompt_token_ids=[int(i) for i in ids],
                                    token_ids=reply, logprobs=[-1.0] * len(reply), weight_version=0))
        return out

    return act


def play_groups(cfg: Any, tokenizer: Any, n_tasks: int, seed: int) -> tuple[list[Any], dict[str, float]]:
    """``n_tasks`` train tasks of the config's environment, ``learner.group_size`` episodes each."""
    from dreamgym.envs.registry import make_env
    from dreamgym.rollout import group_stats, group_trajectories, repeat_tasks, run_episodes

    g = cfg.learner.group_size
    envs = [make_env(cfg.env) for _ in range(g)]
    try:
        tasks = envs[0].tasks(n_tasks, first=seed, split=cfg.env.split)
        trajs, _ = run_episodes(envs, repeat_tasks(tasks, g), windowed_act(cfg.policy, tokenizer, seed),
                                source="real")
    finally:
        for e in envs:
            e.close()
    groups, _ = group_trajectories(trajs, min_size=g)
    return groups, group_stats(groups)


def prefix_facts(groups: Sequence[Any], micro_batch_tokens: int) -> dict[str, float]:
    """How much of the batch is a common token prefix: of all its sequences, of the micro-batches the plain
    forward forms (``micro_batches``, by length) and of those the shared-prefix forward forms
    (``prefix_micro_batches``, by token order), with the token positions each would run."""
    from learner.batching import micro_batches, prefix_micro_batches
    from learner.sequences import build_batch
    from learner.shared_prefix import MIN_PREFIX, forwarded_tokens, shareable_prefix_len

    seqs = [s.input_ids for s in build_batch(groups).sequences]
    total = sum(len(s) for s in seqs)
    out: dict[str, float] = {
        "sequences": float(len(seqs)),
        "tokens": float(total),
        "mean_sequence_tokens": total / len(seqs),
        "batch_common_prefix_tokens": float(shareable_prefix_len(seqs)),
    }
    plain = micro_batches([len(s) for s in seqs], micro_batch_tokens)
    shared = prefix_micro_batches(seqs, micro_batch_tokens)
    for name, mbs in (("plain", plain), ("shared", shared)):
        prefixes = [shareable_prefix_len([seqs[i] for i in idx]) for idx in mbs]
        prefixes = [p if p >= MIN_PREFIX else 0 for p in prefixes]
        run = sum(forwarded_tokens([len(seqs[i]) for i in idx], p) for idx, p in zip(mbs, prefixes, strict=True))
        out[f"{name}_micro_batches"] = float(len(mbs))
        out[f"{name}_micro_batch_prefix_mean"] = statistics.mean(prefixes)
        out[f"{name}_micro_batch_prefix_share"] = sum(p * len(i) for p, i in zip(prefixes, mbs, strict=True)) / total
        out[f"{name}_micro_batches_forwarded_tokens"] = float(run)
    return out


def run_settings(cfg: Any, path: Any, groups: list[Any], steps: int, seed: int) -> tuple[list[dict[str, Any]], float]:
    """``steps`` learner steps with ``learner.shared_prefix`` off and on, alternating (old, new, old, new, ...),
    each setting its own learner from the same weights and seed. Returns the two rows and the largest weight
    difference after the first step."""
    from learner.learner import Learner

    actions = sum(len(t.transitions) for g in groups for t in g.trajectories)
    learners, rows = {}, {}
    for shared in (False, True):
        lcfg = cfg.learner.model_copy(update={"shared_prefix": shared, "device": "cpu", "precision": "float32"})
        learners[shared] = Learner(lcfg, path, seed=seed, temperature=cfg.policy.temperature)
        rows[shared] = []
    diff = 0.0
    for k in range(steps):
        for shared in (False, True):
            rows[shared].append(learners[shared].step(groups))
        if k == 0:
            new = dict(learners[True].model.named_parameters())
            diff = max(float((p.detach() - new[n].detach()).abs().max())
                       for n, p in learners[False].model.named_parameters())
    out = []
    for shared in (False, True):
        r = rows[shared]
        out.append({
            "shared_prefix": shared,
            "actions": actions,
            "processed_tokens": r[0]["processed_tokens"],
            "learner_tokens_per_action": r[0]["processed_tokens"] / actions,
            "step_seconds": [m["seconds"] for m in r],
            "step_seconds_median": statistics.median(m["seconds"] for m in r),
            "losses": [m["loss"] for m in r],
        })
    return out, diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="dreamgym/configs/train.yaml")
    ap.add_argument("--tasks", type=int, default=2, help="tasks played (GRPO groups before dropping degenerate ones)")
    ap.add_argument("--steps", type=int, default=2, help="learner steps per setting (weights compared after the first)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measure-only", action="store_true", help="print the prefix facts and stop (no learner)")
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/learner-shared-prefix-<host>-<date>)")
    args = ap.parse_args()
    t0, started = time.perf_counter(), dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    import torch
    from transformers import AutoTokenizer

    from dreamgym.config import load_config
    from dreamgym.hardware import cpu_has_native_bf16
    from dreamgym.models import resolve_model

    cfg = load_config(args.config)
    path = resolve_model(cfg.learner.model or cfg.policy.model)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    groups, gstats = play_groups(cfg, tok, args.tasks, args.seed)
    facts = prefix_facts(groups, cfg.learner.micro_batch_tokens)
    print(json.dumps({"groups": gstats, "prefix": facts}), flush=True)
    if args.measure_only:
        return
    from dreamgym.grpo import batch_advantages

    kept = batch_advantages([g.rewards for g in groups]).kept
    groups = [groups[k] for k in kept]
    if not groups:
        raise SystemExit("no played group has reward variance: raise --tasks")
    load_before = os.getloadavg()
    results, diff = run_settings(cfg, path, groups, args.steps, args.seed)
    old, new = results
    out: dict[str, Any] = {
        "bench": "learner_shared_prefix",
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "avx512_bf16": cpu_has_native_bf16(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "date": started,
        "config": args.config,
        "env": cfg.env.name,
        "env_params": cfg.env.params,
        "model": cfg.learner.model or cfg.policy.model,
        "precision": "float32",
        "group_size": cfg.learner.group_size,
        "micro_batch_tokens": cfg.learner.micro_batch_tokens,
        "seed": args.seed,
        "tasks_played": args.tasks,
        "groups_kept": len(groups),
        "steps_per_setting": args.steps,
        "groups": gstats,
        "prefix": facts,
        "results": results,
        "max_abs_weight_diff_after_step_1": diff,
        "loss_abs_diff_step_1": abs(old["losses"][0] - new["losses"][0]),
        "ratios": {
            "learner_tokens_per_action": new["learner_tokens_per_action"] / old["learner_tokens_per_action"],
            "learner_step_seconds": new["step_seconds_median"] / old["step_seconds_median"],
        },
        "load_average_after": os.getloadavg(),
        "notes": "Policy prompts and sampling are untouched by learner.shared_prefix (it changes only how the "
                 "learner forwards the same token sequences, to the same log-probs and gradients within float "
                 "tolerance), so the base policy's held-out success is unchanged by construction; no episodes "
                 "were re-run for it.",
    }
    out["date_end"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    out["seconds"] = time.perf_counter() - t0
    write_result(out, "learner-shared-prefix", args.out)


if __name__ == "__main__":
    main()
