"""Stores reached through ``qdrant-client``: its local mode (in memory or in a folder) and a Qdrant server.

The same class serves both because qdrant-client's local mode speaks the server's API: what differs is
how the client is built. On a server (or a distributed cluster) the collection is created with
``shard_number`` and ``replication_factor``, payload optionally on disk, and every write waits for the
server's acknowledgement (``wait=True``), which is the server's durability guarantee.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dreamgym.errors import ReplayStorageUnavailableError
from dreamgym.replay.filters import FILTER_FIELDS, INDEXED_FIELDS, Condition
from dreamgym.replay.storage.base import StoredPoint, VectorStore

logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise


class ClientStore(VectorStore):
    """One collection through ``qdrant_client.QdrantClient`` (``location``: ``:memory:``, a folder or a URL)."""

    def __init__(
        self,
        dim: int,
        collection: str,
        *,
        path: str | Path | None = None,
        url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        index: str = "exact",
        hnsw_m: int = 16,
        hnsw_ef_construct: int = 100,
        shard_number: int = 1,
        replication_factor: int = 1,
        on_disk_payload: bool = True,
    ) -> None:
        from qdrant_client import QdrantClient, models

        self._m = models
        self.collection = collection
        self.remote = url is not None
        if url is not None:
            self.where = f"{url} (collection {collection!r})"
            self._client = QdrantClient(url=url, api_key=api_key, timeout=max(1, int(timeout_s)),
                                        check_compatibility=False)
        else:
            self.where = f"{path} (collection {collection!r})" if path else f"memory (collection {collection!r})"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # local mode warns that it is not a server; we know
                self._client = QdrantClient(path=str(path)) if path else QdrantClient(location=":memory:")
        try:
            exists = self._client.collection_exists(collection)
        except Exception as e:
            raise ReplayStorageUnavailableError(
                f"cannot reach the Qdrant server at {url}: {_reason(e)}. Start it (see cluster/qdrant.md), fix "
                "replay.url / replay.api_key, or use the embedded store (replay.backend: edge)"
            ) from None
        if exists:
            info = self._client.get_collection(collection)
            vectors = info.config.params.vectors
            self.dim = int(vectors.size) if isinstance(vectors, models.VectorParams) else dim
            return
        self.dim = dim
        self._client.create_collection(
            collection,
            vectors_config=models.VectorParams(size=dim, distance=models.Distance.DOT),
            hnsw_config=models.HnswConfigDiff(m=hnsw_m, ef_construct=hnsw_ef_construct),
            # indexing_threshold=0 disables HNSW building: exact search over plain segments.
            optimizers_config=models.OptimizersConfigDiff(indexing_threshold=0) if index == "exact" else None,
            **({"shard_number": shard_number, "replication_factor": replication_factor,
                "on_disk_payload": on_disk_payload} if self.remote else {}),
        )
        if self.remote:  # local mode ignores payload indexes (and warns); a server needs them
            schema = {"keyword": models.PayloadSchemaType.KEYWORD, "integer": models.PayloadSchemaType.INTEGER}
            for field in INDEXED_FIELDS:
                self._client.create_payload_index(collection, field, field_schema=schema[FILTER_FIELDS[field]],
                                                  wait=True)

    # -- filters -------------------------------------------------------------------------------
    def _filter(self, conditions: Sequence[Condition], after_seq: int | None = None,
                descending: bool = False) -> Any:
        m = self._m
        must: list[Any] = []
        for c in conditions:
            if c.op == "eq":
                must.append(m.FieldCondition(key=c.field, match=m.MatchValue(value=c.value)))
            elif c.op == "any":
                must.append(m.FieldCondition(key=c.field, match=m.MatchAny(any=list(c.value))))
            else:
                must.append(m.FieldCondition(key=c.field, range=m.Range(**c.value)))
        if after_seq is not None:
            bound = {"lt": float(after_seq)} if descending else {"gt": float(after_seq)}
            must.append(m.FieldCondition(key="seq", range=m.Range(**bound)))
        return m.Filter(must=must) if must else None

    @staticmethod
    def _point(r: Any, with_vector: bool) -> StoredPoint:
        vec = np.asarray(r.vector, dtype=np.float32) if with_vector and r.vector is not None else None
        return StoredPoint(id=str(r.id), payload=dict(r.payload or {}), vector=vec, score=getattr(r, "score", None))

    # -- VectorStore -------------------------------------------------------------------------
    def upsert(self, ids: Sequence[str], vectors: np.ndarray, payloads: Sequence[dict[str, Any]]) -> None:
        v = self.check_vectors(vectors, "replay upsert")
        if len(ids):
            batch = self._m.Batch(ids=list(ids), vectors=v.tolist(), payloads=list(payloads))
            self._client.upsert(self.collection, points=batch, wait=True)

    def delete(self, ids: Sequence[str]) -> None:
        if ids:
            self._client.delete(self.collection, points_selector=self._m.PointIdsList(points=list(ids)), wait=True)

    def existing(self, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        recs = self._client.retrieve(self.collection, list(ids), with_payload=False, with_vectors=False)
        return {str(r.id) for r in recs}

    def search(self, vectors: np.ndarray, k: int, conditions: Sequence[Condition], exact: bool,
               hnsw_ef: int | None = None, with_payload: bool = True) -> list[list[StoredPoint]]:
        m = self._m
        v = self.check_vectors(vectors, "replay search")
        flt = self._filter(conditions)
        # Local mode always searches exactly (and warns about search params); a server honours them.
        params = m.SearchParams(exact=exact, hnsw_ef=None if exact else hnsw_ef) if self.remote else None
        reqs = [m.QueryRequest(query=row, limit=k, filter=flt, params=params, with_payload=with_payload)
                for row in v.tolist()]
        results = self._client.query_batch_points(self.collection, requests=reqs)
        return [[self._point(p, False) for p in res.points] for res in results]

    def get(self, ids: Sequence[str], with_vectors: bool = True) -> list[StoredPoint]:
        if not ids:
            return []
        recs = self._client.retrieve(self.collection, list(ids), with_payload=True, with_vectors=with_vectors)
        return [self._point(r, with_vectors) for r in recs]

    def count(self, conditions: Sequence[Condition] = ()) -> int:
        return int(self._client.count(self.collection, count_filter=self._filter(conditions), exact=True).count)

    def ordered(self, conditions: Sequence[Condition], limit: int, after_seq: int | None = None,
                with_vectors: bool = False, descending: bool = False) -> list[StoredPoint]:
        m = self._m
        direction = m.Direction.DESC if descending else m.Direction.ASC
        recs, _ = self._client.scroll(
            self.collection, scroll_filter=self._filter(conditions, after_seq, descending), limit=limit,
            with_payload=True, with_vectors=with_vectors, order_by=m.OrderBy(key="seq", direction=direction),
        )
        return [self._point(r, with_vectors) for r in recs]

    def close(self) -> None:
        self._client.close()


def _reason(e: BaseException) -> str:
    """The innermost cause of a connection failure, e.g. ``[Errno 111] Connection refused``."""
    inner: BaseException | None = e
    while inner is not None and (inner.__cause__ or inner.__context__) is not None:
        inner = inner.__cause__ or inner.__context__
    text = str(inner or e) or type(e).__name__
    return text if len(text) < 300 else text[:300] + "..."

