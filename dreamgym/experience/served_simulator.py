"""One-step predictions of a served simulator (``dreamgym serve-synthetic``'s ``POST /predict``), for fidelity.

``dreamgym eval-experience-model --simulator URL`` scores a simulator someone serves, on held-out real
transitions, beside the copy-top-1 baseline, without this project's trainer. Each held-out query goes to the
server *without* its demonstrations: the server retrieves them from its own store and checks the action against
its own action space, so the score is the served simulator's as a trainer meets it (its data, its model, its
rules), not its model's alone.

Wire format of ``POST /predict`` (one query a request, so a request stays small; ``ServedSimulator`` sends a
batch's queries concurrently): the query's ``env``, ``instruction``, ``state``, ``action``, ``history``
(``[[action, state], ...]``), ``admissible_actions`` and ``reward_so_far``; the reply is the ``Prediction``'s
fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from dreamgym.errors import EnvironmentUnavailableError, RemoteEnvironmentError
from dreamgym.experience.schema import ExperienceQuery, HistoryStep, Prediction


def query_to_wire(q: ExperienceQuery) -> dict[str, Any]:
    """The fields of ``q`` a served simulator reads (no demonstrations, no action space: it has its own)."""
    return {"env": q.env, "instruction": q.instruction, "state": q.state, "action": q.action,
            "history": [[h.action, h.state] for h in q.history], "admissible_actions": q.admissible_actions,
            "reward_so_far": q.reward_so_far}


def query_from_wire(d: dict[str, Any]) -> ExperienceQuery:
    """The query of a ``POST /predict`` body (``ValueError`` / ``TypeError`` naming what is wrong)."""
    for key in ("env", "instruction", "state", "action"):
        if not isinstance(d.get(key), str):
            raise ValueError(f"'{key}' must be a string")
    history = d.get("history") or []
    if not isinstance(history, list) or not all(isinstance(h, list | tuple) and len(h) == 2 for h in history):
        raise ValueError("'history' must be a list of [action, state] pairs")
    admissible = d.get("admissible_actions")
    if admissible is not None and not (isinstance(admissible, list) and all(isinstance(a, str) for a in admissible)):
        raise ValueError("'admissible_actions' must be a list of strings or null")
    return ExperienceQuery(env=d["env"], instruction=d["instruction"], state=d["state"], action=d["action"],
                           history=[HistoryStep(action=str(a), state=str(s)) for a, s in history],
                           admissible_actions=admissible, reward_so_far=float(d.get("reward_so_far") or 0.0))


class ServedSimulator:
    """``predict(queries)`` over a served simulator's ``POST /predict`` (the ``predict`` that ``evaluate`` takes)."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 600.0, concurrency: int = 32) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dreamgym-simulator")
        about = self._request("GET", "/")
        if not isinstance(about, dict) or "synthetic" not in about:
            raise RemoteEnvironmentError(f"the server at {self.url} is not a `dreamgym serve-synthetic` server "
                                         f"(GET / answered {about!r:.120})")
        self.about: dict[str, Any] = about["synthetic"]

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            r = self.http.request(method, self.url + path, json=body, timeout=(10, self.timeout_s))
        except requests.RequestException as e:
            raise EnvironmentUnavailableError(f"cannot reach the served simulator at {self.url} ({method} {path}: "
                                              f"{type(e).__name__}); is `dreamgym serve-synthetic` running there?"
                                              ) from None
        try:
            payload = r.json()
        except ValueError:
            payload = {"error": r.text[:300]}
        if not r.ok:
            error = payload.get("error") if isinstance(payload, dict) else payload
            raise RemoteEnvironmentError(f"the served simulator at {self.url}: {method} {path} failed "
                                         f"(HTTP {r.status_code}): {error}")
        return payload

    def _one(self, q: ExperienceQuery) -> Prediction:
        d = self._request("POST", "/predict", query_to_wire(q))
        fields = {f.name for f in dataclasses.fields(Prediction)}
        return Prediction(**{k: v for k, v in d.items() if k in fields})

    def predict(self, queries: Sequence[ExperienceQuery]) -> list[Prediction]:
        return list(self.pool.map(self._one, queries))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()
