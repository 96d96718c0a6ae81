"""Bad input to the replay buffer: each case is one clear DreamGymError naming what, where and the fix."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest
from replay_fixtures import *  # noqa: F403

from dreamgym.config import ReplayConfig
from dreamgym.errors import (
    DreamGymError,
    FilterFieldError,
    ReplayStorageUnavailableError,
    SnapshotError,
    VectorSizeError,
)
from dreamgym.replay.buffer import ReplayBuffer
from dreamgym.replay.storage import open_store


def test_wrong_vector_size(make_buffer, twx_data, tmp_path, encoder):
    ts, vecs = twx_data
    buf = make_buffer()
    with pytest.raises(VectorSizeError, match=r"size 5 .* holds 384-d vectors.*replay\.encoder"):
        buf.add(ts[:2], np.ones((2, 5), dtype=np.float32))
    with pytest.raises(VectorSizeError, match="2 transitions but vectors of shape"):
        buf.add(ts[:2], vecs[:3])
    with pytest.raises(VectorSizeError, match="size 10"):
        buf.search(np.ones((1, 10), dtype=np.float32))
    assert len(buf) == 0
    # A folder built with 8-d vectors, then opened with the 384-d encoder: refused on first embedding.
    root = tmp_path / "small"
    open_store(ReplayConfig(path=root), 8, 0, root).close()
    small = ReplayBuffer.from_config(ReplayConfig(path=root), encoder=encoder)
    with pytest.raises(VectorSizeError, match=r"encoder 'all-MiniLM-L6-v2' makes 384-d vectors .* holds 8-d"):
        small.add(ts[:1])
    small.close()


def test_unknown_or_malformed_filter(make_buffer, twx_data):
    ts, vecs = twx_data
    buf = make_buffer()
    buf.add(ts[:5], vecs[:5])
    with pytest.raises(FilterFieldError, match=r"unknown filter field 'enviroment'.*can filter on: env, env_family"):
        buf.retrieve(ts[0].state, ts[0].action, filters={"enviroment": "twx:coin"})
    with pytest.raises(FilterFieldError, match="expects a integer value"):
        buf.search(vecs[:1], filters={"iteration": "3"})
    with pytest.raises(FilterFieldError, match="not a range"):
        buf.search(vecs[:1], filters={"iteration": {"above": 1}})
    with pytest.raises(FilterFieldError, match="non-empty list"):
        buf.search(vecs[:1], filters={"source": []})


def test_unreachable_server(encoder):
    with socket.socket() as s:  # a free loopback port: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = ReplayConfig(backend="server", url=f"http://127.0.0.1:{port}", timeout_s=2)
    t0 = time.perf_counter()
    with pytest.raises(ReplayStorageUnavailableError) as e:
        ReplayBuffer.from_config(cfg, encoder=encoder)
    msg = str(e.value)
    assert f"http://127.0.0.1:{port}" in msg and "refused" in msg.lower()
    assert "cluster/qdrant.md" in msg and "replay.backend: edge" in msg
    assert time.perf_counter() - t0 < 10


def _snapshot(make_buffer, twx_data, tmp_path):
    ts, vecs = twx_data
    src = make_buffer(name="src")
    src.add(ts[:30], vecs[:30])
    return src.snapshot(tmp_path / "snap")


def test_corrupt_snapshot(make_buffer, twx_data, tmp_path):
    snap = _snapshot(make_buffer, twx_data, tmp_path)
    meta = snap / "part-000.meta.parquet"
    data = bytearray(meta.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    meta.write_bytes(bytes(data))
    dst = make_buffer(name="dst")
    with pytest.raises(SnapshotError, match=r"part-000\.meta\.parquet is corrupt .*SHA-256.*take a new snapshot"):
        dst.restore(snap)
    assert len(dst) == 0  # nothing half-restored


def test_truncated_or_incomplete_snapshot(make_buffer, twx_data, tmp_path):
    snap = _snapshot(make_buffer, twx_data, tmp_path)
    tfile = snap / "part-000.transitions.parquet"
    tfile.write_bytes(tfile.read_bytes()[:200])
    with pytest.raises(SnapshotError, match="truncated or modified"):
        make_buffer(name="a").restore(snap)
    (snap / "manifest.json").unlink()
    with pytest.raises(SnapshotError, match=r"manifest\.json is missing .*interrupted"):
        make_buffer(name="b").restore(snap)
    with pytest.raises(SnapshotError, match="not found"):
        make_buffer(name="c").restore(tmp_path / "nowhere")


def test_snapshot_edited_consistently_is_caught_by_ids(make_buffer, twx_data, tmp_path):
    """A row edited and its checksum updated still fails: each id must be the hash of its content."""
    import pyarrow.parquet as pq

    from dreamgym.data.transitions import TransitionWriter, read_transitions
    from dreamgym.replay.snapshot import sha256_file

    snap = _snapshot(make_buffer, twx_data, tmp_path)
    tfile = snap / "part-000.transitions.parquet"
    rows = read_transitions(tfile).to_pylist()
    rows[3]["next_state"] = "You win a million coins."
    with TransitionWriter(tfile, optional=("valid",)) as w:
        w.write(rows)
    m = json.loads((snap / "manifest.json").read_text())
    m["parts"][0]["files"][tfile.name] = sha256_file(tfile)
    (snap / "manifest.json").write_text(json.dumps(m))
    assert pq.ParquetFile(tfile).metadata.num_rows == 30
    with pytest.raises(SnapshotError, match=r"row 3 of part part-000 has id .* content hashes to"):
        make_buffer(name="d").restore(snap)


def test_restore_into_non_empty_or_other_encoder(make_buffer, twx_data, tmp_path):
    ts, vecs = twx_data
    snap = _snapshot(make_buffer, twx_data, tmp_path)
    full = make_buffer(name="full")
    full.add(ts[:1], vecs[:1])
    with pytest.raises(SnapshotError, match="needs an empty replay buffer"):
        full.restore(snap)
    m = json.loads((snap / "manifest.json").read_text())
    m["dim"] = 768
    (snap / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(SnapshotError, match="holds 768-d vectors"):
        make_buffer(name="e").restore(snap)


def test_folder_reopened_with_another_shard_count(make_buffer, tmp_path, encoder):
    make_buffer(name="lay").close()
    with pytest.raises(ReplayStorageUnavailableError, match=r"num_shards=1.*replay\.shards: 1"):
        ReplayBuffer.from_config(ReplayConfig(path=tmp_path / "lay", shards=2), num_shards=2, encoder=encoder)


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    from dreamgym.cli import main

    code = main(["seed-replay", "--data", str(tmp_path / "missing.parquet"), "--run.out_dir", str(tmp_path)])
    assert code == 2
    assert "transitions file not found" in capsys.readouterr().err
    assert issubclass(SnapshotError, DreamGymError)
