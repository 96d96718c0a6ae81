"""``RolloutWorker``: a Ray actor that owns environments and runs episodes with the policy engines.

Each worker owns ``train.rollout.envs_per_worker`` environments of each kind it uses, made on first use: real
ones (one Java engine each for TextWorldExpress), evaluation ones (``train.eval.env``, else the real ones) and
``SyntheticEnv`` instances over the shared experience-model replicas (least-loaded router) and the replay
buffer's retrieval. ``run(tasks, phase)`` runs one episode per task with ``dreamgym.rollout.run_episodes``
in the environment of the phase's ``dreamgym.schedule.rollout_plan``; the policy is the engines' batched
``act``, split across the engines.

A ``SyntheticEnv`` needs each task's initial state ``s_0`` and the valid actions of the states it reaches:
both come from the real data (``OfflineTaskFacts`` over the offline file, which reaches the worker through
the object store as an ``actors.files.ShippedFile`` in the ``WorkerParts`` of each ``run`` call; nothing is
read from the driver's node). Only when
training also uses the real environment (``real``, ``s2r``) does a task unknown to the data get its ``s_0``
from a *reset* of the real environment (no action is taken, so no real transition is spent); a ``synthetic``
run never opens one.

Phases: ``real`` (training in the real environment), ``synthetic`` (training in the experience model),
``eval`` (the policy on held-out real tasks, optionally at another temperature) and ``random`` (the
random-valid-action baseline on the same tasks).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from dreamgym.config import DreamGymConfig
from dreamgym.data.task_facts import OfflineTaskFacts
from dreamgym.envs.registry import make_env
from dreamgym.errors import ActorHungError
from dreamgym.rollout import ActFn, RolloutStats, random_valid_act, run_episodes
from dreamgym.schedule import Schedule, rollout_plan
from dreamgym.types import ActionSample, AgentTurn, Demonstration, Task, Trajectory
from dreamgym.watchdog import Waits, hung_message

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from actors.files import ShippedFile
    from dreamgym.envs.base import Environment


def engines_act(engines: Sequence[ActorHandle], temperature: float | None = None, timeout_s: float | None = None,
                waits: Waits | None = None) -> ActFn:
    """The batched policy over engine actors: the turns are split evenly, one ``act`` call per engine.

    ``timeout_s`` (``train.watchdog.engine_s``) bounds the calls together: an engine that has not answered by
    then is alive but stuck, and ``ActorHungError`` names it. An engine gives up a little earlier on a weight
    update that keeps it from generating (``wait_s``; ``dreamgym.weight_gate``), so its own error, naming the
    update, arrives first. ``waits`` registers each wait (the status line)."""

    def act(turns: Sequence[AgentTurn]) -> list[ActionSample]:
        k = len(engines)
        chunks = [list(turns[i::k]) for i in range(k)]
        kw: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
        if timeout_s is not None:
            kw["wait_s"] = timeout_s * 0.9
        refs = [e.act.remote(c, 1, **kw) if c else None for e, c in zip(engines, chunks, strict=True)]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        answers: list[list[list[ActionSample]]] = []
        for i, r in enumerate(refs):
            if r is None:
                answers.append([])
                continue
            what = f"policy-engine-{i} act ({len(chunks[i])} turns)"
            with waits.waiting(what) if waits is not None else contextlib.nullcontext():
                try:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    answers.append(ray.get(r, timeout=left))
                except ray.exceptions.GetTimeoutError:
                    raise ActorHungError(hung_message(what, timeout_s or 0.0, "train.watchdog.engine_s")) from None
                except ray.exceptions.RayTaskError as e:  # the engine's own WeightUpdateStalledError: a fault
                    if isinstance(e.cause, ActorHungError):
                        raise e.cause from None
                    raise
        out: list[ActionSample | None] = [None] * len(turns)
        for i, ans in enumerate(answers):
            for j, samples in enumerate(ans):
                out[i + j * k] = samples[0]
        return [s for s in out if s is not None]

    return act


@dataclass
class WorkerParts:
    """What a rollout worker calls and reads: the policy engines, the experience-model replicas, the replay
    buffer (its shards' handles) and the offline data. Sent with every ``run`` call, not to the constructor:
    Ray logs an error for a restartable actor whose constructor arguments hold object-store references, and
    actor handles count as such; a worker that Ray restarted gets them again with its next call."""

    engines: list[ActorHandle]
    replicas: list[ActorHandle] = field(default_factory=list)
    replay: Any = None
    offline_data: ShippedFile | None = None


class RolloutWorker:
    """The actor class (``create_rollout_workers`` applies ``ray.remote``); its ``WorkerParts`` come with the
    first ``run`` call."""

    def __init__(self, cfg: dict[str, Any], index: int = 0) -> None:
        self.cfg = DreamGymConfig.model_validate(cfg)
        self.index = index
        self.engines: list[ActorHandle] = []
        self.replicas: list[ActorHandle] = []
        self.replay: Any = None
        self.offline_data: ShippedFile | None = None
        self.schedule = Schedule.from_config(self.cfg.train)
        self._envs: dict[str, list[Environment]] = {}
        """Environments by kind (``real``, ``eval``, ``synthetic``), each list made on first use: a run that
        never trains or evaluates in the real environment never opens one."""
        self.facts = OfflineTaskFacts()
        """Tasks, initial states and valid actions known from real data (the offline file, real resets)."""
        self._reset_initial: dict[str, str] = {}
        self._reset_lock = threading.Lock()
        self.real_resets = 0
        self._experience: Any = None
        self._live: dict[str, Any] = {"phase": None, "episodes": 0, "tasks": 0, "steps": 0, "running": False}
        self.waits = Waits()
        self._router: Any = None
        """The engine and replica calls this worker waits on now (its ``progress`` names the oldest)."""

    def ready(self) -> dict[str, Any]:
        return {"index": self.index, "engines": len(self.engines), "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id()}

    def envs(self, kind: str) -> list[Environment]:
        """This worker's ``train.rollout.envs_per_worker`` environments of ``kind``, made on first use."""
        if kind == "eval" and self.cfg.train.eval.env is None:
            kind = "real"
        if kind not in self._envs:
            n = self.cfg.train.rollout.envs_per_worker
            if kind == "synthetic":
                self._envs[kind] = self._build_synthetic()
            else:
                spec = self.cfg.env if kind == "real" else self.cfg.train.eval.env
                assert spec is not None
                self._envs[kind] = [make_env(spec) for _ in range(n)]
        return self._envs[kind]

    def tasks(self, count: int, first: int, split: str) -> list[Task]:
        """Reproducible tasks of the evaluation environment (the held-out evaluation set)."""
        return self.envs("eval")[0].tasks(count, first=first, split=split)

    # -- synthetic environments ----------------------------------------------------------------------
    def _build_synthetic(self) -> list[Environment]:
        from actors.experience_model import RayExperienceClient
        from dreamgym.experience.setup import build_model
        from dreamgym.experience.synthetic_env import SyntheticEnv

        em = self.cfg.experience_model
        if self.replicas:
            client: Any = RayExperienceClient(self.replicas, em.router_refresh_s, em.request_timeout_s, owns=False,
                                              revive_timeout_s=em.revive_timeout_s, waits=self.waits)
            self._router = client.router
        elif em.backend in ("http", "copy"):  # copy: the top-1 retrieved transition, no model (copy-sim)
            from actors.experience_model import connect_experience_model

            client = connect_experience_model(em)
        else:
            raise RuntimeError("synthetic rollouts need experience-model replicas or experience_model.backend: "
                               "http or copy")
        self._experience = build_model(em, client, self.cfg.env.state_max_chars)
        if self.offline_data is not None:
            from actors.files import local_copy
            from dreamgym.data.transitions import iter_transitions

            with local_copy(self.offline_data) as path:
                for t in iter_transitions(path):
                    if t.env == self.cfg.env.name:
                        self.facts.add(t)
        retrieve = self._retrieve if self.replay is not None and em.top_k > 0 else None
        return [SyntheticEnv(self._experience, retrieve, self.cfg.env.name, top_k=em.top_k,
                             max_steps=self.cfg.env.max_steps, state_max_chars=self.cfg.env.state_max_chars,
                             initial_state=self._initial_state, admissible=self._admissible,
                             action_space=self.facts.action_space)
                for _ in range(self.cfg.train.rollout.envs_per_worker)]

    def _admissible(self, state: str) -> list[str] | None:
        """The valid actions a synthetic state shows the policy: recorded for it, or for the most similar
        recorded state (``experience_model.similar_state_actions``)."""
        return self.facts.admissible_like(state, self.cfg.experience_model.similar_state_actions)

    def _retrieve(self, state: str, action: str, k: int) -> list[Demonstration]:
        """Top-k demonstrations from the replay buffer, of this worker's environment."""
        return self.replay.retrieve(state, action, k, filters={"env": self.cfg.env.name})

    def _initial_state(self, task: Task) -> str | None:
        """``s_0`` of ``task``: from the offline data; else, when training uses the real environment (``real``,
        ``s2r``), from a reset of it (cached; a reset spends no transition). A synthetic-only run never resets:
        a task with no known initial state is refused by the ``SyntheticEnv``, naming it."""
        known = self.facts.initial_state(task) or self._reset_initial.get(task.task_id)
        if known is not None or not self.schedule.uses_real_training:
            return known
        with self._reset_lock:
            obs = self.envs("real")[0].reset(task)
            self.real_resets += 1
        self._reset_initial[task.task_id] = obs.state
        self.facts.add_state(obs.state, obs.admissible_actions)
        return obs.state

    # -- rollouts ------------------------------------------------------------------------------------
    def run(self, tasks: list[Task], phase: str, temperature: float | None = None,
            seed: int = 0, parts: WorkerParts | None = None) -> tuple[list[Trajectory], dict[str, Any]]:
        """One episode per task. ``phase``: ``real``, ``synthetic``, ``eval`` or ``random``. ``parts``: the
        engines, replicas, replay buffer and offline data of the run (kept from the first call)."""
        if parts is not None and not self.engines:
            self.engines, self.replicas = list(parts.engines), list(parts.replicas)
            self.replay, self.offline_data = parts.replay, parts.offline_data
        plan = rollout_plan(phase)
        threads = 1
        if plan.env == "synthetic":
            envs, threads = self.envs("synthetic"), self.cfg.train.rollout.synthetic_threads
        else:
            envs = self.envs(plan.env)
        act = (random_valid_act(seed) if plan.policy == "random"
               else engines_act(self.engines, temperature, self.cfg.train.watchdog.engine_s, self.waits))
        em_before = self._experience.stats.copy() if self._experience is not None else None
        self._live = {"phase": phase, "episodes": 0, "tasks": len(tasks), "steps": 0, "running": True}

        def on_step(s: RolloutStats) -> None:
            self._live = {"phase": phase, "episodes": s.episodes, "tasks": len(tasks), "steps": s.steps,
                          "running": True}

        source = "synthetic" if plan.env == "synthetic" else "real"
        trajs, stats = run_episodes(envs, tasks, act, source=source, threads=min(threads, len(envs)),
                                    policy_name=plan.policy,
                                    episode_prefix=f"w{self.index}-{phase}-{seed}", on_step=on_step)
        out: dict[str, Any] = stats.as_dict()
        if em_before is not None and phase == "synthetic":
            spent = self._experience.stats - em_before
            out.update({f"em_{key}": n for key, n in spent.counts().items()})
            out.update({f"em_reason:{why}": n for why, n in spent.reasons.items()})
        out["real_resets"] = self.real_resets
        out["notices"] = self._router.take_notices() if self._router is not None else []
        self._live = {**self._live, "running": False}
        return trajs, out

    @ray.method(concurrency_group="progress")
    def progress(self) -> dict[str, Any]:
        """Episodes and steps of the ``run`` in flight (answered while it runs: its own concurrency group), and the
        oldest engine or replica call it waits on (``waiting``, for ``waiting_s`` seconds) if any."""
        longest = self.waits.longest()
        waiting = {"waiting": longest[0], "waiting_s": round(longest[1], 1)} if longest else {}
        return {**self._live, **waiting, "pid": os.getpid(), "index": self.index}

    def close(self) -> None:
        for envs in self._envs.values():
            for env in envs:
                env.close()


def create_rollout_workers(
    cfg: DreamGymConfig,
    name_prefix: str | None = None,
    log: Callable[[str], None] | None = None,
) -> list[ActorHandle]:
    """Start ``train.rollout.workers`` workers with ``train.rollout.num_cpus`` (and ``resources``) each; returns
    once all are up, logging the nodes they run on to ``log``. What they call (``WorkerParts``) goes with each
    ``run`` call.

    Ray restarts a worker that dies up to ``train.rollout.max_restarts`` times (the driver runs its share of
    episodes again); ``name_prefix`` names them ``<prefix>-<i>`` (``ray list actors`` shows which run they serve).
    """
    r = cfg.train.rollout
    # ``progress`` answers in its own concurrency group while ``run`` holds the default one.
    cls = ray.remote(concurrency_groups={"progress": 1})(RolloutWorker)
    workers = [cls.options(num_cpus=r.num_cpus, max_restarts=r.max_restarts, resources=dict(r.resources) or None,
                           name=f"{name_prefix}-{i}" if name_prefix else None)
               .remote(cfg.model_dump(mode="json"), i)
               for i in range(r.workers)]
    ready = ray.get([w.ready.remote() for w in workers])
    if log is not None:
        nodes = sorted({x["node"] for x in ready})
        log(f"{len(workers)} rollout worker(s) up on node(s) {', '.join(nodes)}")
    return workers
