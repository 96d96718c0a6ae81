"""The learner and the policy engines of a config, placed as ``dreamgym train`` places them (for the GPU tests that
drive weight syncs by hand)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dreamgym.config import DreamGymConfig


@contextmanager
def placed_learner_and_engines(cfg: DreamGymConfig, sleep_mode: bool = False) -> Iterator[tuple[Any, list[Any]]]:
    """``(learner actor, policy-engine actors)`` in the plan's placement groups (``dreamgym.placement``), the engines
    built for the config's weight sync; on exit the actors are killed and the groups removed."""
    import ray

    from actors.learner_actor import create_learner
    from actors.placement import actor_options, create_groups, remove_groups
    from actors.policy_engine import create_policy_engines
    from actors.weight_sync import engine_transfer_backend
    from dreamgym.placement import plan_placement

    plan = plan_placement(cfg)
    groups = create_groups(plan, 120, print)
    handles: list[Any] = []
    try:
        learner_opts, _ = actor_options(plan.role("learner")[0], groups)
        learner = create_learner(cfg, None, {"scheduling_strategy": learner_opts["scheduling_strategy"]})
        handles.append(learner)
        engines = create_policy_engines(cfg.policy, weight_transfer_backend=engine_transfer_backend(cfg),
                                        placements=[actor_options(a, groups) for a in plan.role("policy-engine")],
                                        sleep_mode=sleep_mode)
        handles += engines
        yield learner, engines
    finally:
        for h in handles:
            ray.kill(h)
        remove_groups(groups)
