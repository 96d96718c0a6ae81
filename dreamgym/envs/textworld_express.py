"""TextWorldExpress games (``twx:<game>``): coin, twc, cookingworld, mapreader, arithmetic, ...

The engine is a Java program driven through py4j. Offline collection wants >= 1,000 transitions/s on
two cores and the engine itself runs several thousand steps/s, so the hot path (``step``) talks to
the engine's py4j server directly: one ``stepJSON`` round trip per step and nothing else (the
packaged Python wrapper adds a task-description round trip and a run history per step). The gold
path is generated only when ``gold_actions()`` asks for it, because generating it slows ``reset``.

The engine's gold agents find the goal by a random walk seeded afresh on every request (an unseeded JVM
``Random``): one 5-room coin game measured 6 to 16 steps over six requests, and a checker that compared
one walk with the step budget judged the same task feasible or not by chance. ``gold_actions`` therefore
returns the shortest of ``GOLD_SAMPLES`` walks, each with its immediate back-and-forth moves removed.

Tasks are reproducible by ``(game, game parameters, split, seed)``. Each split has its own seed
range and its own object set (the engine's ``gameFold``): train seeds start at 0, dev at 10,000,
test at 20,000 (the engine publishes the first 1,000 of each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from dreamgym.envs.base import Environment
from dreamgym.envs.java import require_java, start_engine, stop_engine
from dreamgym.errors import EnvironmentSpecError
from dreamgym.types import Observation, StepResult, Task

try:  # the engine depends on orjson; fall back to json so a broken install still works, slower
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    from json import loads as _loads

if TYPE_CHECKING:
    from dreamgym.config import EnvConfig

#: Game parameters each game accepts (textworld-express 1.1.0, from the engine's own error messages).
GAME_PARAMS: dict[str, tuple[str, ...]] = {
    "coin": ("numLocations", "numDistractorItems", "includeDoors", "limitInventorySize"),
    "twc": ("numLocations", "numItemsToPutAway", "includeDoors", "limitInventorySize"),
    "cookingworld": ("numLocations", "numDistractorItems", "numIngredients", "includeDoors", "limitInventorySize"),
    "mapreader": ("numLocations", "maxDistractorItemsPerLocation", "includeDoors", "limitInventorySize",
                  "maxDistanceApart"),
    "arithmetic": (),
    "sorting": (),
    "simonsays": ("gameLength", "numDistractors", "memorization", "verbose"),
    "peckingorder": (),
}

#: Small default worlds (a random agent sometimes wins them; baselines in docs/stack-notes.md). The user's
#: ``env.params`` are merged over these; games not listed use the engine's defaults.
DEFAULT_PARAMS: dict[str, dict[str, int]] = {
    "coin": {"numLocations": 3, "includeDoors": 0},
    "twc": {"numLocations": 1, "numItemsToPutAway": 1, "includeDoors": 0},
    "cookingworld": {"numLocations": 1, "numIngredients": 1, "numDistractorItems": 0, "includeDoors": 0,
                     "limitInventorySize": 0},
}

#: First seed of each split; a split holds ``SPLIT_SIZE`` seeds so the ranges never overlap.
SPLIT_SEED_BASE = {"train": 0, "dev": 10_000, "test": 20_000}
SPLIT_SIZE = 10_000

#: Gold walks drawn per episode; the shortest is the plan (a walk costs ~6 ms of engine time).
GOLD_SAMPLES = 5

#: The move that undoes each move: ``move east`` straight after ``move west`` returns to the same room
#: with nothing changed, in every game of the engine.
_OPPOSITE_MOVE = {"move north": "move south", "move south": "move north",
                  "move east": "move west", "move west": "move east"}

#: Task parameters that are not game parameters.
_TASK_KEYS = ("seed", "split")


def _int_param(game: str, key: str, value: Any) -> int:
    """Game parameters are integers (flags are 0/1); the engine silently ignores a non-number."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise EnvironmentSpecError(
        f"twx:{game} parameter {key}={value!r} must be an integer (flags such as includeDoors are 0 or 1)"
    )


