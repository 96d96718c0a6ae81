"""Where a ``dreamgym train`` run's actors go: one plan, computed from the config before any actor starts.

No Ray here: ``plan_placement(cfg)`` says what every role asks for and which bundles are packed
together; ``actors.placement`` turns the plan into Ray placement groups and actor options unchanged, and
``dreamgym train --dry-run`` prints it (``PlacementPlan.table``) and checks it against a cluster shape
(``PlacementPlan.problems``).

Rules:

- Every GPU an actor uses is reserved exactly once: either in a bundle of a placement group (the actor,
  or vLLM's tensor-parallel workers, run inside that bundle and ask for nothing outside it) or, for an
  actor outside any group, by the actor itself. ``PlacementPlan.total_gpus`` adds them up.
- A CUDA engine (policy engine or experience-model replica) of tensor-parallel size ``t`` gets ``t``
  one-GPU bundles in a ``STRICT_PACK`` group (one node, NVLink). The engine actor sits in its first
  bundle; with ``t`` = 1 it holds that GPU itself, with ``t`` > 1 it holds none and vLLM's Ray executor
  starts one worker per bundle (``VLLM_RAY_BUNDLE_INDICES``).
- The learner is ``learner.data_parallel`` actors (ranks), each with ``learner.num_cpus`` / ``num_gpus``.
- ``train.colocate``: the learner ranks' bundles (bundles ``0 .. N-1``) and every policy engine's bundles
  form one ``STRICT_PACK`` group. With the CUDA IPC sync (one learner rank and one engine sharing one GPU,
  ``dreamgym.sync_choice``) both sit in one bundle that holds the GPU fractions of both: the same device.
- CPU engines, rollout workers, replay shards, the curriculum and a learner without ``colocate`` are
  plain actors with their own ``num_cpus`` / ``num_gpus``.

``NcclRanks`` numbers the NCCL weight-sync group: the learner is rank 0, engine ``i``'s tensor-parallel
worker ``j`` is rank ``1 + i * t + j`` (vLLM adds the worker's own rank to the offset it is sent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dreamgym.config import DreamGymConfig, EngineConfig

#: Ray CPUs of the curriculum actor (it mostly waits).
CURRICULUM_CPUS = 0.25

#: Ray refuses an empty bundle; a bundle with nothing to reserve gets this much CPU.
MIN_BUNDLE_CPUS = 0.01


@dataclass(frozen=True)
class Bundle:
    """One bundle of a placement group: what it reserves on one node."""

    cpus: float
    gpus: float = 0.0

    def resources(self) -> dict[str, float]:
        """Ray's bundle mapping (never empty)."""
        out = {k: v for k, v in (("CPU", self.cpus), ("GPU", self.gpus)) if v}
        return out or {"CPU": MIN_BUNDLE_CPUS}


@dataclass(frozen=True)
class GroupPlan:
    """One placement group: its name, strategy and bundles."""

    name: str
    bundles: tuple[Bundle, ...]
    strategy: str = "STRICT_PACK"

    @property
    def cpus(self) -> float:
        return sum(max(b.cpus, 0.0 if b.gpus else MIN_BUNDLE_CPUS) for b in self.bundles)

    @property
    def gpus(self) -> float:
        return sum(b.gpus for b in self.bundles)


@dataclass(frozen=True)
class ActorPlan:
    """One actor: its role, index, what it asks Ray for and, inside a group, which bundles are its."""

    role: str
    index: int
    cpus: float
    gpus: float
    """What the actor process itself asks for (inside a group: a share of its first bundle)."""
    group: str | None = None
    bundles: tuple[int, ...] = ()
    """Bundle indices in ``group``: the actor runs in the first; a tensor-parallel engine's workers use all."""
    tensor_parallel_size: int = 1

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def gpus_used(self) -> float:
        """GPUs the actor and its workers use (a tensor-parallel engine: one per bundle)."""
        return self.gpus if self.tensor_parallel_size == 1 else float(self.tensor_parallel_size)


