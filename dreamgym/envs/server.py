"""``dreamgym serve-env``: any local adapter served over HTTP, AgentGym-compatible.

The verbs and field names follow AgentGym's environment servers (see ``remote_dialects``), so an
AgentGym-style client can drive it, and ``RemoteEnv`` (dialect ``dreamgym``) gets what our richer
protocol needs: task listing, gold actions, abstract states, success flags. Ids are accepted as
``id`` or ``env_idx``, in bodies and in query strings.

=======================  ===========================================================================
endpoint                 meaning
=======================  ===========================================================================
``GET /``                ``{ok, protocol, env, split, max_steps, admissible_actions, state_rules, envs}``
``POST /create``         a new adapter instance -> ``{id, env_idx}`` (body fields are ignored)
``POST /reset``          ``{id, task}`` (a task from ``/tasks``) or ``{id, data_idx|game|session_id|idx}``
                         (index i = ``tasks(1, first=i, split=env.split)``) -> ``{id, observation,
                         state, instruction, available_actions, task, reward, done, success, info}``
``POST /step``           ``{id, action}`` -> ``{id, observation, state, instruction, available_actions,
                         reward, done, success, info}``
``GET /observation``     the raw observation text (``?id=``)
``GET /available_actions``  the admissible actions or ``null``
``GET /instruction_text``   the task instruction
``GET /gold_actions``    the expert plan of the running episode or ``null``
``GET /tasks``           ``?count=&first=&split=`` -> a list of tasks (``Task.to_dict()``)
``GET /detail``          the episode's task, step count and whether it is done
``GET /list_envs``       ids of the live instances
``POST /close``          ``{id}`` -> ``{id, closed}``; releases the instance
=======================  ===========================================================================

Errors are JSON ``{"error": message, "type": class}`` with a 4xx status for the client's mistakes
(unknown id 404, missing field or bad value 422, unknown task 400, step without an episode 409,
body too large 413, too many instances 429) and 5xx for engine failures (503: the engine, or a synthetic
environment's experience model, is unreachable or did not answer in time).

Limits (``Limits``): at most ``max_envs`` live instances; an instance nobody touched for ``session_timeout_s``
is closed (its id then answers 404 "unknown environment id ... closed after N s idle", which ``RemoteEnv``
recovers from at its next reset); request bodies over ``max_body_bytes`` and actions over
``MAX_ACTION_CHARS`` are refused before they reach the engine.

The same app serves the synthetic environment (``dreamgym serve-synthetic``,
``dreamgym.experience.serve``): ``build_app`` takes the instance factory, extra ``GET /`` facts and a step
observer for its metrics.

Concurrency: engines are not thread-safe, so each instance has its own lock and requests run in
FastAPI's thread pool; different instances step in parallel, one instance serialises. A separate
"catalog" instance answers ``/tasks`` and turns reset indices into tasks, so listing tasks never
disturbs a running episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from dreamgym.envs.registry import make_env
from dreamgym.envs.remote_dialects import PROTOCOL
from dreamgym.errors import DreamGymError, EnvironmentSpecError, EnvironmentUnavailableError
from dreamgym.types import Observation, StepResult, Task

if TYPE_CHECKING:
    from dreamgym.config import EnvConfig
    from dreamgym.envs.base import Environment

T = TypeVar("T")

#: Reset body fields that carry a task index, one per AgentGym server family.
INDEX_FIELDS = ("data_idx", "game", "session_id", "idx")

#: Where ``dreamgym.envs.openenv_server`` mounts the OpenEnv protocol.
PREFIX = "/openenv"

#: Longest action text ``POST /step`` accepts (an action is a command, not a document).
MAX_ACTION_CHARS = 2_000


@dataclass(frozen=True)
class Limits:
    """What one server admits: shared by ``serve-env`` and ``serve-synthetic`` (their ``--max-sessions``,
    ``--session-timeout-s`` and ``--max-request-kb``)."""

    max_envs: int = 256
    """Live instances (sessions) at once; ``POST /create`` past it answers 429."""
    session_timeout_s: float | None = 1800.0
    """An instance with no request for this long is closed (``None``: never)."""
    max_body_bytes: int = 64 * 1024
    """Largest request body; larger ones answer 413 before they are read."""


class ApiError(Exception):
    """A request the server refuses, with its HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "RemoteEnvironmentError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass
