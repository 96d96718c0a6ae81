"""The placement plan (``dreamgym.placement``) on Ray: resources asked for and waited on, placement groups
created, and the Ray options that put each actor into its bundle.

Every wait is bounded and fails naming what is missing: the cluster's resources (``wait_for_resources``,
bounded by ``ray.resources_timeout_s``; an autoscaling cluster is asked for the plan's bundles with
``ray.autoscaler.sdk.request_resources`` and starts nodes meanwhile) and the placement groups
(``create_groups``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import ray

from dreamgym.errors import ActorDiedStartingError, ConfigError
from dreamgym.placement import ActorPlan, PlacementPlan

#: Seconds between lines on what is still pending while waiting for resources or placement groups.
PENDING_LOG_S = 15.0


def _short(cpus: float, gpus: float, have: dict[str, float]) -> list[str]:
    out = []
    if cpus > have.get("CPU", 0.0) + 1e-9:
        out.append(f"{cpus:g} CPUs (the cluster has {have.get('CPU', 0.0):g})")
    if gpus > have.get("GPU", 0.0) + 1e-9:
        out.append(f"{gpus:g} GPUs (the cluster has {have.get('GPU', 0.0):g})")
    return out


def wait_for_resources(plan: PlacementPlan, timeout_s: float, log: Callable[[str], None] = print,
                       poll_s: float = 1.0) -> None:
    """Return once the cluster has the CPUs/GPUs ``plan`` reserves; raise ``ConfigError`` after ``timeout_s``.

    When resources are short the autoscaler (if the cluster has one; a no-op otherwise) is asked for the plan's
    bundles, and the wait prints what is pending every ``PENDING_LOG_S``. The request is cleared afterwards, so
    the autoscaler can scale down once the run ends.
    """
    short = _short(plan.total_cpus, plan.total_gpus, ray.cluster_resources())
    if not short:
        return
    from ray.autoscaler.sdk import request_resources

    asked = False
    if timeout_s > 0:
        request_resources(bundles=plan.resource_bundles())
        asked = True
    t0 = last = time.monotonic()
    try:
        while short and time.monotonic() - t0 < timeout_s:
            if time.monotonic() - last >= PENDING_LOG_S:
                last = time.monotonic()
                log(f"waiting for the cluster to offer {', '.join(short)} "
                    f"({time.monotonic() - t0:.0f}/{timeout_s:g} s, asked the autoscaler)")
            time.sleep(poll_s)
            short = _short(plan.total_cpus, plan.total_gpus, ray.cluster_resources())
    finally:
        if asked:
            request_resources(bundles=[])
    if short:
        waited = f" within ray.resources_timeout_s = {timeout_s:g} s" if timeout_s > 0 else ""
        raise ConfigError(
            f"the run's actors ask for {plan.total_cpus:g} CPUs and {plan.total_gpus:g} GPUs; still missing"
            f"{waited}: {', '.join(short)}. Lower policy.engine.num_cpus, experience_model.engine.num_cpus, "
            "learner.num_cpus, train.rollout.num_cpus or replay.num_cpus (fractions are fine: they only reserve "
            "scheduling slots), use a bigger cluster, or give an autoscaling cluster more time "
            "(ray.resources_timeout_s). `dreamgym train --dry-run` prints what each actor asks for"
        )


def create_groups(plan: PlacementPlan, timeout_s: float, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Create every placement group of ``plan``; wait (at most ``timeout_s``) until all are placed.

    Raises ``ConfigError`` naming the groups (and their bundles) that could not be placed; nothing is left
    reserved then.
    """
    from ray.util.placement_group import placement_group, remove_placement_group

    groups = {g.name: placement_group([b.resources() for b in g.bundles], strategy=g.strategy) for g in plan.groups}
    if not groups:
        return groups
    refs = {pg.ready(): name for name, pg in groups.items()}
    t0 = time.monotonic()
    pending = list(refs)
    while pending and time.monotonic() - t0 < timeout_s:
        left = timeout_s - (time.monotonic() - t0)
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(PENDING_LOG_S, max(left, 0.0)))
        if pending and time.monotonic() - t0 < timeout_s:
            log(f"waiting for placement groups {', '.join(refs[r] for r in pending)} "
                f"({time.monotonic() - t0:.0f}/{timeout_s:g} s)")
    if pending:
        missing = [plan.group(refs[r]) for r in pending]
        for pg in groups.values():
            remove_placement_group(pg)
        what = "; ".join(f"{g.name} ({g.strategy}, {len(g.bundles)} bundles, {g.gpus:g} GPUs, {g.cpus:g} CPUs)"
                         for g in missing)
        raise ConfigError(f"placement groups not placed within {timeout_s:g} s: {what}. A STRICT_PACK group "
                          "needs all its bundles on one node; see `dreamgym train --dry-run`")
    return groups


def actor_options(actor: ActorPlan, groups: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Ray ``.options(...)`` and extra environment variables that put ``actor`` where the plan says.

    Inside a group the actor asks for its share of its first bundle and nothing outside it; its child tasks
    and actors (vLLM's tensor-parallel workers) are captured by the group and told their bundles.
    """
    opts: dict[str, Any] = {"num_cpus": actor.cpus, "num_gpus": actor.gpus}
    env: dict[str, str] = {}
    if actor.group is None:
        return opts, env
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
        groups[actor.group], placement_group_bundle_index=actor.bundles[0],
        placement_group_capture_child_tasks=actor.tensor_parallel_size > 1,
    )
    if actor.tensor_parallel_size > 1:
        env["VLLM_RAY_BUNDLE_INDICES"] = ",".join(map(str, actor.bundles))
    return opts, env


def remove_groups(groups: dict[str, Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for pg in groups.values():
        with contextlib.suppress(Exception):  # already gone with the job
            remove_placement_group(pg)


def start_or_kill(handles: list[Any], refs: dict[Any, str], timeout_s: float, what: str) -> list[Any]:
    """``wait_started``; if any actor is not up, kill them all (none is half-started) and raise."""
    try:
        wait_started(refs, timeout_s, what)
    except Exception:
        for h in handles:
            ray.kill(h)
        raise
    return handles


def wait_started(refs: dict[Any, str], timeout_s: float, what: str) -> list[Any]:
    """``ray.get`` the start calls of several actors within ``timeout_s``; raise naming the ones not up."""
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    failed, died = [], 0
    results = {}
    for r in ready:
        try:
            results[r] = ray.get(r)
        except Exception as e:
            cause = getattr(e, "cause", None) or e
            failed.append(f"{refs[r]}: {type(cause).__name__}: {cause}")
            died += isinstance(e, ray.exceptions.RayActorError)  # ActorDiedError, ActorUnavailableError
    if pending:
        failed += [f"{refs[r]}: not up within {what} = {timeout_s:g} s" for r in pending]
    if failed and died == len(failed):  # killed while starting, not refused by its config: a fault
        raise ActorDiedStartingError("died while starting: " + "; ".join(failed))
    if failed:
        raise RuntimeError("; ".join(failed))
    return [results[r] for r in refs]