@dataclass
class PlacementPlan:
    """What every actor of a run asks for, and the placement groups that hold the GPU actors."""

    groups: list[GroupPlan] = field(default_factory=list)
    actors: list[ActorPlan] = field(default_factory=list)

    def group(self, name: str) -> GroupPlan:
        return next(g for g in self.groups if g.name == name)

    def role(self, role: str) -> list[ActorPlan]:
        return [a for a in self.actors if a.role == role]

    def loose(self) -> list[ActorPlan]:
        """Actors outside every placement group (they reserve their own resources)."""
        return [a for a in self.actors if a.group is None]

    @property
    def total_cpus(self) -> float:
        return sum(g.cpus for g in self.groups) + sum(a.cpus for a in self.loose())

    @property
    def total_gpus(self) -> float:
        return sum(g.gpus for g in self.groups) + sum(a.gpus for a in self.loose())

    def resource_bundles(self) -> list[dict[str, float]]:
        """Every reservation as a bundle (for the autoscaler's ``request_resources(bundles=...)``)."""
        out = [b.resources() for g in self.groups for b in g.bundles]
        out += [{k: v for k, v in (("CPU", a.cpus), ("GPU", a.gpus)) if v} for a in self.loose()]
        return [b for b in out if b]

    def problems(self, cluster_cpus: float | None = None, cluster_gpus: float | None = None,
                 node_gpus: float | None = None) -> list[str]:
        """Why the plan cannot be placed on a cluster of this shape (empty: it fits).

        ``node_gpus``: GPUs of the largest node; a ``STRICT_PACK`` group needs all of its GPUs on one node.
        """
        out = []
        if cluster_cpus is not None and self.total_cpus > cluster_cpus + 1e-9:
            out.append(f"the actors ask for {self.total_cpus:g} CPUs, the cluster has {cluster_cpus:g}")
        if cluster_gpus is not None and self.total_gpus > cluster_gpus + 1e-9:
            out.append(f"the actors ask for {self.total_gpus:g} GPUs, the cluster has {cluster_gpus:g}")
        if node_gpus is not None:
            for g in self.groups:
                if g.strategy == "STRICT_PACK" and g.gpus > node_gpus + 1e-9:
                    out.append(f"placement group {g.name} needs {g.gpus:g} GPUs on one node, the largest node "
                               f"has {node_gpus:g}")
        return out

    def table(self) -> str:
        """The actor map: role, count, CPUs and GPUs each, placement group and bundles; then the totals."""
        rows: list[tuple[str, ...]] = [("role", "count", "CPUs each", "GPUs each", "TP", "placement")]
        seen: dict[tuple[Any, ...], list[ActorPlan]] = {}
        for a in self.actors:
            seen.setdefault((a.role, a.cpus, a.gpus_used, a.tensor_parallel_size, a.group is None), []).append(a)
        for (role, cpus, gpus, tp, loose), acts in seen.items():
            if loose:
                where = "own reservation"
            else:
                where = "; ".join(f"{a.group}[{','.join(map(str, a.bundles))}]" for a in acts)
            rows.append((role, str(len(acts)), f"{cpus:g}", f"{gpus:g}", str(tp), where))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        for g in self.groups:
            b = ", ".join(f"{{CPU: {x.cpus:g}, GPU: {x.gpus:g}}}" for x in g.bundles)
            lines.append(f"group {g.name} ({g.strategy}): {b}")
        lines.append(f"total: {self.total_cpus:g} CPUs, {self.total_gpus:g} GPUs")
        return "\n".join(lines)


@dataclass(frozen=True)
class NcclRanks:
    """Ranks of the NCCL weight-sync group: learner rank 0, then every engine's tensor-parallel workers."""

    engines: int
    tensor_parallel_size: int = 1

    @property
    def world_size(self) -> int:
        return 1 + self.engines * self.tensor_parallel_size

    def rank(self, engine: int, worker: int = 0) -> int:
        if not (0 <= engine < self.engines and 0 <= worker < self.tensor_parallel_size):
            raise IndexError(f"engine {engine}, worker {worker} outside {self.engines} engines x "
                             f"TP {self.tensor_parallel_size}")
        return 1 + engine * self.tensor_parallel_size + worker

    def offset(self, engine: int) -> int:
        """The ``rank_offset`` engine ``engine`` is sent (vLLM adds each worker's tensor-parallel rank)."""
        return self.rank(engine, 0)


def shares_gpus(plan: PlacementPlan) -> bool:
    """Whether Ray may put two of the plan's GPU processes on one GPU: two or more requests below one GPU.

    Such processes must start one after another: vLLM's memory profiling charges to the engine it profiles whatever
    other processes take on the device meanwhile (and asserts free memory did not rise), so engines, replicas and
    a learner loading at the same time on one GPU fail or take each other's share. ``actors.train_setup`` then
    starts the policy engines one by one, then the replicas one by one, then the learner. Whether the layout fits
    at all is the memory plan's question (``dreamgym.memory_plan``, ``train --dry-run``).
    """
    return sum(1 for a in plan.actors if 0 < a.gpus < 1) >= 2


def vllm_parallel_kwargs(tensor_parallel_size: int) -> dict[str, Any]:
    """Extra ``vllm.LLM`` / ``EngineArgs`` arguments for a tensor-parallel engine (none for one GPU).

    With more than one GPU the engine's workers are Ray actors in the engine's placement group bundles
    (vLLM's Ray executor picks the current group up; ``VLLM_RAY_BUNDLE_INDICES`` names the bundles).
    """
    if tensor_parallel_size <= 1:
        return {}
    return {"tensor_parallel_size": tensor_parallel_size, "distributed_executor_backend": "ray"}


def _engine_bundles(e: EngineConfig) -> list[Bundle]:
    """The bundles of one CUDA engine: the actor's CPUs and one GPU, then one GPU per further TP worker."""
    per = e.num_gpus if e.tensor_parallel_size == 1 else 1.0
    return [Bundle(e.num_cpus, per)] + [Bundle(0.0, 1.0)] * (e.tensor_parallel_size - 1)


