"""Environments served over HTTP (``remote:<dialect>``), in the style of AgentGym's environment servers.

``RemoteEnv`` is an ordinary ``Environment``: rollout code cannot tell it from a local adapter. It
talks to one server (``env.url``) in one of the dialects of ``remote_dialects.DIALECTS``: the AgentGym
servers for WebShop, ALFWorld, WebArena(-Lite), ScienceWorld and TextCraft, or ``dreamgym``, our own
``dreamgym serve-env`` which serves any local adapter and also answers tasks, gold actions and
success.

Lifecycle: construction checks that the server answers (``GET /``) so a wrong URL fails at once with
one ``EnvironmentUnavailableError``; the server-side environment is created (``POST /create``) at the
first ``reset`` and released by ``close()``. One instance runs one episode at a time.

Tasks: a ``dreamgym`` server lists its tasks (``GET /tasks``). AgentGym servers do not; their tasks
are integer indices into the server's own task list (WebShop session ids, ALFWorld game numbers,
WebArena config numbers, ScienceWorld variations) and ``tasks(count, first)`` returns indices
``first .. first+count-1``, or a window of ``env.params.task_ids`` (e.g. ``"0-99,200,205"``) when
given, which is how a split or the WebArena-Lite subset is chosen. Their instructions are known only
after ``reset``.

Every failure is a ``DreamGymError`` that names the server and the endpoint: unreachable server or
timeout -> ``EnvironmentUnavailableError`` (with how to start one); an HTTP error, an ``{"error": ...}``
reply or a reply that is not the expected JSON -> ``RemoteEnvironmentError``; a task the server does
not know -> ``EnvironmentSpecError`` (forwarded from a dreamgym server).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
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
CLIENT_PARAMS = ("task_ids", "world_type")

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
        self._http = requests.Session()
        # Episode state.
        self._env_id: int | None = None
        self._task: Task | None = None
        self._instruction = ""
        self._admissible: list[str] | None = None
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
        return cls(name, cfg.url, params=dict(cfg.params), max_steps=cfg.max_steps,
                   state_max_chars=cfg.state_max_chars, timeout_s=cfg.timeout_s,
                   admissible_actions=cfg.admissible_actions)

    @classmethod
    def known_names(cls) -> list[str]:
        return list(DIALECTS)

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
        """Server task indices: a window of ``env.params.task_ids`` if given (it overrides the split),
        else of the dialect's range for ``split``, else ``first .. first+count-1``."""
        if self._task_ids is not None:
            if first + count > len(self._task_ids):
                raise EnvironmentSpecError(
                    f"{self.spec}: env.params.task_ids lists {len(self._task_ids)} tasks; "
                    f"tasks {first}..{first + count - 1} were asked for"
                )
            return self._task_ids[first:first + count]
        splits = self.dialect.splits
        if not splits:
            return list(range(first, first + count))
        if split not in splits:
            raise EnvironmentSpecError(
                f"{self.spec} has no {split!r} split; valid splits: {', '.join(splits)} "
                "(or choose indices with env.params.task_ids)"
            )
        start, stop = splits[split]
        if stop is not None and start + first + count > stop:
            raise EnvironmentSpecError(
                f"{self.spec} split {split!r} holds {stop - start} tasks; tasks {first}..{first + count - 1} "
                "were asked for"
            )
        return list(range(start + first, start + first + count))

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
        body[d.id_key] = self._ensure_created()
        payload = self._request("POST", "/reset", body=body)
        reply = self._parse(d.parse_reset, "POST", "/reset", payload)
        if d.observe_after_reset:
            observed = self._request("GET", "/observation", query=self._id_query())
            reply.text = observed if isinstance(observed, str) else str(observed)
        self._task, self._steps, self._done = task, 0, False
        self._instruction = self._find_instruction(reply, task)
        self._admissible = self._fetch_admissible(reply)
        return self._observation(reply)

    def step(self, action: str) -> StepResult:
        if self._done or self._task is None:
            raise RuntimeError("step() called with no running episode: call reset(task) first")
        d = self.dialect
        was_admissible = None if self._admissible is None else action in self._admissible
        payload = self._request("POST", "/step", body={d.id_key: self._env_id, "action": d.wrap_action(action)})
        reply = self._parse(d.parse_step, "POST", "/step", payload)
        self._steps += 1
        # The client enforces env.max_steps itself: AgentGym servers have no step budget.
        truncated = not reply.done and self._steps >= self.max_steps
        self._done = reply.done or truncated
        self._admissible = None if self._done else self._fetch_admissible(reply)
        info = dict(reply.info)
        info.setdefault("admissible", was_admissible)
        info["truncated"] = bool(info.get("truncated")) or truncated
        return StepResult(observation=self._observation(reply), reward=reply.reward, done=self._done,
                          success=reply.success, info=info)

    def admissible_actions(self) -> list[str] | None:
        return None if self._admissible is None else list(self._admissible)

    def gold_actions(self) -> list[str] | None:
        """A dreamgym server's expert plan for the running episode; AgentGym servers have none."""
        if self.dialect.name != "dreamgym" or self._env_id is None or self._task is None:
            return None
        payload = self._request("GET", "/gold_actions", query=self._id_query())
        if payload is not None and not isinstance(payload, list):
            raise self._malformed("GET", "/gold_actions", "a JSON list of actions or null", payload)
        return None if payload is None else [str(a) for a in payload]

    def abstract_state(self, raw: str) -> str:
        cleaned = self.dialect.state_cleaner(raw, self._instruction)
        return normalise_state(cleaned, max_chars=self.state_max_chars, boilerplate=self.dialect.boilerplate)

    def close(self) -> None:
        if self._env_id is not None and self.dialect.has_close:
            # Best effort: the server may already be gone when a run shuts down.
            with contextlib.suppress(DreamGymError):
                self._request("POST", "/close", body={self.dialect.id_key: self._env_id})
        self._env_id, self._task, self._done = None, None, True
        self._http.close()

    # -- helpers -------------------------------------------------------------------------------
    def _observation(self, reply: Reply) -> Observation:
        state = reply.state if reply.state is not None else self.abstract_state(reply.text)
        return Observation(text=reply.text, state=state, admissible_actions=self.admissible_actions(),
                           instruction=self._instruction)

    def _ensure_created(self) -> int:
        if self._env_id is None:
            body = {k: v for k, v in self.params.items() if k not in CLIENT_PARAMS}
            payload = self._request("POST", "/create", body=body)
            self._env_id = self._parse(self.dialect.create_id, "POST", "/create", payload)
        return self._env_id

    def _id_query(self) -> dict[str, Any]:
        return {self.dialect.id_key: self._env_id}

    def _find_instruction(self, reply: Reply, task: Task) -> str:
        d = self.dialect
        if reply.instruction:
            return reply.instruction
        if d.instruction_endpoint:
            text = self._request("GET", d.instruction_endpoint, query=self._id_query())
            # WebShop's page heading reads "Instruction: <goal>".
            return re.sub(r"^\s*Instruction:\s*", "", str(text or "")).strip()
        return find_instruction(d.instruction_pattern, reply.text) or task.instruction

    def _fetch_admissible(self, reply: Reply) -> list[str] | None:
        d = self.dialect
        if not self.with_admissible:
            return None
        if reply.admissible is not None or d.actions_endpoint is None or d.parse_actions is None:
            return reply.admissible
        payload = self._request("GET", d.actions_endpoint, query=self._id_query())
        return self._parse(d.parse_actions, "GET", d.actions_endpoint, payload)

    def _probe(self) -> Any:
        payload = self._request("GET", "/")
        if self.dialect.name == "dreamgym" and not (isinstance(payload, dict) and payload.get("protocol") == PROTOCOL):
            others = ", ".join(f"remote:{n}" for n in DIALECTS if n != "dreamgym")
            raise RemoteEnvironmentError(
                f"the server at {self.url} is not a `dreamgym serve-env` server (GET / answered {payload!r:.120}); "
                f"for an AgentGym server use its dialect ({others})"
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
