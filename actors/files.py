"""Files on a multi-node cluster: nothing a remote actor reads is a path that exists only on the driver's node.

Two ways, by size:

- **Small artefacts through the object store.** ``ship_file(path)`` puts a file's bytes into Ray's object
  store once and returns a ``ShippedFile`` (picklable; the reference inside it is not resolved when it is
  passed to an actor); ``local_copy(shipped)`` writes it into a private temporary folder on the actor's own
  node for as long as the ``with`` block reads it. The offline real transitions reach the rollout workers and
  the curriculum this way.
- **Large artefacts in a shared run directory.** Checkpoints (the learner), the replay buffer's embedded
  storage (replay shards) and the fine-tuned experience model (written by the SFT task, loaded by the replicas)
  go to the run directory. ``check_shared_run_dir`` proves, before anything is written, that every node that
  could host one of those roles sees the driver's run directory (a marker file the driver wrote, read back
  by a zero-CPU task pinned to each node), and refuses the run with a message naming the nodes otherwise.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from dreamgym.errors import ConfigError

#: Seconds the per-node marker reads may take together before a silent node counts as not seeing the run dir.
CHECK_TIMEOUT_S = 60.0

#: Name of the marker file ``check_shared_run_dir`` writes into the run directory (removed afterwards).
MARKER = ".dreamgym-shared-check"


@dataclass(frozen=True)
class ShippedFile:
    """A file's bytes in the object store (``ref``), its file name and where the driver read it from."""

    name: str
    ref: Any
    size: int
    source: str


def ship_file(path: str | Path) -> ShippedFile:
    """Put ``path``'s bytes into the object store once; every actor given the result can ``local_copy`` it."""
    p = Path(path)
    data = p.read_bytes()
    return ShippedFile(p.name, ray.put(data), len(data), str(p))


@contextlib.contextmanager
def local_copy(shipped: ShippedFile) -> Iterator[Path]:
    """The shipped file, written into a fresh private temporary folder of this process's node; removed on exit."""
    folder = Path(tempfile.mkdtemp(prefix="dreamgym-shipped-"))
    try:
        path = folder / shipped.name
        path.write_bytes(ray.get(shipped.ref))
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- the shared run directory ------------------------------------------------------------------------------
def _read_marker(path: str) -> tuple[str, str]:
    """On one node: the node's id and the marker's content (or why it could not be read)."""
    node = ray.get_runtime_context().get_node_id()
    try:
        return node, Path(path).read_text()
    except OSError as e:
        return node, f"unreadable: {type(e).__name__}: {e}"


def _fits(demand: Mapping[str, float], total: Mapping[str, float]) -> bool:
    return all(total.get(k, 0.0) + 1e-9 >= v for k, v in demand.items() if v > 0)


def nodes_for_roles(roles: Mapping[str, Mapping[str, float]],
                    nodes: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per alive node id, the roles (``name -> Ray resource demand``) the node could host by its totals."""
    out: dict[str, list[str]] = {}
    for n in nodes:
        if not n.get("Alive", False):
            continue
        fits = [role for role, demand in roles.items() if _fits(demand, n.get("Resources", {}))]
        if fits:
            out[n["NodeID"]] = fits
    return out


def check_shared_run_dir(run_dir: Path, roles: Mapping[str, Mapping[str, float]],
                         log: Callable[[str], None] = print, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Raise ``ConfigError`` unless every alive node that could host one of ``roles`` (the actors and tasks that
    read or write ``run_dir``, each with its Ray resource demand) reads back a marker the driver wrote there."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = ray.nodes()
    hosts = nodes_for_roles(roles, nodes)
    if not hosts:
        return
    where = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in nodes}
    marker = run_dir / MARKER
    token = secrets.token_hex(16)
    marker.write_text(token)
    try:
        task = ray.remote(num_cpus=0)(_read_marker)
        refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(str(marker)): node for node in hosts}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        bad = {refs[r]: f"did not answer within {timeout_s:g} s" for r in pending}
        for r in ready:
            _, seen = ray.get(r)
            if seen != token:
                bad[refs[r]] = seen if seen.startswith("unreadable") else "a different file at that path"
    finally:
        marker.unlink(missing_ok=True)
    if bad:
        lines = "; ".join(f"node {node} ({where.get(node, '?')}), which could host {', '.join(hosts[node])}: {why}"
                          for node, why in bad.items())
        raise ConfigError(
            f"the run directory {run_dir} is not shared with every node that may read or write it. {lines}. "
            "Checkpoints, the replay buffer's embedded storage and the fine-tuned experience model are written "
            "there by actors that can run on any node: give run.out_dir a filesystem mounted at the same path on "
            "every node (NFS, a ReadWriteMany volume), or keep those roles off the nodes that do not see it (give such "
            "nodes only a custom resource that the roles needing no run directory request: "
            "train.rollout.resources, experience_model.engine.resources without train.experience_sft)")
    log(f"run directory shared with {len(hosts)} node(s) that may read or write it")
