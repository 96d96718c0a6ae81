"""``dreamgym train`` (GRPO on Ray, ``actors.driver``) and ``dreamgym sft`` (behaviour cloning of the policy
on gold episodes, in this process)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dreamgym.config import DreamGymConfig, load_config, parse_overrides


def default_train_config() -> str:
    """The packaged default config of ``dreamgym train`` (and ``dreamgym sft``)."""
    from importlib.resources import files

    return str(files("dreamgym") / "configs" / "train.yaml")


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.resume:
        parse_overrides(overrides)  # malformed overrides fail before anything starts
        cfg = None
    else:
        cfg = load_config(args.config or default_train_config(), overrides)
    from actors.driver import run_train

    s = run_train(cfg, resume=args.resume, overrides=overrides if args.resume else None)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    print(f"trained {s['iterations']} iterations ({s['mode']}) in {s['wall_seconds'] / 60:.1f} min: held-out real "
          f"success {pct(s['success_start'])} -> {pct(s['success_final'])} (random valid action "
          f"{pct(s['baseline_success'])}); real transitions {s['real_transitions']} for training, "
          f"{s['synthetic_transitions']} synthetic; report {s.get('report', '-')}; run directory {s['run_dir']}")
    return 0


def run_sft(cfg: DreamGymConfig, out: str | Path | None = None) -> dict[str, Any]:
    """Behaviour cloning in this process (Ray only to collect gold episodes when the offline data has none);
    returns the summary (``out``: the HF folder written)."""
    import time

    from transformers import AutoTokenizer

    from actors.train_setup import gold_for_warm_start
    from dreamgym.runs import MetricsLog, create_run_dir
    from learner.bc import BehaviourCloning, run_bc, save_policy, tokenise_episode
    from learner.learner import Learner

    run_dir = create_run_dir(cfg, "sft")
    metrics = MetricsLog(run_dir)
    episodes = gold_for_warm_start(cfg, cfg.train.offline_data, run_dir)
    learner = Learner.from_config(cfg)
    tok = AutoTokenizer.from_pretrained(str(learner.model_path), local_files_only=True)
    trajs = [tokenise_episode(ep, tok, cfg.policy) for ep in episodes]
    bc = BehaviourCloning(learner, cfg.train.warm_start.lr)
    t0 = time.perf_counter()

    def log(m: dict[str, float]) -> None:
        metrics.write(event="sft", **m)
        print(f"step {int(m['bc_step'])}/{cfg.train.warm_start.steps}: gold-reply NLL {m['nll']:.3f} "
              f"({m['tokens_per_s']:.0f} tok/s)", flush=True)

    hist = run_bc(bc.step, trajs, cfg.train.warm_start.steps, cfg.train.warm_start.batch_episodes, cfg.run.seed, log)
    path = save_policy(learner, Path(out) if out else run_dir / "model")
    summary = {"out": str(path), "run_dir": str(run_dir), "episodes": len(trajs), "steps": len(hist),
               "nll_first": hist[0]["nll"], "nll_last": hist[-1]["nll"], "seconds": time.perf_counter() - t0}
    metrics.write(event="summary", **summary)
    return summary


def cmd_sft(args: argparse.Namespace, overrides: list[str]) -> int:
    s = run_sft(load_config(args.config or default_train_config(), overrides), out=args.out)
    print(f"behaviour cloning on {s['episodes']} gold episodes, {s['steps']} steps: gold-reply NLL "
          f"{s['nll_first']:.3f} -> {s['nll_last']:.3f} in {s['seconds']:.0f} s; model in {s['out']} (use it as "
          f"--policy.model {s['out']}); run directory {s['run_dir']}")
    return 0
