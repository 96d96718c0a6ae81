"""Setting up a ``dreamgym train`` run: offline data, the replay buffer, every actor, the warm start.

Everything here runs before the first iteration (or again on ``--resume``, skipping what is done):

0. on a joined cluster, a check that every node that may read or write the run directory sees it
   (``check_run_dir``; ``actors.files``): the offline data reaches the actors through the object store,
   checkpoints, the replay storage and the fine-tuned experience model stay in the run directory;
1. offline real data: ``train.offline_data`` or a collection with ``collect.*`` into the run directory;
2. the replay buffer (``ShardedReplayBuffer``, S shard actors over ``replay.path`` or ``<run>/replay``),
   seeded with the offline data once;
3. the actors, each with the resources its config section names: policy engines (``policy.*``),
   experience-model replicas (``experience_model.*``, synthetic modes only), the learner
   (``learner.data_parallel`` ranks of ``learner.num_cpus``/``num_gpus``), the curriculum (with text
   generation through the replicas) and the rollout workers (``train.rollout.*``). ``train.colocate`` packs
   the learner and the engines in one placement group. A cluster without the CPUs/GPUs all of them ask for
   fails here, naming the numbers.
4. the warm start: behaviour cloning on the offline gold episodes (``learner.bc``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from actors.cluster import close_actors, wait_names_free
from actors.files import check_shared_run_dir, ship_file
from dreamgym.config import DreamGymConfig
from dreamgym.errors import ConfigError, TrainingFaultError
from dreamgym.placement import CURRICULUM_CPUS, PlacementPlan, plan_placement, shares_gpus
from dreamgym.schedule import Schedule, steps_learner, uses_replay
from dreamgym.types import Transition
from learner.checkpoint import META_FILE, read_meta

#: Seconds between status lines while a long setup stage (the experience-model SFT) runs.
STATUS_INTERVAL_S = 30.0


@dataclass
class Actors:
    """Handles of one run's actors (the driver kills them at the end) and the placement groups they sit in."""

    engines: list[Any] = field(default_factory=list)
    replicas: list[Any] = field(default_factory=list)
    learner: Any = None
    """One learner actor's handle, or a ``LearnerGroup`` (``learner.data_parallel`` > 1) that answers like one."""
    curriculum: Any = None
    workers: list[Any] = field(default_factory=list)
    worker_names: list[str] = field(default_factory=list)
    """The workers' Ray names: a run that resumes itself in the same driver reuses them once they are free."""
    replay: Any = None
    placement_groups: dict[str, Any] = field(default_factory=dict)
    plan: PlacementPlan | None = None
    offline: Any = None
    """The offline data in the object store (``actors.files.ShippedFile``), held for the whole run and sent with
    every rollout call: a worker that Ray restarts reads it again."""

    def worker_parts(self) -> Any:
        """What the rollout workers call (``actors.rollout.WorkerParts``), sent with each of their ``run`` calls."""
        from actors.rollout import WorkerParts

        return WorkerParts(self.engines, self.replicas, self.replay, self.offline)

    def shutdown(self) -> None:
        if self.replay is not None:
            with contextlib.suppress(Exception):
                self.replay.close()
        # Rollout workers and the curriculum hold environments (server-side ones for remote:*): close them first.
        close_actors([h for h in [*self.workers, self.curriculum] if h is not None])
        wait_names_free(self.worker_names)
        from actors.learner_group import learner_handles

        for h in [*learner_handles(self.learner), *self.replicas, *self.engines]:
            if h is not None:
                ray.kill(h)
        if self.placement_groups:
            from actors.placement import remove_groups

            remove_groups(self.placement_groups)
            self.placement_groups = {}


def requested_resources(cfg: DreamGymConfig) -> tuple[float, float]:
    """``(CPUs, GPUs)`` all actors of a run reserve together (the totals of ``plan_placement(cfg)``)."""
    plan = plan_placement(cfg)
    return plan.total_cpus, plan.total_gpus


