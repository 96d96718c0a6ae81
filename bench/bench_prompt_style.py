"""Learner tokens per policy action and the agent's success, ``policy.prompt_style`` windowed vs chat.

One in-process vLLM engine (no Ray) serves the config's policy; the same held-out real episodes (the
config's environment, ``train.eval`` split, seeds ``first_seed..``) are played once per prompt style,
and each style's trajectories are turned into the learner's token sequences
(``learner.sequences.trajectory_sequences``, what a GRPO/PPO step reads). Reported per style:

- ``learner_tokens_per_action``: sum of the sequence lengths / number of policy actions;
- ``sequences_per_episode`` (chat: 1, more only when a conversation restarts at ``engine.max_model_len``);
- success rate, invalid-action and unparsable rates, steps, sampling seconds;

and ``tokens_per_action_ratio`` = windowed / chat (the issue-13 target is at least 2.5).

    .venv/bin/python bench/bench_prompt_style.py [--episodes 32] [--config dreamgym/configs/train.yaml]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import time
from typing import Any

from benchlib import write_result


def learner_tokens(trajectories: list[Any]) -> dict[str, float]:
    """Token facts of the sequences the learner would build from ``trajectories``."""
    from learner.sequences import trajectory_sequences

    seqs = [s for i, t in enumerate(trajectories) for s in trajectory_sequences(t, i)]
    actions = sum(len(t.transitions) for t in trajectories)
    tokens = sum(len(s) for s in seqs)
    return {
        "actions": float(actions),
        "sequences": float(len(seqs)),
        "learner_tokens": float(tokens),
        "learner_tokens_per_action": tokens / actions if actions else 0.0,
        "reply_tokens_per_action": sum(s.num_policy_tokens for s in seqs) / actions if actions else 0.0,
        "sequences_per_episode": len(seqs) / len(trajectories) if trajectories else 0.0,
        "max_sequence_tokens": float(max((len(s) for s in seqs), default=0)),
    }


def run_style(policy: Any, envs: list[Any], tasks: list[Any], style: str) -> dict[str, Any]:
    from dreamgym.rollout import run_episodes
    from dreamgym.types import AgentTurn

    policy.cfg = policy.cfg.model_copy(update={"prompt_style": style})
    restarts0 = policy.chat_restarts

    def act(turns: list[AgentTurn]) -> list[Any]:
        return [s[0] for s in policy.act(turns)]

    trajs, stats = run_episodes(envs, tasks, act, source="real", episode_prefix=style)
    d = stats.as_dict()
    return {
        "style": style,
        **learner_tokens(trajs),
        "chat_restarts": policy.chat_restarts - restarts0,
        **{k: d[k] for k in ("episodes", "steps", "success_rate", "invalid_action_rate", "unparsable_rate",
                             "act_seconds", "env_seconds", "seconds")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="dreamgym/configs/train.yaml")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--envs", type=int, default=8, help="episodes played at once (one environment each)")
    ap.add_argument("--styles", default="windowed,chat")
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/prompt-style-<host>-<date>.json)")
    args = ap.parse_args()

    from dreamgym.config import load_config
    from dreamgym.envs.registry import make_env
    from dreamgym.vllm_engine import VllmPolicy

    cfg = load_config(args.config)
    ev = cfg.train.eval
    envs = [make_env(cfg.env) for _ in range(min(args.envs, args.episodes))]
    tasks = envs[0].tasks(args.episodes, first=ev.first_seed, split=ev.split)
    policy = VllmPolicy(cfg.policy)
    results = []
    try:
        for style in args.styles.split(","):
            t0 = time.perf_counter()
            results.append(run_style(policy, envs, tasks, style))
            print(json.dumps(results[-1]), flush=True)
            results[-1]["wall_seconds"] = time.perf_counter() - t0
    finally:
        for e in envs:
            e.close()
    by = {r["style"]: r for r in results}
    out: dict[str, Any] = {
        "bench": "prompt_style",
        "host": socket.gethostname(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": args.config,
        "env": cfg.env.name,
        "policy": cfg.policy.model,
        "temperature": cfg.policy.temperature,
        "max_model_len": cfg.policy.engine.max_model_len,
        "episodes": args.episodes,
        "eval_split": ev.split,
        "first_seed": ev.first_seed,
        "cpus": os.cpu_count(),
        "results": results,
    }
    if "windowed" in by and "chat" in by and by["chat"]["learner_tokens_per_action"]:
        w, c = by["windowed"]["learner_tokens_per_action"], by["chat"]["learner_tokens_per_action"]
        out["tokens_per_action_ratio"] = w / c
    write_result(out, "prompt-style", args.out)


if __name__ == "__main__":
    main()
