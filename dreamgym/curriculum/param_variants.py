"""Parameter variants: new tasks that are real parameter changes of a parent, checked in the real
environment.

Parameterised environments reproduce a task from its parameters, so a variant can be a real task
rather than a text: TextWorldExpress games take game parameters (``numLocations``,
``numDistractorItems``, ``includeDoors``, ...) and a seed; ScienceWorld tasks take a variation and
simplifications. ``propose_param_variants`` makes candidates, each one change in the harder direction
(one more location, more distractors, doors on, fewer simplifications) or a different world of the
same size (a new seed / variation). ``EnvChecker`` resets each candidate in the real environment: the
engine must accept the parameters (its refusal message becomes the rejection detail), and where the
environment has an expert plan, the plan must exist and fit the step budget (feasible). Of the checked
candidates, the first harder one in proposal order is kept (harder but feasible), else the first new
world. The expert plan's length does not rank them: TextWorldExpress draws a different plan for the
same game on every request (2 to 27 steps for one 5-room coin game), so ranking by it would make the
curriculum irreproducible and resume inexact. Every generated task of this kind carries ``kind='param'``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dreamgym.errors import DreamGymError
from dreamgym.types import Task

if TYPE_CHECKING:
    from dreamgym.envs.base import Environment

#: Families whose tasks have parameter variants.
PARAM_FAMILIES = ("twx", "sciworld")

#: TextWorldExpress game parameters and the step that makes a game harder.
TWX_HARDER: tuple[tuple[str, int], ...] = (
    ("numLocations", 1),
    ("numDistractorItems", 2),
    ("numItemsToPutAway", 1),
    ("numIngredients", 1),
    ("maxDistractorItemsPerLocation", 1),
    ("maxDistanceApart", 1),
)

#: ScienceWorld simplifications whose removal makes a task harder ("easy" turns them all on).
SCIWORLD_DROPPABLE = ("teleportAction", "openDoors", "openContainers", "selfWateringFlowerPots")


@dataclass
class ParamCandidate:
    """A proposed parameter variant (its instruction is filled in by the real environment)."""

    task: Task
    change: str
    """What changed, e.g. ``numLocations 3->4`` or ``seed 7->4112``."""
    harder: bool = True
    """A step in the harder direction (``False``: a different world of the same size)."""


def has_param_variants(env: str) -> bool:
    return env.partition(":")[0] in PARAM_FAMILIES


def propose_param_variants(
    parent: Task,
    m: int,
    rng: random.Random,
    variations: Callable[[str], list[int]] | None = None,
) -> list[ParamCandidate]:
    """Up to ``m`` distinct candidates for ``parent`` (none for other families). ``variations(split)``
    lists a ScienceWorld task's variations (from the real environment)."""
    family, _, name = parent.env.partition(":")
    if family == "twx":
        out = _twx_candidates(parent, name, m, rng)
    elif family == "sciworld":
        out = _sciworld_candidates(parent, m, rng, variations)
    else:
        out = []
    return out[:m]


def _twx_candidates(parent: Task, game: str, m: int, rng: random.Random) -> list[ParamCandidate]:
    from dreamgym.envs.textworld_express import GAME_PARAMS, SPLIT_SEED_BASE, SPLIT_SIZE, params_string

    valid = GAME_PARAMS.get(game, ())
    seed = int(parent.params.get("seed", 0))
    split = str(parent.params.get("split", "train"))
    base = {k: int(v) for k, v in parent.params.items() if k in valid}

    def make(params: dict[str, int], new_seed: int, change: str) -> ParamCandidate:
        tid = f"{parent.env}/{split}/seed={new_seed}/{params_string(params)}"
        task = Task(task_id=tid, env=parent.env, instruction="", origin="generated", kind="param",
                    params={"seed": new_seed, "split": split, **params})
        return ParamCandidate(task, change, harder=new_seed == seed)

    moves: list[ParamCandidate] = []
    for key, step in TWX_HARDER:
        if key in base:
            moves.append(make({**base, key: base[key] + step}, seed, f"{key} {base[key]}->{base[key] + step}"))
    if "includeDoors" in valid and base.get("includeDoors", 0) == 0:
        moves.append(make({**base, "includeDoors": 1}, seed, "includeDoors 0->1"))
    rng.shuffle(moves)
    moves = moves[: max(0, m - 1)]  # keep room for at least one new world
    first = SPLIT_SEED_BASE.get(split, 0)
    while len(moves) < m:
        new_seed = first + rng.randrange(SPLIT_SIZE)
        if new_seed != seed:
            moves.append(make(dict(base), new_seed, f"seed {seed}->{new_seed}"))
    return moves