def game_params(game: str, params: dict[str, Any] | None, base: dict[str, int] | None = None) -> dict[str, int]:
    """``base`` (default: the game's defaults) with ``params`` merged over it, checked against the
    parameters the game accepts. Task keys (seed, split) in ``params`` are skipped."""
    valid = GAME_PARAMS[game]
    merged: dict[str, int] = dict(DEFAULT_PARAMS.get(game, {}) if base is None else base)
    for key, value in (params or {}).items():
        if key in _TASK_KEYS:
            continue
        if key not in valid:
            accepted = ", ".join(valid) if valid else "none"
            raise EnvironmentSpecError(
                f"twx:{game} has no game parameter {key!r}; parameters it accepts: {accepted}"
            )
        merged[key] = _int_param(game, key, value)
    return merged


def params_string(params: dict[str, int]) -> str:
    """``{'numLocations': 3, 'includeDoors': 0}`` -> ``'numLocations=3,includeDoors=0'`` (the engine's form)."""
    return ",".join(f"{k}={v}" for k, v in params.items())


def without_backtracking(plan: list[str]) -> list[str]:
    """``plan`` without each move that is straight away undone (``move west`` then ``move east``), repeatedly,
    so a walk into a dead end and back leaves no trace."""
    out: list[str] = []
    for action in plan:
        if out and _OPPOSITE_MOVE.get(out[-1]) == action:
            out.pop()
        else:
            out.append(action)
    return out


class _Engine:
    """One JVM running the TextWorldExpress server (started on first use)."""

    def __init__(self) -> None:
        from textworld_express import TextWorldExpressEnv as _Twx

        # envStepLimit is unused: steps go to the server directly and the adapter counts them.
        self.env = start_engine("TextWorldExpress", _Twx, envStepLimit=10**9)
        self.server = self.env.server
        self.loaded: tuple[str, str] | None = None

    def load(self, game: str, params: str) -> None:
        if self.loaded == (game, params):
            return
        msg = self.server.load(game, params)
        if msg:  # the engine checks ranges, e.g. "Number of locations must be less than 3"
            self.loaded = None
            raise EnvironmentSpecError(f"twx:{game} refused parameters {params!r}: {msg.strip()}")
        self.loaded = (game, params)

    def close(self) -> None:
        stop_engine(self.env)