def _ray_is_local(cfg: DreamGymConfig) -> bool:
    """Whether this run started its own single-node Ray (it cannot grow: no point waiting for resources)."""
    import os

    return not (cfg.ray.address or os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_ID"))


def check_resources(cfg: DreamGymConfig, log: Callable[[str], None] = print,
                    plan: PlacementPlan | None = None) -> None:
    """Wait (at most ``ray.resources_timeout_s``; no wait on a locally started Ray) until the cluster offers the
    CPUs/GPUs all actors ask for, asking an autoscaling cluster for them; raise ``ConfigError`` naming what is
    missing otherwise."""
    from actors.placement import wait_for_resources

    timeout = 0.0 if _ray_is_local(cfg) else cfg.ray.resources_timeout_s
    wait_for_resources(plan or plan_placement(cfg), timeout, log)


def run_dir_roles(cfg: DreamGymConfig) -> dict[str, dict[str, float]]:
    """The roles that read or write the run directory, each with its Ray resource demand: the learner
    (checkpoints), the experience-model SFT task (the fine-tuned model) and the replicas that load it, and the
    replay shards of an embedded buffer. Rollout workers and the curriculum read nothing there; a run without a
    learner or replay shards (``steps_learner``, ``uses_replay``) has none of them."""
    le, em = cfg.learner, cfg.experience_model
    roles = {"learner": {"CPU": le.num_cpus, "GPU": le.num_gpus}} if steps_learner(cfg.train) else {}
    schedule = Schedule.from_config(cfg.train)
    if cfg.train.experience_sft and schedule.uses_synthetic and em.backend == "ray":
        roles["experience-model SFT"] = {"CPU": le.num_cpus, "GPU": le.num_gpus}
        roles["experience-replica"] = {"CPU": em.engine.num_cpus, "GPU": em.engine.gpus(), **em.engine.resources}
    if cfg.replay.backend != "server" and uses_replay(cfg.train):
        roles["replay-shard"] = {"CPU": cfg.replay.num_cpus}
    return roles


def check_run_dir(cfg: DreamGymConfig, run_dir: Path, log: Callable[[str], None] = print) -> None:
    """On a joined cluster: refuse (``ConfigError``) unless every node that may host a role of ``run_dir_roles``
    sees ``run_dir`` (``actors.files.check_shared_run_dir``). A Ray this run started is one node: nothing to do."""
    if not _ray_is_local(cfg):
        check_shared_run_dir(run_dir, run_dir_roles(cfg), log)


# -- offline data and the replay buffer -----------------------------------------------------------
def offline_data(cfg: DreamGymConfig, run_dir: Path, log: Callable[[str], None]) -> Path | None:
    """The offline real transitions: ``train.offline_data``, or a collection into ``<run>/offline.parquet``;
    ``None`` with ``collect.episodes: 0`` (real-mode training only: synthesis starts from real data)."""
    if cfg.train.offline_data is not None:
        path = Path(cfg.train.offline_data)
        if not path.is_file():
            raise ConfigError(f"train.offline_data {path} does not exist")
        return path
    path = run_dir / "offline.parquet"
    if path.is_file():
        return path
    if cfg.collect.episodes == 0:
        if Schedule.from_config(cfg.train).uses_synthetic:
            raise ConfigError("collect.episodes is 0 and train.offline_data is unset, but synthetic iterations need "
                              "offline real data (tasks, initial states, demonstrations): collect some episodes or "
                              "give --train.offline_data F.parquet, or use --train.mode real")
        log("no offline data (collect.episodes 0): the replay buffer starts empty")
        return None
    from actors.collect import run_collect

    sub = cfg.model_copy(deep=True)
    sub.collect.out = path
    sub.run.out_dir = run_dir / "stages"
    s = run_collect(sub, progress=False)
    log(f"collected {s['transitions']} real transitions from {s['episodes']} {s['policy']} episodes "
        f"(success {s['success_rate']:.0%}) in {s['elapsed_s']:.1f} s")
    return path


def open_replay(cfg: DreamGymConfig, run_dir: Path) -> Any:
    from actors.replay import ShardedReplayBuffer

    root = cfg.replay.path or (run_dir / "replay" if cfg.replay.backend != "server" else None)
    buf = ShardedReplayBuffer.create(cfg.replay, root)
    buf.warm()  # the encoder loads while the engines start: the seeding and the first writes need it
    return buf


def seed_replay(replay: Any, data: Path, batch_size: int) -> dict[str, Any]:
    from dreamgym.replay.seed import seed_from_parquet

    rep = seed_from_parquet(replay, data, batch_size=batch_size, progress=False)
    return {"rows": rep.rows, **rep.result.to_dict(), "seconds": round(rep.seconds, 2)}


# -- the experience model ------------------------------------------------------------------------
def experience_sft(cfg: DreamGymConfig, offline: Path, run_dir: Path, log: Callable[[str], None]) -> Path:
    """The experience model fine-tuned on the offline data (``learner.sft_experience``, the paper's loss) in Ray
    actors with the learner's resources and rank count (``actors.experience_sft``: data-parallel over
    ``learner.data_parallel`` ranks, one process with one); reused when the run directory already has it (resume).
    Rank 0 first annotates the offline data (``experience_model.annotate``: a teacher, else template rationales)."""
    from actors.experience_sft import start_sft_ranks

    out = run_dir / "experience_model"
    if (out / "dreamgym_sft.json").is_file():
        return out
    c = cfg.model_copy(deep=True)
    c.experience_model.train.step_budget = cfg.env.max_steps  # the budget the offline episodes were cut at
    c.experience_model.train.threads = c.experience_model.train.threads or cfg.learner.threads
    c.experience_model.train.log_every = 1
    progress = run_dir / "experience_sft.jsonl"
    watch = _SFTWatch(progress, c.experience_model.train.max_steps, c.experience_model.train.stall_timeout_s, log)
    ranks = start_sft_ranks(c, log)
    try:
        rank0 = ranks.handles[0]
        annotated = watch.get([rank0.annotate.remote(c.model_dump(mode="json"), str(offline),
                                                     str(run_dir / "offline_annotated.parquet"))])[0]
        c.experience_model.train.data = Path(annotated)
        if ranks.world_size > 1:
            address, port = watch.get([rank0.rendezvous.remote()])[0]
            watch.get(ranks.join(c, address, port))
        s = watch.get(ranks.train(c, out, progress))[0]
    finally:
        ranks.kill()  # done, failed, stalled or interrupted: no rank trains on, and the run's actors get the GPUs
    ranks_note = f" on {ranks.world_size} data-parallel ranks" if ranks.world_size > 1 else ""
    log(f"experience model fine-tuned on {s['examples']} offline transitions ({s['steps']} steps{ranks_note}, loss "
        f"{s['loss_first']:.3f} -> {s['loss_last']:.3f}) in {s['train_seconds']:.0f} s")
    return out


class _SFTWatch:
    """Waits on the fine-tune's calls with a status line every ``STATUS_INTERVAL_S`` from its progress file (minutes
    of work), and stops it (``TrainingFaultError``) once that file has not grown for ``bound`` seconds
    (``experience_model.train.stall_timeout_s``: a hung rank, a lost node)."""

    def __init__(self, progress: Path, total: int | None, bound: float, log: Callable[[str], None]) -> None:
        self.progress, self.total, self.bound, self.log = progress, total, bound, log
        self.size, self.changed, self.t0 = -1, time.monotonic(), time.perf_counter()

    def get(self, refs: list[Any]) -> list[Any]:
        """``ray.get(refs)``; the first call that fails fails it at the next look, not when the others end."""
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=STATUS_INTERVAL_S)
            ray.get(done)
            if pending:
                self._look()
        return ray.get(refs)

    def _look(self) -> None:
        now_size = self.progress.stat().st_size if self.progress.is_file() else 0
        if now_size != self.size:
            self.size, self.changed = now_size, time.monotonic()
        elif time.monotonic() - self.changed > self.bound:
            raise TrainingFaultError(
                f"the experience-model fine-tune made no progress for {self.bound:.0f} s "
                f"(experience_model.train.stall_timeout_s; progress in {self.progress}): stopped it")
        self.log(_sft_status(self.progress, self.total, time.perf_counter() - self.t0))


