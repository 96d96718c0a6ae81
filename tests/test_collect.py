"""``dreamgym collect`` on a real local Ray cluster with real TextWorldExpress games."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml

from actors.collect import run_collect
from dreamgym.config import load_config
from dreamgym.data.transitions import read_transitions, summarise
from dreamgym.errors import EnvironmentSpecError

DREAMGYM = str(Path(sys.executable).with_name("dreamgym"))

pytestmark = pytest.mark.ray


def _collect(tmp_path, *overrides: str) -> dict:
    cfg = load_config(None, ["--run.out_dir", str(tmp_path / "runs"), "--collect.episodes_per_batch", "8",
                             "--collect.policy", "random", *overrides])
    return run_collect(cfg, progress=False)


@pytest.mark.parametrize("game", ["coin", "twc", "cookingworld"])
def test_gold_collection_wins_every_episode(ray_cluster, tmp_path, game: str) -> None:
    s = _collect(tmp_path, "--env.name", f"twx:{game}", "--collect.policy", "gold", "--collect.episodes", "12")
    table = read_transitions(s["out"])
    assert s["episodes"] == 12 and s["success_rate"] == 1.0
    finals = table.filter(table.column("done"))
    assert finals.num_rows == 12 and all(finals.column("success").to_pylist())
    # Rewards of each episode sum to 1 (the normalised score of a win).
    per_episode = table.group_by("episode_id").aggregate([("reward", "sum")])
    assert all(abs(r - 1.0) < 1e-6 for r in per_episode.column("reward_sum").to_pylist())
    assert set(table.column("policy").to_pylist()) == {"gold"}
    assert set(table.column("source").to_pylist()) == {"real"}
    # Consecutive steps chain: next_state of step t is the state of step t+1.
    rows = table.sort_by([("episode_id", "ascending"), ("step", "ascending")]).to_pylist()
    for a, b in itertools.pairwise(rows):
        if a["episode_id"] == b["episode_id"]:
            assert b["step"] == a["step"] + 1 and b["state"] == a["next_state"]


def test_random_collection_writes_valid_file_and_run_dir(ray_cluster, tmp_path) -> None:
    s = _collect(tmp_path, "--collect.policy", "random", "--collect.episodes", "40", "--env.max_steps", "10")
    info = summarise(s["out"])
    assert info["episodes"] == 40 and info["tasks"] == 40
    table = read_transitions(s["out"])
    assert pc.max(table.column("step")).as_py() <= 9
    # Every random action was one of the admissible actions of its state.
    for row in table.slice(0, 200).to_pylist():
        assert row["action"] in row["admissible_actions"]
    run_dir = Path(s["run_dir"])
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["collect"]["episodes"] == 40
    assert "summary" in (run_dir / "metrics.jsonl").read_text()


def test_random_collection_is_reproducible(ray_cluster, tmp_path) -> None:
    """Same seed -> same file, however episodes were spread over workers and batches.

    (Only for the random policy: TextWorldExpress's own gold-path generator explores with an
    engine-internal RNG that a task seed does not reset, so gold paths can differ between runs.)
    """
    a = read_transitions(
        _collect(tmp_path / "a", "--collect.episodes", "16", "--collect.episodes_per_batch", "3")["out"]
    )
    b = read_transitions(_collect(tmp_path / "b", "--collect.episodes", "16")["out"])
    key = [("episode_id", "ascending"), ("step", "ascending")]
    assert a.sort_by(key).equals(b.sort_by(key))


def test_mixed_policy_records_each_episodes_behaviour(ray_cluster, tmp_path) -> None:
    table = read_transitions(_collect(tmp_path, "--collect.policy", "mixed", "--collect.episodes", "16")["out"])
    assert {"mixed:gold", "mixed:random"} == set(table.column("policy").to_pylist())
    gold = table.filter(pc.equal(table.column("policy"), "mixed:gold"))
    assert all(gold.filter(gold.column("done")).column("success").to_pylist())


def test_unknown_game_lists_valid_names(ray_cluster, tmp_path) -> None:
    with pytest.raises(EnvironmentSpecError, match="coin") as e:
        _collect(tmp_path, "--env.name", "twx:coins")
    assert "twc" in str(e.value)


def test_cli_collect_end_to_end(ray_cluster, tmp_path) -> None:
    """The command line in a process of its own, joining the session's Ray as it would a cluster (a command that
    starts a local Ray of its own: tests/test_train.py::test_a_killed_driver_resumes_and_sigterm_...)."""
    out = tmp_path / "coin.parquet"
    address = ray_cluster.get_runtime_context().gcs_address
    r = subprocess.run([DREAMGYM, "collect", "--env", "twx:coin", "--policy", "mixed", "--episodes", "20",
                        "--out", str(out), "--run.out_dir", str(tmp_path / "runs"), "--ray.address", address],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "wrote" in r.stdout and summarise(out)["episodes"] == 20


def test_scienceworld_collection(ray_cluster, tmp_path) -> None:
    """ScienceWorld through the same collector: gold episodes win; admissible lists are optional (slow)."""
    s = _collect(tmp_path, "--env.name", "sciworld:find-living-thing", "--collect.policy", "gold",
                 "--collect.episodes", "2", "--collect.workers", "1", "--env.admissible_actions", "false",
                 "--env.max_steps", "40")
    table = read_transitions(s["out"])
    assert s["episodes"] == 2 and s["success_rate"] == 1.0
    assert set(table.column("env").to_pylist()) == {"sciworld:find-living-thing"}
    assert table.column("admissible_actions").null_count == table.num_rows
