"""``dreamgym collect``: scripted episodes on many Ray actors, streamed to one Parquet file.

Each ``CollectWorker`` owns one environment instance (one JVM for Java engines) and runs batches of
consecutive task seeds; the driver keeps at most two batches in flight per worker and writes every
finished batch as one Parquet row group, so memory stays bounded however many episodes are asked for.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
from tqdm import tqdm

from actors.cluster import close_actors, cluster_cpus, connect, unwrap_actor_error
from dreamgym.collect import EpisodeStats, collect_range
from dreamgym.config import DreamGymConfig, EnvConfig
from dreamgym.data.transitions import TransitionWriter, transitions_to_batch
from dreamgym.envs.registry import make_env
from dreamgym.errors import ConfigError
from dreamgym.policies import make_policy
from dreamgym.runs import MetricsLog, create_run_dir


@ray.remote(num_cpus=1)
class CollectWorker:
    """One real environment and one scripted policy; runs ranges of task seeds."""

    def __init__(self, env_cfg: dict[str, Any], policy: str, gold_fraction: float, run_seed: int, run_tag: str):
        self.env = make_env(EnvConfig.model_validate(env_cfg))
        self.policy = make_policy(policy, gold_fraction)
        self.run_seed = run_seed
        self.run_tag = run_tag
        self.split = env_cfg["split"]

    def ready(self) -> bool:
        return True

    def close(self) -> bool:
        """Release the environment (a remote one holds a server-side environment: a JVM on ScienceWorld)."""
        self.env.close()
        return True

    def run(self, first: int, count: int) -> tuple[pa.RecordBatch, EpisodeStats]:
        transitions, stats = collect_range(
            self.env, self.policy, first, count, self.split, self.run_seed, self.run_tag
        )
        return transitions_to_batch(transitions), stats


def _num_workers(cfg: DreamGymConfig) -> int:
    if cfg.collect.workers:
        return cfg.collect.workers
    return max(1, min(cluster_cpus(), 8, cfg.collect.episodes))


def run_collect(cfg: DreamGymConfig, progress: bool = True) -> dict[str, Any]:
    """Collect ``cfg.collect.episodes`` episodes; returns the summary also saved in the run dir."""
    if cfg.collect.episodes < 1:
        raise ConfigError("collect.episodes is 0: nothing to collect (give --episodes N with N >= 1)")
    # Build one environment in the driver first so a bad spec, a bad parameter or a missing Java
    # runtime fails here with its own message, not inside an actor.
    make_env(cfg.env).close()
    run_dir = create_run_dir(cfg, "collect")
    out = Path(cfg.collect.out) if cfg.collect.out else run_dir / "transitions.parquet"
    where = connect(cfg.ray)
    metrics = MetricsLog(run_dir)
    c = cfg.collect
    n_workers = _num_workers(cfg)
    run_tag = f"{cfg.env.name}/{c.policy}/seed{cfg.run.seed}"
    workers = [
        CollectWorker.remote(cfg.env.model_dump(mode="json"), c.policy, c.gold_fraction, cfg.run.seed, run_tag)
        for _ in range(n_workers)
    ]
    try:
        ray.get([w.ready.remote() for w in workers])
    except ray.exceptions.RayActorError as e:
        raise unwrap_actor_error(e) from None

    ranges = [(c.first_seed + s, min(c.episodes_per_batch, c.episodes - s))
              for s in range(0, c.episodes, c.episodes_per_batch)]
    total = EpisodeStats()
    start = time.perf_counter()
    bar = tqdm(total=c.episodes, unit="ep", desc=f"collect {cfg.env.name} ({where}, {n_workers} workers)",
               disable=not progress)
    pending: dict[ray.ObjectRef, Any] = {}
    idle = list(workers) * 2  # two batches in flight per worker hide the driver's write time
    with TransitionWriter(out) as writer:
        try:
            while ranges or pending:
                while ranges and idle:
                    w = idle.pop()
                    first, count = ranges.pop(0)
                    pending[w.run.remote(first, count)] = w
                done, _ = ray.wait(list(pending), num_returns=1)
                w = pending.pop(done[0])
                batch, stats = ray.get(done[0])
                writer.write(batch)
                idle.append(w)
                total.add(stats)
                elapsed = time.perf_counter() - start
                bar.update(stats.episodes)
                bar.set_postfix(trans=total.transitions, tps=f"{total.transitions / elapsed:.0f}",
                                success=f"{total.successes / max(total.episodes, 1):.0%}")
                metrics.write(event="batch", episodes=total.episodes, transitions=total.transitions,
                              successes=total.successes, elapsed_s=round(elapsed, 3))
        except ray.exceptions.RayTaskError as e:
            raise unwrap_actor_error(e) from None
        finally:
            bar.close()
            close_actors(workers)
    elapsed = time.perf_counter() - start
    summary = {
        "out": str(out),
        "run_dir": str(run_dir),
        "env": cfg.env.name,
        "policy": c.policy,
        "episodes": total.episodes,
        "transitions": total.transitions,
        "success_rate": total.successes / max(total.episodes, 1),
        "elapsed_s": elapsed,
        "transitions_per_s": total.transitions / max(elapsed, 1e-9),
        "workers": n_workers,
    }
    metrics.write(event="summary", **summary)
    return summary
