"""The OpenEnv protocol on a ``dreamgym`` environment server, built on OpenEnv's own server (``openenv-core``).

OpenEnv (Meta's environment standard, spoken by TRL's ``GRPOTrainer`` and SkyRL) serves an ``Environment``
subclass through its ``HTTPEnvServer``: one WebSocket (``/ws``) per client session, each with its own
``Environment`` instance (``reset`` / ``step`` / ``state`` / ``close`` messages), plus stateless ``/reset``,
``/step``, ``/state``, ``/schema``, ``/metadata`` and ``/health``. ``mount_openenv`` mounts that app under
``/openenv`` on the AgentGym app of ``dreamgym.envs.server``, so both protocols share one process, one session
pool and its limits: ``PoolSession`` is OpenEnv's ``Environment`` over one instance of the server's ``EnvPool``
(it counts against ``--max-sessions``, the idle timeout closes it, its steps feed the same step observer as
``POST /step``, i.e. ``serve-synthetic``'s ``/metrics``).

OpenEnv's own client drives it::

    from openenv.core import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:36002/openenv").sync() as env:
        r = env.reset(task_index=3)            # or task=<a task of GET /tasks>, or seed=N
        r = env.step({"action": "move east"})  # r.observation: text, state, available_actions, info ...

Token: a WebSocket without ``Authorization: Bearer <token>`` is refused (HTTP 403) when the server has one.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import random
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from openenv.core.env_server import Action, Environment, HTTPEnvServer, Observation, State
from openenv.core.env_server.exceptions import EnvironmentFactoryError, SessionCapacityError
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

from dreamgym.envs.server import (
    MAX_ACTION_CHARS,
    PREFIX,
    ApiError,
    EnvPool,
    _jsonable,
    _ResetBody,
    _task_of,
    api_error_reply,
    reset_episode,
    step_episode,
)
from dreamgym.types import Observation as DreamObservation
from dreamgym.types import StepResult

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import ASGIApp, Receive, Scope, Send

class TextAction(Action):
    """One action: the command text, as the AgentGym ``POST /step``'s ``action``."""

    action: str = Field(min_length=1, max_length=MAX_ACTION_CHARS, description="the action text, e.g. 'move east'")


class TextObservation(Observation):
    """What a reset or step shows (``done`` and ``reward`` are OpenEnv's own fields)."""

    text: str = Field(description="the observation text the policy reads")
    state: str = Field(description="the environment state text")
    instruction: str = Field(default="", description="the task instruction")
    available_actions: list[str] | None = Field(default=None, description="the valid actions, if the env knows them")
    success: bool = Field(default=False, description="whether the episode's goal was reached")
    task: dict[str, Any] | None = Field(default=None, description="the task a reset started")
    info: dict[str, Any] = Field(default_factory=dict, description="the step's info; a synthetic step's says what "
                                 "the simulator did (reasoning, demonstration_ids/scores, settled, retries ...)")


class SessionState(State):
    """OpenEnv's ``state()``: the episode id and step count, plus the server's instance id and the task."""

    env_id: int = Field(description="this session's instance id in the server's pool (as AgentGym's 'id')")
    task_id: str | None = None
    done: bool = False
    success: bool = False


