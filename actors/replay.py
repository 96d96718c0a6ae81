"""The replay buffer sharded over Ray: S ``ReplayShard`` actors and the client that routes to them.

- **Writes** are routed by a stable hash of the point id (a content hash, computed in the caller), so
  an exact duplicate always meets its twin on the same shard and is stored once. Each shard embeds
  its own transitions, so the encoder work spreads over the shards.
- **Queries** are embedded once (by one shard, round robin), the vector is handed to every shard as an
  object ref (no round trip through the caller), each shard returns its exact top-k and the client
  merges them: with exact search the merged top-k equals the top-k of one unsharded buffer.
- **Durability**: each shard owns its storage folder (``<replay.path>/shard-NNN``) and writes through
  it before acknowledging. When a shard actor dies, Ray restarts it (``replay.max_restarts``); the new
  process reopens the same folder and finds every acknowledged transition. Calls in flight are retried
  (``max_task_retries``), which is safe because writes are idempotent (content ids, insert-if-absent).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import ray

from dreamgym.config import DreamGymConfig, ReplayConfig
from dreamgym.errors import ConfigError, DreamGymError, ReplayError, ReplayTimeoutError
from dreamgym.replay.buffer import AddResult, ReplayBuffer, rank
from dreamgym.replay.filters import Filters, parse_filters
from dreamgym.replay.records import payload_transition, point_id, shard_of
from dreamgym.types import Demonstration, Trajectory, Transition

log = logging.getLogger(__name__)

#: Retries of a call whose shard died mid-call (it is re-run on the restarted shard; writes are idempotent).
MAX_TASK_RETRIES = 3


@ray.remote
class ReplayShard:
    """One shard of the replay buffer: a ``ReplayBuffer`` over its own storage folder or collection."""

    def __init__(self, cfg: dict[str, Any], root: str | None, shard: int, num_shards: int) -> None:
        self.shard = shard
        self.buffer = ReplayBuffer.from_config(ReplayConfig.model_validate(cfg), root, shard, num_shards)
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed

    def info(self) -> dict[str, Any]:
        return {"shard": self.shard, "pid": os.getpid(), "restarted": self.restarted,
                "where": self.buffer.store.where, "dim": self.buffer.store.dim, "encoder": self.buffer.encoder.name}

    def add(self, transitions: list[Transition], vectors: np.ndarray | None, iteration: int,
            policy_version: int | None, ids: list[str] | None = None) -> AddResult:
        return self.buffer.add(transitions, vectors, iteration=iteration, policy_version=policy_version, ids=ids)

    def encode(self, queries: list[tuple[str, str]]) -> np.ndarray:
        return self.buffer._encode(queries)

    def warm(self) -> str | None:
        """Load the encoder now. A failure is returned, not raised: the first write or query raises it again, with
        its message, where someone waits for the answer."""
        try:
            self.buffer.encoder.load()
        except Exception as e:
            return repr(e)
        return None

    def search(self, vectors: np.ndarray, k: int | None, filters: Filters | None) -> list[list[Demonstration]]:
        return self.buffer.search(vectors, k, filters)

    def counts(self) -> dict[str, int]:
        return self.buffer.counts()

    def page(self, filters: Filters | None, after_seq: int | None, limit: int) -> tuple[list[Transition], int | None]:
        """One page of stored transitions in insertion order, and the ``seq`` to continue after."""
        pts = self.buffer.store.ordered(parse_filters(filters, "iter_transitions"), limit, after_seq=after_seq)
        return [payload_transition(p.payload) for p in pts], (int(pts[-1].payload["seq"]) if pts else None)

    def snapshot_part(self, directory: str) -> dict[str, Any]:
        from dreamgym.replay.snapshot import write_part

        return write_part(self.buffer, directory, f"part-{self.shard:03d}")

    def restore(self, directory: str) -> int:
        return self.buffer.restore(directory)

    def optimize(self) -> None:
        self.buffer.optimize()

    def close(self) -> None:
        self.buffer.close()


class ShardedReplayBuffer:
    """The ``ReplayBuffer`` API over S shard actors. Picklable: hand it to rollout actors as it is."""

    def __init__(self, shards: Sequence[Any], cfg: ReplayConfig) -> None:
        self.shards = list(shards)
        self.cfg = cfg
        self._next_encoder = 0

    @classmethod
    def create(cls, cfg: ReplayConfig, root: str | Path | None = None, name: str | None = None) -> ShardedReplayBuffer:
        """Start ``cfg.shards`` shard actors over ``root`` (default ``cfg.path``) and wait until they are up.

        ``name``: register the actors as ``<name>-shard-NNN`` so other drivers can find them.
        """
        root = Path(root) if root is not None else cfg.path
        if cfg.backend == "edge" and root is None:
            raise ConfigError(
                "replay.path is required for the sharded buffer with backend 'edge' (one folder per shard)")
        if cfg.backend == "local" and root is None:
            log.warning("replay: backend 'local' without replay.path keeps shards in memory; "
                        "a restarted shard comes back empty")
        if cfg.backend == "server":
            _check_server(cfg)  # fail here with a clear message rather than inside S actor constructors
        shards = []
        for i in range(cfg.shards):
            opts: dict[str, Any] = {"num_cpus": cfg.num_cpus, "max_restarts": cfg.max_restarts,
                                    "max_task_retries": MAX_TASK_RETRIES}
            if name:
                opts["name"] = f"{name}-shard-{i:03d}"
            shards.append(ReplayShard.options(**opts).remote(  # type: ignore[attr-defined]
                cfg.model_dump(mode="json"), str(root) if root is not None else None, i, cfg.shards))
        buf = cls(shards, cfg)
        buf.info()  # surfaces constructor errors (locked folder, wrong layout) now
        return buf

    def _get(self, refs: Any) -> Any:
        return _get(refs, self.cfg.call_timeout_s)

    # -- writes ----------------------------------------------------------------------------------
    def add(self, transitions: Sequence[Transition], vectors: np.ndarray | None = None, *, iteration: int = -1,
            policy_version: int | None = None) -> AddResult:
        """Route each transition to its shard and wait for every shard's acknowledgement."""
        return self.add_async(transitions, vectors, iteration=iteration, policy_version=policy_version).result()

    def add_async(self, transitions: Sequence[Transition], vectors: np.ndarray | None = None, *,
                  iteration: int = -1, policy_version: int | None = None) -> PendingAdd:
        """Send a write to the shards without waiting; it is acknowledged (durable) when ``.result()`` returns.

        Seeding keeps a few of these in flight so that reading and hashing the next batch here overlaps
        the shards' writes. Writes from one caller reach each shard in the order they were sent.
        """
        ids = [point_id(t) for t in transitions]
        groups: dict[int, list[int]] = {}
        for i, pid in enumerate(ids):
            groups.setdefault(shard_of(pid, len(self.shards)), []).append(i)
        refs = []
        for s, idx in groups.items():
            vecs = None if vectors is None else np.asarray(vectors)[idx]
            refs.append(self.shards[s].add.remote([transitions[i] for i in idx], vecs, iteration, policy_version,
                                                  [ids[i] for i in idx]))
        return PendingAdd(refs, self.cfg.call_timeout_s)

    def add_trajectory(self, trajectory: Trajectory, iteration: int = -1) -> AddResult:
        return self.add(trajectory.transitions, iteration=iteration, policy_version=trajectory.weight_version)

    # -- retrieval ---------------------------------------------------------------------------
    def retrieve(self, state: str, action: str, k: int | None = None,
                 filters: Filters | None = None) -> list[Demonstration]:
        """The top-k demonstrations for ``(state, action)`` over all shards."""
        return self.retrieve_batch([(state, action)], k, filters)[0]

    def retrieve_batch(self, queries: Sequence[tuple[str, str]], k: int | None = None,
                       filters: Filters | None = None) -> list[list[Demonstration]]:
        parse_filters(filters)  # a bad filter fails here, with its own message, before any actor call
        if not queries:
            return []
        encoder = self.shards[self._next_encoder % len(self.shards)]
        self._next_encoder += 1
        vec_ref = encoder.encode.remote(list(queries))
        return self._fan_out(vec_ref, k, filters, len(queries))

    def search(self, vectors: np.ndarray, k: int | None = None,
               filters: Filters | None = None) -> list[list[Demonstration]]:
        """Top-k for precomputed query vectors over all shards."""
        parse_filters(filters)
        v = np.asarray(vectors, dtype=np.float32)
        return self._fan_out(ray.put(v), k, filters, len(v))

    def _fan_out(self, vec_ref: Any, k: int | None, filters: Filters | None, n: int) -> list[list[Demonstration]]:
        k = k or self.cfg.k
        per_shard = self._get([s.search.remote(vec_ref, k, filters) for s in self.shards])
        # The same total order as one unsharded buffer, so the merged top-k equals its top-k.
        return [rank(chain.from_iterable(res[q] for res in per_shard), k) for q in range(n)]

    # -- reading -------------------------------------------------------------------------------
    def counts(self) -> dict[str, Any]:
        per = self._get([s.counts.remote() for s in self.shards])
        total = {key: sum(c[key] for c in per) for key in per[0]}
        return {**total, "per_shard": per}

    def __len__(self) -> int:
        return int(self.counts()["total"])

    def info(self) -> list[dict[str, Any]]:
        return self._get([s.info.remote() for s in self.shards])

    def warm(self) -> None:
        """Have every shard load its encoder, without waiting: a shard runs its calls in order, so a write or query
        that comes sooner waits for it, and one that comes later finds it loaded (``dreamgym train`` warms the
        shards while its engines and learner load)."""
        for s in self.shards:
            s.warm.remote()

    def iter_transitions(self, filters: Filters | None = None, batch_size: int = 1024) -> Iterator[Transition]:
        """Every stored transition, shard by shard, each in insertion order (bounded memory)."""
        parse_filters(filters, "iter_transitions")
        for s in self.shards:
            after: int | None = None
            while True:
                page, after = self._get(s.page.remote(filters, after, batch_size))
                if not page:
                    break
                yield from page

    # -- persistence -------------------------------------------------------------------------
    def snapshot(self, directory: str | Path) -> Path:
        """Each shard writes its own part (in parallel); the manifest is written last."""
        from dreamgym.replay.snapshot import write_manifest

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        parts = _get([s.snapshot_part.remote(str(d)) for s in self.shards])
        info = self.info()[0]
        return write_manifest(d, parts, dim=info["dim"], encoder=info["encoder"], num_shards=len(self.shards))

    def restore(self, directory: str | Path) -> int:
        from dreamgym.replay.snapshot import read_manifest

        read_manifest(directory)  # a missing or malformed manifest fails here, once, not in S actors
        return int(sum(_get([s.restore.remote(str(directory)) for s in self.shards])))

    def optimize(self) -> None:
        _get([s.optimize.remote() for s in self.shards])

    def close(self, kill: bool = True) -> None:
        """Close every shard's storage (flushing it) and, by default, end the actors."""
        try:
            self._get([s.close.remote() for s in self.shards])
        finally:
            if kill:
                for s in self.shards:
                    ray.kill(s, no_restart=True)


