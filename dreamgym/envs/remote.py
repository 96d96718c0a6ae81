"""Environments served over HTTP (``remote:<dialect>``), in the style of AgentGym's environment servers.

``RemoteEnv`` is an ordinary ``Environment``: rollout code cannot tell it from a local adapter. It
talks to one server (``env.url``) in one of the dialects of ``remote_dialects.DIALECTS``: the AgentGym
servers for WebShop, ALFWorld, WebArena(-Lite), ScienceWorld and TextCraft, or ``dreamgym``, our own
``dreamgym serve-env`` which serves any local adapter and also answers tasks, gold actions and
success.

Lifecycle: construction checks that the server answers (``GET /``) so a wrong URL fails at once with
one ``EnvironmentUnavailableError``, and that it is the dialect's server (a banner naming another
family is refused). The server-side environment is created (``POST /create``) at the first ``reset``
and released by ``close()``, else by a finalizer (garbage collection, interpreter exit). After a
connection error, a timeout or an "id not valid" reply the id is forgotten and the next reset creates
a new environment: a restarted server hands out old ids to other clients (where the dialect can tell,
``Dialect.owns``, each reset also checks that the server's last observation for the id is the client's).
One instance runs one episode at a time.

Tasks: a ``dreamgym`` server lists its tasks (``GET /tasks``). AgentGym servers do not; their tasks
are integer indices into the server's own task list (WebShop session ids, ALFWorld game numbers,
WebArena config numbers, ScienceWorld variations, TextCraft goals, BabyAI levels and seeds) and
``tasks(count, first, split)`` returns the ``first .. first+count-1``-th indices of the dialect's split
(``remote_dialects.Split``), or a window of ``env.params.task_ids`` (e.g. ``"0-99,200,205"``) when
given, which is how the WebArena-Lite subset is chosen. Their instructions are known only after
``reset``.

Every failure is a ``DreamGymError`` that names the server and the endpoint: unreachable server or
timeout -> ``EnvironmentUnavailableError`` (with how to start one); an HTTP error, an ``{"error": ...}``
reply or a reply that is not the expected JSON -> ``RemoteEnvironmentError``; a task the server does
not know -> ``EnvironmentSpecError`` (forwarded from a dreamgym server).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import weakref
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

import requests

from dreamgym.envs.abstract_state import normalise_state
from dreamgym.envs.base import Environment
from dreamgym.envs.remote_dialects import DIALECTS, PROTOCOL, Dialect, Reply, find_instruction
from dreamgym.errors import (
    ConfigError,
    DreamGymError,
    EnvironmentSpecError,
    EnvironmentUnavailableError,
    RemoteEnvironmentError,
)
from dreamgym.types import Observation, StepResult, Task

if TYPE_CHECKING:
    from dreamgym.config import EnvConfig

#: ``env.params`` keys the client reads itself; every other key is sent with ``POST /create``.
CLIENT_PARAMS = ("task_ids", "train_task_ids", "dev_task_ids", "test_task_ids", "world_type", "dialect_check")

#: Error replies meaning the server does not know the client's environment id (any more): AgentGym's
#: "The id 15 is not valid." / "... has been deleted.", a dreamgym server's "unknown environment id 15".
_STALE_ID = re.compile(r"\bid \d+ is not valid|environment \d+ has been deleted|unknown environment id")

#: ``GET /`` of an AgentGym server: ``"This is environment TextCraft."``.
_BANNER = re.compile(r"^\s*This is environment ([\w .-]+?)\.?\s*$")

#: Error classes a dreamgym server names in its error replies (``{"error": ..., "type": ...}``).
_FORWARDED_ERRORS: dict[str, type[DreamGymError]] = {
    "EnvironmentSpecError": EnvironmentSpecError,
    "EnvironmentUnavailableError": EnvironmentUnavailableError,
}


class RemoteEnv(Environment):
    """An environment behind an HTTP server speaking one of the dialects of ``DIALECTS``."""

    family: ClassVar[str] = "remote"

    def __init__(
        self,
        name: str,
        url: str,
        params: dict[str, Any] | None = None,
        max_steps: int = 20,
        state_max_chars: int = 2_000,
        timeout_s: float = 60.0,
        admissible_actions: bool = True,
        token: str | None = None,
    ) -> None:
        if name not in DIALECTS:
            raise EnvironmentSpecError(
                f"unknown remote environment 'remote:{name}'; valid names: {', '.join(self.known_names())}"
            )
        super().__init__(f"remote:{name}", max_steps=max_steps, state_max_chars=state_max_chars)
        self.dialect: Dialect = DIALECTS[name]
        self.url = _check_url(url, self.spec)
        self.params = dict(params or {})
        self.timeout_s = timeout_s
        self.with_admissible = admissible_actions
        self._task_ids = _parse_task_ids(self.params.get("task_ids"))
        self._split_task_ids = {split: _parse_task_ids(self.params.get(f"{split}_task_ids"))
                                for split in ("train", "dev", "test")}
        self._http = requests.Session()
        if token:
            # On the session, so every request (including the finalizer's /close) carries it.
            self._http.headers["Authorization"] = f"Bearer {token}"
        # The server-side environment this client holds; a finalizer closes it when the client is garbage
        # collected or the interpreter exits without ``close()`` (a Ray actor killed with ray.kill runs
        # neither: its owner calls ``close`` first).
        self._lease = _Lease(self._http, self.url, self.dialect.id_key, self.dialect.has_close)
        self._finalizer = weakref.finalize(self, _release, self._lease)
        # Episode state.
        self._task: Task | None = None
        self._instruction = ""
        self._admissible: list[str] | None = None
        self._episode_actions: list[str] | None = None
        self._plan: list[str] | None = None
        self._level = 0.0
        self._last: tuple[str, bool] | None = None
        """The server's last observation text to this client and whether it ended the episode."""
        self._steps = 0
        self._done = True
        try:
            # What the server says about itself at GET / (a dreamgym server names its environment).
            self.server_info: Any = self._probe()
        except BaseException:
            self._http.close()
            raise

    @classmethod
    def from_config(cls, name: str, cfg: EnvConfig) -> RemoteEnv:
        if not cfg.url:
            raise ConfigError(
                f"remote:{name} needs env.url, the base URL of its server "
                "(e.g. --env.url http://127.0.0.1:36001)"
            )
        from dreamgym.secrets import resolve

        return cls(name, cfg.url, params=dict(cfg.params), max_steps=cfg.max_steps,
                   state_max_chars=cfg.state_max_chars, timeout_s=cfg.timeout_s,
                   admissible_actions=cfg.admissible_actions, token=resolve(cfg.token, "env.token"))

    @classmethod
    def known_names(cls) -> list[str]:
        return list(DIALECTS)

    @property
    def _env_id(self) -> int | None:
        """The server-side environment id this client holds (``None``: none yet, or forgotten)."""
        return self._lease.env_id

    # -- tasks ---------------------------------------------------------------------------------
    def tasks(self, count: int, first: int = 0, split: str = "train") -> list[Task]:
        if count < 0 or first < 0:
            raise EnvironmentSpecError(f"task window first={first}, count={count} must not be negative")
        if self.dialect.name == "dreamgym":
            payload = self._request("GET", "/tasks", query={"count": count, "first": first, "split": split})
            if not isinstance(payload, list):
                raise self._malformed("GET", "/tasks", "a JSON list of tasks", payload)
            try:
                # The server's tasks name its own adapter; here they run through this client.
                return [dataclasses.replace(Task.from_dict(t), env=self.spec) for t in payload]
            except TypeError as e:
                raise self._malformed("GET", "/tasks", f"task objects ({e})", payload) from None
        indices = self._indices(count, first, split)
        return [Task(task_id=f"{self.spec}/{i}", env=self.spec, instruction="", params={"index": i, "split": split})
                for i in indices]

    def _indices(self, count: int, first: int, split: str) -> list[int]:
        """Server task indices: a window of ``env.params.<split>_task_ids`` or ``env.params.task_ids`` if
        given (they override the split), else of the dialect's split (``remote_dialects.Split``)."""
        chosen = self._split_task_ids.get(split)
        key = f"{split}_task_ids"
        if chosen is None:
            chosen, key = self._task_ids, "task_ids"
        if chosen is not None:
            if first + count > len(chosen):
                raise EnvironmentSpecError(
                    f"{self.spec}: env.params.{key} lists {len(chosen)} tasks; "
                    f"tasks {first}..{first + count - 1} were asked for"
                )
            return chosen[first:first + count]
        splits = self.dialect.splits
        if split not in splits:
            raise EnvironmentSpecError(
                f"{self.spec} has no {split!r} split; valid splits: {', '.join(splits)} "
                "(or choose indices with env.params.task_ids)"
            )
        size = splits[split].size()
        if size is not None and first + count > size:
            raise EnvironmentSpecError(
                f"{self.spec} split {split!r} holds {size} tasks; tasks {first}..{first + count - 1} "
                "were asked for"
            )
        return splits[split].indices(first, count)

    # -- episode -------------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        d = self.dialect
        self._done = True  # a failed reset leaves no episode running
        if d.name == "dreamgym":
            body: dict[str, Any] = {"task": task.to_dict()}
        else:
            index = task.params.get("index")
            if not isinstance(index, int) or isinstance(index, bool):
                raise EnvironmentSpecError(
                    f"task {task.task_id!r} has no integer 'index' parameter; {self.spec} tasks are indices "
                    f"into the server's task list (make them with tasks())"
                )
            body = d.reset_body(index, self.params)
        self._check_ownership()
        payload = self._reset_request(body)
        reply = self._parse(d.parse_reset, "POST", "/reset", payload)
        self._last = (reply.text, reply.done)
        if d.observe_after_reset:
            observed = self._call("GET", "/observation", query=self._id_query())
            reply.text = observed if isinstance(observed, str) else str(observed)
        self._task, self._steps, self._done = task, 0, False
        self._level = reply.level or 0.0
        self._instruction = self._find_instruction(reply, task)
        self._episode_actions = d.episode_actions(reply.text) if d.episode_actions else None
        self._plan = d.gold_plan(reply.text) if d.gold_plan else None
        self._admissible = self._fetch_admissible(reply)
        return self._observation(reply)

    def _check_ownership(self) -> None:
        """Before a reset: is the environment behind this client's id still the one it played? A server that
        restarted while the client sat idle may have handed the id to another client; the server's last
        observation for the id then differs from the client's, and the id is forgotten (not closed: it is
        not this client's). Only for dialects whose ``/observation`` can tell (``Dialect.owns``)."""
        owns = self.dialect.owns
        if owns is None or self._lease.env_id is None or self._last is None:
            return
        last_text, last_done = self._last
        try:
            mine = owns(self._call("GET", "/observation", query=self._id_query()), last_text)
        except RemoteEnvironmentError as e:
            # ScienceWorld and BabyAI refuse to show a finished episode: ours, if our last reply finished it.
            mine = last_done and "has finished" in str(e) and self._lease.env_id is not None
        if not mine:
            self._lease.env_id = None

    def _reset_request(self, body: dict[str, Any]) -> Any:
        """``POST /reset`` on this client's environment; one that the server no longer knows (it was restarted
        or closed the environment) is replaced by a new one, never by guessing that the old id is still ours."""
        for attempt in (0, 1):
            body[self.dialect.id_key] = self._ensure_created()
            try:
                return self._call("POST", "/reset", body=body)
            except RemoteEnvironmentError as e:
                if attempt or not _STALE_ID.search(str(e)):
                    raise
        raise AssertionError("unreachable")

    def step(self, action: str) -> StepResult:
        if self._done or self._task is None:
            raise RuntimeError("step() called with no running episode: call reset(task) first")
        d = self.dialect
        was_admissible = None if self._admissible is None else action in self._admissible
        try:
            payload = self._call("POST", "/step", body={d.id_key: self._env_id, "action": d.wrap_action(action)})
            reply = self._parse(d.parse_step, "POST", "/step", payload)
        except DreamGymError:
            self._done = True  # the episode cannot go on; the next reset starts a new one
            raise
        self._last = (reply.text, reply.done)
        self._steps += 1
        reward = reply.reward
        if reply.level is not None:  # a running score: the reward is its change (remote_dialects.Reply.level)
            reward, self._level = round(reply.level - self._level, 9), reply.level
        # The client enforces env.max_steps itself: AgentGym servers have no step budget.
        truncated = not reply.done and self._steps >= self.max_steps
        self._done = reply.done or truncated
        self._admissible = None if self._done else self._fetch_admissible(reply)
        info = dict(reply.info)
        info.setdefault("admissible", was_admissible)
        info["truncated"] = bool(info.get("truncated")) or truncated
        return StepResult(observation=self._observation(reply), reward=reward, done=self._done,
                          success=reply.success, info=info)

    def admissible_actions(self) -> list[str] | None:
        return None if self._admissible is None else list(self._admissible)

    def gold_actions(self) -> list[str] | None:
        """The expert plan of the running episode: a dreamgym server's, or one the dialect computes from the
        first observation (TextCraft's crafting commands); other AgentGym servers have none."""
        if self._task is None:
            return None
        if self.dialect.gold_plan is not None:
            return None if self._plan is None else list(self._plan)
        if self.dialect.name != "dreamgym" or self._env_id is None:
            return None
        payload = self._call("GET", "/gold_actions", query=self._id_query())
        if payload is not None and not isinstance(payload, list):
            raise self._malformed("GET", "/gold_actions", "a JSON list of actions or null", payload)
        return None if payload is None else [str(a) for a in payload]

    def abstract_state(self, raw: str) -> str:
        cleaned = self.dialect.state_cleaner(raw, self._instruction)
        return normalise_state(cleaned, max_chars=self.state_max_chars, boilerplate=self.dialect.boilerplate)

    def close(self) -> None:
        """Close the server-side environment (best effort: the server may be gone when a run shuts down)."""
        _release(self._lease)
        self._task, self._done = None, True
        self._http.close()

    # -- helpers -------------------------------------------------------------------------------
    def _observation(self, reply: Reply) -> Observation:
        state = reply.state if reply.state is not None else self.abstract_state(reply.text)
        return Observation(text=reply.text, state=state, admissible_actions=self.admissible_actions(),
                           instruction=self._instruction)

    def _ensure_created(self) -> int:
        if self._lease.env_id is None:
            body = {k: v for k, v in self.params.items() if k not in CLIENT_PARAMS}
            payload = self._request("POST", "/create", body=body)
            self._lease.env_id = self._parse(self.dialect.create_id, "POST", "/create", payload)
        return self._lease.env_id

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              query: dict[str, Any] | None = None) -> Any:
        """A request about this client's environment. When it fails in a way that may mean the server lost or
        replaced the environment (unreachable, timed out, "id not valid"), the id is forgotten: a restarted
        server hands out ids from 0 again, so an old id may now be another client's environment."""
        try:
            return self._request(method, path, body=body, query=query)
        except EnvironmentUnavailableError:
            self._lease.env_id = None
            raise
        except RemoteEnvironmentError as e:
            if _STALE_ID.search(str(e)):
                self._lease.env_id = None
            raise

    def _id_query(self) -> dict[str, Any]:
        return {self.dialect.id_key: self._env_id}

    def _find_instruction(self, reply: Reply, task: Task) -> str:
        d = self.dialect
        if reply.instruction:
            return reply.instruction
        if d.instruction_endpoint:
            text = self._call("GET", d.instruction_endpoint, query=self._id_query())
            # WebShop's page heading reads "Instruction: <goal>".
            return re.sub(r"^\s*Instruction:\s*", "", str(text or "")).strip()
        return find_instruction(d.instruction_pattern, reply.text) or task.instruction

    def _fetch_admissible(self, reply: Reply) -> list[str] | None:
        d = self.dialect
        if not self.with_admissible:
            return None
        if reply.admissible is None and self._episode_actions is not None:
            return list(self._episode_actions)
        if reply.admissible is not None or d.actions_endpoint is None or d.parse_actions is None:
            return reply.admissible
        payload = self._call("GET", d.actions_endpoint, query=self._id_query())
        return self._parse(d.parse_actions, "GET", d.actions_endpoint, payload)

    def _probe(self) -> Any:
        """``GET /``, and the dialect check: a server that names another family is refused at once (a wrong
        dialect otherwise looks like it works: servers ignore fields they do not know, such as a game index)."""
        payload = self._request("GET", "/")
        d = self.dialect
        ours = isinstance(payload, dict) and payload.get("protocol") == PROTOCOL
        if d.name == "dreamgym" and not ours:
            others = ", ".join(f"remote:{n}" for n in DIALECTS if n != "dreamgym")
            raise RemoteEnvironmentError(
                f"the server at {self.url} is not a `dreamgym serve-env` server (GET / answered {payload!r:.120}); "
                f"for an AgentGym server use its dialect ({others})"
            )
        if d.name == "dreamgym" or str(self.params.get("dialect_check", True)).lower() in ("false", "0", "no"):
            return payload
        named = _BANNER.match(payload) if isinstance(payload, str) else None
        family = named.group(1) if named else None
        match = next((n for n, x in DIALECTS.items() if x.banner and family and x.banner.lower() == family.lower()),
                     None)
        if ours:
            family, match = "dreamgym serve-env", "dreamgym"
        wrong = family is not None and (match != d.name if d.banner or match else False)
        if wrong:
            use = f"use remote:{match}" if match else "no dialect of this client speaks to it"
            raise RemoteEnvironmentError(
                f"the server at {self.url} is a {family} server (GET / answered {payload!r:.120}), not the "
                f"{d.description} server that {self.spec} expects: {use} (or, if the server names itself "
                "wrongly, set env.params.dialect_check false)"
            )
        return payload

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 query: dict[str, Any] | None = None) -> Any:
        where = f"{method} {path}"
        try:
            resp = self._http.request(method, self.url + path, json=body, params=query,
                                      timeout=(min(10.0, self.timeout_s), self.timeout_s))
        except requests.ConnectionError as e:
            raise EnvironmentUnavailableError(self._unreachable(where, _reason(e))) from None
        except requests.Timeout:
            raise EnvironmentUnavailableError(
                f"the environment server for {self.spec} at {self.url} did not answer {where} within "
                f"{self.timeout_s:g} s (env.timeout_s); raise env.timeout_s or check the server's load"
            ) from None
        except requests.RequestException as e:
            raise RemoteEnvironmentError(f"{where} to {self.url} failed: {_reason(e)}") from None
        try:
            payload = resp.json()
        except ValueError:
            payload = None
            if resp.ok:
                raise self._malformed(method, path, "JSON", resp.text) from None
        if not resp.ok:
            message = _error_message(payload) or resp.text.strip()[:300] or resp.reason
            cls = _FORWARDED_ERRORS.get(payload.get("type", "") if isinstance(payload, dict) else "",
                                        RemoteEnvironmentError)
            raise cls(f"{self.spec} server at {self.url}: {where} failed (HTTP {resp.status_code}): {message}")
        if isinstance(payload, dict) and "error" in payload and len(payload) <= 2:
            # AgentGym servers answer failures with HTTP 200 and {"error": "..."}.
            raise RemoteEnvironmentError(f"{self.spec} server at {self.url}: {where} reported an error: "
                                         f"{payload['error']}")
        return payload

    def _parse(self, reader: Any, method: str, path: str, payload: Any) -> Any:
        try:
            return reader(payload)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise self._malformed(method, path, f"the {self.dialect.name} reply format ({e})", payload) from None

    def _malformed(self, method: str, path: str, expected: str, payload: Any) -> RemoteEnvironmentError:
        return RemoteEnvironmentError(
            f"{self.spec} server at {self.url}: {method} {path} answered something that is not {expected}: "
            f"{payload!r:.300}; is env.url the {self.dialect.description} server?"
        )

    def _unreachable(self, where: str, reason: str) -> str:
        port = urlsplit(self.url).port or 36001
        hint = self.dialect.start_hint.format(port=port)
        return (f"cannot reach the environment server for {self.spec} at {self.url} ({where}: {reason}). "
                f"Is it running? To fix: {hint}, or point env.url at the right server.")


