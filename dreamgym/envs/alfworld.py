"""ALFWorld games (``alfworld:<path>``): one ``.tw-pddl`` game file, or a folder searched for them.

Games run in TextWorld's PDDL engine with ALFWorld's ``AlfredDemangler`` (object names such as
``potato 1`` instead of PDDL ids), as ALFWorld itself loads them. A reset takes ~2-4 s and a step
~0.2 s, so one engine serves every episode of an adapter and a game is only re-loaded when the task
changes. A folder laid out like ALFWorld's data (``train/``, ``valid_seen/``, ``valid_unseen/``)
maps the splits train/dev/test onto those subfolders; any other folder gives the same games for
every split.

Gold actions: ALFWorld's own experts need per-game planning (TextWorld's planner took 68 s and then
crashed on the debug game), so the adapter offers a ``winning_commands.txt`` next to the game file
when there is one (one command a line, as the ALFWorld debug game the tests use ships it) and ``None``
otherwise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dreamgym.envs.abstract_state import normalise_state
from dreamgym.envs.base import Environment
from dreamgym.errors import EnvironmentSpecError, EnvironmentUnavailableError
from dreamgym.types import Observation, StepResult, Task

if TYPE_CHECKING:
    from dreamgym.config import EnvConfig

GAME_SUFFIX = ".tw-pddl"
GOLD_FILE = "winning_commands.txt"
SPLIT_FOLDERS = {"train": "train", "dev": "valid_seen", "test": "valid_unseen"}
_GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")
# The goal sentence lives in the game's grammar as the "task" rule: "rhs": "Your task is to: ...".
_TASK_RULE = re.compile(r'"task"\s*:\s*\[\s*\{\s*"rhs"\s*:\s*"((?:[^"\\]|\\.)*)"')
_TASK_LINE = re.compile(r"^Your task is to:.*$", re.MULTILINE)
# The intro banner and the goal line are dropped from the state (the goal is the instruction).
_BOILERPLATE = (r"^-= Welcome to TextWorld, ALFRED! =-$", r"^Your task is to:")


def read_game_file(path: Path) -> dict[str, Any]:
    """Parse a ``.tw-pddl`` file, or raise one clear error naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EnvironmentUnavailableError(
            f"ALFWorld game file {path} cannot be read as a TextWorld-PDDL game ({type(e).__name__}: {e}); "
            f"a .tw-pddl file is JSON with the keys {', '.join(_GAME_KEYS)} (ALFWorld's data has one per "
            "game folder; re-download or regenerate it)"
        ) from None
    missing = [k for k in _GAME_KEYS if not isinstance(data, dict) or not isinstance(data.get(k), str)]
    if missing:
        raise EnvironmentUnavailableError(
            f"ALFWorld game file {path} is not a TextWorld-PDDL game: missing {', '.join(missing)} "
            f"(expected a JSON object with {', '.join(_GAME_KEYS)})"
        )
    return data


def game_instruction(game: dict[str, Any]) -> str:
    """The goal sentence ("Your task is to: ...") from the game's grammar, without running it."""
    m = _TASK_RULE.search(game["grammar"])
    return json.loads(f'"{m.group(1)}"').strip() if m else ""


