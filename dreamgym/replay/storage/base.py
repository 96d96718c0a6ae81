"""The one seam between the replay buffer and a vector store.

Every backend (Qdrant's engine in-process, qdrant-client's local mode, a Qdrant server or cluster)
implements this small interface with the same behaviour, so the buffer's data rules (dedup, eviction,
snapshots) are written once. Points carry a ``seq`` payload field, a per-store insertion counter, which
``ordered`` pages through: that gives FIFO eviction and stable snapshot order on every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dreamgym.errors import VectorSizeError
from dreamgym.replay.filters import Condition


@dataclass
class StoredPoint:
    """A point read back from a store (``score`` set by searches, ``vector`` when asked for)."""

    id: str
    payload: dict[str, Any]
    vector: np.ndarray | None = None
    score: float | None = None


class VectorStore(ABC):
    """A collection of ``(id, unit vector, payload)`` ranked by dot product.

    ``ids`` are UUID strings; vectors are float32 rows of length ``dim``.
    """

    dim: int
    where: str
    """Human-readable location (folder or URL and collection) for error messages."""

    def check_vectors(self, vectors: np.ndarray, what: str) -> np.ndarray:
        """Refuse vectors of the wrong shape, naming the store and how to fix it."""
        v = np.asarray(vectors, dtype=np.float32)
        if v.ndim != 2 or v.shape[1] != self.dim:
            got = v.shape[1] if v.ndim == 2 else f"an array of shape {v.shape}"
            raise VectorSizeError(
                f"{what}: vectors have size {got} but the replay collection at {self.where} holds {self.dim}-d "
                "vectors; use the encoder the collection was built with (replay.encoder), or start a new "
                "collection (another replay.path / replay.collection)"
            )
        return v

    @abstractmethod
    def upsert(self, ids: Sequence[str], vectors: np.ndarray, payloads: Sequence[dict[str, Any]]) -> None:
        """Write points; returns once they are durable (for persistent backends)."""

    @abstractmethod
    def delete(self, ids: Sequence[str]) -> None:
        """Remove points by id (unknown ids are ignored)."""

    @abstractmethod
    def existing(self, ids: Sequence[str]) -> set[str]:
        """The subset of ``ids`` already stored."""

    @abstractmethod
    def search(self, vectors: np.ndarray, k: int, conditions: Sequence[Condition], exact: bool,
               hnsw_ef: int | None = None, with_payload: bool = True) -> list[list[StoredPoint]]:
        """Top-``k`` points by dot product for each query row, among points matching all ``conditions``
        (``with_payload=False``: ids and scores only, payloads empty)."""

    @abstractmethod
    def get(self, ids: Sequence[str], with_vectors: bool = True) -> list[StoredPoint]:
        """Points by id (missing ids are skipped; order is not guaranteed)."""

    @abstractmethod
    def count(self, conditions: Sequence[Condition] = ()) -> int:
        """Exact number of points matching ``conditions``."""

    @abstractmethod
    def ordered(self, conditions: Sequence[Condition], limit: int, after_seq: int | None = None,
                with_vectors: bool = False, descending: bool = False) -> list[StoredPoint]:
        """Up to ``limit`` points matching ``conditions`` in ``seq`` order, starting after ``after_seq``
        (ascending: ``seq > after_seq``; descending: ``seq < after_seq``)."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Persist buffered state (backends whose writes are already durable need nothing)."""

    def optimize(self) -> None:  # noqa: B027 - optional hook
        """Build indexes / vacuum deleted points where the backend does that on request."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files, locks and connections."""