class _Slot:
    """One adapter instance and its episode."""

    env: Environment
    lock: threading.Lock = field(default_factory=threading.Lock)
    task: Task | None = None
    observation: Observation | None = None
    steps: int = 0
    done: bool = False
    used: float = field(default_factory=time.monotonic)
    """When a request last touched this instance (``EnvPool.reap``)."""


class EnvPool:
    """The adapter instances of one server, keyed by integer id. ``make`` builds one instance (default: the
    adapter of ``cfg``); ``session_timeout_s`` closes instances left idle (``reap``)."""

    def __init__(self, cfg: EnvConfig, max_envs: int = 256, make: Callable[[], Environment] | None = None,
                 session_timeout_s: float | None = None) -> None:
        self.cfg = cfg
        self.max_envs = max_envs
        self.session_timeout_s = session_timeout_s
        self._make: Callable[[], Environment] = make or (lambda: make_env(cfg))
        # Built now so a wrong spec or wrong game parameters fail at startup, not at the first request.
        self.catalog = self._make()
        self.catalog_lock = threading.Lock()
        self.spec = self.catalog.spec
        try:  # start the engine once: a missing runtime or bad game parameters show now
            self.tasks(1, 0, cfg.split)
        except BaseException:
            self.catalog.close()
            raise
        self._slots: dict[int, _Slot] = {}
        self._expired: OrderedDict[int, float] = OrderedDict()
        """Ids closed for idleness and how long they had been idle, so a late request learns why (bounded)."""
        self.expired_total = 0
        self._lock = threading.Lock()
        self._next_id = 0

    def create(self) -> int:
        self.reap()
        with self._lock:
            if len(self._slots) >= self.max_envs:
                raise ApiError(429, f"this server holds {self.max_envs} environments already; "
                                    "POST /close the ones you no longer use")
            env_id, self._next_id = self._next_id, self._next_id + 1
        slot = _Slot(env=self._make())  # outside the pool lock: engines can be slow to build
        with self._lock:
            self._slots[env_id] = slot
        return env_id

    def get(self, env_id: int) -> _Slot:
        self.reap()  # an instance idle past the timeout is gone, even if no sweep ran since
        with self._lock:
            slot = self._slots.get(env_id)
            live = sorted(self._slots)
            idle = self._expired.get(env_id)
        if slot is None:
            shown = ", ".join(map(str, live[:20])) or "none"
            why = (f": it was closed after {idle:.0f} s without a request (the server's --session-timeout-s)"
                   if idle is not None else "")
            raise ApiError(404, f"unknown environment id {env_id}{why}; live ids: {shown} (POST /create makes one)")
        slot.used = time.monotonic()
        return slot

    def reap(self) -> list[int]:
        """Close the instances idle for longer than ``session_timeout_s`` (not one serving a request now);
        returns their ids."""
        if self.session_timeout_s is None:
            return []
        now = time.monotonic()
        with self._lock:
            stale = {i: s for i, s in self._slots.items()
                     if now - s.used > self.session_timeout_s and not s.lock.locked()}
            for i, s in stale.items():
                del self._slots[i]
                self._expired[i] = now - s.used
            while len(self._expired) > 10_000:
                self._expired.popitem(last=False)
            self.expired_total += len(stale)
        for s in stale.values():
            with contextlib.suppress(Exception), s.lock:  # one failed close must not keep the others open
                s.env.close()
        return sorted(stale)

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._slots)

    def close(self, env_id: int) -> None:
        slot = self.get(env_id)
        with self._lock:
            self._slots.pop(env_id, None)
        with slot.lock:
            slot.env.close()

    def close_all(self) -> None:
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
        for env in [*(s.env for s in slots), self.catalog]:
            with contextlib.suppress(Exception):  # shutting down: one failed close must not stop the rest
                env.close()

    def tasks(self, count: int, first: int, split: str) -> list[Task]:
        with self.catalog_lock:
            return self.catalog.tasks(count, first=first, split=split)