class TextWorldExpressEnv(Environment):
    """A TextWorldExpress game. Reward = change of the normalised score (sums to 1 on a win)."""

    family: ClassVar[str] = "twx"
    state_rules: ClassVar[str] = (
        "The state is the game's text answer to the last action, whitespace-normalised: after a move "
        "or 'look around' the description of the current room (the objects in it, whether containers "
        "and doors are open or closed, the exits by compass direction); after other actions the "
        "game's short reply (e.g. 'You take the coin.', the inventory list, a recipe, or "
        "\"Unknown action: I'm not sure what you mean.\" for an action the game does not accept). "
        "Rooms not currently visible are never part of the state, the inventory only right after "
        "'inventory'."
    )

    def __init__(
        self,
        game: str,
        params: dict[str, Any] | None = None,
        split: str = "train",
        max_steps: int = 20,
        state_max_chars: int = 2_000,
        admissible_actions: bool = True,
    ) -> None:
        if game not in GAME_PARAMS:
            raise EnvironmentSpecError(
                f"unknown TextWorldExpress game {game!r}; valid games: {', '.join(self.known_names())}"
            )
        super().__init__(f"twx:{game}", max_steps=max_steps, state_max_chars=state_max_chars)
        self.game = game
        self.params = game_params(game, params)
        self.split = _check_split(split)
        self.with_admissible = admissible_actions
        require_java("TextWorldExpress")  # fail at construction; the JVM itself starts on first use
        self._engine: _Engine | None = None
        # Episode state.
        self._task: Task | None = None
        self._seed = 0
        self._fold = "train"
        self._actions: list[str] = []
        self._valid: list[str] = []
        self._score = 0.0
        self._done = True
        self._gold: list[str] | None = None

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_config(cls, name: str, cfg: EnvConfig) -> TextWorldExpressEnv:
        return cls(name, params=dict(cfg.params), split=cfg.split, max_steps=cfg.max_steps,
                   state_max_chars=cfg.state_max_chars, admissible_actions=cfg.admissible_actions)

    @classmethod
    def known_names(cls) -> list[str]:
        return list(GAME_PARAMS)

    @property
    def engine(self) -> _Engine:
        if self._engine is None:
            self._engine = _Engine()
        return self._engine

    # -- tasks ---------------------------------------------------------------------------------
    def tasks(self, count: int, first: int = 0, split: str = "train") -> list[Task]:
        """Seeds ``first .. first+count-1`` of ``split``. Ends any running episode (it resets games
        to read each seed's task description)."""
        split = _check_split(split)
        if first < 0 or count < 0 or first + count > SPLIT_SIZE:
            raise EnvironmentSpecError(
                f"twx task indices {first}..{first + count - 1} are outside 0..{SPLIT_SIZE - 1} of split {split!r}"
            )
        engine = self.engine
        pstr = params_string(self.params)
        engine.load(self.game, pstr)
        self._done = True
        out = []
        for i in range(first, first + count):
            seed = SPLIT_SEED_BASE[split] + i
            engine.server.generateNewGameJSON(seed, split, False)
            out.append(Task(
                task_id=f"{self.spec}/{split}/seed={seed}/{pstr}",
                env=self.spec,
                instruction=str(engine.server.getTaskDescription()).strip(),
                params={"seed": seed, "split": split, **self.params},
            ))
        return out

    # -- episode -------------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        if task.env != self.spec:
            raise EnvironmentSpecError(f"task {task.task_id!r} is for {task.env!r}; this adapter runs {self.spec!r}")
        if "seed" not in task.params:
            raise EnvironmentSpecError(f"task {task.task_id!r} has no 'seed' parameter; twx tasks need one")
        seed = _int_param(self.game, "seed", task.params["seed"])
        fold = _check_split(str(task.params.get("split", self.split)))
        # A task's own game parameters (e.g. a curriculum's bigger map) override the adapter's.
        params = game_params(self.game, task.params, base=self.params)
        engine = self.engine
        engine.load(self.game, params_string(params))
        resp = _loads(engine.server.generateNewGameJSON(seed, fold, False))
        self._task, self._seed, self._fold = task, seed, fold
        self._actions, self._score, self._done, self._gold = [], float(resp["score"]), False, None
        self._valid = sorted(resp["validActions"])
        instruction = task.instruction or str(engine.server.getTaskDescription()).strip()
        return self._observation(resp["observation"], instruction)

    def step(self, action: str) -> StepResult:
        if self._done or self._task is None:
            raise RuntimeError("step() called with no running episode: call reset(task) first")
        admissible = action in self._valid
        resp = _loads(self.engine.server.stepJSON(action))
        self._actions.append(action)
        score = float(resp["score"])
        reward, self._score = score - self._score, score
        success = bool(resp["tasksuccess"])
        engine_done = success or bool(resp["taskfailure"]) or score >= 1.0
        truncated = not engine_done and len(self._actions) >= self.max_steps
        self._done = engine_done or truncated
        self._valid = sorted(resp["validActions"])
        return StepResult(
            observation=self._observation(resp["observation"], self._task.instruction),
            reward=reward,
            done=self._done,
            success=success,
            info={"score": score, "raw_score": resp["scoreRaw"], "admissible": admissible,
                  "truncated": truncated, "task_failure": bool(resp["taskfailure"])},
        )

    def _observation(self, raw: str, instruction: str) -> Observation:
        return Observation(
            text=raw,
            state=self.abstract_state(raw),
            admissible_actions=list(self._valid) if self.with_admissible else None,
            instruction=instruction,
        )

    def admissible_actions(self) -> list[str] | None:
        return list(self._valid)

    def gold_actions(self) -> list[str] | None:
        """The expert plan from the episode's start: the shortest of ``GOLD_SAMPLES`` gold walks without
        back-and-forth moves (ties broken by text, so equal walks give one answer). Generated on first
        request: the game is regenerated with the gold path and the actions taken so far are replayed
        (same seed, same game), so asking mid-episode keeps the current state."""
        if self._task is None:
            return None
        if self._gold is None:
            server = self.engine.server
            walks = []
            for _ in range(GOLD_SAMPLES):
                server.generateNewGameJSON(self._seed, self._fold, True)
                walks.append(without_backtracking([str(a) for a in server.getGoldActionSequence()]))
            self._gold = min(walks, key=lambda w: (len(w), w))
            for action in self._actions:
                server.stepJSON(action)
        return list(self._gold)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def _check_split(split: str) -> str:
    if split not in SPLIT_SEED_BASE:
        raise EnvironmentSpecError(f"unknown split {split!r}; valid splits: {', '.join(SPLIT_SEED_BASE)}")
    return split
