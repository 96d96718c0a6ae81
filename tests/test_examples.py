"""The examples run for real, as a user runs them (a subprocess from the repository root), so they cannot rot."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def test_gym_agent_help() -> None:
    assert "--model" in _run("examples/gym_agent.py", "--help").stdout


@pytest.mark.parametrize("model", ["copy", pytest.param("tiny", marks=pytest.mark.engine)])
def test_gym_agent_plays_synthetic_episodes(model: str) -> None:
    out = _run("examples/gym_agent.py", "--model", model, "--real-episodes", "4", "--episodes", "2",
               "--max-steps", "3", "--max-tokens", "16").stdout
    assert out.startswith("4 real episodes")
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("== episode")] == [
        "== episode 0", "== episode 0", "== episode 1", "== episode 1"]
    assert "-- step 1: > " in out and "-- step 4:" not in out  # each episode stepped, within the budget
    last, head = out.strip().splitlines()[-1], "experience model stats: "  # then "{...} (N s in all)"
    assert last.startswith(head), last
    stats = ast.literal_eval(last[len(head): last.rindex(" (")])
    assert stats["queries"] >= 2 and stats["model_calls"] >= 1
    if model == "copy":  # the retrieval-only baseline always replies in the format
        assert stats["invalid"] == 0 and "invalid transition" not in out
    else:  # a random model never does: the first step of every episode is an invalid transition
        assert stats["invalid"] == 2 and out.count("truncated (invalid transition: ") == 2
