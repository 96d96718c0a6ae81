"""The sharded replay buffer on a real local Ray cluster: routing, merged top-k, snapshots, shard restarts."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from replay_fixtures import *  # noqa: F403
from replay_fixtures import synthetic_of

from dreamgym.config import ReplayConfig
from dreamgym.errors import FilterFieldError, SnapshotError
from dreamgym.replay.buffer import ReplayBuffer
from dreamgym.replay.records import point_id, shard_of


@pytest.fixture
def sharded(ray_cluster, tmp_path):
    from actors.replay import ShardedReplayBuffer

    made = []

    def make(name: str, shards: int = 2, **fields: object) -> ShardedReplayBuffer:
        # num_cpus=0: shards are light and must not wait for CPUs other tests' actors hold.
        cfg = ReplayConfig(path=tmp_path / name, shards=shards, num_cpus=0, **fields)  # type: ignore[arg-type]
        buf = ShardedReplayBuffer.create(cfg)
        made.append(buf)
        return buf

    yield make
    for b in made:
        b.close()


def _ids_by_shard(buf) -> list[set[str]]:
    import ray

    out = []
    for s in buf.shards:
        ids: set[str] = set()
        after = None
        while True:
            page, after = ray.get(s.page.remote(None, after, 100))
            if not page:
                break
            ids |= {point_id(t) for t in page}
        out.append(ids)
    return out


def test_two_shards_give_the_same_top_k_as_one(sharded, make_buffer, twx_data):
    ts, vecs = twx_data
    synth = [synthetic_of(t, i) for i, t in enumerate(ts[:20])]
    two = sharded("two")
    assert two.add(ts, vecs).stored == len(ts)
    assert two.add(synth, vecs[:20], iteration=1, policy_version=2).stored == 20
    one = make_buffer()
    one.add(ts, vecs)
    one.add(synth, vecs[:20], iteration=1, policy_version=2)

    counts = two.counts()
    assert (counts["real"], counts["synthetic"]) == (len(ts), 20)
    # Writes are routed by a stable hash of the content id: each shard holds exactly its ids.
    by_shard = _ids_by_shard(two)
    assert all(by_shard) and sum(len(s) for s in by_shard) == len(ts) + 20
    for i, ids in enumerate(by_shard):
        assert all(shard_of(pid, 2) == i for pid in ids)
    # A duplicate meets its twin on the same shard and is not stored again.
    assert two.add(ts, vecs).duplicates == len(ts)

    for flt in (None, {"source": "real"}, {"task_id": ts[3].task_id}, {"iteration": 1}):
        a = two.search(vecs[:12], k=8, filters=flt)
        b = one.search(vecs[:12], k=8, filters=flt)
        for da, db in zip(a, b, strict=True):
            assert [d.id for d in da] == [d.id for d in db]
            assert [d.score for d in da] == pytest.approx([d.score for d in db], abs=1e-6)
    # Text queries: embedded once by a shard, fanned out, merged; same as the one-process buffer.
    q = ts[9]
    assert [d.id for d in two.retrieve(q.state, q.action, k=6)] == [d.id for d in one.retrieve(q.state, q.action, k=6)]
    with pytest.raises(FilterFieldError, match="unknown filter field 'sauce'"):
        two.retrieve(q.state, q.action, filters={"sauce": "real"})


def test_killed_shard_comes_back_with_everything_it_acknowledged(sharded, twx_data):
    import ray

    ts, vecs = twx_data
    buf = sharded("kill", synthetic_cap=4)
    buf.add(ts[:80], vecs[:80])
    buf.add([synthetic_of(t, i) for i, t in enumerate(ts[:12])], vecs[:12], iteration=2)
    before_counts = {k: v for k, v in buf.counts().items() if k in ("real", "synthetic", "total")}
    before_ids = _ids_by_shard(buf)
    victim = buf.shards[0]
    old_pid = buf.info()[0]["pid"]

    ray.kill(victim, no_restart=False)  # SIGKILL: no flush, no atexit, no goodbye
    deadline = time.monotonic() + 90
    while True:  # calls wait for the restart (max_task_retries); the pid tells the new process apart
        info = buf.info()[0]
        if info["pid"] != old_pid:
            break
        assert time.monotonic() < deadline, "the killed shard was not restarted"
        time.sleep(0.2)
    assert info["restarted"]
    assert {k: v for k, v in buf.counts().items() if k in before_counts} == before_counts
    assert _ids_by_shard(buf) == before_ids
    # It keeps working: retrieval over both shards and new writes after the restart.
    assert buf.search(vecs[:1], k=3)[0][0].score == pytest.approx(1.0, abs=1e-4)
    assert buf.add(ts[80:100], vecs[80:100]).stored == 20


def test_a_shard_call_past_its_bound_is_a_clear_replay_error(sharded, twx_data):
    """Every wait on the shards is bounded by ``replay.call_timeout_s``: a write whose acknowledgement does not
    come in time (here a bound shorter than any write) ends in one line that names the field, not a hang."""
    from dreamgym.errors import ReplayError

    ts, vecs = twx_data
    buf = sharded("bound")
    buf.cfg = buf.cfg.model_copy(update={"call_timeout_s": 1e-4})
    with pytest.raises(ReplayError, match=r"did not answer within 0 s \(replay\.call_timeout_s\)"):
        buf.add(ts, vecs)
    with pytest.raises(ReplayError, match=r"replay\.call_timeout_s"):
        buf.retrieve_batch([(t.state, t.action) for t in ts])
    buf.cfg = buf.cfg.model_copy(update={"call_timeout_s": 300.0})
    assert len(buf) == len({point_id(t) for t in ts})  # the bounded write still landed, once


def test_sharded_snapshot_restores_into_any_layout(sharded, make_buffer, twx_data, tmp_path):
    ts, vecs = twx_data
    src = sharded("src")
    src.add(ts, vecs)
    src.add([synthetic_of(t, i) for i, t in enumerate(ts[:10])], vecs[:10], iteration=5)
    snap = src.snapshot(tmp_path / "snap")
    manifest = json.loads((snap / "manifest.json").read_text())
    assert manifest["num_shards"] == 2 and [p["name"] for p in manifest["parts"]] == ["part-000", "part-001"]

    same = sharded("same")
    assert same.restore(snap) == len(ts) + 10
    assert _ids_by_shard(same) == _ids_by_shard(src)
    single = make_buffer(name="single")  # another layout: one shard takes every row
    assert single.restore(snap) == len(ts) + 10
    a = src.search(vecs[:6], k=8)
    for other in (same.search(vecs[:6], k=8), single.search(vecs[:6], k=8)):
        assert [[d.id for d in row] for row in other] == [[d.id for d in row] for row in a]

    (snap / "part-001.meta.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(SnapshotError, match=r"part-001\.meta\.parquet is corrupt"):
        sharded("bad").restore(snap)


@pytest.mark.slow
def test_seed_replay_on_two_shards(ray_cluster, tmp_path, twx_parquet):
    from actors.replay import run_seed_replay
    from dreamgym.config import load_config
    from dreamgym.data.transitions import read_transitions

    rows = read_transitions(twx_parquet).to_pylist()
    unique = len({point_id(r) for r in rows})
    # Small write batches: many of them in flight at once (seeding pipelines its writes to the shards).
    cfg = load_config(None, {"replay": {"path": str(tmp_path / "r"), "shards": 2, "num_cpus": 0,
                                        "write_batch_size": 16},
                             "run": {"out_dir": str(tmp_path / "runs")}})
    s = run_seed_replay(cfg, twx_parquet, progress=False)
    assert len(rows) > 3 * 16
    assert (s["rows"], s["stored"] + s["duplicates"]) == (len(rows), len(rows))
    assert (s["stored"], s["real"], s["shards"]) == (unique, unique, 2)
    # The shards closed; their folders reopen in this process with the same contents.
    total = 0
    for i in range(2):
        b = ReplayBuffer.from_config(cfg.replay, shard=i, num_shards=2)
        total += len(b)
        assert all(shard_of(point_id(t), 2) == i for t in b.iter_transitions())
        b.close()
    assert total == unique
    assert np.isfinite(s["rows_per_s"])