def _sciworld_candidates(
    parent: Task, m: int, rng: random.Random, variations: Callable[[str], list[int]] | None
) -> list[ParamCandidate]:
    from dreamgym.envs.scienceworld import SIMPLIFICATIONS

    variation = int(parent.params.get("variation", 0))
    split = str(parent.params.get("split", "train"))
    simpl = str(parent.params.get("simplifications", "easy"))
    parts = [p for p in simpl.split(",") if p]
    if parts == ["easy"]:
        electrical = "power-component" in parent.env or "conductivity" in parent.env
        parts = [p for p in SIMPLIFICATIONS if p != "easy" and not (electrical and p == "noElectricalAction")]

    def make(v: int, s: str, change: str) -> ParamCandidate:
        tid = f"{parent.env}/{split}/var={v}/{s or 'none'}"
        task = Task(task_id=tid, env=parent.env, instruction="", origin="generated", kind="param",
                    params={"variation": v, "split": split, "simplifications": s})
        return ParamCandidate(task, change, harder=v == variation)

    moves = [make(variation, ",".join(p for p in parts if p != drop), f"simplification {drop} removed")
             for drop in SCIWORLD_DROPPABLE if drop in parts]
    rng.shuffle(moves)
    moves = moves[: max(0, m - 1)]
    pool = [v for v in (variations(split) if variations else []) if v != variation]
    rng.shuffle(pool)
    for v in pool[: m - len(moves)]:
        moves.append(make(v, simpl, f"variation {variation}->{v}"))
    return moves


@dataclass
class CheckResult:
    """The real environment's verdict on a candidate."""

    ok: bool
    reason: str = ""
    """``env_refused`` (the engine rejected the parameters), ``env_error`` or ``infeasible``."""
    detail: str = ""
    instruction: str = ""
    """The instruction the environment gives the task."""
    expert_steps: int | None = None
    """Length of the environment's expert plan (``None`` when it has none)."""


class EnvChecker:
    """Checks candidates by resetting them in a real environment (``reset``, then its expert plan)."""

    def __init__(self, env: Environment, max_steps: int | None = None) -> None:
        self.env = env
        self.max_steps = max_steps if max_steps is not None else env.max_steps

    def variations(self, split: str) -> list[int]:
        fn: Any = getattr(self.env, "variations", None)
        return list(fn(split)) if fn is not None else []

    def __call__(self, task: Task) -> CheckResult:
        try:
            obs = self.env.reset(task)
            plan = self.env.gold_actions()
        except DreamGymError as e:
            return CheckResult(False, "env_refused", str(e))
        except Exception as e:  # the engine's own errors (py4j, Java exceptions)
            return CheckResult(False, "env_error", f"{type(e).__name__}: {str(e)[:300]}")
        if plan is not None and not plan:
            return CheckResult(False, "infeasible", "the environment has no expert plan for it")
        if plan is not None and len(plan) > self.max_steps:
            return CheckResult(False, "infeasible",
                               f"the expert plan takes {len(plan)} steps, more than the budget of {self.max_steps}")
        return CheckResult(True, instruction=obs.instruction, expert_steps=None if plan is None else len(plan))


def checked_task(candidate: ParamCandidate, result: CheckResult) -> Task:
    """The candidate's task with the instruction the real environment gave it."""
    return replace(candidate.task, instruction=result.instruction)
