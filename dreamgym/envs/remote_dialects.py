"""How each environment server speaks the AgentGym protocol: the one table of per-server differences.

AgentGym (github.com/WooooDyy/AgentGym) serves every environment as a small HTTP service with the
same verbs: ``POST /create`` -> a server-side environment id, ``POST /reset`` (id + task index),
``POST /step`` (id + action), ``GET /observation``, sometimes ``GET /available_actions`` and
``POST /close``. The verbs are shared; the field names and reply shapes are not. Read against the
servers at AgentGym commit 3ef9235 (``agentenv-*/agentenv_*/server.py``):

============  =========  ==========================  ===============================  ================
dialect       id field   /create answers             /reset body (task index i)       /step answers
============  =========  ==========================  ===============================  ================
webshop       env_idx    a bare integer              ``{session_id: i}``              ``{state, reward,
                                                     -> ``[observation, null]``        done, info}``
alfworld      id         ``{id}``                    ``{game: i, world_type}``        ``{observation,
                                                     -> ``{observation,                reward, done,
                                                     available_actions, task_type}``  available_actions}``
webarena      env_idx    ``{env_idx}``               ``{seed: 0, idx: i}``            ``{observation,
                                                     -> ``{observation, sites,        reward, terminated,
                                                     object}`` (object = intent)      truncated, info}``
sciworld      id         ``{id}``                    ``{data_idx: i}`` ->             ``{observation,
                                                     ``{task_description,             reward, score,
                                                     observation, score, ...}``       done}``
textcraft     id         ``{id, observation, ...}``  ``{data_idx: i}`` ->             ``{observation,
                                                     ``{observation, ...}``           reward, done}``
dreamgym      id         ``{id, env_idx}``           ``{task: Task}`` or an index     ``{observation,
              (or        (``dreamgym serve-env``)    -> ``{observation, state,        state, reward, done,
              env_idx)                               instruction, available_actions,  success, info,
                                                     task}``                          available_actions}``
============  =========  ==========================  ===============================  ================

Other differences that matter to a client:

- Query parameters of ``GET`` endpoints use the same id field (``?env_idx=3`` or ``?id=3``).
- ALFWorld, ScienceWorld and TextCraft report failures as HTTP 200 with ``{"error": "..."}``.
- Admissible actions: WebShop answers ``GET /available_actions`` with ``{has_search_bar,
  clickables}`` (actions are ``click[<clickable>]`` and ``search[<keywords>]``); ALFWorld puts
  ``available_actions`` into every reset/step reply; WebArena, ScienceWorld and TextCraft offer none
  (ScienceWorld's ``/action_hint`` lists templates and objects, not valid actions).
- Instruction: WebShop ``GET /instruction_text``; ALFWorld the ``Your task is to: ...`` line of the
  first observation; WebArena the ``object`` field of the reset reply; ScienceWorld
  ``task_description``; TextCraft the ``Goal: ...`` line.
- Rewards and success: WebShop pays a reward in [0, 1] when ``click[buy now]`` ends the episode
  (success = reward 1.0, the usual WebShop success rate); ALFWorld's reward is ``won`` (0/1);
  WebArena's reward is the evaluator's 0/1 and only meaningful when ``terminated``; ScienceWorld's
  ``score`` runs 0..100 (reward = score change / 100, success = score 100); TextCraft pays 1 for the
  crafted goal.
- Actions: WebArena's server extracts the action from between triple backticks (it parses an LLM's
  whole answer); a bare action such as ``click [1234]`` is wrapped in backticks here.
- ``POST /close`` exists for WebArena, ScienceWorld, TextCraft and dreamgym only.
- Tasks are integer indices into the server's own task list: WebShop session ids (goal indices),
  ALFWorld game indices, WebArena config file numbers (``config_files/<i>.json``), ScienceWorld
  (task, variation) pairs, TextCraft goals. The servers do not list them. Where the benchmark fixes
  a split, ``splits`` below records it: WebShop test 0-499, dev 500-1499, train 1500+ (WebShop's
  ``baseline_models/env.py``); ALFWorld train 0-2419, test 2420-2619 (the order of the server's two
  mapping files).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

JSON = Any

#: What a ``dreamgym serve-env`` server answers in ``GET /`` under ``protocol``.
PROTOCOL = "dreamgym-env/1"


@dataclass
class Reply:
    """A reset or step reply of any dialect, in one shape."""

    text: str
    """The raw observation text."""
    reward: float = 0.0
    done: bool = False
    success: bool = False
    admissible: list[str] | None = None
    """Valid actions when the reply carries them (``None``: not in the reply)."""
    instruction: str | None = None
    """The task instruction when the reply carries it."""
    state: str | None = None
    """The abstract state, when the server computed it (dreamgym servers do)."""
    info: dict[str, Any] = field(default_factory=dict)


def _same_action(action: str) -> str:
    return action


def _keep_text(text: str, instruction: str) -> str:
    return text


@dataclass(frozen=True)
class Dialect:
    """One server family's way of speaking the protocol."""

    name: str
    description: str
    id_key: str
    """Field carrying the server-side environment id in bodies and query strings."""
    create_id: Callable[[JSON], int]
    """Reads the environment id out of the ``/create`` reply."""
    reset_body: Callable[[int, Mapping[str, Any]], dict[str, Any]]
    """Body of ``/reset`` for task index ``i`` (and the client's ``env.params``)."""
    parse_reset: Callable[[JSON], Reply]
    parse_step: Callable[[JSON], Reply]
    observe_after_reset: bool = False
    """Read the first observation from ``GET /observation`` (the reset reply is partial or raw)."""
    instruction_endpoint: str | None = None
    """``GET`` endpoint answering the instruction text, where the reset reply lacks it."""
    instruction_pattern: str | None = None
    """Regex whose group 1 is the instruction inside the first observation."""
    actions_endpoint: str | None = None
    """``GET`` endpoint listing admissible actions (``parse_actions`` reads its reply)."""
    parse_actions: Callable[[JSON], list[str]] | None = None
    wrap_action: Callable[[str], str] = _same_action
    has_close: bool = False
    state_cleaner: Callable[[str, str], str] = _keep_text
    """Dialect-specific clean-up of the raw text before the generic normaliser (``text, instruction``)."""
    boilerplate: tuple[str, ...] = ()
    """Regexes of lines the abstract state drops."""
    start_hint: str = ""
    """How to start such a server (shown when it cannot be reached)."""
    splits: Mapping[str, tuple[int, int | None]] = field(default_factory=dict)
    """Task index range ``[start, stop)`` of each split where the benchmark fixes one (``None``: open end)."""


