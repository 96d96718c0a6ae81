"""The experience replay buffer: storage of real and synthetic transitions and top-k retrieval.

Modules, one job each:

- ``records``: point ids (content hash), payloads, the text ``phi`` embeds, shard routing;
- ``encoder``: the embedding ``phi(s, a)`` (a sentence-transformers model, batched);
- ``filters``: the retrieval filter language, checked before storage is touched;
- ``storage``: the ``VectorStore`` seam and its backends (qdrant-edge in-process, qdrant-client local
  mode, a Qdrant server or cluster);
- ``buffer``: ``ReplayBuffer``, the data rules (no eviction of real data, FIFO cap on synthetic data,
  invalid transitions never stored, duplicates stored once) and retrieval;
- ``snapshot``: snapshot/restore to Parquet, verified;
- ``seed``: streaming a transitions Parquet file into a buffer.

No Ray here: ``actors/replay.py`` shards the buffer over Ray actors. Nothing heavy is imported by this
package itself; import the submodule you need.
"""