@dataclasses.dataclass
class _Lease:
    """The server-side environment a ``RemoteEnv`` holds, kept apart from it so that a finalizer can
    close the environment without keeping the client alive."""

    http: requests.Session
    url: str
    id_key: str
    has_close: bool
    env_id: int | None = None


def _release(lease: _Lease) -> None:
    """Close the leased environment once (best effort: a server that is gone has nothing left to close)."""
    env_id, lease.env_id = lease.env_id, None
    if env_id is None or not lease.has_close:
        return
    with contextlib.suppress(requests.RequestException):
        lease.http.post(lease.url + "/close", json={lease.id_key: env_id}, timeout=(5, 10))


def _check_url(url: str, spec: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"env.url {url!r} for {spec} must be an http(s) URL such as http://127.0.0.1:36001")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError as e:
        raise ConfigError(f"env.url {url!r} for {spec}: {e}") from None
    return url.rstrip("/")


def _parse_task_ids(value: Any) -> list[int] | None:
    """``"0-3,7"`` -> ``[0, 1, 2, 3, 7]`` (``env.params`` holds scalars, so the list is a string)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    out: list[int] = []
    for part in str(value).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise ConfigError(f"env.params.task_ids: {part!r} is not an index or a range such as '0-99'")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ConfigError(f"env.params.task_ids: range {part.strip()!r} runs backwards")
        out.extend(range(lo, hi + 1))
    return out


def _reason(e: Exception) -> str:
    """The useful part of a requests error ("[Errno 111] Connection refused", not the urllib3 chain)."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    if m:
        return m.group(0).strip()
    for marker in ("Connection refused", "Name or service not known", "Connection reset", "Connection aborted"):
        if marker in text:
            return marker
    return type(e).__name__


def _error_message(payload: Any) -> str:
    if isinstance(payload, dict):
        for key in ("error", "detail", "message"):
            if payload.get(key):
                return str(payload[key])
    return ""