class PendingAdd:
    """A write sent to the shards; ``result()`` waits for every shard's acknowledgement and sums them."""

    def __init__(self, refs: list[Any], timeout_s: float | None = None) -> None:
        self.refs = refs
        self.timeout_s = timeout_s

    def result(self) -> AddResult:
        total = AddResult()
        for r in _get(self.refs, self.timeout_s):
            total += r
        return total


def _get(refs: Any, timeout_s: float | None = None) -> Any:
    """``ray.get`` that re-raises a shard's DreamGymError as itself (message without Ray's wrapping), and waits
    at most ``timeout_s`` (``replay.call_timeout_s``: a killed shard's calls are retried once it is back)."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise ReplayTimeoutError(
            f"the replay shards did not answer within {timeout_s:.0f} s (replay.call_timeout_s): a shard that died "
            "was not restarted in time, or its storage is stuck; see the ReplayShard actors' logs") from None
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if isinstance(getattr(e, "cause", None), DreamGymError) else None
        if cause is not None:
            raise cause from None
        raise
    except ray.exceptions.RayActorError as e:
        text = str(e)
        for marker in ("ReplayStorageUnavailableError: ", "VectorSizeError: ", "SnapshotError: ", "ReplayError: "):
            if marker in text:
                reason = text.split(marker, 1)[1].strip().splitlines()[0]
                raise ReplayError(f"a replay shard could not start: {reason}") from None
        raise


def _check_server(cfg: ReplayConfig) -> None:
    from dreamgym.replay.encoder import Encoder
    from dreamgym.replay.storage import open_store

    open_store(cfg, Encoder(cfg.encoder).dim, 0).close()


# -- seeding (the ``dreamgym seed-replay`` command) ---------------------------------------------------
def run_seed_replay(cfg: DreamGymConfig, data: str | Path, progress: bool = True) -> dict[str, Any]:
    """Seed the replay buffer from a transitions Parquet file; returns a summary (also in the run dir).

    One shard without a Ray address (``ray.address``, ``RAY_ADDRESS``) runs in this process, as from the command
    line, also in a process already connected to Ray (a shard actor would only add its start); otherwise S shard
    actors. The buffer lives in ``replay.path`` (default: ``replay/`` in the run directory) for later runs.
    """
    from dreamgym.data.transitions import open_transitions
    from dreamgym.replay.seed import seed_from_parquet
    from dreamgym.runs import MetricsLog, create_run_dir

    open_transitions(data)  # a missing or malformed file fails before anything starts
    run_dir = create_run_dir(cfg, "seed-replay")
    rcfg = cfg.replay
    root = Path(rcfg.path) if rcfg.path else (run_dir / "replay" if rcfg.backend != "server" else None)
    if rcfg.shards == 1 and not cfg.ray.address and not os.environ.get("RAY_ADDRESS"):
        buffer: Any = ReplayBuffer.from_config(rcfg, root)
    else:
        from actors.cluster import connect

        connect(cfg.ray)
        buffer = ShardedReplayBuffer.create(rcfg, root)
    try:
        report = seed_from_parquet(buffer, data, batch_size=rcfg.write_batch_size, progress=progress)
        if rcfg.index == "hnsw":
            buffer.optimize()
        counts = buffer.counts()
    finally:
        buffer.close()
    summary = {"data": str(data), "rows": report.rows, **report.result.to_dict(),
               "rows_per_s": round(report.rows_per_s, 1), "seconds": round(report.seconds, 2),
               "real": counts["real"], "synthetic": counts["synthetic"], "shards": rcfg.shards,
               "backend": rcfg.backend, "replay_path": str(root) if root else rcfg.url, "run_dir": str(run_dir)}
    MetricsLog(run_dir).write(event="seed_replay", **summary)
    return summary
