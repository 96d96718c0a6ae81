"""ScienceWorld tasks (``sciworld:<task name>``), e.g. ``sciworld:find-non-living-thing``.

A task name has hundreds of variations split by the engine into train/dev/test lists; a DreamGym
task is one variation. The engine is a Scala program behind py4j and is slow to load a variation
(0.1-1 s) and to enumerate valid actions (~0.3 s a step, hundreds of templated combinations), so:

- one JVM serves every episode of an adapter instance;
- valid actions are only enumerated when ``env.admissible_actions`` is true;
- the gold path (seconds to generate for some tasks) is only generated when ``gold_actions()`` is
  called, then cached per variation;
- steps talk to the py4j server directly (the packaged wrapper fetches look, inventory, task
  description and valid actions on every step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from dreamgym.envs.abstract_state import normalise_state
from dreamgym.envs.base import Environment
from dreamgym.envs.java import require_java, start_engine, stop_engine
from dreamgym.errors import EnvironmentSpecError
from dreamgym.types import Observation, StepResult, Task

if TYPE_CHECKING:
    from dreamgym.config import EnvConfig

#: ``easy`` turns on all simplifications below (electrical tasks keep their connect actions).
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")
DEFAULT_SIMPLIFICATIONS = "easy"
_PARAM_KEYS = ("simplifications",)
_TASK_KEYS = ("variation", "split")
SPLITS = ("train", "dev", "test")


def task_names() -> list[str]:
    """The 30 ScienceWorld task names, read from the package's task table (no JVM)."""
    from scienceworld.constants import ID2TASK

    return list(ID2TASK.values())


def canonical_task_name(name: str) -> str:
    """A task name, a task id (``4-2``) or a paper name -> the engine's task name, else an error."""
    from scienceworld.utils import infer_task

    canonical = infer_task(name)
    if canonical not in task_names():
        raise EnvironmentSpecError(
            f"unknown ScienceWorld task {name!r}; valid task names: {', '.join(task_names())}"
        )
    return canonical


def check_simplifications(task: str, value: Any) -> str:
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    for p in parts:
        if p not in SIMPLIFICATIONS:
            raise EnvironmentSpecError(
                f"sciworld:{task} simplification {p!r} is unknown; valid ones (comma-separated): "
                f"{', '.join(SIMPLIFICATIONS)}"
            )
    if "noElectricalAction" in parts and ("power-component" in task or "conductivity" in task):
        raise EnvironmentSpecError(
            f"sciworld:{task} needs electrical actions: drop 'noElectricalAction' from its simplifications"
        )
    return ",".join(parts)


