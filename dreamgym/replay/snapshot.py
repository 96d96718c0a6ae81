"""Replay snapshots: every stored point (id, payload, vector) as Parquet, checked on the way back.

A snapshot folder holds, per part (one part per shard):

- ``part-NNN.transitions.parquet``: the transitions, in the project's transitions schema (with the
  ``valid`` column), so a snapshot is also a dataset ``dreamgym inspect-data`` reads and the experience
  model trains on;
- ``part-NNN.meta.parquet``: row-aligned with it, the point ``id``, ``seq`` (insertion order, which FIFO
  eviction follows), ``iteration``, ``policy_version`` and the stored ``vector``;
- ``manifest.json``, written last: format version, vector size, encoder, shard layout, and the SHA-256
  of every file. A folder without it is an interrupted snapshot.

Restoring verifies checksums, schemas, row counts and that each id is the hash of its row's content
before it writes anything, so a damaged snapshot fails with a ``SnapshotError`` naming the file and
the problem instead of restoring half a buffer.

This module knows the files, not the buffer: ``ReplayBuffer.snapshot`` and ``ReplayBuffer.restore``
(``buffer.py``) call it, never the other way round.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dreamgym.data.transitions import TransitionWriter, iter_batches
from dreamgym.errors import DataSchemaError, SnapshotError
from dreamgym.replay.records import payload_transition, point_id, point_payload, shard_of
from dreamgym.replay.storage import StoredPoint
from dreamgym.types import Transition

FORMAT = "dreamgym-replay-snapshot"
VERSION = 1
MANIFEST = "manifest.json"
FIX = "take a new snapshot, or restore from an intact copy of this folder"


def meta_schema(dim: int) -> pa.Schema:
    return pa.schema([
        pa.field("id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
    ])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Store(Protocol):
    dim: int


class PointSource(Protocol):
    """What ``write_part`` reads: a ``ReplayBuffer`` (its shard, its vector size, its points in ``seq`` order)."""

    shard: int
    store: _Store

    def iter_points(self, filters: Any = None, batch_size: int = 1024,
                    with_vectors: bool = False) -> Iterator[list[StoredPoint]]: ...


# -- writing --------------------------------------------------------------------------------------
def write_part(buffer: PointSource, directory: str | Path, name: str, batch_size: int = 4096) -> dict[str, Any]:
    """Write every point of ``buffer`` as part ``name`` (streamed a page at a time); returns its manifest entry."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tpath, mpath = d / f"{name}.transitions.parquet", d / f"{name}.meta.parquet"
    schema = meta_schema(buffer.store.dim)
    rows = 0
    with TransitionWriter(tpath, optional=("valid",)) as tw, pq.ParquetWriter(mpath, schema, compression="zstd") as mw:
        for page in buffer.iter_points(batch_size=batch_size, with_vectors=True):
            tw.write([payload_transition(p.payload) for p in page])
            vecs = np.stack([p.vector for p in page]).astype(np.float32)  # type: ignore[misc]
            mw.write_table(pa.table({
                "id": [p.id for p in page],
                "seq": [int(p.payload["seq"]) for p in page],
                "iteration": [int(p.payload.get("iteration", -1)) for p in page],
                "policy_version": [int(p.payload.get("policy_version", -1)) for p in page],
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel(), pa.float32()), buffer.store.dim),
            }, schema=schema))
            rows += len(page)
    return {"name": name, "shard": buffer.shard, "rows": rows,
            "files": {p.name: sha256_file(p) for p in (tpath, mpath)}}


def write_manifest(directory: str | Path, parts: list[dict[str, Any]], dim: int, encoder: str,
                   num_shards: int) -> Path:
    """Write ``manifest.json`` last and atomically: its presence marks a complete snapshot."""
    d = Path(directory)
    manifest = {"format": FORMAT, "version": VERSION, "dim": dim, "encoder": encoder, "num_shards": num_shards,
                "rows": sum(p["rows"] for p in parts), "created": time.time(),
                "parts": sorted(parts, key=lambda p: p["name"])}
    tmp = d / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(d / MANIFEST)
    return d


