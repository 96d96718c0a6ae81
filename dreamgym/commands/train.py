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
    if getattr(args, "dry_run", False):
        config = Path(args.resume) / "config.yaml" if args.resume else (args.config or default_train_config())
        return dry_run(load_config(config, overrides), args.cluster_cpus, args.cluster_gpus, args.node_gpus,
                       getattr(args, "gpu_memory_gib", None))
    if args.resume:
        parse_overrides(overrides)  # malformed overrides fail before anything starts
        cfg = None
    else:
        cfg = load_config(args.config or default_train_config(), overrides)
    from actors.cluster import unwrap_actor_error
    from actors.driver import run_train

    try:
        s = run_train(cfg, resume=args.resume, overrides=overrides if args.resume else None, stop_on_sigterm=True)
    except Exception as e:  # an actor's error (e.g. the environment server died): its message, not Ray's traceback
        cause = unwrap_actor_error(e)
        if cause is e:
            raise
        raise cause from None

    from dreamgym.verdict import verdict_line

    baseline = "-" if s.get("baseline_success") is None else f"{s['baseline_success']:.0%}"
    print(f"trained {s['iterations']} iterations ({s['mode']}): {verdict_line(s)}; random valid action {baseline}; "
          f"report {s.get('report', '-')}; run directory {s['run_dir']}")
    return 0


def cluster_shape(cfg: DreamGymConfig) -> tuple[float, float, float | None, str]:
    """``(CPUs, GPUs, GPUs of the largest node, what)`` of the cluster ``cfg`` would run on: the joined cluster
    (``ray.address`` / ``RAY_ADDRESS``; joining starts no actor), else this machine (its CPUs, or ``ray.num_cpus``,
    and the GPUs ``nvidia-smi -L`` lists)."""
    import os
    import shutil
    import subprocess

    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        from actors.cluster import cluster_shape as live_shape

        cpus, gpus, node_gpus = live_shape(address)
        return cpus, gpus, node_gpus, f"the Ray cluster at {address}"
    gpus = 0.0
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        gpus = float(sum(line.startswith("GPU ") for line in r.stdout.splitlines())) if r.returncode == 0 else 0.0
    cpus = float(cfg.ray.num_cpus or os.cpu_count() or 1)
    return cpus, gpus, gpus, "this machine (a local Ray)"


def dry_run(cfg: DreamGymConfig, cluster_cpus: float | None = None, cluster_gpus: float | None = None,
            node_gpus: float | None = None, gpu_memory_gib: float | None = None) -> int:
    """Print the placement plan of ``cfg`` and check it against a cluster: the stated shape where one is given
    (``cluster_cpus`` / ``cluster_gpus`` / ``node_gpus``), else the live one. A plan with GPUs also gets its memory
    plan per GPU (``dreamgym.memory_plan``; ``gpu_memory_gib`` per GPU, default an 80 GB GPU), which must fit too.
    Exit code 0 when it fits, 2 when not."""
    from dreamgym.memory_plan import DEFAULT_GPU_GIB, gpu_count, plan_memory
    from dreamgym.placement import experience_sft_plan, plan_placement
    from dreamgym.study.arms import fine_tunes_experience_model

    plan = plan_placement(cfg)
    print(plan.table())
    if cluster_cpus is None and cluster_gpus is None:
        cpus, gpus, largest, what = cluster_shape(cfg)
        node_gpus = largest if node_gpus is None else node_gpus
    else:
        cpus, gpus, what = cluster_cpus, cluster_gpus, "the stated cluster shape"
    shape = ", ".join(x for x in (f"{cpus:g} CPUs" if cpus is not None else "",
                                  f"{gpus:g} GPUs" if gpus is not None else "",
                                  f"{node_gpus:g} GPUs on the largest node" if node_gpus is not None else "") if x)
    problems = plan.problems(cpus, gpus, node_gpus)
    if plan.total_gpus > 0:
        memory = plan_memory(cfg, plan, max(int(gpus or 0), gpu_count(plan)), gpu_memory_gib or DEFAULT_GPU_GIB)
        print(memory.table())
        problems += memory.problems()
    if fine_tunes_experience_model(cfg):  # it runs first, alone, so it is checked as a plan of its own
        sft = experience_sft_plan(cfg)
        print("before the run, the experience-model fine-tune (train.experience_sft):")
        print(sft.table())
        problems += [f"experience-model fine-tune: {p}" for p in sft.problems(cpus, gpus, node_gpus)]
        if sft.total_gpus > 0:
            memory = plan_memory(cfg, sft, max(int(gpus or 0), gpu_count(sft)), gpu_memory_gib or DEFAULT_GPU_GIB)
            print(memory.table())
            problems += [f"experience-model fine-tune: {p}" for p in memory.problems()]
    if problems:
        print(f"does not fit {what} ({shape}): " + "; ".join(problems))
        return 2
    print(f"fits {what} ({shape})")
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