class AlfWorldEnv(Environment):
    """An ALFWorld game. Reward 1.0 when the game is won; success = won."""

    family: ClassVar[str] = "alfworld"
    state_rules: ClassVar[str] = (
        "The state is the game's text answer to the last action, whitespace-normalised: after "
        "'go to X' where the agent arrived and what it sees on or in X (or that X is closed); "
        "after take/put/open/heat/cool/clean/use the short confirmation ('You pick up the potato 1 "
        "from the countertop 2.'); 'Nothing happens.' for an action the game does not accept. The "
        "first state lists the receptacles in the room. Objects are named with a number ('apple 2'). "
        "The inventory and places not visited are not part of the state."
    )

    def __init__(
        self,
        path: str,
        split: str = "train",
        max_steps: int = 50,
        state_max_chars: int = 2_000,
        admissible_actions: bool = True,
    ) -> None:
        root = Path(path).expanduser()
        if not root.exists():
            raise EnvironmentSpecError(
                f"ALFWorld game path {root} does not exist; use alfworld:/path/to/game{GAME_SUFFIX} or a folder "
                f"containing {GAME_SUFFIX} files"
            )
        super().__init__(f"alfworld:{path}", max_steps=max_steps, state_max_chars=state_max_chars)
        self.root = root.resolve()
        self.split = split
        self.with_admissible = admissible_actions
        self._env: Any = None
        self._loaded: str | None = None
        self._task: Task | None = None
        self._gamefile: Path | None = None
        self._valid: list[str] | None = None
        self._steps = 0
        self._done = True

    @classmethod
    def from_config(cls, name: str, cfg: EnvConfig) -> AlfWorldEnv:
        if cfg.params:
            raise EnvironmentSpecError(
                f"alfworld takes no env.params (got {', '.join(sorted(cfg.params))}); the game file is the task"
            )
        return cls(name, split=cfg.split, max_steps=cfg.max_steps, state_max_chars=cfg.state_max_chars,
                   admissible_actions=cfg.admissible_actions)

    @classmethod
    def known_names(cls) -> list[str]:
        """ALFWorld names are paths to game files or folders: there is no fixed list."""
        return []

    # -- tasks ---------------------------------------------------------------------------------
    def game_files(self, split: str = "train") -> list[Path]:
        """The game files of ``split``, sorted (see the module docstring for the split folders)."""
        if self.root.is_file():
            return [self.root]
        folder = self.root
        sub = SPLIT_FOLDERS.get(split)
        if sub is None:
            raise EnvironmentSpecError(f"unknown split {split!r}; valid splits: {', '.join(SPLIT_FOLDERS)}")
        if any((self.root / s).is_dir() for s in SPLIT_FOLDERS.values()):
            folder = self.root / sub
        files = sorted(folder.rglob(f"*{GAME_SUFFIX}")) if folder.is_dir() else []
        if not files:
            raise EnvironmentSpecError(f"no {GAME_SUFFIX} game files under {folder} (split {split!r})")
        return files

    def tasks(self, count: int, first: int = 0, split: str = "train") -> list[Task]:
        files = self.game_files(split)
        if first < 0 or count < 0 or first + count > len(files):
            raise EnvironmentSpecError(
                f"{self.spec} has {len(files)} game(s) for split {split!r}; asked for {count} from index {first}"
            )
        out = []
        for f in files[first:first + count]:
            rel = f.relative_to(self.root).as_posix() if f != self.root else ""
            out.append(Task(
                task_id=f"{self.spec}/{rel}" if rel else self.spec,
                env=self.spec,
                instruction=game_instruction(read_game_file(f)),
                params={"gamefile": str(f), "split": split},
            ))
        return out

    # -- episode -------------------------------------------------------------------------------
    def _engine_for(self, gamefile: Path) -> Any:
        """Load ``gamefile`` into the engine (once per game), with clear errors."""
        if self._env is not None and self._loaded == str(gamefile):
            return self._env
        read_game_file(gamefile)  # a clear error for unreadable files before the engine sees them
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

        infos = textworld.EnvInfos(won=True, admissible_commands=self.with_admissible)
        try:
            if self._env is None:
                self._env = textworld.start(str(gamefile), request_infos=infos, wrappers=[AlfredDemangler])
            else:
                self._env.load(str(gamefile))
            self._loaded = str(gamefile)
        except Exception as e:  # PDDL/grammar parse errors surface as many exception types
            self._loaded = None
            raise EnvironmentUnavailableError(
                f"ALFWorld game file {gamefile} could not be loaded by TextWorld ({type(e).__name__}: {e})"
            ) from None
        return self._env

    def reset(self, task: Task) -> Observation:
        gamefile = Path(str(task.params.get("gamefile", ""))) if task.params.get("gamefile") else None
        if gamefile is None:
            raise EnvironmentSpecError(f"task {task.task_id!r} has no 'gamefile' parameter; alfworld tasks need one")
        engine = self._engine_for(gamefile)
        try:
            gs = engine.reset()
        except Exception as e:
            self._loaded = None
            raise EnvironmentUnavailableError(
                f"ALFWorld game file {gamefile} failed to start ({type(e).__name__}: {e})"
            ) from None
        self._task, self._gamefile, self._steps, self._done = task, gamefile, 0, False
        self._valid = self._admissible(gs)
        feedback = str(gs.feedback)
        m = _TASK_LINE.search(feedback)
        instruction = task.instruction or (m.group(0).strip() if m else "")
        return self._observation(feedback, instruction)

    def step(self, action: str) -> StepResult:
        if self._done or self._task is None:
            raise RuntimeError("step() called with no running episode: call reset(task) first")
        admissible = None if self._valid is None else action in self._valid
        gs, _score, engine_done = self._env.step(action)
        self._steps += 1
        won = bool(gs["won"])
        truncated = not (engine_done or won) and self._steps >= self.max_steps
        self._done = bool(engine_done) or won or truncated
        self._valid = self._admissible(gs)
        info: dict[str, Any] = {"won": won, "truncated": truncated}
        if admissible is not None:
            info["admissible"] = admissible
        return StepResult(observation=self._observation(str(gs.feedback), self._task.instruction),
                          reward=1.0 if won else 0.0, done=self._done, success=won, info=info)

    def _admissible(self, gs: Any) -> list[str] | None:
        cmds = gs["admissible_commands"] if self.with_admissible else None
        return sorted(str(c) for c in cmds) if cmds is not None else None

    def _observation(self, raw: str, instruction: str) -> Observation:
        return Observation(text=raw, state=self.abstract_state(raw),
                           admissible_actions=list(self._valid) if self._valid is not None else None,
                           instruction=instruction)

    def abstract_state(self, raw: str) -> str:
        return normalise_state(raw, max_chars=self.state_max_chars, boilerplate=_BOILERPLATE)

    def admissible_actions(self) -> list[str] | None:
        return list(self._valid) if self._valid is not None else None

    def gold_actions(self) -> list[str] | None:
        if self._gamefile is None:
            return None
        gold = self._gamefile.parent / GOLD_FILE
        if not gold.is_file():
            return None
        return [line.strip() for line in gold.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
            self._loaded = None