# -- reading --------------------------------------------------------------------------------------
def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a snapshot folder, checked for shape (not yet the files)."""
    d = Path(directory)
    path = d / MANIFEST
    if not d.is_dir():
        raise SnapshotError(f"replay snapshot folder not found: {d}")
    if not path.is_file():
        raise SnapshotError(
            f"{d} is not a complete replay snapshot: {MANIFEST} is missing (the snapshot was interrupted or this is "
            f"another folder); {FIX}"
        )
    try:
        m = json.loads(path.read_text())
    except ValueError as e:
        raise SnapshotError(f"{path} is not valid JSON ({e}); {FIX}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise SnapshotError(f"{path} is not a dreamgym replay snapshot manifest (format {FORMAT!r} expected); {FIX}")
    if m.get("version") != VERSION:
        raise SnapshotError(f"{path} has snapshot version {m.get('version')!r}; this dreamgym reads version {VERSION}")
    for key, typ in (("dim", int), ("num_shards", int), ("parts", list), ("encoder", str)):
        if not isinstance(m.get(key), typ):
            raise SnapshotError(f"{path}: field {key!r} is missing or not a {typ.__name__}; {FIX}")
    for p in m["parts"]:
        if not (isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("rows"), int)
                and isinstance(p.get("shard"), int) and isinstance(p.get("files"), dict) and len(p["files"]) == 2):
            raise SnapshotError(f"{path}: malformed part entry {p!r}; {FIX}")
    return m


def verify_part(directory: str | Path, part: dict[str, Any]) -> None:
    """Check that both files of a part exist and have the checksums the manifest recorded."""
    d = Path(directory)
    for fname, digest in part["files"].items():
        f = d / fname
        if not f.is_file():
            raise SnapshotError(f"replay snapshot {d}: file {fname} listed in {MANIFEST} is missing; {FIX}")
        if sha256_file(f) != digest:
            raise SnapshotError(
                f"replay snapshot {d}: {fname} is corrupt (its SHA-256 differs from the one in {MANIFEST}: the file "
                f"was truncated or modified); {FIX}"
            )


def iter_part(directory: str | Path, part: dict[str, Any], dim: int,
              batch_size: int = 4096) -> Iterator[tuple[list[str], np.ndarray, list[dict[str, Any]]]]:
    """Stream a part as ``(ids, vectors, payloads)`` batches, checking schema, alignment and ids."""
    d = Path(directory)
    name = part["name"]
    tpath, mpath = d / f"{name}.transitions.parquet", d / f"{name}.meta.parquet"
    try:
        meta = pq.ParquetFile(mpath)
    except (pa.ArrowInvalid, OSError) as e:
        raise SnapshotError(f"replay snapshot {d}: {mpath.name} is not readable Parquet ({e}); {FIX}") from None
    if not meta.schema_arrow.equals(meta_schema(dim)):
        raise SnapshotError(
            f"replay snapshot {d}: {mpath.name} has schema {meta.schema_arrow} but {meta_schema(dim)} was expected "
            f"(vectors of size {dim}); {FIX}"
        )
    if meta.metadata.num_rows != part["rows"]:
        raise SnapshotError(f"replay snapshot {d}: {mpath.name} has {meta.metadata.num_rows} rows, {MANIFEST} says "
                            f"{part['rows']}; {FIX}")
    taker = _RowTaker(meta.iter_batches(batch_size=batch_size))
    seen = 0
    try:
        for tb in iter_batches(tpath, batch_size):
            mb = taker.take(tb.num_rows)
            if mb.num_rows != tb.num_rows:
                raise SnapshotError(f"replay snapshot {d}: {tpath.name} has more rows than {mpath.name}; {FIX}")
            ids = mb.column("id").to_pylist()
            flat = mb.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            vecs = flat.reshape(-1, dim).astype(np.float32)
            payloads = []
            for row, pid, seq, it, pv in zip(tb.to_pylist(), ids, mb.column("seq").to_pylist(),
                                             mb.column("iteration").to_pylist(),
                                             mb.column("policy_version").to_pylist(), strict=True):
                t = Transition(**row)
                if point_id(t) != pid:
                    raise SnapshotError(
                        f"replay snapshot {d}: row {seen + len(payloads)} of part {name} has id {pid} but its "
                        f"content hashes to {point_id(t)} (the files do not belong together or were edited); {FIX}"
                    )
                payloads.append(point_payload(t, it, pv, seq))
            seen += len(ids)
            yield ids, vecs, payloads
    except DataSchemaError as e:
        raise SnapshotError(f"replay snapshot {d}: {e}; {FIX}") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise SnapshotError(f"replay snapshot {d}: part {name} cannot be read ({e}); {FIX}") from None
    if seen != part["rows"]:
        raise SnapshotError(f"replay snapshot {d}: part {name} has {seen} rows, {MANIFEST} says {part['rows']}; {FIX}")


class _RowTaker:
    """Hands out the next ``n`` rows of a batch stream (Parquet batch sizes of two files need not line up)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._pending: pa.Table | None = None

    def take(self, n: int) -> pa.Table:
        tables = [self._pending] if self._pending is not None else []
        have = self._pending.num_rows if self._pending is not None else 0
        while have < n:
            b = next(self._batches, None)
            if b is None:
                break
            tables.append(pa.Table.from_batches([b]))
            have += b.num_rows
        if not tables:
            return pa.table({})
        table = pa.concat_tables(tables)
        self._pending = table.slice(n) if table.num_rows > n else None
        return table.slice(0, n)


# -- restoring ------------------------------------------------------------------------------------
def read_shard(directory: str | Path, manifest: dict[str, Any], shard: int, num_shards: int, first_seq: int,
               batch_size: int = 4096) -> Iterator[tuple[list[str], np.ndarray, list[dict[str, Any]]]]:
    """The points of the snapshot that belong to shard ``shard`` of ``num_shards``, as ``(ids, vectors,
    payloads)`` batches ready for ``ReplayBuffer.restore`` to insert; every checksum is verified first.

    With the same shard layout as the snapshot, the shard's own part is read and every payload is
    identical (``seq`` included). With another layout, every part is read, the rows whose hash routes to
    ``shard`` are kept and ``seq`` is renumbered from ``first_seq`` in snapshot order.
    """
    d = Path(directory)
    same = manifest["num_shards"] == num_shards
    parts = [p for p in manifest["parts"] if p["shard"] == shard] if same else list(manifest["parts"])
    for p in parts:  # all checksums first: a damaged snapshot must not restore half a buffer
        verify_part(d, p)
    seq = first_seq
    for p in parts:
        for ids, vecs, payloads in iter_part(d, p, manifest["dim"], batch_size):
            if not same:
                keep = [i for i, pid in enumerate(ids) if shard_of(pid, num_shards) == shard]
                ids, vecs = [ids[i] for i in keep], vecs[keep]
                payloads = [payloads[i] for i in keep]
                for pl in payloads:
                    pl["seq"] = seq
                    seq += 1
            if ids:
                yield ids, vecs, payloads