# -- small readers -----------------------------------------------------------------------------


def _num(payload: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = payload.get(key, default)
    return float(value) if isinstance(value, int | float) else default


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _actions(value: Any) -> list[str] | None:
    return [str(a) for a in value] if isinstance(value, list) else None


def _key(payload: JSON, key: str) -> int:
    if isinstance(payload, dict) and isinstance(payload.get(key), int):
        return int(payload[key])
    raise ValueError(f"expected a JSON object with an integer {key!r}, got {payload!r:.200}")


def _bare_int(payload: JSON) -> int:
    if isinstance(payload, int) and not isinstance(payload, bool):
        return payload
    raise ValueError(f"expected a bare integer environment id, got {payload!r:.200}")


# -- WebShop -------------------------------------------------------------------------------------


def _webshop_reset(payload: JSON) -> Reply:
    # [observation, null]; the observation is refreshed from GET /observation anyway.
    text = payload[0] if isinstance(payload, list) and payload else payload
    return Reply(text=_text(text))


def _webshop_step(payload: JSON) -> Reply:
    reward, done = _num(payload, "reward"), bool(payload.get("done"))
    return Reply(text=_text(payload.get("state")), reward=reward, done=done, success=done and reward >= 1.0)


def _webshop_actions(payload: JSON) -> list[str]:
    actions = ["search[<keywords>]"] if payload.get("has_search_bar") else []
    # 'search' itself is listed among the clickables of the search page; search[...] covers it.
    return actions + [f"click[{c}]" for c in payload.get("clickables", []) if c != "search"]


def _webshop_clean(text: str, instruction: str) -> str:
    # Text mode joins the page's visible strings with ' [SEP] '; every page repeats the
    # instruction, which the task already carries.
    lines = [part.strip() for part in text.split("[SEP]")]
    drop = {"WebShop", "Instruction:", instruction.strip()}
    return "\n".join(line for line in lines if line and line not in drop)


# -- ALFWorld ------------------------------------------------------------------------------------


def _alfworld_reset(payload: JSON) -> Reply:
    return Reply(text=_text(payload.get("observation")), admissible=_actions(payload.get("available_actions")),
                 info={"task_type": payload.get("task_type")})


def _alfworld_step(payload: JSON) -> Reply:
    won = _num(payload, "reward")
    return Reply(text=_text(payload.get("observation")), reward=won, done=bool(payload.get("done")),
                 success=won >= 1.0, admissible=_actions(payload.get("available_actions")))


# -- WebArena ------------------------------------------------------------------------------------


def _webarena_reset(payload: JSON) -> Reply:
    text = _text(payload.get("observation"))
    if text == "TimeoutError":  # the server's way of saying the browser or the site did not answer
        raise ValueError("the WebArena server answered 'TimeoutError' to /reset: its websites or browser "
                         "did not respond (restart the server or check the site URLs it was set up with)")
    return Reply(text=text, instruction=_text(payload.get("object")), info={"sites": payload.get("sites")})


def _webarena_step(payload: JSON) -> Reply:
    terminated, truncated = bool(payload.get("terminated")), bool(payload.get("truncated"))
    reward = _num(payload, "reward") if terminated else 0.0  # only the final evaluation counts
    return Reply(text=_text(payload.get("observation")), reward=reward, done=terminated or truncated,
                 success=terminated and reward >= 1.0, info={"truncated": truncated})


def _webarena_action(action: str) -> str:
    return action if "```" in action else f"```{action.strip()}```"


# -- ScienceWorld / TextCraft --------------------------------------------------------------------


def _sciworld_reset(payload: JSON) -> Reply:
    return Reply(text=_text(payload.get("observation")), instruction=_text(payload.get("task_description")),
                 info={"task_name": payload.get("task_name"), "variation": payload.get("var_num")})


def _sciworld_step(payload: JSON) -> Reply:
    score = _num(payload, "score")
    return Reply(text=_text(payload.get("observation")), reward=_num(payload, "reward") / 100.0,
                 done=bool(payload.get("done")), success=score >= 100.0, info={"score": score})


def _textcraft_reset(payload: JSON) -> Reply:
    return Reply(text=_text(payload.get("observation")))


def _textcraft_step(payload: JSON) -> Reply:
    reward = _num(payload, "reward")
    return Reply(text=_text(payload.get("observation")), reward=reward, done=bool(payload.get("done")),
                 success=reward >= 1.0)


# -- dreamgym (our own server, ``dreamgym serve-env``) -----------------------------------------


def _dreamgym_reply(payload: JSON) -> Reply:
    return Reply(
        text=_text(payload.get("observation")),
        reward=_num(payload, "reward"),
        done=bool(payload.get("done")),
        success=bool(payload.get("success")),
        admissible=_actions(payload.get("available_actions")),
        instruction=_text(payload.get("instruction")),
        state=payload.get("state") if isinstance(payload.get("state"), str) else None,
        info=dict(payload.get("info") or {}),
    )


_AGENTGYM_HINT = "start AgentGym's agentenv-{0} server (`{0} --host 0.0.0.0 --port {{port}}`) on that machine"

#: The table. ``remote:<name>`` picks a row; docs/remote-environments.md explains each.
DIALECTS: dict[str, Dialect] = {
    "webshop": Dialect(
        name="webshop",
        description="AgentGym agentenv-webshop (WebShop text mode)",
        id_key="env_idx",
        create_id=_bare_int,
        reset_body=lambda i, params: {"session_id": i},
        parse_reset=_webshop_reset,
        parse_step=_webshop_step,
        observe_after_reset=True,
        instruction_endpoint="/instruction_text",
        actions_endpoint="/available_actions",
        parse_actions=_webshop_actions,
        state_cleaner=_webshop_clean,
        start_hint=_AGENTGYM_HINT.format("webshop"),
        # WebShop's own split of its (seed-233 shuffled) goals, baseline_models/env.py.
        splits={"test": (0, 500), "dev": (500, 1500), "train": (1500, None)},
    ),
    "alfworld": Dialect(
        name="alfworld",
        description="AgentGym agentenv-alfworld (text world)",
        id_key="id",
        create_id=lambda p: _key(p, "id"),
        reset_body=lambda i, params: {"game": i, "world_type": str(params.get("world_type", "Text"))},
        parse_reset=_alfworld_reset,
        parse_step=_alfworld_step,
        instruction_pattern=r"Your task is to:\s*(.+)",
        start_hint=_AGENTGYM_HINT.format("alfworld"),
        # The server lists configs/mappings_train.json (2,420 games), then mappings_test.json (200).
        splits={"train": (0, 2420), "test": (2420, 2620)},
    ),
    "webarena": Dialect(
        name="webarena",
        description="AgentGym agentenv-webarena (WebArena / WebArena-Lite tasks, accessibility tree)",
        id_key="env_idx",
        create_id=lambda p: _key(p, "env_idx"),
        reset_body=lambda i, params: {"seed": 0, "idx": i},
        parse_reset=_webarena_reset,
        parse_step=_webarena_step,
        observe_after_reset=True,
        wrap_action=_webarena_action,
        has_close=True,
        # The server wraps each page into its prompt template: the objective and the previous action
        # are known to the agent already, empty text nodes carry nothing.
        boilerplate=(r"^OBSERVATION:$", r"^OBJECTIVE:", r"^PREVIOUS ACTION:", r"^\[\d+\] StaticText ''$"),
        start_hint=_AGENTGYM_HINT.format("webarena"),
    ),
    "sciworld": Dialect(
        name="sciworld",
        description="AgentGym agentenv-sciworld (ScienceWorld)",
        id_key="id",
        create_id=lambda p: _key(p, "id"),
        reset_body=lambda i, params: {"data_idx": i},
        parse_reset=_sciworld_reset,
        parse_step=_sciworld_step,
        has_close=True,
        start_hint=_AGENTGYM_HINT.format("sciworld"),
    ),
    "textcraft": Dialect(
        name="textcraft",
        description="AgentGym agentenv-textcraft (Minecraft crafting)",
        id_key="id",
        create_id=lambda p: _key(p, "id"),
        reset_body=lambda i, params: {"data_idx": i},
        parse_reset=_textcraft_reset,
        parse_step=_textcraft_step,
        instruction_pattern=r"Goal:\s*(.+)",
        has_close=True,
        start_hint=_AGENTGYM_HINT.format("textcraft"),
    ),
    "dreamgym": Dialect(
        name="dreamgym",
        description="a local adapter served by `dreamgym serve-env` (tasks, gold actions, success)",
        id_key="id",
        create_id=lambda p: _key(p, "id"),
        reset_body=lambda i, params: {"data_idx": i},
        parse_reset=_dreamgym_reply,
        parse_step=_dreamgym_reply,
        has_close=True,
        start_hint="start one, e.g. `dreamgym serve-env --env twx:coin --host 127.0.0.1 --port {port}`",
    ),
}


def find_instruction(pattern: str | None, text: str) -> str:
    """Group 1 of ``pattern`` in ``text`` (first match), or ``''``."""
    if not pattern:
        return ""
    m = re.search(pattern, text)
    return m.group(1).strip() if m else ""
