"""Connecting to Ray: join a running cluster or start a local one, with clear errors."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

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
        with _without_token_notice():
            ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False,
                     log_to_driver=cfg.log_to_driver, configure_logging=False, _system_config=system)
        if os.environ.get(AUTH_MODE_VAR, "").lower() == "disabled":
            return ("local Ray, without token authentication (RAY_AUTH_MODE=disabled: whoever reaches this "
                    "machine's Ray ports can run code on it; unset it to have a token again)")
        return "local Ray"
    except (ConnectionError, TimeoutError) as e:
        raise DreamGymError(
            f"cannot connect to the Ray cluster at {address!r}: {e}. Start one with `ray start --head`, "
            "or leave ray.address unset (and RAY_ADDRESS empty) to run on a local Ray"
        ) from None


#: Ray's switch for token authentication (``token`` or ``disabled``; unset: on for a Ray that ``ray.init`` starts).
AUTH_MODE_VAR = "RAY_AUTH_MODE"

#: The logger of Ray's token-authentication setup and the start of the notice it logs on every local start.
_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropTokenNotice:
    """A ``logging`` filter that drops Ray's token notice and lets everything else through."""

    def filter(self, record: object) -> bool:
        return not str(getattr(record, "msg", "")).startswith(_TOKEN_NOTICE)


@contextlib.contextmanager
def _without_token_notice() -> Any:
    """Ray 2.60 turns token authentication on for a Ray that ``ray.init`` starts (a token in
    ``~/.ray/auth_token``, made if missing) and logs a warning saying so on every start, which users read as an
    error. Authentication stays exactly as Ray sets it; only that line is dropped (the run's first status line
    says which Ray it uses, and with ``RAY_AUTH_MODE=disabled`` that it is unprotected). A cluster keeps its
    token: see ``cluster/README.md``."""
    import logging

    logger, drop = logging.getLogger(_TOKEN_LOGGER), _DropTokenNotice()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def cluster_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1))


def close_actors(actors: list[Any], timeout_s: float = 30.0) -> None:
    """``close()`` every actor (each releases its environments), then ``ray.kill`` it: a killed actor runs no
    clean-up of its own, so without the ``close`` every server-side environment it held would leak. An actor
    that is dead or does not answer within ``timeout_s`` is killed all the same."""
    import ray

    refs = [a.close.remote() for a in actors]
    with contextlib.suppress(ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in refs:
        with contextlib.suppress(ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            ray.get(ref, timeout=0)
    for a in actors:
        ray.kill(a)


def wait_names_free(names: list[str], timeout_s: float = 30.0) -> None:
    """Until no live actor holds any of ``names`` (``ray.kill`` frees a name a moment later), within
    ``timeout_s``; a name still held then makes the next ``options(name=...)`` fail with Ray's own message."""
    import ray

    deadline = time.monotonic() + timeout_s
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            time.sleep(0.2)


def unwrap_actor_error(e: BaseException) -> BaseException:
    """The ``DreamGymError`` an actor raised, out of Ray's wrapping (a ``RayTaskError`` whose text is the
    whole remote traceback), so the user reads its one-line message; ``e`` itself when there is none."""
    cause: BaseException | None = e
    for _ in range(4):  # an actor calling an actor wraps twice
        cause = getattr(cause, "cause", None)
        if cause is None:
            break
        if isinstance(cause, DreamGymError) and not hasattr(cause, "cause"):
            return cause
    return e


def cluster_shape(address: str) -> tuple[float, float, float]:
    """``(CPUs, GPUs, GPUs of the largest live node)`` of the Ray cluster at ``address``; joins and leaves it
    (starts no actor). Used by ``dreamgym train --dry-run``."""
    import ray

    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        have = ray.cluster_resources()
        node_gpus = max((n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
    finally:
        ray.shutdown()
    return have.get("CPU", 0.0), have.get("GPU", 0.0), node_gpus


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, a job scheduler, ``ray job stop``) stops the driver like Ctrl-C, so its cleanup runs
    (actors shut down, a running fine-tune task cancelled) instead of the process aborting and leaving its Ray
    work running. Call it after ``ray.init``: Ray installs its own handler there, which aborts the process."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