def _sft_status(progress: Path, total: int | None, elapsed: float) -> str:
    """One line on the experience-model SFT so far, from the last record of its progress file."""
    lines = progress.read_text().splitlines() if progress.is_file() else []
    if not lines:
        return f"experience model SFT: annotating and loading the base model ({elapsed:.0f} s)"
    rec = json.loads(lines[-1])
    steps = f"{rec['step']}/{total}" if total else str(rec["step"])
    return (f"experience model SFT: step {steps}, loss {rec['loss']:.3f}, "
            f"{rec.get('tokens_per_s', 0.0):.0f} tok/s ({elapsed:.0f} s)")


# -- actors -----------------------------------------------------------------------------------------
def _curriculum_generator(em: dict[str, Any], replicas: list[Any]) -> Any:
    """Built inside the curriculum actor: text variants through the experience model (replicas or HTTP)."""
    from actors.experience_model import RayExperienceClient, connect_experience_model
    from dreamgym.config import ExperienceModelConfig
    from dreamgym.curriculum.generator import ClientTextGenerator

    cfg = ExperienceModelConfig.model_validate(em)
    if replicas:
        return ClientTextGenerator(RayExperienceClient(replicas, cfg.router_refresh_s, cfg.request_timeout_s))
    return ClientTextGenerator(connect_experience_model(cfg))