class PoolSession(Environment[TextAction, TextObservation, SessionState]):
    """One OpenEnv session: an instance of the server's ``EnvPool`` for as long as the session lives."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own pool instance and lock

    def __init__(self, pool: EnvPool, on_step: Callable[[StepResult, float], None] | None = None) -> None:
        super().__init__()
        self._pool, self._on_step = pool, on_step
        self._id = pool.create()  # past --max-sessions: ApiError 429, which OpenEnv reports to the client
        self._state = SessionState(env_id=self._id)

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_index: int | None = None,
              task: dict[str, Any] | None = None, **unknown: Any) -> TextObservation:
        """Start an episode: ``task`` (one of ``GET /tasks``), ``task_index`` (its index there), else the task at
        ``seed`` (modulo the task count; a random one without a seed)."""
        if unknown:
            raise ApiError(422, f"reset: unknown argument(s) {sorted(unknown)}; reset takes task, task_index, seed "
                                "and episode_id")
        if task is None and task_index is None:
            count = len(self._pool.tasks(100_000, 0, self._pool.cfg.split))
            task_index = (seed if seed is not None else random.randrange(1 << 30)) % max(count, 1)
        found = _task_of(_ResetBody(task=task, data_idx=task_index), self._pool)
        obs = reset_episode(self._pool.get(self._id), found, "reset")
        self._state = SessionState(env_id=self._id, episode_id=episode_id or uuid.uuid4().hex, task_id=found.task_id)
        return _observation(obs, task=_jsonable(found.to_dict()))

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        result = step_episode(self._id, self._pool.get(self._id), action.action, "step", self._on_step, "reset()")
        self._state.step_count += 1
        self._state.done, self._state.success = bool(result.done), bool(result.success)
        return _observation(result.observation, reward=float(result.reward), done=bool(result.done),
                            success=bool(result.success), info=_jsonable(result.info))

    @property
    def state(self) -> SessionState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self._pool.spec, version="1.0.0",
                                   description=f"dreamgym environment server: {self._pool.spec}")

    def close(self) -> None:
        with contextlib.suppress(ApiError):  # already closed for idleness
            self._pool.close(self._id)


def _observation(obs: DreamObservation, **fields: Any) -> TextObservation:
    return TextObservation(text=obs.text, state=obs.state, instruction=obs.instruction,
                           available_actions=obs.admissible_actions, **fields)


def mount_openenv(app: FastAPI, token: str | None = None,
                  on_step: Callable[[StepResult, float], None] | None = None) -> HTTPEnvServer:
    """Mount OpenEnv's app for ``app.state.pool`` under ``PREFIX``; returns its ``HTTPEnvServer``."""
    from fastapi import FastAPI

    pool: EnvPool = app.state.pool
    sub = FastAPI(title=f"dreamgym OpenEnv server: {pool.spec}")
    server = _PoolEnvServer(pool, functools.partial(PoolSession, pool, on_step), TextAction, TextObservation,
                            max_concurrent_envs=pool.max_envs)
    server.register_routes(sub)
    sub.add_exception_handler(ApiError, api_error_reply)  # type: ignore[arg-type]
    app.mount(PREFIX, _websocket_token(sub, token) if token else sub)
    return server


class _PoolEnvServer(HTTPEnvServer):
    """OpenEnv's server, with the pool's own refusal passed on.

    OpenEnv wraps any error of the session factory as "Environment factory 'partial' failed to create instance",
    which hides why: the shared pool is full (its AgentGym sessions count too, so OpenEnv's own session count can
    be under the limit), or another ``ApiError``. A full pool becomes OpenEnv's capacity error (its client's
    ``CAPACITY_REACHED``) carrying the pool's text; any other ``ApiError`` keeps its text."""

    def __init__(self, pool: EnvPool, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pool = pool

    async def _create_session(self) -> tuple[str, Environment]:  # OpenEnv 0.3's one place a session is made
        try:
            return await super()._create_session()
        except EnvironmentFactoryError as e:
            cause = e.__cause__
            if not isinstance(cause, ApiError):
                raise
            if cause.status == 429:
                raise SessionCapacityError(len(self._pool.ids()), self._pool.max_envs, cause.message) from cause
            raise EnvironmentFactoryError(e.factory_name, cause.message) from cause


def _websocket_token(inner: ASGIApp, token: str) -> ASGIApp:
    """Refuse a WebSocket without ``Authorization: Bearer <token>`` (HTTP requests: the app's own check)."""
    expected = token.encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            headers = dict(scope.get("headers") or [])
            scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
                await send({"type": "websocket.close", "code": 1008})
                return
        await inner(scope, receive, send)

    return guarded
