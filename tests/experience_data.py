"""Data for the experience-model tests: hand-made toy transitions and real twx:coin transitions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamgym.data.transitions import TransitionWriter

TOY_ENV = "toy:rooms"
HALL = "You are in the hall. The kitchen is to the north."
KITCHEN = "You are in the kitchen."


def toy_row(episode: str, step: int, state: str, action: str, next_state: str, reward: float, done: bool,
            success: bool, reasoning: str | None = None, admissible: list[str] | None = None) -> dict[str, Any]:
    return {"episode_id": episode, "step": step, "task_id": "toy/0", "env": TOY_ENV,
            "instruction": "Go to the kitchen.", "state": state, "action": action, "next_state": next_state,
            "reward": reward, "done": done, "success": success,
            "admissible_actions": admissible if admissible is not None else ["go north", "look"],
            "source": "real", "policy": "gold", "reasoning": reasoning,
            # Hand-written reasoning stands for a teacher's: the SFT keeps it as written (no cited demonstration).
            "reasoning_source": "teacher" if reasoning else "template"}


def write_toy(path: Path, rows: list[dict[str, Any]]) -> Path:
    with TransitionWriter(path, optional=("reasoning", "reasoning_source")) as w:
        w.write(rows)
    return path


def controlled_rows() -> list[dict[str, Any]]:
    """The toy world: ``go north`` wins, ``look`` changes nothing. The controlled tiny model is trained
    on the first row only: it answers that prompt with a valid reply and any other prompt (``look``)
    with malformed text."""
    return [
        toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True, "The agent goes north."),
        toy_row("e1", 0, HALL, "look", HALL, 0.0, False, False, "Looking changes nothing."),
    ]


def collect_coin(path: Path, split: str, episodes: int, first: int = 0) -> Path:
    """Real twx:coin transitions (3 rooms), collected in this process with the mixed policy."""
    from dreamgym.collect import collect_range
    from dreamgym.config import EnvConfig
    from dreamgym.envs.registry import make_env
    from dreamgym.policies import make_policy

    env = make_env(EnvConfig(name="twx:coin", split=split))
    try:
        transitions, _ = collect_range(env, make_policy("mixed", 0.5), first, episodes, split, 0,
                                       f"twx:coin/mixed/{split}")
    finally:
        env.close()
    with TransitionWriter(path) as w:
        w.write(transitions)
    return path
