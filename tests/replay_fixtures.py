"""Fixtures shared by the replay tests: real TextWorldExpress transitions, the real encoder, real stores.

Imported with ``from replay_fixtures import *`` by the ``test_replay_*`` modules. The transitions are
played through the real ``twx:coin`` engine with the random policy of ``dreamgym collect``; their
``phi(s, a)`` vectors are computed once per session by the packaged all-MiniLM-L6-v2 so each test can
build fresh buffers without paying for the embedding again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from dreamgym.config import ReplayConfig
from dreamgym.replay.buffer import ReplayBuffer
from dreamgym.replay.encoder import Encoder
from dreamgym.replay.records import point_id
from dreamgym.types import Transition

__all__ = ["encoder", "make_buffer", "synthetic_of", "twx_data", "twx_parquet", "unique_transitions"]


def unique_transitions(ts: list[Transition]) -> list[Transition]:
    seen: set[str] = set()
    out = []
    for t in ts:
        pid = point_id(t)
        if pid not in seen:
            seen.add(pid)
            out.append(t)
    return out


def synthetic_of(t: Transition, i: int, **changes: object) -> Transition:
    """A synthetic transition derived from a real one (distinct content through its next state)."""
    fields = {"source": "synthetic", "policy": f"policy@v{i}", "next_state": f"{t.next_state} [dream {i}]",
              "episode_id": f"synthetic/{i}", **changes}
    return dataclasses.replace(t, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def encoder() -> Encoder:
    return Encoder()


@pytest.fixture(scope="session")
def twx_data(encoder: Encoder) -> tuple[list[Transition], np.ndarray]:
    """Unique real ``twx:coin`` transitions (random policy, 40 episodes) and their phi vectors."""
    from dreamgym.collect import collect_range
    from dreamgym.config import EnvConfig
    from dreamgym.envs.registry import make_env
    from dreamgym.policies import make_policy

    env = make_env(EnvConfig(name="twx:coin"))
    try:
        raw, _ = collect_range(env, make_policy("random"), 0, 40, "train", 0, "replay-tests")
    finally:
        env.close()
    ts = unique_transitions(raw)
    return ts, encoder.encode([(t.state, t.action) for t in ts])


@pytest.fixture(scope="session")
def twx_parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transitions Parquet file of 15 random ``twx:coin`` episodes (with duplicates, as collected)."""
    from dreamgym.collect import collect_range
    from dreamgym.config import EnvConfig
    from dreamgym.data.transitions import TransitionWriter
    from dreamgym.envs.registry import make_env
    from dreamgym.policies import make_policy

    env = make_env(EnvConfig(name="twx:coin"))
    try:
        raw, _ = collect_range(env, make_policy("random"), 100, 15, "train", 1, "replay-seed")
    finally:
        env.close()
    path = tmp_path_factory.mktemp("replay-data") / "coin.parquet"
    with TransitionWriter(path) as w:
        w.write(raw)
    return path


@pytest.fixture
def make_buffer(tmp_path: Path, encoder: Encoder):
    """``make_buffer(backend="edge", **config)`` -> a fresh buffer in its own folder (closed after the test)."""
    made: list[ReplayBuffer] = []

    def make(backend: str = "edge", name: str = "replay", **fields: object) -> ReplayBuffer:
        cfg = ReplayConfig(backend=backend, path=tmp_path / name, **fields)  # type: ignore[arg-type]
        buf = ReplayBuffer.from_config(cfg, encoder=encoder)
        made.append(buf)
        return buf

    yield make
    for b in made:
        with contextlib.suppress(Exception):  # a test may have closed it already
            b.close()

