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
babyai        id         ``{id}``                    ``{data_idx: i}`` ->             ``{observation,
                                                     ``{observation, reward,          reward, score,
                                                     score, done}``                   done}``
dreamgym      id         ``{id, env_idx}``           ``{task: Task}`` or an index     ``{observation,
              (or        (``dreamgym serve-env``)    -> ``{observation, state,        state, reward, done,
              env_idx)                               instruction, available_actions,  success, info,
                                                     task}``                          available_actions}``
============  =========  ==========================  ===============================  ================

Other differences that matter to a client:

- Query parameters of ``GET`` endpoints use the same id field (``?env_idx=3`` or ``?id=3``).
- ALFWorld, ScienceWorld, TextCraft and BabyAI report failures as HTTP 200 with ``{"error": "..."}``;
  an unknown id is ``"The id N is not valid."`` (a restarted server hands out ids from 0 again).
- ``GET /`` names the family: ``"This is environment TextCraft."`` (``banner`` below; the client refuses
  a server that names another family).
- Admissible actions: WebShop answers ``GET /available_actions`` with ``{has_search_bar,
  clickables}`` (actions are ``click[<clickable>]`` and ``search[<keywords>]``); ALFWorld puts
  ``available_actions`` into every reset/step reply; BabyAI writes ``Available actions: [...]`` at the
  end of every observation; TextCraft lists its crafting commands in the first observation (the client
  derives the episode's valid actions and an expert plan from them); WebArena and ScienceWorld offer none
  (ScienceWorld's ``/action_hint`` lists templates and objects, not valid actions).
- Instruction: WebShop ``GET /instruction_text``; ALFWorld the ``Your task is to: ...`` line of the
  first observation; WebArena the ``object`` field of the reset reply; ScienceWorld
  ``task_description``; TextCraft the ``Goal: ...`` line; BabyAI the ``Your goal: ...`` line.
- Rewards and success (one convention per family, the same as the local adapters'; the table is in
  docs/remote-environments.md): WebShop pays a reward in [0, 1] when ``click[buy now]`` ends the episode
  (success = reward 1.0, the usual WebShop success rate); ALFWorld's reward is ``won`` (0/1);
  WebArena's reward is the evaluator's 0/1 and only meaningful when ``terminated``; ScienceWorld's
  ``score`` runs 0..100, -100 for a failed task (reward = change of max(score, 0) / 100, so a failure
  counts 0 as in ``sciworld:``; success = score 100); TextCraft pays 1 for the crafted goal; BabyAI's
  ``reward`` is a level repeated in every reply (reward = its change, success = ``done``).
- Actions: WebArena's server extracts the action from between triple backticks (it parses an LLM's
  whole answer); a bare action such as ``click [1234]`` is wrapped in backticks here.
- ``POST /close`` exists for WebArena, ScienceWorld, TextCraft, BabyAI and dreamgym only.
- Tasks are integer indices into the server's own task list: WebShop session ids (goal indices),
  ALFWorld game indices, WebArena config file numbers (``config_files/<i>.json``), ScienceWorld
  (task, variation) pairs, TextCraft goals, BabyAI (level, seed) pairs. The servers do not list them.
  ``splits`` below gives every dialect a train and a test split: the benchmark's own where it fixes
  one (WebShop test 0-499, dev 500-1499, train 1500+, from WebShop's ``baseline_models/env.py``;
  ALFWorld train 0-2419, test 2420-2619, the order of the server's two mapping files), else every
  fifth index (BabyAI: every fifth seed) held out for test.
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
    level: float | None = None
    """The episode's progress so far in [0, 1], where the server reports a running score instead of
    per-step rewards (ScienceWorld, BabyAI): the client's reward is the change of the level."""
    info: dict[str, Any] = field(default_factory=dict)


def _same_action(action: str) -> str:
    return action


def _keep_text(text: str, instruction: str) -> str:
    return text


@dataclass(frozen=True)
class Split:
    """The task indices of one split: indices ``i`` in ``[start, stop)`` with ``(i - start) % period`` in
    ``residues``. A contiguous range is ``period=1, residues=(0,)``; an interleaved split (every fifth
    index for ``test``) keeps the server's order of difficulty or task type in both splits."""

    start: int = 0
    stop: int | None = None
    """First index past the split (``None``: open end)."""
    period: int = 1
    residues: tuple[int, ...] = (0,)

    def size(self) -> int | None:
        if self.stop is None:
            return None
        full, rest = divmod(self.stop - self.start, self.period)
        return full * len(self.residues) + sum(1 for r in self.residues if r < rest)

    def index(self, k: int) -> int:
        """The server index of the split's ``k``-th task."""
        block, r = divmod(k, len(self.residues))
        return self.start + block * self.period + self.residues[r]

    def indices(self, first: int, count: int) -> list[int]:
        return [self.index(k) for k in range(first, first + count)]


def interleaved(stop: int | None, period: int, test: tuple[int, ...]) -> dict[str, Split]:
    """``test``: the indices whose remainder modulo ``period`` is in ``test``; ``train``: all others."""
    train = tuple(r for r in range(period) if r not in test)
    return {"train": Split(0, stop, period, train), "test": Split(0, stop, period, tuple(sorted(test)))}


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
    episode_actions: Callable[[str], list[str]] | None = None
    """Valid actions read from the first observation and kept for the whole episode (TextCraft's
    crafting commands), where the server lists none."""
    gold_plan: Callable[[str], list[str] | None] | None = None
    """An expert plan computed from the first observation, where the observation reveals enough."""
    wrap_action: Callable[[str], str] = _same_action
    has_close: bool = False
    state_cleaner: Callable[[str, str], str] = _keep_text
    """Dialect-specific clean-up of the raw text before the generic normaliser (``text, instruction``)."""
    boilerplate: tuple[str, ...] = ()
    """Regexes of lines the abstract state drops."""
    start_hint: str = ""
    """How to start such a server (shown when it cannot be reached)."""
    splits: Mapping[str, Split] = field(default_factory=dict)
    """The task indices of each split: the benchmark's own where it fixes one, else a documented
    deterministic split by index (every dialect has ``train`` and ``test``)."""
    banner: str | None = None
    """The family the server names in ``GET /`` (``"This is environment <banner>."``); ``None``: not known."""
    owns: Callable[[JSON, str], bool] | None = None
    """Whether the ``GET /observation`` reply for the client's id shows the last observation the client was
    given (``reply, last text``): the check, before each reset, that a restarted server has not handed the
    id to another client. ``None``: the server's ``/observation`` cannot tell."""


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


# -- ScienceWorld ---------------------------------------------------------------------------------


def _sciworld_level(payload: JSON) -> tuple[float, float]:
    # The score runs 0..100, and -100 once the task is failed; failure counts as 0, as in the local
    # ``sciworld:`` adapter, so an episode's rewards sum to its final score / 100.
    score = _num(payload, "score")
    return score, max(score, 0.0) / 100.0


def _sciworld_reset(payload: JSON) -> Reply:
    _, level = _sciworld_level(payload)
    return Reply(text=_text(payload.get("observation")), instruction=_text(payload.get("task_description")),
                 level=level, info={"task_name": payload.get("task_name"), "variation": payload.get("var_num")})


def _sciworld_step(payload: JSON) -> Reply:
    score, level = _sciworld_level(payload)
    done = bool(payload.get("done"))
    return Reply(text=_text(payload.get("observation")), level=level, done=done,
                 success=done and score >= 100.0, info={"score": int(score), "task_failure": score < 0})


# -- TextCraft -------------------------------------------------------------------------------------

_CRAFT = re.compile(r"^craft (\d+) (.+?) using (.+)$")
_INGREDIENT = re.compile(r"^(\d+) (.+)$")


def _textcraft_recipes(text: str) -> list[tuple[str, int, str, list[tuple[int, str]]]]:
    """``(command, output count, output item, [(count, input item)])`` of every crafting command listed."""
    out = []
    for line in text.splitlines():
        m = _CRAFT.match(line.strip())
        if not m:
            continue
        inputs = []
        for part in m.group(3).split(","):
            im = _INGREDIENT.match(part.strip())
            if im:
                inputs.append((int(im.group(1)), im.group(2)))
        out.append((line.strip(), int(m.group(1)), m.group(2), inputs))
    return out


def _textcraft_family(item: str, made: dict[str, list[str]]) -> list[str]:
    """The listed items an ingredient such as ``planks`` stands for (``oak planks``, ...): TextCraft's item
    families are named by their last words and must be spelled as one member in a command. ``made`` maps
    each listed output to its ingredients; an output made from ``item`` itself (``black stained glass``
    from ``glass``) is not a member."""
    if item in made:
        return []
    return sorted(m for m, inputs in made.items() if m.endswith(" " + item) and item not in inputs)


def _textcraft_command(n: int, item: str, inputs: list[tuple[int, str]]) -> str:
    return f"craft {n} {item} using " + ", ".join(f"{c} {i}" for c, i in inputs)


def _textcraft_actions(text: str) -> list[str]:
    """The actions TextCraft's first observation reveals: ``inventory``; every listed crafting command, with
    an item family (``2 planks``) spelled as each of its listed members (``2 oak planks``), since the server
    only crafts from named items; and ``get <n> <item>`` for every ingredient no listed command makes (``n``:
    each count a command uses)."""
    recipes = _textcraft_recipes(text)
    made = {item: [i for _, i in inputs] for _, _, item, inputs in recipes}
    crafts: list[str] = []
    gets: dict[str, set[int]] = {}
    for cmd, n, item, inputs in recipes:
        families = {i: _textcraft_family(i, made) for _, i in inputs}
        for family, members in families.items():
            if not members:
                continue
            for member in members:
                crafts.append(_textcraft_command(n, item, [(c, member if i == family else i) for c, i in inputs]))
        if not any(families.values()):
            crafts.append(cmd)
        for count, ingredient in inputs:
            if ingredient not in made and not families[ingredient]:
                gets.setdefault(ingredient, set()).add(count)
    return ["inventory", *dict.fromkeys(crafts),
            *(f"get {n} {item}" for item, counts in gets.items() for n in sorted(counts))]


def _textcraft_plan(text: str) -> list[str] | None:
    """An expert plan from the listed commands: craft the goal with the first command that makes it,
    ingredients first (recursively; an item family such as ``planks`` as its first listed member), getting
    what no command makes. ``None`` when no command makes the goal."""
    goal = find_instruction(r"Goal: craft (.+?)\.?$", text)
    recipes = _textcraft_recipes(text)
    made = {item: [i for _, i in inputs] for _, _, item, inputs in recipes}
    by_output: dict[str, tuple[int, list[tuple[int, str]]]] = {}
    for _, n, item, inputs in recipes:
        by_output.setdefault(item, (n, inputs))
    if goal not in by_output:
        return None
    plan: list[str] = []
    have: dict[str, int] = {}

    def need(item: str, n: int, path: tuple[str, ...]) -> None:
        recipe = by_output.get(item)
        if recipe is None:
            if have.get(item, 0) < n:  # as many as the command uses: a count the valid actions list
                plan.append(f"get {n} {item}")
                have[item] = have.get(item, 0) + n
            return
        if item in path or len(plan) > 100:  # a cycle of commands (ingot <-> block) or a runaway plan
            raise ValueError(item)
        made_n, inputs = recipe
        concrete = [(c, (_textcraft_family(i, made) or [i])[0]) for c, i in inputs]
        while have.get(item, 0) < n:
            for count, ingredient in concrete:
                need(ingredient, count, (*path, item))
            for count, ingredient in concrete:
                have[ingredient] = have.get(ingredient, 0) - count
            plan.append(_textcraft_command(made_n, item, concrete))
            have[item] = have.get(item, 0) + made_n

    try:
        need(goal, 1, ())
    except ValueError:
        return None
    return plan


def _same_text(payload: JSON, last: str) -> bool:
    # TextCraft and ScienceWorld answer GET /observation with the text of their last reply.
    return payload == last


def _textcraft_reset(payload: JSON) -> Reply:
    return Reply(text=_text(payload.get("observation")))


def _textcraft_step(payload: JSON) -> Reply:
    reward = _num(payload, "reward")
    return Reply(text=_text(payload.get("observation")), reward=reward, done=bool(payload.get("done")),
                 success=reward >= 1.0)


# -- BabyAI ------------------------------------------------------------------------------------------

_BABYAI_ACTIONS = re.compile(r"\n?Available actions: \[(.*)\]\s*$", re.S)
#: A valid BabyAI action that only repeats the list the client already has.
_BABYAI_CHECK = "check available actions"


def _babyai_actions(text: str) -> list[str] | None:
    m = _BABYAI_ACTIONS.search(text)
    if not m:
        return None
    return [a for a in re.findall(r'"([^"]*)"', m.group(1)) if a != _BABYAI_CHECK]


def _babyai_reply(payload: JSON) -> Reply:
    # ``reward`` is a level, not a step reward: MiniGrid's 1 - 0.9 * steps / max_steps once the goal is
    # reached, repeated in every later reply; ``done`` only once that level is above 0.5.
    text, done = _text(payload.get("observation")), bool(payload.get("done"))
    level = min(max(_num(payload, "reward"), 0.0), 1.0)
    return Reply(text=text, level=level, done=done, success=done, admissible=_babyai_actions(text),
                 instruction=find_instruction(r"Your goal:\s*(.+)", text) or None)


def _babyai_owns(payload: JSON, last: str) -> bool:
    # GET /observation answers {"observation": "Your goal: ...\n" + the last observation, ...}.
    return isinstance(payload, dict) and _text(payload.get("observation")).endswith(last)


def _babyai_clean(text: str, instruction: str) -> str:
    text = _BABYAI_ACTIONS.sub("", text)
    return "\n".join(line for line in text.splitlines() if not line.startswith("Your goal:"))


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


#: TextCraft's goals: the items whose recipe tree is at least one level deep (``reset`` takes index % 544).
TEXTCRAFT_GOALS = 544

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
        splits={"test": Split(0, 500), "dev": Split(500, 1500), "train": Split(1500, None)},
        banner="WebShop",
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
        splits={"train": Split(0, 2420), "test": Split(2420, 2620)},
        banner="AlfWorld",
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
        # No split of its own: every fifth config number (0, 5, ...) is a test task.
        splits=interleaved(812, 5, (0,)),
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
        # The server's list of (task, variation) pairs has no split: every fifth pair is a test task.
        splits=interleaved(None, 5, (0,)),
        banner="ScienceWorld",
        owns=_same_text,
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
        episode_actions=_textcraft_actions,
        gold_plan=_textcraft_plan,
        has_close=True,
        start_hint=_AGENTGYM_HINT.format("textcraft"),
        # 544 goals sorted by recipe depth (an index past them wraps around): every fifth is a test goal.
        splits=interleaved(TEXTCRAFT_GOALS, 5, (0,)),
        banner="TextCraft",
        owns=_same_text,
    ),
    "babyai": Dialect(
        name="babyai",
        description="AgentGym agentenv-babyai (BabyAI / MiniGrid levels in text)",
        id_key="id",
        create_id=lambda p: _key(p, "id"),
        reset_body=lambda i, params: {"data_idx": i},
        parse_reset=_babyai_reply,
        parse_step=_babyai_reply,
        has_close=True,
        state_cleaner=_babyai_clean,
        start_hint=_AGENTGYM_HINT.format("babyai"),
        # Index i is level i % 40 + 1 with seed i // 40: seeds 0, 5, 10, ... (all 40 levels) are test tasks.
        splits=interleaved(None, 200, tuple(range(40))),
        banner="BabyAI",
        owns=_babyai_owns,
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
