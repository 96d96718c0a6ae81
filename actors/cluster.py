"""Connecting to Ray: join a running cluster or start a local one, with clear errors."""

from __future__ import annotations

import os

from dreamgym.config import RayConfig
from dreamgym.errors import DreamGymError


def connect(cfg: RayConfig) -> str:
    """Join ``cfg.address`` (or ``RAY_ADDRESS``), else start a local single-node Ray.

    Returns a short description of what it connected to. A no-op when Ray is already initialised
    (tests and ``ray job submit`` drivers).
    """
    import ray

    if ray.is_initialized():
        return "existing Ray session"
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, log_to_driver=cfg.log_to_driver, configure_logging=False)
            return f"Ray cluster at {address}"
        # "local": a fresh single-node Ray even if another one runs on this machine (join it with "auto").
        system = {"worker_niceness": cfg.worker_niceness} if cfg.worker_niceness is not None else None
        ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=cfg.log_to_driver,
                 configure_logging=False, _system_config=system)
        return "local Ray"
    except (ConnectionError, TimeoutError) as e:
        raise DreamGymError(
            f"cannot connect to the Ray cluster at {address!r}: {e}. Start one with `ray start --head`, "
            "or leave ray.address unset (and RAY_ADDRESS empty) to run on a local Ray"
        ) from None


def cluster_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1))