# -- request bodies ---------------------------------------------------------------------------


class _IdBody(BaseModel):
    # AgentGym clients send extra fields (world_type, seed, ...): accept and ignore them.
    model_config = ConfigDict(extra="allow")

    id: int | None = None
    """The environment id (ALFWorld/ScienceWorld/TextCraft style)."""
    env_idx: int | None = None
    """The environment id (WebShop/WebArena style)."""


class _StepBody(_IdBody):
    action: str = Field(max_length=MAX_ACTION_CHARS)


class _ResetBody(_IdBody):
    task: dict[str, Any] | None = None
    data_idx: int | None = None
    game: int | None = None
    session_id: int | None = None
    idx: int | None = None


def _env_id(where: str, id_: int | None, env_idx: int | None) -> int:
    if id_ is None and env_idx is None:
        raise ApiError(422, f"{where}: the environment id is missing; send 'id' (or 'env_idx')")
    if id_ is not None and env_idx is not None and id_ != env_idx:
        raise ApiError(422, f"{where}: 'id' ({id_}) and 'env_idx' ({env_idx}) disagree")
    return id_ if id_ is not None else env_idx  # type: ignore[return-value]


# -- replies ----------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """Adapter ``info`` may hold engine objects; anything JSON cannot hold becomes its ``str``."""
    return json.loads(json.dumps(value, default=str))


def _observation_reply(env_id: int, obs: Observation) -> dict[str, Any]:
    return {"id": env_id, "observation": obs.text, "state": obs.state, "instruction": obs.instruction,
            "available_actions": obs.admissible_actions}


def _engine_call(where: str, fn: Callable[[], T]) -> T:
    """Run an adapter call, turning its failures into HTTP errors with a message."""
    try:
        return fn()
    except ApiError:
        raise
    except EnvironmentSpecError as e:
        raise ApiError(400, f"{where}: {e}", "EnvironmentSpecError") from None
    except EnvironmentUnavailableError as e:  # also the synthetic environment's experience model (503)
        raise ApiError(503, f"{where}: {e}", "EnvironmentUnavailableError") from None
    except DreamGymError as e:
        raise ApiError(400, f"{where}: {e}", type(e).__name__) from None
    except Exception as e:
        raise ApiError(500, f"{where}: the environment failed: {type(e).__name__}: {e}", "EngineError") from None


# -- the app ----------------------------------------------------------------------------------


def reset_episode(slot: _Slot, task: Task, where: str) -> Observation:
    """Start ``task`` in ``slot``'s instance (every protocol's reset); a failed reset leaves no episode to step."""
    with slot.lock:
        slot.task, slot.observation = None, None
        obs = _engine_call(where, lambda: slot.env.reset(task))
        slot.task, slot.observation, slot.steps, slot.done = task, obs, 0, False
    return obs


def step_episode(slot_id: int, slot: _Slot, action: str, where: str,
                 on_step: Callable[[StepResult, float], None] | None, reset: str = "POST /reset") -> StepResult:
    """One step of ``slot``'s episode (every protocol's step): refused without a running episode (409, naming the
    protocol's ``reset``), then reported to ``on_step(result, seconds)``."""
    with slot.lock:
        if slot.task is None:
            raise ApiError(409, f"{where}: environment {slot_id} has no episode; {reset} first")
        if slot.done:
            raise ApiError(409, f"{where}: the episode of environment {slot_id} has ended; {reset} to start "
                                "another")
        t0 = time.perf_counter()
        result = _engine_call(where, lambda: slot.env.step(action))
        slot.observation, slot.steps, slot.done = result.observation, slot.steps + 1, result.done
    if on_step is not None:
        on_step(result, time.perf_counter() - t0)
    return result


async def api_error_reply(request: Request, exc: ApiError) -> JSONResponse:
    """An ``ApiError`` as the one JSON error every endpoint answers with."""
    return JSONResponse({"error": exc.message, "type": exc.kind}, status_code=exc.status)




