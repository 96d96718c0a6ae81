"""Seeding: stream a transitions Parquet file of any size into a replay buffer.

Memory stays bounded by a few batches (``batch_size`` rows; ``MAX_IN_FLIGHT`` + 1 for a sharded sink)
whatever the file size: rows are read with ``dreamgym.data.transitions.iter_batches`` (schema and values
checked on the way) and written batch by batch. The sink is anything with
``add(transitions, vectors) -> AddResult``: a single-process ``ReplayBuffer`` or the sharded buffer on Ray.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from dreamgym.data.transitions import iter_batches, open_transitions
from dreamgym.replay.buffer import AddResult
from dreamgym.types import Transition

_FIELDS = set(Transition.__dataclass_fields__)


#: Batches a sink with ``add_async`` (the sharded buffer) may hold unacknowledged while the next is read.
MAX_IN_FLIGHT = 2


class ReplaySink(Protocol):
    def add(self, transitions: list[Transition], vectors: np.ndarray | None = None) -> AddResult: ...


class Pending(Protocol):
    def result(self) -> AddResult: ...


@dataclass
class SeedReport:
    path: str
    rows: int
    result: AddResult
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def _transition(row: dict[str, object]) -> Transition:
    t = Transition(**{k: v for k, v in row.items() if k in _FIELDS})  # type: ignore[arg-type]
    if t.valid is None:  # the optional column may be null: offline rows are valid unless marked otherwise
        t.valid = True
    return t


def acknowledged_adds(sink: ReplaySink, batches: Iterable[tuple[list[Transition], np.ndarray | None]]
                      ) -> Iterator[tuple[AddResult, int]]:
    """Add each ``(transitions, vectors)`` batch to ``sink``; yields ``(result, rows)`` as each is acknowledged.

    A sink with ``add_async`` (the sharded buffer) gets up to ``MAX_IN_FLIGHT`` batches at once, so its
    shards write while the caller prepares the next batch; memory stays bounded by those batches.
    """
    submit: Callable[..., Pending] | None = getattr(sink, "add_async", None)
    in_flight: deque[tuple[Pending, int]] = deque()
    for transitions, vectors in batches:
        if submit is None:
            yield sink.add(transitions, vectors), len(transitions)
            continue
        in_flight.append((submit(transitions, vectors), len(transitions)))
        while len(in_flight) > MAX_IN_FLIGHT:
            pending, n = in_flight.popleft()
            yield pending.result(), n
    while in_flight:
        pending, n = in_flight.popleft()
        yield pending.result(), n


def seed_from_parquet(sink: ReplaySink, path: str | Path, batch_size: int = 1024, progress: bool = True) -> SeedReport:
    """Add every row of a transitions file to ``sink``, with a tqdm progress bar (rows) when ``progress``.

    The bar counts acknowledged rows; writes to a sharded buffer are pipelined (``acknowledged_adds``).
    """
    from tqdm import tqdm

    total = open_transitions(path).metadata.num_rows
    batches = (([_transition(r) for r in batch.to_pylist()], None) for batch in iter_batches(path, batch_size))
    result = AddResult()
    rows = 0
    t0 = time.perf_counter()
    with tqdm(total=total, unit="tr", desc=f"seeding {Path(path).name}", disable=not progress, smoothing=0.1) as bar:
        for res, n in acknowledged_adds(sink, batches):
            result += res
            rows += n
            bar.update(n)
            bar.set_postfix(stored=result.stored, dup=result.duplicates, refresh=False)
    return SeedReport(str(path), rows, result, time.perf_counter() - t0)
