"""The single-process replay buffer on real stores with real twx:coin transitions and the real encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from replay_fixtures import *  # noqa: F403
from replay_fixtures import synthetic_of

from dreamgym.data.transitions import read_transitions
from dreamgym.replay.records import point_id, task_family
from dreamgym.types import Trajectory

BACKENDS = ["edge", "local"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_and_retrieve_with_filters(backend, make_buffer, twx_data):
    ts, vecs = twx_data
    buf = make_buffer(backend)
    res = buf.add(ts, vecs)
    assert res.stored == len(ts) and res.duplicates == 0
    synth = [synthetic_of(t, i) for i, t in enumerate(ts[:6])]
    res = buf.add(synth, vecs[:6], iteration=3, policy_version=7)
    assert res.stored == 6
    assert buf.counts()["real"] == len(ts) and buf.counts()["synthetic"] == 6

    # A stored transition is its own nearest demonstration (same phi(s, a)), real and synthetic alike.
    q = ts[0]
    demos = buf.search(vecs[:1], k=8)[0]
    assert len(demos) == 8
    assert demos[0].score == pytest.approx(1.0, abs=1e-4)
    assert {d.transition.state for d in demos[:2]} == {q.state}
    assert [d.score for d in demos] == sorted((d.score for d in demos), reverse=True)

    only_real = buf.search(vecs[:1], k=8, filters={"source": "real"})[0]
    assert only_real and all(d.transition.source == "real" for d in only_real)
    only_synth = buf.search(vecs[:1], k=8, filters={"source": "synthetic", "iteration": {"gte": 3}})[0]
    assert len(only_synth) == 6
    d = only_synth[0]
    # Synthetic metadata: iteration, policy version, task id, reward, valid flag.
    assert (d.iteration, d.policy_version, d.transition.valid) == (3, 7, True)
    assert d.transition.task_id == synth[0].task_id and d.transition.reward == synth[0].reward

    by_task = buf.search(vecs[:1], k=50, filters={"task_id": q.task_id})[0]
    assert by_task and all(x.transition.task_id == q.task_id for x in by_task)
    fam = task_family(q.task_id)
    assert "seed=" not in fam and "/train/" not in fam
    assert len(buf.search(vecs[:1], k=50, filters={"task_family": fam, "env": "twx:coin"})[0]) == 50
    assert buf.search(vecs[:1], k=5, filters={"env": "twx:cookingworld"})[0] == []
    assert buf.search(vecs[:1], k=5, filters={"env_family": ["twx", "sciworld"]})[0]


def test_retrieve_by_text_with_the_real_encoder(make_buffer, twx_data):
    ts, vecs = twx_data
    buf = make_buffer()
    buf.add(ts[:40])  # embedded here by the encoder
    stored = {p.id: p.vector for page in buf.iter_points(with_vectors=True) for p in page}
    # Same vectors as the session's batch embedding (bf16 batching may differ in the last bits).
    for t, v in zip(ts[:40], vecs[:40], strict=True):
        assert float(stored[point_id(t)] @ v) > 0.999
    q = ts[7]
    demos = buf.retrieve(q.state, q.action, k=4)
    assert demos[0].transition.state == q.state and demos[0].transition.action == q.action
    assert len(buf.retrieve_batch([(t.state, t.action) for t in ts[:3]], k=2)) == 3


def test_exact_duplicates_are_stored_once(make_buffer, twx_data):
    ts, vecs = twx_data
    buf = make_buffer()
    batch = ts[:20] + ts[:5]
    res = buf.add(batch, np.concatenate([vecs[:20], vecs[:5]]))
    assert (res.stored, res.duplicates) == (20, 5)
    res = buf.add(ts[:20], vecs[:20])  # a retried write acknowledges without storing twice
    assert (res.stored, res.duplicates) == (0, 20)
    # Episode and step do not make a transition new: the content does.
    moved = [type(t)(**{**t.to_dict(), "episode_id": "other", "step": 99}) for t in ts[:3]]
    assert buf.add(moved, vecs[:3]).duplicates == 3
    assert len(buf) == 20
    assert {p.id for page in buf.iter_points() for p in page} == {point_id(t) for t in ts[:20]}


def test_synthetic_cap_evicts_oldest_first_and_never_real(make_buffer, twx_data):
    ts, vecs = twx_data
    buf = make_buffer(synthetic_cap=10)
    buf.add(ts[:30], vecs[:30])
    evicted = 0
    for it in range(3):  # 3 iterations x 8 synthetic transitions, 24 > cap
        batch = [synthetic_of(t, it * 100 + i) for i, t in enumerate(ts[it * 8:(it + 1) * 8])]
        evicted += buf.add(batch, vecs[it * 8:(it + 1) * 8], iteration=it).evicted
    c = buf.counts()
    assert (c["real"], c["synthetic"], evicted) == (30, 10, 14)
    kept = [t for t in buf.iter_transitions({"source": "synthetic"})]
    # FIFO: the newest 10 survive: all 8 of iteration 2 and the last 2 of iteration 1.
    assert [t.episode_id for t in kept] == [f"synthetic/{100 + i}" for i in (6, 7)] + [
        f"synthetic/{200 + i}" for i in range(8)]
    assert {p.payload["iteration"] for page in buf.iter_points({"source": "synthetic"}) for p in page} == {1, 2}
    # Many more synthetic writes still never touch real data.
    more = [synthetic_of(t, 1000 + i) for i, t in enumerate(ts[:40])]
    buf.add(more, vecs[:40], iteration=9)
    assert buf.counts()["real"] == 30 and buf.counts()["synthetic"] == 10


def test_invalid_synthetic_never_stored_as_demonstration(make_buffer, twx_data):
    ts, vecs = twx_data
    buf = make_buffer()
    bad = synthetic_of(ts[0], 1, valid=False, next_state="<unparsable reply>")
    good = synthetic_of(ts[1], 2)
    res = buf.add([bad, good], vecs[:2], iteration=1)
    assert (res.stored, res.invalid) == (1, 1)
    assert buf.counts()["invalid_skipped"] == 1 and buf.counts()["synthetic"] == 1
    hits = buf.search(vecs[:1], k=10, filters={"source": ["real", "synthetic"]})[0]
    assert all(h.transition.next_state != bad.next_state for h in hits)
    assert all(t.valid for t in buf.iter_transitions())
    # A whole trajectory: its weight version becomes the policy version of each stored transition.
    traj_ts = [synthetic_of(t, 50 + i) for i, t in enumerate(ts[2:5])]
    traj_ts[1] = synthetic_of(ts[3], 51, valid=False)
    from dreamgym.types import Task

    traj = Trajectory(task=Task(ts[2].task_id, "twx:coin", ts[2].instruction), transitions=traj_ts, success=False,
                      total_reward=0.0, weight_version=12)
    res = buf.add_trajectory(traj, iteration=4)
    assert (res.stored, res.invalid) == (2, 1)
    assert {p.payload["policy_version"] for page in buf.iter_points({"iteration": 4}) for p in page} == {12}


@pytest.mark.parametrize("backend", BACKENDS)
def test_snapshot_restore_is_identical(backend, make_buffer, twx_data, tmp_path):
    ts, vecs = twx_data
    src = make_buffer(backend, "src", synthetic_cap=5)
    src.add(ts, vecs)
    src.add([synthetic_of(t, i) for i, t in enumerate(ts[:8])], vecs[:8], iteration=2, policy_version=3)

    def dump(buf):
        return [(p.id, p.payload, p.vector) for page in buf.iter_points(with_vectors=True) for p in page]

    before = dump(src)
    snap = src.snapshot(tmp_path / "snap")
    # The snapshot's transitions file is a valid transitions dataset (schema checked).
    assert read_transitions(Path(snap) / "part-000.transitions.parquet").num_rows == len(before)

    dst = make_buffer(backend, "dst", synthetic_cap=5)
    assert dst.restore(snap) == len(before)
    after = dump(dst)
    assert [a[0] for a in after] == [b[0] for b in before]
    assert [a[1] for a in after] == [b[1] for b in before]
    assert all(np.array_equal(a[2], b[2]) for a, b in zip(after, before, strict=True))
    assert dst.counts() == {**src.counts(), "duplicates_skipped": 0, "invalid_skipped": 0, "evicted": 0}
    for qi in (0, 5, 17):
        for flt in (None, {"source": "real"}):
            a = src.search(vecs[qi:qi + 1], k=8, filters=flt)[0]
            b = dst.search(vecs[qi:qi + 1], k=8, filters=flt)[0]
            assert [d.id for d in a] == [d.id for d in b]
            assert [d.score for d in a] == pytest.approx([d.score for d in b], abs=1e-6)
    # FIFO order survives the round trip: the next eviction removes the same (oldest) point.
    oldest = next(iter(src.iter_transitions({"source": "synthetic"})))
    dst.add([synthetic_of(ts[20], 99)], vecs[20:21], iteration=3)
    assert all(t.episode_id != oldest.episode_id for t in dst.iter_transitions({"source": "synthetic"}))


def test_reopen_keeps_everything(tmp_path, encoder, twx_data):
    from dreamgym.config import ReplayConfig
    from dreamgym.replay.buffer import ReplayBuffer

    ts, vecs = twx_data
    cfg = ReplayConfig(path=tmp_path / "r", synthetic_cap=3)
    buf = ReplayBuffer.from_config(cfg, encoder=encoder)
    buf.add(ts[:10], vecs[:10])
    buf.add([synthetic_of(t, i) for i, t in enumerate(ts[:5])], vecs[:5], iteration=1)
    ids = sorted(p.id for page in buf.iter_points() for p in page)
    buf.close()
    again = ReplayBuffer.from_config(cfg, encoder=encoder)
    assert sorted(p.id for page in again.iter_points() for p in page) == ids
    assert (again.counts()["real"], again.counts()["synthetic"]) == (10, 3)
    assert again.add(ts[:10], vecs[:10]).duplicates == 10  # seq and counters continue where they were
    again.close()


def test_seed_replay_command_streams_parquet(tmp_path, twx_parquet, capsys):
    from dreamgym.cli import main
    from dreamgym.config import ReplayConfig
    from dreamgym.replay.buffer import ReplayBuffer

    rows = read_transitions(twx_parquet)
    unique = len({point_id(r) for r in rows.to_pylist()})
    code = main(["seed-replay", "--data", str(twx_parquet), "--path", str(tmp_path / "seeded"),
                 "--replay.write_batch_size", "64", "--run.out_dir", str(tmp_path / "runs")])
    assert code == 0
    out = capsys.readouterr()
    assert f"seeded {unique} transitions from {rows.num_rows} rows" in out.out
    assert "seeding coin.parquet" in out.err  # the tqdm progress bar
    buf = ReplayBuffer.from_config(ReplayConfig(path=tmp_path / "seeded"))
    assert buf.counts()["real"] == unique
    assert sum(1 for _ in buf.iter_transitions(batch_size=50)) == unique
    buf.close()
