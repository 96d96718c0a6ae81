"""The experience replay buffer of one process (one shard): DreamGym's memory.

Seeded with offline real transitions and grown with the policy's synthetic ones, it answers, for each
synthetic step, the top-k demonstrations: the stored transitions whose ``phi(s, a)`` is most similar to
the query's. The experience model reads them before predicting the next state and reward.

Data rules, enforced here so every backend behaves the same:

- real transitions are never evicted;
- synthetic transitions are capped (``synthetic_cap``) and the oldest go first (FIFO by ``seq``);
- a transition marked invalid (an experience-model reply that could not be parsed) is never stored,
  so it can never come back as a demonstration;
- exact duplicates are stored once: the point id is a hash of the content (``records.point_id``) and
  a write skips ids already present, which also makes retried writes harmless;
- every stored synthetic transition carries its metadata: iteration, policy version, task id, reward,
  valid flag (plus the source, policy and episode it came from).

Ray does not appear here; ``actors/replay.py`` runs S of these as shard actors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dreamgym.errors import ReplayStorageUnavailableError, SnapshotError, VectorSizeError
from dreamgym.replay.encoder import Encoder, normalise
from dreamgym.replay.filters import Condition, Filters, parse_filters
from dreamgym.replay.records import payload_transition, point_id, point_payload
from dreamgym.replay.storage import StoredPoint, VectorStore, open_store
from dreamgym.types import SOURCES, Demonstration, Trajectory, Transition

if TYPE_CHECKING:
    from dreamgym.config import ReplayConfig

REAL = Condition("source", "eq", "real")
SYNTHETIC = Condition("source", "eq", "synthetic")
LAYOUT_FILE = "layout.json"
#: Extra candidates fetched per search so that ties at the k-th place are broken the same way everywhere.
TIE_MARGIN = 8
#: Most candidates fetched for one query while following a tie at the k-th place.
MAX_TIE_FETCH = 4096


@dataclass
class AddResult:
    """The acknowledgement of a write: what happened to each transition offered."""

    stored: int = 0
    """Newly stored transitions (durable when ``add`` returns)."""
    duplicates: int = 0
    """Exact duplicates of stored (or earlier in the same batch) transitions, not stored again."""
    invalid: int = 0
    """Transitions marked ``valid=False``, never stored."""
    evicted: int = 0
    """Oldest synthetic transitions removed to respect the per-shard cap."""

    def __iadd__(self, other: AddResult) -> AddResult:
        self.stored += other.stored
        self.duplicates += other.duplicates
        self.invalid += other.invalid
        self.evicted += other.evicted
        return self

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class ReplayBuffer:
    """Add, retrieve, count, snapshot and restore transitions in one vector store.

    ``encoder`` computes ``phi(s, a)`` for writes and queries without precomputed vectors; it is loaded on
    first use. ``shard``/``num_shards`` only matter for restoring snapshots with another shard layout.
    """

    def __init__(
        self,
        store: VectorStore,
        encoder: Encoder | None = None,
        *,
        synthetic_cap: int = 100_000,
        demo_sources: Sequence[str] = ("real", "synthetic"),
        k: int = 4,
        exact: bool = True,
        hnsw_ef: int = 128,
        shard: int = 0,
        num_shards: int = 1,
    ) -> None:
        self.store = store
        self.encoder = encoder or Encoder()
        self.synthetic_cap = synthetic_cap
        self.demo_sources = list(demo_sources)
        self.k = k
        self.exact = exact
        self.hnsw_ef = hnsw_ef
        self.shard = shard
        self.num_shards = num_shards
        # Counters are derived from storage on open, so they survive restarts with the data.
        self._real = store.count([REAL])
        self._synthetic = store.count([SYNTHETIC])
        last = store.ordered([], 1, descending=True)
        self._next_seq = int(last[0].payload["seq"]) + 1 if last else 0
        self._session = AddResult()
        self._deleted_since_optimize = 0
        # A crash between a write and its eviction leaves the shard over the cap: settle it now.
        self._evict()

    @classmethod
    def from_config(cls, cfg: ReplayConfig, root: str | Path | None = None, shard: int = 0, num_shards: int = 1,
                    encoder: Encoder | None = None) -> ReplayBuffer:
        """Open shard ``shard`` of ``num_shards`` as the config says (``root`` overrides ``cfg.path``)."""
        encoder = encoder or Encoder(cfg.encoder, cfg.encode_batch_size, threads=cfg.encoder_threads,
                                     dtype=cfg.encoder_dtype)
        root = Path(root) if root is not None else cfg.path
        if cfg.backend != "server" and root is not None:
            check_layout(root, num_shards, encoder, cfg.backend)
        store = open_store(cfg, encoder.dim, shard, root)
        return cls(store, encoder, synthetic_cap=cfg.synthetic_cap, demo_sources=cfg.demo_sources, k=cfg.k,
                   exact=cfg.index == "exact", hnsw_ef=cfg.hnsw_ef, shard=shard, num_shards=num_shards)

    # -- writes ----------------------------------------------------------------------------------
    def add(self, transitions: Sequence[Transition], vectors: np.ndarray | None = None, *, iteration: int = -1,
            policy_version: int | None = None, ids: Sequence[str] | None = None) -> AddResult:
        """Store transitions (skipping invalid ones and exact duplicates); durable when it returns.

        ``vectors``: precomputed ``phi(s, a)`` rows, one per transition (else the encoder computes them).
        ``iteration``: the training iteration that produced them (``-1``: offline data).
        ``policy_version``: weight version of the policy (default: each transition's ``weight_version``).
        ``ids``: their ``records.point_id``s when the caller has them already (the sharded client routes by
        them), so they are not hashed twice.
        """
        res = AddResult()
        if vectors is not None:
            vectors = np.asarray(vectors, dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[0] != len(transitions):
                raise VectorSizeError(
                    f"replay add: got {len(transitions)} transitions but vectors of shape {vectors.shape}; pass one "
                    f"row of size {self.store.dim} per transition, or vectors=None to embed them here"
                )
            self.store.check_vectors(vectors, "replay add")
        if ids is not None and len(ids) != len(transitions):
            raise ValueError(f"replay add: {len(ids)} ids for {len(transitions)} transitions")
        keep: list[int] = []
        keep_ids: list[str] = []
        seen: set[str] = set()
        for i, t in enumerate(transitions):
            if not t.valid:
                res.invalid += 1
                continue
            pid = ids[i] if ids is not None else point_id(t)
            if pid in seen:
                res.duplicates += 1
                continue
            seen.add(pid)
            keep.append(i)
            keep_ids.append(pid)
        present = self.store.existing(keep_ids)
        if present:
            res.duplicates += len(present)
            keep = [i for i, pid in zip(keep, keep_ids, strict=True) if pid not in present]
            keep_ids = [pid for pid in keep_ids if pid not in present]
        if keep:
            new = [transitions[i] for i in keep]
            # Only new transitions are embedded: duplicates cost a hash, not a forward pass.
            vecs = normalise(vectors[keep]) if vectors is not None else self._encode([(t.state, t.action) for t in new])
            payloads = [point_payload(t, iteration, _version(t, policy_version), self._next_seq + j)
                        for j, t in enumerate(new)]
            self._insert(keep_ids, vecs, payloads)
            res.stored = len(new)
        res.evicted = self._evict()
        self._session += res
        return res

    def add_trajectory(self, trajectory: Trajectory, iteration: int = -1) -> AddResult:
        """Store a whole episode; its ``weight_version`` becomes the transitions' policy version."""
        return self.add(trajectory.transitions, iteration=iteration, policy_version=trajectory.weight_version)

    def _encode(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        vecs = self.encoder.encode(pairs)
        if vecs.shape[1] != self.store.dim:
            raise VectorSizeError(
                f"replay: the encoder {self.encoder.name!r} makes {vecs.shape[1]}-d vectors but the collection at "
                f"{self.store.where} holds {self.store.dim}-d ones; set replay.encoder to the model the collection "
                "was built with, or use a new replay.path / replay.collection"
            )
        return vecs

    def _insert(self, ids: list[str], vectors: np.ndarray, payloads: list[dict[str, Any]]) -> None:
        """Write points whose payloads already carry ``seq``; keeps the counters in step."""
        self.store.upsert(ids, vectors, payloads)
        for p in payloads:
            if p["source"] == "real":
                self._real += 1
            else:
                self._synthetic += 1
        self._next_seq = max(self._next_seq, max(int(p["seq"]) for p in payloads) + 1)

    def _evict(self) -> int:
        """Remove the oldest synthetic transitions beyond the cap (FIFO); real ones are never touched."""
        evicted = 0
        while self._synthetic > self.synthetic_cap:
            oldest = self.store.ordered([SYNTHETIC], min(self._synthetic - self.synthetic_cap, 4096))
            if not oldest:
                break
            self.store.delete([p.id for p in oldest])
            self._synthetic -= len(oldest)
            evicted += len(oldest)
        self._deleted_since_optimize += evicted
        if self._deleted_since_optimize > max(10_000, len(self) // 5):
            # Deleted points only cost disk until the segment is vacuumed; do it now and then.
            self.store.optimize()
            self._deleted_since_optimize = 0
        return evicted

    # -- retrieval ---------------------------------------------------------------------------
    def conditions(self, filters: Filters | None) -> list[Condition]:
        """Checked filter conditions, with the default demonstration sources unless ``source`` is given."""
        conds = parse_filters(filters)
        # A condition every point meets (all sources) is left out: it would only slow the search down.
        if not any(c.field == "source" for c in conds) and not set(SOURCES) <= set(self.demo_sources):
            conds.append(Condition("source", "any", list(self.demo_sources)))
        return conds

    def retrieve(self, state: str, action: str, k: int | None = None,
                 filters: Filters | None = None) -> list[Demonstration]:
        """The top-k demonstrations for ``(state, action)``, most similar first."""
        return self.retrieve_batch([(state, action)], k, filters)[0]

    def retrieve_batch(self, queries: Sequence[tuple[str, str]], k: int | None = None,
                       filters: Filters | None = None) -> list[list[Demonstration]]:
        """``retrieve`` for many ``(state, action)`` queries with one encoder pass and one store call."""
        conds = self.conditions(filters)  # checked before paying for the embedding
        if not queries:
            return []
        return self.search_conditions(self._encode(list(queries)), k, conds)

    def search(self, vectors: np.ndarray, k: int | None = None,
               filters: Filters | None = None) -> list[list[Demonstration]]:
        """Top-k demonstrations for precomputed query vectors ``phi(s, a)`` (one list per row)."""
        return self.search_conditions(vectors, k, self.conditions(filters))

    def search_conditions(self, vectors: np.ndarray, k: int | None,
                          conditions: list[Condition]) -> list[list[Demonstration]]:
        k = k or self.k
        v = self.store.check_vectors(vectors, "replay search")
        # Extra candidates so that ties at the k-th place are settled by ``rank``, not by storage order.
        limit = k + TIE_MARGIN
        hits = self.store.search(v, limit, conditions, exact=self.exact, hnsw_ef=self.hnsw_ef)
        out = []
        for i, row in enumerate(hits):
            if len(row) == limit and _key(row[-1]) == _key(row[k - 1]):
                row = self._follow_tie(v[i:i + 1], k, conditions, row)
            out.append([to_demonstration(p) for p in _top(row, k)])
        return out

    def _follow_tie(self, v: np.ndarray, k: int, conditions: list[Condition],
                    row: list[StoredPoint]) -> list[StoredPoint]:
        """Widen one query until the tie at the k-th place ends (bounded by ``MAX_TIE_FETCH``).

        Identical (s, a) with different outcomes are common (the same room and move in many seeds). The
        wider searches fetch ids and scores only; payloads are read for the k winners alone.
        """
        known = {p.id: p for p in row}
        cand, wider = row, len(row)
        while len(cand) == wider and _key(cand[-1]) == _key(cand[k - 1]) and wider < MAX_TIE_FETCH:
            wider = min(wider * 4, MAX_TIE_FETCH)
            cand = self.store.search(v, wider, conditions, exact=self.exact, hnsw_ef=self.hnsw_ef,
                                     with_payload=False)[0]
        top = _top(cand, k)
        known.update({p.id: p for p in self.store.get([p.id for p in top if p.id not in known], with_vectors=False)})
        return [StoredPoint(p.id, known[p.id].payload, score=p.score) for p in top]

    # -- reading -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._real + self._synthetic

    def counts(self) -> dict[str, int]:
        """Stored transitions by source, plus what this process skipped or evicted since it opened."""
        s = self._session
        return {"real": self._real, "synthetic": self._synthetic, "total": len(self),
                "duplicates_skipped": s.duplicates, "invalid_skipped": s.invalid, "evicted": s.evicted}

    def iter_points(self, filters: Filters | None = None, batch_size: int = 1024,
                    with_vectors: bool = False) -> Iterator[list[StoredPoint]]:
        """Stored points in insertion order (``seq``), a page at a time (bounded memory)."""
        conds = parse_filters(filters, "iter_points")
        after: int | None = None
        while True:
            page = self.store.ordered(conds, batch_size, after_seq=after, with_vectors=with_vectors)
            if not page:
                return
            yield page
            after = int(page[-1].payload["seq"])

    def iter_transitions(self, filters: Filters | None = None, batch_size: int = 1024) -> Iterator[Transition]:
        """Every stored transition matching ``filters``, oldest first (training data for the experience model)."""
        for page in self.iter_points(filters, batch_size):
            for p in page:
                yield payload_transition(p.payload)

    def __iter__(self) -> Iterator[Transition]:
        return self.iter_transitions()

    # -- persistence -------------------------------------------------------------------------
    def snapshot(self, directory: str | Path) -> Path:
        """Write every stored point (ids, payloads, vectors) to Parquet files in ``directory``."""
        from dreamgym.replay.snapshot import write_manifest, write_part

        part = write_part(self, directory, "part-000")
        return write_manifest(directory, [part], dim=self.store.dim, encoder=self.encoder.name, num_shards=1)

    def restore(self, directory: str | Path, batch_size: int = 4096) -> int:
        """Load the points of a snapshot that belong to this shard into this (empty) buffer; returns how many.

        With the snapshot's shard layout every payload comes back identical (``seq`` included); with
        another layout this shard keeps the points its hash routes to it, renumbered in snapshot order.
        """
        from dreamgym.replay.snapshot import read_manifest, read_shard

        d = Path(directory)
        m = read_manifest(d)
        if len(self):
            raise SnapshotError(
                f"restore needs an empty replay buffer, but the one at {self.store.where} holds {len(self)} "
                "transitions; restore into a new replay.path (or collection)"
            )
        if m["dim"] != self.store.dim:
            raise SnapshotError(
                f"replay snapshot {d} holds {m['dim']}-d vectors (encoder {m['encoder']!r}) but the buffer at "
                f"{self.store.where} holds {self.store.dim}-d ones; restore it into a buffer built with that encoder "
                "(replay.encoder)"
            )
        restored = 0
        for ids, vecs, payloads in read_shard(d, m, self.shard, self.num_shards, self._next_seq, batch_size):
            self._insert(ids, vecs, payloads)
            restored += len(ids)
        self._evict()
        if not self.exact:
            self.optimize()
        return restored

    def optimize(self) -> None:
        """Build the vector index (``hnsw``) and vacuum deleted points, where the backend does it on request."""
        self.store.optimize()

    def flush(self) -> None:
        self.store.flush()

    def close(self) -> None:
        self.store.close()


def rank(demos: Iterable[Demonstration], k: int) -> list[Demonstration]:
    """The top-k demonstrations, most similar first, in one total order every shard layout agrees on.

    Scores are compared at 1e-6 (the same vectors scored by two segment layouts can differ in the last
    bits), ties by id: the top-k of one buffer then equals the merged top-k of its shards.
    """
    return sorted(demos, key=lambda d: _order(d.score, d.id))[:k]


def _order(score: float | None, point_id: str) -> tuple[float, str]:
    """The one total order of ``rank``: score at 1e-6, most similar first, then id."""
    return -round(score or 0.0, 6), point_id


def _key(p: StoredPoint) -> float:
    """A stored point's score as ``rank`` compares it (ties at the k-th place are detected with it)."""
    return -_order(p.score, p.id)[0]


def _top(points: Iterable[StoredPoint], k: int) -> list[StoredPoint]:
    """``rank`` for stored points (before their payloads are decoded)."""
    return sorted(points, key=lambda p: _order(p.score, p.id))[:k]


def _version(t: Transition, policy_version: int | None) -> int:
    if policy_version is not None:
        return policy_version
    return t.weight_version if t.weight_version is not None else -1


def to_demonstration(p: StoredPoint) -> Demonstration:
    return Demonstration(transition=payload_transition(p.payload), score=float(p.score or 0.0), id=p.id,
                         iteration=int(p.payload.get("iteration", -1)),
                         policy_version=int(p.payload.get("policy_version", -1)))


def check_layout(root: str | Path, num_shards: int, encoder: Encoder, backend: str) -> None:
    """Record (first open) or check (later opens) how a replay folder is sharded and embedded.

    Routing is ``hash(id) mod S``: reopening a folder with another S would store a duplicate on another
    shard, and another encoder would mix incomparable vectors; both are refused with the fix.
    """
    root = Path(root)
    path = root / LAYOUT_FILE
    want = {"num_shards": num_shards, "encoder": encoder.name, "backend": backend}
    if path.is_file():
        try:
            have = json.loads(path.read_text())
        except ValueError:
            have = None
        if not isinstance(have, dict):
            raise ReplayStorageUnavailableError(f"{path} is not valid JSON; it describes the replay folder {root}")
        for key, value in want.items():
            if have.get(key) != value:
                fix = {"num_shards": f"replay.shards: {have.get(key)}", "encoder": f"replay.encoder: {have.get(key)}",
                       "backend": f"replay.backend: {have.get(key)}"}[key]
                raise ReplayStorageUnavailableError(
                    f"the replay folder {root} was built with {key}={have.get(key)!r}, not {value!r}; set {fix} "
                    "to reuse it, or point replay.path at a new folder"
                )
        return
    root.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(want, indent=2) + "\n")
    tmp.replace(path)  # atomic: shards opening together write the same content
