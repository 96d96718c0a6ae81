"""The replay buffer against a real Qdrant server or cluster (``backend: server``).

Skipped unless ``QDRANT_URL`` points at a server (``QDRANT_API_KEY`` if it needs one); see
cluster/qdrant.md for starting one. Each test uses its own collection names and deletes them after.
The same checks as the embedded tests: filters, duplicates, FIFO cap, invalid data, snapshot identity.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
from replay_fixtures import *  # noqa: F403
from replay_fixtures import synthetic_of

from dreamgym.config import ReplayConfig
from dreamgym.replay.buffer import ReplayBuffer

URL = os.environ.get("QDRANT_URL")
pytestmark = [
    pytest.mark.qdrant_server,
    pytest.mark.skipif(not URL, reason="set QDRANT_URL to a Qdrant server to run the server-path tests"),
]


@pytest.fixture
def server_buffer(encoder):
    made: list[tuple[ReplayBuffer, ReplayConfig]] = []

    def make(**fields: object) -> ReplayBuffer:
        cfg = ReplayConfig(backend="server", url=URL, api_key=os.environ.get("QDRANT_API_KEY"),
                           collection=f"dreamgym-test-{uuid.uuid4().hex[:8]}", **fields)  # type: ignore[arg-type]
        buf = ReplayBuffer.from_config(cfg, encoder=encoder)
        made.append((buf, cfg))
        return buf

    yield make
    for buf, _ in made:
        store = buf.store
        store._client.delete_collection(store.collection)  # type: ignore[attr-defined]
        buf.close()


def test_server_add_retrieve_dedup_evict(server_buffer, twx_data):
    ts, vecs = twx_data
    buf = server_buffer(synthetic_cap=5, shard_number=2)
    assert buf.add(ts, vecs).stored == len(ts)
    assert buf.add(ts[:10], vecs[:10]).duplicates == 10
    res = buf.add([synthetic_of(t, i) for i, t in enumerate(ts[:8])], vecs[:8], iteration=4)
    assert (res.stored, res.evicted) == (8, 3)
    bad = synthetic_of(ts[9], 99, valid=False)
    assert buf.add([bad], vecs[9:10]).invalid == 1
    assert (buf.counts()["real"], buf.counts()["synthetic"]) == (len(ts), 5)
    d = buf.search(vecs[:1], k=8, filters={"source": "real", "env": "twx:coin"})[0]
    assert d[0].score == pytest.approx(1.0, abs=1e-4) and all(x.transition.source == "real" for x in d)
    assert [x.transition.episode_id for x in buf.iter_transitions({"source": "synthetic"})] == [
        f"synthetic/{i}" for i in range(3, 8)]


def test_server_snapshot_restore_identical(server_buffer, twx_data, tmp_path):
    ts, vecs = twx_data
    src = server_buffer()
    src.add(ts, vecs)
    snap = src.snapshot(tmp_path / "snap")
    dst = server_buffer()
    assert dst.restore(snap) == len(ts)

    def dump(b):
        return [(p.id, p.payload, p.vector) for page in b.iter_points(with_vectors=True) for p in page]

    a, b = dump(src), dump(dst)
    assert [x[:2] for x in a] == [x[:2] for x in b]
    assert all(np.array_equal(x[2], y[2]) for x, y in zip(a, b, strict=True))
    assert [d.id for d in src.search(vecs[:1], k=8)[0]] == [d.id for d in dst.search(vecs[:1], k=8)[0]]