def _engine_actor(role: str, i: int, e: EngineConfig, group: str | None, first: int) -> ActorPlan:
    tp = e.tensor_parallel_size
    if group is None:
        return ActorPlan(role, i, e.num_cpus, e.gpus())
    # In a group: the actor holds its first bundle's GPU (TP 1) or none (vLLM's TP workers hold them).
    return ActorPlan(role, i, e.num_cpus, e.num_gpus if tp == 1 else 0.0, group, tuple(range(first, first + tp)), tp)


def plan_placement(cfg: DreamGymConfig) -> PlacementPlan:
    """The placement of every actor ``dreamgym train`` starts for ``cfg``."""
    from dreamgym.schedule import Schedule, steps_learner, uses_replay
    from dreamgym.sync_choice import weight_sync_of

    plan = PlacementPlan()
    p, em, t, r = cfg.policy, cfg.experience_model, cfg.train, cfg.replay
    le = cfg.learner
    ranks = le.data_parallel if steps_learner(t) else 0  # a run that only evaluates has no learner
    cuda_policy = p.engine.device == "cuda"
    if t.colocate and weight_sync_of(cfg) == "ipc":
        # One GPU for one learner rank and one engine: both in one bundle, so Ray gives them the same device
        # (CUDA IPC hands the weights over on it; two bundles of fractions may land on two GPUs of a node).
        plan.actors += [ActorPlan("learner", r, le.num_cpus, le.num_gpus, "colocated", (0,)) for r in range(ranks)]
        plan.actors.append(_engine_actor("policy-engine", 0, p.engine, "colocated", 0))
        cpus, gpus = p.engine.num_cpus + le.num_cpus * ranks, p.engine.num_gpus + le.num_gpus * ranks
        plan.groups.append(GroupPlan("colocated", (Bundle(cpus, gpus),)))
    elif t.colocate:
        bundles = [Bundle(le.num_cpus, le.num_gpus)] * ranks
        plan.actors += [ActorPlan("learner", r, le.num_cpus, le.num_gpus, "colocated", (r,))
                        for r in range(ranks)]
        for i in range(p.num_engines):
            if cuda_policy:
                plan.actors.append(_engine_actor("policy-engine", i, p.engine, "colocated", len(bundles)))
                bundles += _engine_bundles(p.engine)
            else:
                plan.actors.append(ActorPlan("policy-engine", i, p.engine.num_cpus, 0.0, "colocated",
                                             (len(bundles),)))
                bundles.append(Bundle(p.engine.num_cpus))
        plan.groups.append(GroupPlan("colocated", tuple(bundles)))
    else:
        plan.actors += [ActorPlan("learner", r, le.num_cpus, le.num_gpus) for r in range(ranks)]
        for i in range(p.num_engines):
            group = f"policy-engine-{i}" if cuda_policy else None
            plan.actors.append(_engine_actor("policy-engine", i, p.engine, group, 0))
            if group:
                plan.groups.append(GroupPlan(group, tuple(_engine_bundles(p.engine))))
    if Schedule.from_config(t).uses_synthetic and em.backend == "ray":
        for i in range(em.replicas):
            group = f"experience-replica-{i}" if em.engine.device == "cuda" else None
            plan.actors.append(_engine_actor("experience-replica", i, em.engine, group, 0))
            if group:
                plan.groups.append(GroupPlan(group, tuple(_engine_bundles(em.engine))))
    plan.actors += [ActorPlan("replay-shard", i, r.num_cpus, 0.0) for i in range(r.shards if uses_replay(t) else 0)]
    plan.actors.append(ActorPlan("curriculum", 0, CURRICULUM_CPUS, 0.0))
    plan.actors += [ActorPlan("rollout-worker", i, t.rollout.num_cpus, 0.0) for i in range(t.rollout.workers)]
    return plan


def experience_sft_plan(cfg: DreamGymConfig) -> PlacementPlan:
    """Where the experience-model fine-tune's ranks go (``train.experience_sft``, before the run's actors start).

    One rank per learner rank (``learner.data_parallel``), each with ``learner.num_cpus`` and ``num_gpus`` (at
    least one GPU for ``experience_model.train.device: cuda``). With ``train.colocate`` several ranks are packed
    on one node as the learner's are (a ``STRICT_PACK`` group of their bundles: the gradient all-reduce stays on
    the node); otherwise each reserves its own resources, as the learner's do.
    """
    le = cfg.learner
    n = le.data_parallel
    gpus = max(le.num_gpus, 1.0) if cfg.experience_model.train.device == "cuda" else le.num_gpus
    if cfg.train.colocate and n > 1:
        return PlacementPlan(groups=[GroupPlan("experience-sft", (Bundle(le.num_cpus, gpus),) * n)],
                             actors=[ActorPlan("experience-sft", r, le.num_cpus, gpus, "experience-sft", (r,))
                                     for r in range(n)])
    return PlacementPlan(actors=[ActorPlan("experience-sft", r, le.num_cpus, gpus) for r in range(n)])
