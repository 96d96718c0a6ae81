"""``actors.files``: files through the object store, and the check that a run directory is shared.

The 2-node end-to-end run is ``tests/test_two_nodes.py``; here the pieces: which nodes could host the roles that
read or write the run directory (pure), a shipped file read back in a task, and the check on one node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.files import nodes_for_roles
from dreamgym.config import validate_config

NODES = [
    {"NodeID": "head", "Alive": True, "Resources": {"CPU": 2.0, "memory": 1e9}},
    {"NodeID": "rollout", "Alive": True, "Resources": {"worker_node": 10.0, "memory": 1e9}},
    {"NodeID": "gpu", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 4.0}},
    {"NodeID": "dead", "Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},
]


def test_nodes_for_roles_follow_each_roles_demand() -> None:
    roles = {"learner": {"CPU": 1.0, "GPU": 1.0}, "replay-shard": {"CPU": 0.5},
             "experience-replica": {"CPU": 0.0, "GPU": 0.0, "worker_node": 1.0}}
    assert nodes_for_roles(roles, NODES) == {"head": ["replay-shard"], "rollout": ["experience-replica"],
                                             "gpu": ["learner", "replay-shard"]}
    # a role that asks for nothing fits every alive node
    assert set(nodes_for_roles({"any": {"CPU": 0.0}}, NODES)) == {"head", "rollout", "gpu"}


def test_run_dir_roles_name_every_reader_and_writer() -> None:
    from actors.train_setup import run_dir_roles

    pinned = {"worker_node": 1.0}
    base = {"experience_model": {"engine": {"num_cpus": 0, "resources": pinned}},
            "train": {"mode": "synthetic", "rollout": {"num_cpus": 0, "resources": pinned}}}
    cfg = validate_config(base)
    assert set(run_dir_roles(cfg)) == {"learner", "replay-shard"}  # rollout workers and the replica read none
    cfg = validate_config({**base, "train": {**base["train"], "experience_sft": True}})
    roles = run_dir_roles(cfg)
    # the fine-tuned model is written by the SFT task and loaded by the replicas from the run directory
    assert roles["experience-replica"] == {"CPU": 0.0, "GPU": 0.0, "worker_node": 1.0}
    assert "experience-model SFT" in roles
    cfg = validate_config({**base, "replay": {"backend": "server", "url": "http://127.0.0.1:6333"}})
    assert "replay-shard" not in run_dir_roles(cfg)


@pytest.mark.ray
def test_a_shipped_file_is_read_on_the_actors_node_and_one_node_shares_the_run_dir(ray_cluster,
                                                                                    tmp_path: Path) -> None:
    import ray

    from actors.files import MARKER, check_shared_run_dir, local_copy, ship_file

    src = tmp_path / "driver" / "offline.parquet"
    src.parent.mkdir()
    src.write_bytes(b"PAR1 not really")
    shipped = ship_file(src)
    assert shipped.size == 15 and shipped.name == "offline.parquet"

    @ray.remote(num_cpus=0)
    def read(box: list) -> tuple[str, bytes, bool]:
        with local_copy(box[0]) as path:
            data = path.read_bytes()
        return str(path), data, path.exists()

    where, data, left = ray.get(read.remote([shipped]))
    assert data == b"PAR1 not really" and not left  # the copy is gone after the block
    assert not where.startswith(str(src.parent))
    # one node sees its own run directory; the marker is removed afterwards
    lines: list[str] = []
    check_shared_run_dir(tmp_path, {"learner": {"CPU": 0.1}}, lines.append)
    assert lines == ["run directory shared with 1 node(s) that may read or write it"]
    assert not (tmp_path / MARKER).exists()
    # no node can host the role: nothing to check
    check_shared_run_dir(tmp_path, {"learner": {"GPU": 64.0}}, lines.append)
    assert len(lines) == 1
