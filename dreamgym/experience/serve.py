"""``dreamgym serve-synthetic``: DreamGym's synthetic environment as an HTTP server other trainers train in.

The server is ``dreamgym serve-env``'s app (``dreamgym.envs.server``: the AgentGym ``create`` / ``reset`` /
``step`` / ``close`` protocol, the token, the limits, one JSON error per bad request) with a different instance
factory: every session is its own ``SyntheticEnv`` episode, and all sessions share what is expensive to hold
once per process:

- the **offline transitions file** (``train.offline_data``), indexed once (``TransitionIndex``): the tasks
  (``GET /tasks``), their first states, the admissible lists recorded for real states, the action space and
  the retrieval store the experience model is grounded on;
- the **experience model** (``experience_model``): ``backend: copy`` (the copy-top-1 simulator, no LLM),
  ``local`` (a model folder, e.g. from ``dreamgym train-experience-model``, on an in-process vLLM engine) or
  ``http`` (an OpenAI-compatible endpoint), wrapped in the same ``ExperienceModel`` as in training: prompt,
  parser, retries, admissible and action-space settling, the family's reward rule, invalid-reply accounting.

What a client sees per step is ``serve-env``'s reply; its ``info`` carries the experience model's
``reasoning``, the retrieved ``demonstration_ids`` and ``demonstration_scores``, whether a rule ``settled``
the step, ``attempts`` and ``retries``, ``valid`` / ``invalid_reason``. ``GET /metrics`` (``SyntheticMetrics``)
is the simulator's health for a user watching from their own trainer. ``GET /`` speaks the ``dreamgym``
protocol, so ``remote:dreamgym`` (``RemoteEnv``) and ``dreamgym train --train.mode real`` train against it.
OpenEnv's protocol is mounted under ``/openenv`` (``dreamgym.envs.openenv_server``: OpenEnv's own server over the
same sessions, limits and metrics; its ``GenericEnvClient(base_url=URL + "/openenv")`` drives it).
``POST /predict`` answers one query outside any session (``dreamgym.experience.served_simulator``: how
``dreamgym eval-experience-model --simulator URL`` scores the served simulator on held-out transitions).

Waits on the model are bounded by ``experience_model.request_timeout_s``; a backend that is down or too slow
answers HTTP 503 naming it (``ExperienceBackendError`` is an ``EnvironmentUnavailableError``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym.errors import ConfigError, DreamGymError, EnvironmentUnavailableError
from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.experience.schema import Prediction
from dreamgym.experience.synthetic_env import SyntheticEnv, synthetic_env_from_index
from dreamgym.types import StepResult

if TYPE_CHECKING:
    from fastapi import FastAPI

    from dreamgym.config import DreamGymConfig
    from dreamgym.envs.server import EnvPool, Limits

#: Step latencies kept for the percentiles of ``/metrics`` (the most recent ones).
LATENCY_WINDOW = 4096


class SyntheticMetrics:
    """What ``GET /metrics`` reports: steps served, their latency, reward paid, episode ends, how many steps a
    rule settled and how many transitions were invalid, with the experience model's own tally (model calls,
    retries, malformed replies by reason). Thread-safe: sessions step in parallel."""

    def __init__(self, model: ExperienceModel) -> None:
        self.model = model
        self._lock = threading.Lock()
        self.steps = 0
        self.reward_paid = 0.0
        self.episodes_ended = 0
        self.successes = 0
        self.settled = 0
        self.invalid = 0
        self.invalid_by_reason: Counter[str] = Counter()
        self.seconds = 0.0
        self._recent: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def step(self, result: StepResult, seconds: float) -> None:
        info = result.info
        with self._lock:
            self.steps += 1
            self.seconds += seconds
            self._recent.append(seconds)
            self.reward_paid += float(result.reward)
            self.episodes_ended += bool(result.done)
            self.successes += bool(result.success)
            self.settled += bool(info.get("settled"))
            if not info.get("valid", True):
                self.invalid += 1
                self.invalid_by_reason[str(info.get("invalid_reason") or "unknown")] += 1

    def as_dict(self, pool: EnvPool) -> dict[str, Any]:
        with self._lock:
            recent = sorted(self._recent)
            steps = self.steps
            out: dict[str, Any] = {
                "steps": steps, "reward_paid": round(self.reward_paid, 6), "episodes_ended": self.episodes_ended,
                "successes": self.successes, "rule_settled": self.settled,
                "rule_settled_share": round(self.settled / steps, 4) if steps else None,
                "invalid_transitions": self.invalid, "invalid_transitions_by_reason": dict(self.invalid_by_reason),
                "latency_s": {"mean": round(self.seconds / steps, 6) if steps else None,
                              "p50": _quantile(recent, 0.5), "p95": _quantile(recent, 0.95),
                              "max": round(recent[-1], 6) if recent else None, "window": len(recent)},
            }
        model = self.model.stats.copy()
        out["model"] = {**model.as_dict(), **model.rule_shares(), "busy_s": round(self.model.busy_s, 3)}
        out["sessions"] = {"live": len(pool.ids()), "max": pool.max_envs, "expired": pool.expired_total,
                           "timeout_s": pool.session_timeout_s}
        return out


def _quantile(ordered: list[float], q: float) -> float | None:
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 6) if ordered else None


@dataclass
class SyntheticParts:
    """What every session of one server shares: the index of the offline data, the experience model and its
    client (closed by ``close``)."""

    index: TransitionIndex
    client: ExperienceClient
    model: ExperienceModel
    imitates: str

    def make(self, cfg: DreamGymConfig) -> SyntheticEnv:
        """A new session: a ``SyntheticEnv`` over the shared model and index, as the rollout workers build it."""
        em = cfg.experience_model
        return synthetic_env_from_index(
            self.model, self.index, self.imitates, max_steps=cfg.env.max_steps, use_retrieval=em.top_k > 0,
            top_k=em.top_k, state_max_chars=cfg.env.state_max_chars, similar_state_actions=em.similar_state_actions)

    def predict(self, body: dict[str, Any]) -> Prediction:
        """One prediction for a ``POST /predict`` body: retrieval from this server's store, its action space, its
        model and rules (as a session's step in that state)."""
        from dreamgym.envs.server import ApiError
        from dreamgym.experience.served_simulator import query_from_wire

        try:
            q = query_from_wire(body)
        except (ValueError, TypeError) as e:
            raise ApiError(422, f"POST /predict: {e}") from None
        if q.env not in (self.imitates, f"synthetic:{self.imitates}"):
            raise ApiError(400, f"POST /predict: the query is for {q.env!r}; this server imitates {self.imitates!r}",
                           "EnvironmentSpecError")
        q.env = self.imitates
        top_k = self.model.prompt.top_k
        q.demonstrations = list(self.index(q.state, q.action, top_k)) if top_k > 0 else []
        q.action_space = self.index.action_space()
        return self.model.predict_one(q)

    def close(self) -> None:
        self.client.close()


def open_synthetic(cfg: DreamGymConfig) -> SyntheticParts:
    """Index ``train.offline_data`` (rows of ``env.name`` only) and open the experience model's client. Every
    input a user can get wrong fails here, with what to change, before the server listens."""
    from dreamgym.experience.backends import open_client
    from dreamgym.experience.setup import build_model

    em, data = cfg.experience_model, cfg.train.offline_data
    if data is None:
        raise ConfigError("serve-synthetic needs offline real transitions: --offline-data PATH.parquet (tasks, first "
                          "states, admissible actions and the retrieval store; `dreamgym collect` writes one)")
    if not Path(data).is_file():
        raise ConfigError(f"serve-synthetic: the offline data {str(data)!r} (train.offline_data) is not a file")
    if em.backend not in ("copy", "local", "http"):
        raise ConfigError(f"serve-synthetic runs the experience model in its own process: experience_model.backend "
                          f"{em.backend!r} is not one of copy (the copy-top-1 simulator, no model), local (a model "
                          "folder on vLLM in this process) or http (an OpenAI-compatible endpoint, "
                          "--experience_model.url); set --backend")
    spec = cfg.env.name
    index = TransitionIndex.from_parquet(data, env=spec)
    if index.size == 0:
        from dreamgym.data.transitions import summarise

        envs = ", ".join(summarise(data)["envs"]) or "none"
        raise ConfigError(f"serve-synthetic: {data} holds no transitions of {spec!r} (env.name); its rows are of: "
                          f"{envs}. Set --env to one of them")
    try:
        client = open_client(em)
    except DreamGymError:
        raise
    except Exception as e:  # an engine that cannot start (a model longer than its context, no memory...): one line
        detail = " ".join(str(e).split())[:600]
        raise EnvironmentUnavailableError(f"serve-synthetic: the experience model ({em.backend}: {em.model}) did not "
                                          f"start: {type(e).__name__}: {detail}") from None
    return SyntheticParts(index=index, client=client, model=build_model(em, client, cfg.env.state_max_chars),
                          imitates=spec)


def build_synthetic_app(cfg: DreamGymConfig, token: str | None = None, limits: Limits | None = None,
                        parts: SyntheticParts | None = None) -> FastAPI:
    """``serve-env``'s app whose sessions are synthetic episodes, plus ``GET /metrics``. ``parts``: shared pieces
    already opened (default: ``open_synthetic(cfg)``); they are closed at app shutdown."""
    from dreamgym.envs.server import _engine_call, build_app

    parts = parts or open_synthetic(cfg)
    em = cfg.experience_model
    metrics = SyntheticMetrics(parts.model)
    about = {"synthetic": {"imitates": parts.imitates, "backend": em.backend,
                           "model": "copy-top-1" if em.backend == "copy" else em.model,
                           "transitions": parts.index.size, "tasks": len(parts.index.tasks()), "top_k": em.top_k,
                           "model_timeout_s": em.request_timeout_s}}
    try:
        app = build_app(cfg.env, token=token, limits=limits, make=lambda: parts.make(cfg), about=about,
                        on_step=metrics.step, on_shutdown=parts.close)
    except BaseException:
        parts.close()
        raise
    pool = app.state.pool
    try:
        from dreamgym.envs.openenv_server import mount_openenv
    except ImportError as e:  # the OpenEnv package is a dev extra: a GPU image may not carry it
        print(f"serve-synthetic: OpenEnv routes off ({e}); `pip install openenv-core==0.3.0` serves /openenv too",
              flush=True)
    else:
        mount_openenv(app, token, on_step=metrics.step)  # OpenEnv under /openenv: the same pool, limits and metrics

    @app.get("/metrics")
    def get_metrics() -> dict[str, Any]:
        return metrics.as_dict(pool)

    @app.post("/predict")
    def predict(body: dict[str, Any]) -> dict[str, Any]:
        return dataclasses.asdict(_engine_call("POST /predict", lambda: parts.predict(body)))

    app.state.metrics = metrics
    return app


def serve_synthetic(cfg: DreamGymConfig, host: str = "127.0.0.1", port: int = 36002, token: str | None = None,
                    limits: Limits | None = None) -> None:
    """Serve the synthetic environment of ``cfg`` on ``host:port`` until interrupted (loopback by default)."""
    from dreamgym.envs.server import run_app

    run_app(lambda: build_synthetic_app(cfg, token, limits), host, port, token, "serve-synthetic")