def build_app(cfg: EnvConfig, max_envs: int | None = None, token: str | None = None, *, limits: Limits | None = None,
              make: Callable[[], Environment] | None = None, about: dict[str, Any] | None = None,
              on_step: Callable[[StepResult, float], None] | None = None,
              on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """The FastAPI app serving ``cfg``'s environment; its instances are closed at app shutdown.

    ``token``: every request must carry ``Authorization: Bearer <token>``; others get HTTP 401. ``limits``: see
    ``Limits`` (``max_envs`` overrides its field). ``make``: builds one instance (default: ``cfg``'s adapter);
    ``about``: extra facts for ``GET /``; ``on_step(result, seconds)``: called after every step that
    succeeded; ``on_shutdown``: called after the instances are closed."""
    limits = limits or Limits()
    if max_envs is not None:
        limits = dataclasses.replace(limits, max_envs=max_envs)
    pool = EnvPool(cfg, max_envs=limits.max_envs, make=make, session_timeout_s=limits.session_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_reap_forever(pool)) if limits.session_timeout_s is not None else None
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()
            pool.close_all()  # here, not after uvicorn returns: uvicorn re-raises SIGTERM on its way out
            if on_shutdown is not None:
                on_shutdown()

    app = FastAPI(title=f"dreamgym environment server: {pool.spec}", lifespan=lifespan)
    app.state.pool = pool
    app.state.limits = limits
    _limit_body(app, limits.max_body_bytes)
    if token:  # added last: the outermost check, so a request without the token learns nothing else
        _require_token(app, token)

    app.add_exception_handler(ApiError, api_error_reply)  # type: ignore[arg-type]

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            if err.get("type") == "json_invalid":
                problems.append("the body is not valid JSON")
                continue
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            problems.append(f"{loc}: {err.get('msg', 'invalid')}")
        message = f"{request.method} {request.url.path}: " + "; ".join(problems)
        return JSONResponse({"error": message, "type": "RequestValidationError"}, status_code=422)

    @app.get("/")
    def hello() -> dict[str, Any]:
        return {"ok": True, "protocol": PROTOCOL, "env": pool.spec, "split": cfg.split, "max_steps": cfg.max_steps,
                "admissible_actions": cfg.admissible_actions, "state_rules": pool.catalog.state_rules,
                "envs": len(pool.ids()), "max_envs": limits.max_envs, "session_timeout_s": limits.session_timeout_s,
                **(about or {})}

    @app.get("/list_envs")
    def list_envs() -> list[int]:
        return pool.ids()

    @app.post("/create")
    def create(body: dict[str, Any] | None = None) -> dict[str, int]:
        env_id = _engine_call("POST /create", pool.create)
        return {"id": env_id, "env_idx": env_id}

    @app.post("/reset")
    def reset(body: _ResetBody) -> dict[str, Any]:
        slot_id = _env_id("POST /reset", body.id, body.env_idx)
        slot = pool.get(slot_id)
        task = _engine_call("POST /reset", lambda: _task_of(body, pool))
        obs = reset_episode(slot, task, "POST /reset")
        return {**_observation_reply(slot_id, obs), "task": task.to_dict(), "reward": 0.0, "done": False,
                "success": False, "info": {}}

    @app.post("/step")
    def step(body: _StepBody) -> dict[str, Any]:
        slot_id = _env_id("POST /step", body.id, body.env_idx)
        result = step_episode(slot_id, pool.get(slot_id), body.action, "POST /step", on_step)
        return {**_observation_reply(slot_id, result.observation), "reward": float(result.reward),
                "done": bool(result.done), "success": bool(result.success), "info": _jsonable(result.info)}

    def _slot_with_episode(where: str, id_: int | None, env_idx: int | None) -> _Slot:
        slot = pool.get(_env_id(where, id_, env_idx))
        if slot.observation is None:
            raise ApiError(409, f"{where}: this environment has no episode yet; POST /reset first")
        return slot

    @app.get("/observation")
    def observation(id: int | None = None, env_idx: int | None = None) -> str:
        slot = _slot_with_episode("GET /observation", id, env_idx)
        return slot.observation.text  # type: ignore[union-attr]

    @app.get("/available_actions")
    def available_actions(id: int | None = None, env_idx: int | None = None) -> list[str] | None:
        slot = _slot_with_episode("GET /available_actions", id, env_idx)
        with slot.lock:
            return _engine_call("GET /available_actions", slot.env.admissible_actions)

    @app.get("/instruction_text")
    def instruction_text(id: int | None = None, env_idx: int | None = None) -> str:
        slot = _slot_with_episode("GET /instruction_text", id, env_idx)
        return slot.observation.instruction  # type: ignore[union-attr]

    @app.get("/gold_actions")
    def gold_actions(id: int | None = None, env_idx: int | None = None) -> list[str] | None:
        slot = _slot_with_episode("GET /gold_actions", id, env_idx)
        with slot.lock:
            return _engine_call("GET /gold_actions", slot.env.gold_actions)

    @app.get("/detail")
    def detail(id: int | None = None, env_idx: int | None = None) -> dict[str, Any]:
        slot_id = _env_id("GET /detail", id, env_idx)
        slot = pool.get(slot_id)
        return {"id": slot_id, "task": slot.task.to_dict() if slot.task else None, "steps": slot.steps,
                "done": slot.done, "instruction": slot.observation.instruction if slot.observation else ""}

    @app.get("/tasks")
    def tasks(count: int = Query(10, ge=0, le=100_000), first: int = Query(0, ge=0),
              split: str | None = None) -> list[dict[str, Any]]:
        found = _engine_call("GET /tasks", lambda: pool.tasks(count, first, split or cfg.split))
        return [_task_reply(t, pool.spec) for t in found]

    @app.post("/close")
    def close(body: _IdBody) -> dict[str, Any]:
        slot_id = _env_id("POST /close", body.id, body.env_idx)
        _engine_call("POST /close", lambda: pool.close(slot_id))
        return {"id": slot_id, "closed": True}

    return app


async def _reap_forever(pool: EnvPool) -> None:
    """Close idle instances now and then (also on every ``POST /create``), off the event loop."""
    assert pool.session_timeout_s is not None
    every = min(max(pool.session_timeout_s / 4, 0.5), 30.0)
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(Exception):  # a failed sweep is retried at the next one
            await run_in_threadpool(pool.reap)


def _limit_body(app: FastAPI, max_bytes: int) -> None:
    """Refuse bodies over ``max_bytes`` (HTTP 413) from their ``Content-Length``, before they are read; a body
    without one (chunked) is refused too (411): every HTTP client library sends it for a JSON body."""

    @app.middleware("http")
    async def _check_size(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        length = request.headers.get("content-length")
        where = f"{request.method} {request.url.path}"
        if length is None:
            if request.headers.get("transfer-encoding"):
                return JSONResponse({"error": f"{where}: send the body with a Content-Length header (chunked bodies "
                                              "are refused)", "type": "LengthRequired"}, status_code=411)
        elif not length.isdigit() or int(length) > max_bytes:
            return JSONResponse({"error": f"{where}: the body ({length} bytes) is over this server's limit of "
                                          f"{max_bytes} bytes (--max-request-kb)", "type": "PayloadTooLarge"},
                                status_code=413)
        return await call_next(request)


def _require_token(app: FastAPI, token: str) -> None:
    """Refuse every request without ``Authorization: Bearer <token>`` (HTTP 401, JSON error)."""
    expected = token.encode()

    @app.middleware("http")
    async def _check_token(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            message = ("this server requires a token: send 'Authorization: Bearer <token>' (dreamgym clients: "
                       "env.token or DREAMGYM_ENV_TOKEN)")
        elif not hmac.compare_digest(given.strip().encode(), expected):  # constant time: no timing oracle
            message = "wrong token (env.token / DREAMGYM_ENV_TOKEN must equal the server's --token)"
        else:
            return await call_next(request)
        return JSONResponse({"error": f"{request.method} {request.url.path}: {message}", "type": "Unauthorized"},
                            status_code=401, headers={"WWW-Authenticate": "Bearer"})


def _task_reply(task: Task, spec: str) -> dict[str, Any]:
    return _jsonable(dataclasses.replace(task, env=spec).to_dict())


def _task_of(body: _ResetBody, pool: EnvPool) -> Task:
    """The task a reset asks for: a task object, or an index into the server's task list."""
    if body.task is not None:
        try:
            task = Task.from_dict(body.task)
        except TypeError as e:
            raise ApiError(422, f"POST /reset: 'task' is not a task object ({e}); take one from GET /tasks") from None
        # A client names tasks by its own spec (remote:dreamgym), a synthetic server's also by the spec it imitates
        # (twx:coin, as in its offline data); any other family is another game.
        ours = (pool.spec, getattr(pool.catalog, "imitated", pool.spec))
        if task.env not in ours and not task.env.startswith("remote:"):
            raise ApiError(400, f"POST /reset: task {task.task_id!r} is for {task.env!r}; this server runs "
                                f"{pool.spec!r}", "EnvironmentSpecError")
        return dataclasses.replace(task, env=pool.spec)
    for name in INDEX_FIELDS:
        index = getattr(body, name)
        if index is not None:
            if index < 0:
                raise ApiError(422, f"POST /reset: {name}={index} must not be negative")
            found = pool.tasks(1, index, pool.cfg.split)
            if not found:  # a finite task list (a synthetic server's offline tasks) ends somewhere
                raise ApiError(400, f"POST /reset: {name}={index} is past the server's last task; GET /tasks lists "
                                    "them", "EnvironmentSpecError")
            return found[0]
    raise ApiError(422, "POST /reset: send 'task' (a task from GET /tasks) or a task index "
                        f"({', '.join(INDEX_FIELDS)})")


# -- running it -------------------------------------------------------------------------------


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket, bound here so a busy port is one clear error instead of a uvicorn log line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise EnvironmentUnavailableError(f"cannot serve on host {host!r}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise EnvironmentUnavailableError(
            f"cannot listen on {host}:{port} ({e.strerror}); pick another --port or stop what uses it"
        ) from None
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(cfg: EnvConfig, host: str = "127.0.0.1", port: int = 36001, max_envs: int | None = None,
          token: str | None = None, limits: Limits | None = None) -> None:
    """Serve ``cfg``'s environment on ``host:port`` until interrupted (SIGINT/SIGTERM).

    The default host is the loopback interface: other machines reach the server only when told
    (``--host 0.0.0.0``), and then it should require a ``token``."""
    run_app(lambda: build_app(cfg, max_envs=max_envs, token=token, limits=limits), host, port, token, "serve-env")


def run_app(build: Callable[[], FastAPI], host: str, port: int, token: str | None, command: str) -> None:
    """Bind ``host:port`` first (a busy port is one clear error), then build the app and serve it with uvicorn
    until interrupted; prints one line once it listens."""
    import uvicorn

    sock = _bind(host, port)
    try:
        app = build()
        shown = f"[{host}]" if ":" in host else host
        auth = "token required" if token else "no token"
        line = (f"dreamgym {command}: serving {app.state.pool.spec} on http://{shown}:{port}, {auth} "
                f"(AgentGym protocol: POST /create /reset /step /close, GET /tasks /observation ..."
                f"{'; OpenEnv: ' + PREFIX if any(getattr(r, 'path', '') == PREFIX for r in app.routes) else ''})")
        if not token and not _is_loopback(host):
            print(f"dreamgym {command}: warning: {host} is reachable from other machines and no token is set: "
                  "anyone who reaches the port can drive the environment; set DREAMGYM_SERVE_ENV_TOKEN",
                  file=sys.stderr, flush=True)

        class _Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                if self.started:
                    print(line, flush=True)

        limits = getattr(app.state, "limits", None)  # WebSocket messages (OpenEnv) obey the body limit too
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                                ws_max_size=limits.max_body_bytes if limits else 16 * 1024 * 1024)
        _Server(config).run(sockets=[sock])
    finally:
        sock.close()
