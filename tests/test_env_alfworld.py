"""ALFWorld adapter against the real engine, on the ALFWorld debug game that ships beside the repository
(the ``alfworld_debug_dir`` fixture in conftest finds it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dreamgym.config import EnvConfig
from dreamgym.envs.alfworld import AlfWorldEnv
from dreamgym.envs.registry import make_env
from dreamgym.errors import EnvironmentSpecError, EnvironmentUnavailableError
from dreamgym.types import Task

GOAL = "Your task is to: put a hot potato in sinkbasin."


@pytest.fixture(scope="module")
def env(alfworld_debug_dir: Path) -> Iterator[AlfWorldEnv]:
    e = make_env(EnvConfig(name=f"alfworld:{alfworld_debug_dir / 'game.tw-pddl'}", max_steps=20))
    assert isinstance(e, AlfWorldEnv)
    yield e
    e.close()


def test_tasks_from_file_and_folder(env: AlfWorldEnv, alfworld_debug_dir: Path) -> None:
    [task] = env.tasks(1)
    assert task.instruction == GOAL and task.params["gamefile"].endswith("game.tw-pddl")
    folder = AlfWorldEnv(str(alfworld_debug_dir.parent))
    [same] = folder.tasks(1, split="test")  # a plain folder gives the same games for every split
    assert same.params["gamefile"] == task.params["gamefile"]
    assert same.task_id.endswith("alfworld-debug/game.tw-pddl")
    with pytest.raises(EnvironmentSpecError, match="1 game"):
        folder.tasks(2)


def test_winning_commands_win(env: AlfWorldEnv, alfworld_debug_dir: Path) -> None:
    winning = (alfworld_debug_dir / "winning_commands.txt").read_text().split("\n")
    winning = [c for c in winning if c.strip()]
    obs = env.reset(env.tasks(1)[0])
    assert obs.instruction == GOAL
    assert "countertop 2" in obs.state and "Welcome" not in obs.state and "Your task" not in obs.state
    assert obs.admissible_actions and winning[0] in obs.admissible_actions
    assert env.gold_actions() == winning
    rewards, result = [], None
    for cmd in winning:
        result = env.step(cmd)
        rewards.append(result.reward)
        assert result.info["admissible"]
    assert result is not None and result.done and result.success and result.info["won"]
    assert rewards == [0.0] * (len(winning) - 1) + [1.0]


def test_inadmissible_command_does_not_win(env: AlfWorldEnv) -> None:
    env.reset(env.tasks(1)[0])
    for cmd in ["alice : fly to the moon", "put potato 1 in/on sinkbasin 1"]:  # the second lacks the agent prefix
        r = env.step(cmd)
        assert r.observation.state == "Nothing happens."
        assert not r.done and not r.success and r.reward == 0.0 and r.info["admissible"] is False


def test_malformed_game_file_is_one_clear_error(tmp_path: Path) -> None:
    garbage = tmp_path / "broken.tw-pddl"
    garbage.write_bytes(b"\x00\x01 this is not a game {")
    env = make_env(EnvConfig(name=f"alfworld:{garbage}"))
    with pytest.raises(EnvironmentUnavailableError, match=r"broken\.tw-pddl.*TextWorld-PDDL"):
        env.tasks(1)
    with pytest.raises(EnvironmentUnavailableError, match=r"broken\.tw-pddl"):
        env.reset(Task(task_id="t", env=env.spec, instruction="", params={"gamefile": str(garbage)}))
    keys_only = tmp_path / "nokeys.tw-pddl"
    keys_only.write_text(json.dumps({"grammar": "x"}))
    with pytest.raises(EnvironmentUnavailableError, match=r"nokeys\.tw-pddl.*missing pddl_domain"):
        make_env(EnvConfig(name=f"alfworld:{keys_only}")).tasks(1)


def test_unparseable_pddl_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "badpddl.tw-pddl"
    bad.write_text(json.dumps({"pddl_domain": "(define (domain", "grammar": "{}", "pddl_problem": "(("}))
    env = make_env(EnvConfig(name=f"alfworld:{bad}"))
    with pytest.raises(EnvironmentUnavailableError, match=r"badpddl\.tw-pddl could not be loaded"):
        env.reset(env.tasks(1)[0])
    env.close()


def test_missing_path_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentSpecError, match="does not exist"):
        make_env(EnvConfig(name=f"alfworld:{tmp_path / 'nope.tw-pddl'}"))
    with pytest.raises(EnvironmentSpecError, match=r"no \.tw-pddl game files"):
        make_env(EnvConfig(name=f"alfworld:{tmp_path}")).tasks(1)