class ScienceWorldEnv(Environment):
    """A ScienceWorld task. Reward = score change / 100; success = completed with score 100."""

    family: ClassVar[str] = "sciworld"
    state_rules: ClassVar[str] = (
        "The state is ScienceWorld's text answer to the last action, whitespace-normalised: after "
        "'look around' the current room's name, the objects and substances in it with their "
        "containers' contents and open/closed state, and the doors to other rooms; after other "
        "actions the simulator's short reply (e.g. 'You move to the kitchen.', 'The door is already "
        "open.', a thermometer reading, or 'No known action matches that input.'). Objects in other "
        "rooms and the inventory are not part of the state unless the action shows them."
    )

    def __init__(
        self,
        task_name: str,
        simplifications: str = DEFAULT_SIMPLIFICATIONS,
        split: str = "train",
        max_steps: int = 20,
        state_max_chars: int = 2_000,
        admissible_actions: bool = True,
    ) -> None:
        name = canonical_task_name(task_name)
        super().__init__(f"sciworld:{name}", max_steps=max_steps, state_max_chars=state_max_chars)
        self.task_name = name
        self.simplifications = check_simplifications(name, simplifications)
        self.split = _check_split(split)
        self.with_admissible = admissible_actions
        require_java("ScienceWorld")  # fail at construction; the JVM itself starts on first use
        self._env: Any = None
        self._loaded: tuple[int, str, bool] | None = None  # (variation, simplifications, gold path)
        self._gold_cache: dict[tuple[int, str], list[str]] = {}
        # Episode state.
        self._task: Task | None = None
        self._variation = 0
        self._simpl = self.simplifications
        self._actions: list[str] = []
        self._valid: list[str] | None = None
        self._score = 0
        self._done = True

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_config(cls, name: str, cfg: EnvConfig) -> ScienceWorldEnv:
        params = dict(cfg.params)
        unknown = sorted(set(params) - set(_PARAM_KEYS))
        if unknown:
            raise EnvironmentSpecError(
                f"sciworld:{name} has no parameter(s) {', '.join(unknown)}; parameters it accepts: "
                f"{', '.join(_PARAM_KEYS)} (e.g. simplifications: easy)"
            )
        return cls(name, simplifications=str(params.get("simplifications", DEFAULT_SIMPLIFICATIONS)),
                   split=cfg.split, max_steps=cfg.max_steps, state_max_chars=cfg.state_max_chars,
                   admissible_actions=cfg.admissible_actions)

    @classmethod
    def known_names(cls) -> list[str]:
        return task_names()

    @property
    def server(self) -> Any:
        if self._env is None:
            from scienceworld import ScienceWorldEnv as _Sw

            self._env = start_engine("ScienceWorld", _Sw, taskName="", envStepLimit=10**9)
        return self._env.server

    def _load(self, variation: int, simplifications: str, gold: bool = False) -> None:
        """Start ``variation`` from its beginning: ``reset`` when it is already loaded (with a gold
        path if one is asked for), else ``load``."""
        loaded = self._loaded
        if loaded is not None and loaded[:2] == (variation, simplifications) and (loaded[2] or not gold):
            self.server.reset()
            return
        self.server.load(self.task_name, variation, simplifications, gold)
        self._loaded = (variation, simplifications, gold)

    def variations(self, split: str) -> list[int]:
        """The engine's variation indices of ``split`` for this task."""
        server = self.server
        if self._loaded is None:
            self._load(0, self.simplifications)
        getter = {"train": server.getVariationsTrain, "dev": server.getVariationsDev,
                  "test": server.getVariationsTest}[_check_split(split)]
        return [int(v) for v in getter()]

    # -- tasks ---------------------------------------------------------------------------------
    def tasks(self, count: int, first: int = 0, split: str = "train") -> list[Task]:
        """Variations ``first .. first+count-1`` of ``split``'s list. Loads each one to read its
        task description (0.1-1 s each) and ends any running episode."""
        variations = self.variations(split)
        if first < 0 or count < 0 or first + count > len(variations):
            raise EnvironmentSpecError(
                f"sciworld:{self.task_name} split {split!r} has {len(variations)} variations; "
                f"asked for {count} from index {first}"
            )
        self._done = True
        out = []
        for v in variations[first:first + count]:
            self._load(v, self.simplifications)
            out.append(Task(
                task_id=f"{self.spec}/{split}/var={v}/{self.simplifications or 'none'}",
                env=self.spec,
                instruction=_clean_description(self.server.freeActionTaskDesc()),
                params={"variation": v, "split": split, "simplifications": self.simplifications},
            ))
        return out

    # -- episode -------------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        if task.env != self.spec:
            raise EnvironmentSpecError(f"task {task.task_id!r} is for {task.env!r}; this adapter runs {self.spec!r}")
        if "variation" not in task.params:
            raise EnvironmentSpecError(f"task {task.task_id!r} has no 'variation' parameter; sciworld tasks need one")
        unknown = sorted(set(task.params) - set(_PARAM_KEYS) - set(_TASK_KEYS))
        if unknown:
            raise EnvironmentSpecError(
                f"task {task.task_id!r} has unknown parameter(s) {', '.join(unknown)}; sciworld task parameters: "
                f"{', '.join(_TASK_KEYS + _PARAM_KEYS)}"
            )
        variation = int(task.params["variation"])
        simpl = check_simplifications(self.task_name, task.params.get("simplifications", self.simplifications))
        self._load(variation, simpl)
        server = self.server
        self._task, self._variation, self._simpl = task, variation, simpl
        self._actions, self._score, self._done = [], 0, False
        self._valid = self._valid_actions() if self.with_admissible else None
        instruction = task.instruction or _clean_description(server.freeActionTaskDesc())
        # The first observation is the free 'look' (no move is spent on it).
        return self._observation(str(server.freeActionLook()), instruction)

    def step(self, action: str) -> StepResult:
        if self._done or self._task is None:
            raise RuntimeError("step() called with no running episode: call reset(task) first")
        server = self.server
        admissible = None if self._valid is None else action in self._valid
        raw = str(server.step(action))
        self._actions.append(action)
        # The engine's score is 0..1, or negative once the task is failed; rewards use 0..100 ints
        # like the packaged wrapper, with failure counted as 0 so an episode's rewards sum to its
        # final score / 100.
        score = round(100 * float(server.getScore()))
        completed = bool(server.getCompleted())
        failed = score < 0
        reward = (max(score, 0) - self._score) / 100.0
        self._score = max(score, 0)
        success = completed and score >= 100
        engine_done = completed or failed
        truncated = not engine_done and len(self._actions) >= self.max_steps
        self._done = engine_done or truncated
        self._valid = self._valid_actions() if self.with_admissible and not self._done else None
        info: dict[str, Any] = {"score": score, "truncated": truncated, "task_failure": failed}
        if admissible is not None:
            info["admissible"] = admissible
        return StepResult(observation=self._observation(raw, self._task.instruction), reward=reward,
                          done=self._done, success=success, info=info)

    def abstract_state(self, raw: str) -> str:
        return normalise_state(canonical_listing(raw), max_chars=self.state_max_chars)

    def _valid_actions(self) -> list[str]:
        return sorted(str(a) for a in self.server.getValidActionObjectCombinations())

    def _observation(self, raw: str, instruction: str) -> Observation:
        return Observation(text=raw, state=self.abstract_state(raw),
                           admissible_actions=list(self._valid) if self._valid is not None else None,
                           instruction=instruction)

    def admissible_actions(self) -> list[str] | None:
        if self._task is None:
            return None
        if self._valid is None and not self._done:
            self._valid = self._valid_actions()
        return list(self._valid) if self._valid is not None else None

    def gold_actions(self) -> list[str] | None:
        """The engine's gold plan for the current variation. Generated on first request (reloading
        the variation with the gold path and replaying the actions taken so far), then cached."""
        if self._task is None:
            return None
        key = (self._variation, self._simpl)
        if key not in self._gold_cache:
            self._load(self._variation, self._simpl, gold=True)
            server = self.server
            self._gold_cache[key] = [str(a) for a in server.getGoldActionSequence()]
            for action in self._actions:
                server.step(action)
        return list(self._gold_cache[key])

    def close(self) -> None:
        if self._env is not None:
            stop_engine(self._env)
            self._env = None
            self._loaded = None


def canonical_listing(raw: str) -> str:
    """Sort each block of tab-indented listing lines ("\ta wood cup (containing red paint)").

    The engine lists a room's objects sorted by name but breaks ties (three "wood cup"s) in a
    different order on every load, so the same state would otherwise have several texts.
    """
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        # A deeper-indented line belongs to the line above it: leave such blocks as they are.
        out.extend(block if any(b.startswith("\t\t") for b in block) else sorted(block))
        block.clear()

    for line in raw.split("\n"):
        if line.startswith("\t"):
            block.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


def _clean_description(desc: Any) -> str:
    text = str(desc).strip()
    prefix = "Task Description:"
    return text[len(prefix):].strip() if text.startswith(prefix) else text


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise EnvironmentSpecError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    return split
