"""Vector stores behind one interface (``VectorStore``) and the factory that picks one from the config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dreamgym.replay.storage.base import StoredPoint, VectorStore

if TYPE_CHECKING:
    from dreamgym.config import ReplayConfig

__all__ = ["StoredPoint", "VectorStore", "open_store", "shard_dir"]


def shard_dir(root: str | Path, shard: int) -> Path:
    """Folder of shard ``shard`` under the replay root (``<root>/shard-007``)."""
    return Path(root) / f"shard-{shard:03d}"


def open_store(cfg: ReplayConfig, dim: int, shard: int = 0, root: str | Path | None = None) -> VectorStore:
    """Open (or create) the storage of one shard.

    ``root`` is the replay folder for embedded backends (``None`` with ``local``: in memory); a server
    collection is ``<collection>-s<shard>``.
    """
    if cfg.backend == "edge":
        if root is None:
            raise ValueError("the edge backend stores its shards in a folder: pass root (replay.path)")
        from dreamgym.replay.storage.edge import EdgeStore

        return EdgeStore(shard_dir(root, shard), dim, index=cfg.index, hnsw_m=cfg.hnsw_m,
                         hnsw_ef_construct=cfg.hnsw_ef_construct)

    from dreamgym.replay.storage.client import ClientStore

    common = {"index": cfg.index, "hnsw_m": cfg.hnsw_m, "hnsw_ef_construct": cfg.hnsw_ef_construct}
    if cfg.backend == "local":
        path = shard_dir(root, shard) if root is not None else None
        return ClientStore(dim, cfg.collection, path=path, **common)  # type: ignore[arg-type]
    from dreamgym.secrets import resolve

    return ClientStore(
        dim, f"{cfg.collection}-s{shard}", url=cfg.url, api_key=resolve(cfg.api_key, "replay.api_key"),
        timeout_s=cfg.timeout_s,
        shard_number=cfg.shard_number, replication_factor=cfg.replication_factor,
        on_disk_payload=cfg.on_disk_payload, **common,  # type: ignore[arg-type]
    )