def start_actors(cfg: DreamGymConfig, run_dir: Path, offline: Path | None, checkpoint: Path | None,
                 curriculum_state: dict[str, Any] | None, log: Callable[[str], None]) -> Actors:
    from actors.curriculum import create_curriculum_actor
    from actors.learner_group import create_learner_group
    from actors.placement import actor_options, create_groups
    from actors.policy_engine import create_policy_engines
    from actors.rollout import create_rollout_workers
    from actors.weight_sync import engine_transfer_backend
    from dreamgym.sync_choice import sleeps_engines

    plan = plan_placement(cfg)  # the one plan: checked, placed and started as is
    check_resources(cfg, log, plan)
    a = Actors(plan=plan)
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="start")
    try:
        a.placement_groups = create_groups(plan, cfg.ray.resources_timeout_s, log)

        def placed(role: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
            return [actor_options(x, a.placement_groups) for x in plan.role(role)]

        # One set of options per learner rank (``learner.data_parallel``); only the bundle matters to them.
        learner_places = [{k: v for k, v in opts.items() if k == "scheduling_strategy"} or None
                          for opts, _ in placed("learner")]
        engine_places = placed("policy-engine")
        # The engines, replicas, learner and replay shards load their models at the same time, except where GPU
        # processes may share a GPU (``shares_gpus``): then the engines start one by one, the replicas one by one,
        # and the learner last (vLLM's profiling charges whatever else loads meanwhile to the engine profiled).
        one_by_one = shares_gpus(plan)
        ckpt = checkpoint if checkpoint is not None and (checkpoint / META_FILE).is_file() else None
        learner = bool(plan.role("learner"))  # no learner in a run that only evaluates (``steps_learner``)
        if ckpt is not None and not learner and read_meta(ckpt)["version"] > 0:
            raise ConfigError(f"{ckpt} holds trained weights, which only a learner gives the engines, but this run "
                              "has none (train.iterations 0 and no train.warm_start): resume it with the "
                              "train.iterations it was started with")
        f_replay = pool.submit(open_replay, cfg, run_dir) if uses_replay(cfg.train) else None
        f_engines = pool.submit(create_policy_engines, cfg.policy,
                                weight_transfer_backend=engine_transfer_backend(cfg),
                                placements=engine_places if plan.role("policy-engine")[0].group else None,
                                one_by_one=one_by_one, sleep_mode=sleeps_engines(cfg))
        if one_by_one:
            f_engines.result()
        f_learner = None if one_by_one or not learner else pool.submit(create_learner_group, cfg, ckpt,
                                                                        learner_places)
        f_replicas = None
        if Schedule.from_config(cfg.train).uses_synthetic:
            from actors.experience_model import start_replicas

            if cfg.experience_model.backend == "local":
                raise ConfigError("dreamgym train reaches the experience model through Ray replicas or HTTP: set "
                                  "experience_model.backend to 'ray' or 'http'")
            if cfg.experience_model.backend == "ray":
                replica_places = placed("experience-replica")
                in_groups = any(x.group for x in plan.role("experience-replica"))
                f_replicas = pool.submit(start_replicas, cfg.experience_model,
                                         placements=replica_places if in_groups else None, one_by_one=one_by_one)
                if one_by_one:
                    f_replicas.result()
        if f_learner is None and learner:
            f_learner = pool.submit(create_learner_group, cfg, ckpt, learner_places)
        a.replay = f_replay.result() if f_replay is not None else None
        a.engines = f_engines.result()
        log(f"{len(a.engines)} policy engine(s) up ({cfg.policy.model}, {cfg.policy.engine.resolved_dtype()})")
        if f_replicas is not None:
            a.replicas = f_replicas.result()
            nodes = sorted({x["node"] for x in ray.get([r.info.remote() for r in a.replicas])})
            log(f"{len(a.replicas)} experience-model replica(s) up ({cfg.experience_model.model}) on node(s) "
                f"{', '.join(nodes)}")
        # The learner loads the policy model too: bounded like the engines (it has no timeout setting of its own).
        learner_timeout = max(cfg.policy.engine.start_timeout_s, cfg.experience_model.engine.start_timeout_s)
        try:
            a.learner = f_learner.result(timeout=learner_timeout) if f_learner is not None else None
        except FuturesTimeout:
            raise RuntimeError(f"learner: not up within {learner_timeout:g} s (the larger of policy.engine and "
                               "experience_model.engine start_timeout_s bounds it)") from None
        factory = None
        # The copy backend has no model to write task variants with: its curriculum generates parameter tasks only.
        if (Schedule.from_config(cfg.train).uses_synthetic and cfg.curriculum.llm_variants > 0
                and cfg.experience_model.backend != "copy"):
            factory = functools.partial(_curriculum_generator, cfg.experience_model.model_dump(mode="json"), a.replicas)
        # The offline data reaches the curriculum and the workers through the object store (any node reads it).
        a.offline = None if offline is None else ship_file(offline)
        a.curriculum = create_curriculum_actor(cfg, generator_factory=factory, state=curriculum_state,
                                               num_cpus=CURRICULUM_CPUS, offline_data=a.offline,
                                               use_env=Schedule.from_config(cfg.train).uses_real_training)
        prefix = f"rollout-{run_dir.name}-{os.getpid()}"
        a.workers = create_rollout_workers(cfg, name_prefix=prefix, log=log)
        a.worker_names = [f"{prefix}-{i}" for i in range(len(a.workers))]
    except BaseException:
        # Handles not yet assigned belong to actors owned by this driver: Ray ends them when it exits.
        a.shutdown()
        raise
    finally:
        pool.shutdown(wait=False)
    return a


# -- warm start ---------------------------------------------------------------------------------------
def gold_for_warm_start(cfg: DreamGymConfig, offline: Path | None, run_dir: Path) -> list[list[Transition]]:
    """Gold episodes for the warm start: from ``offline``, else collected with the gold policy into
    ``<run>/gold.parquet`` (reused when it is there). Called before any actor starts, so a collection never
    waits for CPUs the run's actors hold."""
    from dreamgym.data.expert import gold_episodes
    from dreamgym.data.transitions import iter_transitions
    from dreamgym.errors import DreamGymError

    limit = cfg.train.warm_start.episodes
    episodes = gold_episodes(iter_transitions(offline), limit=limit) if offline else []
    if not episodes:
        gold = run_dir / "gold.parquet"
        if not gold.is_file():
            from actors.collect import run_collect

            sub = cfg.model_copy(deep=True)
            sub.collect.policy, sub.collect.episodes, sub.collect.out = "gold", limit, gold
            sub.run.out_dir = run_dir / "stages"
            run_collect(sub, progress=False)
        episodes = gold_episodes(iter_transitions(gold), limit=limit)
    if not episodes:
        raise DreamGymError(f"no successful gold episode of {cfg.env.name} to clone")
    return episodes


def warm_start(cfg: DreamGymConfig, actors: Actors, episodes: list[list[Any]], log: Callable[[str], None],
               record: Callable[[dict[str, Any]], None],
               get: Callable[[Any, str], Any] | None = None) -> int:
    """Behaviour cloning on gold episodes in the learner actor; returns the new weight version. ``get(ref,
    what)`` waits on each learner call (the driver's fault path, ``Run.remote``; default ``ray.get``)."""
    from learner.bc import run_bc

    wait = get or (lambda ref, what: ray.get(ref))
    trajs = wait(actors.learner.tokenise_gold.remote(episodes), "tokenising the gold episodes")
    t = cfg.train.warm_start

    def show(m: dict[str, Any]) -> None:
        record(m)
        log(f"step {int(m['bc_step'])}/{t.steps} on {len(trajs)} gold episodes: gold-reply NLL {m['nll']:.3f} "
            f"({m['tokens_per_s']:.0f} tok/s)")

    run_bc(lambda batch: wait(actors.learner.warm_start_step.remote(batch, t.lr), "a warm-start step"), trajs,
           t.steps, t.batch_episodes, cfg.run.seed, show)
    return int(wait(actors.learner.end_warm_start.remote(), "the end of the warm start"))
