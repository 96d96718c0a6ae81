"""The transitions Parquet format: schema, streaming writer, checked reader.

This is the one place the offline-data schema is written down. One row per transition
``(s_t, a_t) -> (s_{t+1}, r_{t+1})``:

==================  =================  ==========================================================
column              type               meaning
==================  =================  ==========================================================
episode_id          string             unique id of the episode the step belongs to
step                int32              0-based step index inside the episode
task_id             string             stable task id (see ``dreamgym.types.Task``)
env                 string             environment spec, e.g. ``twx:coin``
instruction         string             the task instruction shown to the agent
state               string             abstract state ``s_t`` before the action
action              string             the action ``a_t`` as sent to the environment
next_state          string             abstract state ``s_{t+1}`` after the action
reward              float64            reward ``r_{t+1}`` of this step
done                bool               the episode ended with this step
success             bool               the task was accomplished (at the final step)
admissible_actions  list<string>       valid actions in ``s_t`` (null where unknown)
source              string             ``real`` or ``synthetic``
policy              string             the policy that chose the action (``gold``, ``random``...)
==================  =================  ==========================================================

Optional columns (added by later stages, checked when present):
``valid`` (bool), ``reasoning`` (string), ``reasoning_source`` (string: ``teacher``/``template``).
Any other column is refused, so typos do not silently pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dreamgym.errors import DataSchemaError
from dreamgym.types import SOURCES, Transition

REQUIRED: dict[str, pa.DataType] = {
    "episode_id": pa.string(),
    "step": pa.int32(),
    "task_id": pa.string(),
    "env": pa.string(),
    "instruction": pa.string(),
    "state": pa.string(),
    "action": pa.string(),
    "next_state": pa.string(),
    "reward": pa.float64(),
    "done": pa.bool_(),
    "success": pa.bool_(),
    "admissible_actions": pa.list_(pa.string()),
    "source": pa.string(),
    "policy": pa.string(),
}
OPTIONAL: dict[str, pa.DataType] = {
    "valid": pa.bool_(),
    "reasoning": pa.string(),
    "reasoning_source": pa.string(),
}
NOT_NULL = ("episode_id", "step", "task_id", "env", "state", "action", "next_state", "reward", "done",
            "success", "source")

TRANSITION_SCHEMA = pa.schema([pa.field(k, v) for k, v in REQUIRED.items()])


def schema_with(*optional: str) -> pa.Schema:
    """The required schema plus the named optional columns."""
    return pa.schema([*TRANSITION_SCHEMA, *(pa.field(c, OPTIONAL[c]) for c in optional)])


def check_schema(schema: pa.Schema, where: str) -> None:
    """Refuse a schema that is not the transitions schema, naming the column and the problem."""
    names = set(schema.names)
    for col, typ in REQUIRED.items():
        if col not in names:
            raise DataSchemaError(f"{where}: missing required column {col!r} ({typ})")
    for field in schema:
        expected = REQUIRED.get(field.name, OPTIONAL.get(field.name))
        if expected is None:
            known = ", ".join([*REQUIRED, *OPTIONAL])
            raise DataSchemaError(f"{where}: unknown column {field.name!r}; the transitions schema has: {known}")
        if not field.type.equals(expected):
            raise DataSchemaError(
                f"{where}: column {field.name!r} has type {field.type}, expected {expected}"
            )


def _check_values(table: pa.Table | pa.RecordBatch, where: str) -> None:
    import pyarrow.compute as pc

    for col in NOT_NULL:
        nulls = table.column(col).null_count
        if nulls:
            raise DataSchemaError(f"{where}: column {col!r} has {nulls} null value(s); it must be set on every row")
    bad = pc.invert(pc.is_in(table.column("source"), value_set=pa.array(SOURCES)))
    if pc.any(bad).as_py():
        first = table.column("source").filter(bad)[0].as_py()
        raise DataSchemaError(f"{where}: column 'source' has value {first!r}; allowed: {', '.join(SOURCES)}")
    if pc.any(pc.less(table.column("step"), 0)).as_py():
        raise DataSchemaError(f"{where}: column 'step' has negative values")


def transitions_to_batch(transitions: Iterable[Transition | dict[str, Any]], *optional: str) -> pa.RecordBatch:
    """Build a record batch (required columns plus ``optional``) from transitions or dict rows."""
    rows = [t.to_dict() if isinstance(t, Transition) else t for t in transitions]
    schema = schema_with(*optional)
    columns = {name: [r.get(name) for r in rows] for name in schema.names}
    return pa.RecordBatch.from_pydict(columns, schema=schema)


class TransitionWriter:
    """Streams transitions into a Parquet file, one row group per ``write`` call.

    Memory stays bounded by the largest batch written. The file is written to ``<path>.partial``
    and renamed on ``close`` so a crashed run never leaves a truncated file under the final name.
    """

    def __init__(self, path: str | Path, optional: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self.optional = optional
        self.schema = schema_with(*optional)
        self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")
        self.rows = 0

    def write(self, batch: pa.RecordBatch | pa.Table | Iterable[Transition | dict[str, Any]]) -> None:
        if not isinstance(batch, pa.RecordBatch | pa.Table):
            batch = transitions_to_batch(batch, *self.optional)
        if batch.num_rows == 0:
            return
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        self._writer.write_table(table.cast(self.schema))
        self.rows += batch.num_rows

    def close(self) -> Path:
        self._writer.close()
        self._tmp.replace(self.path)
        return self.path

    def abort(self) -> None:
        self._writer.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> TransitionWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def open_transitions(path: str | Path) -> pq.ParquetFile:
    """Open a transitions file after checking that it is Parquet with the documented schema."""
    p = Path(path)
    if not p.is_file():
        raise DataSchemaError(f"transitions file not found: {p}")
    try:
        pf = pq.ParquetFile(p)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataSchemaError(f"{p} is not a readable Parquet file: {e}") from None
    check_schema(pf.schema_arrow, str(p))
    return pf


def iter_batches(
    path: str | Path, batch_size: int = 4096, columns: list[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """Stream a transitions file in batches (bounded memory), checking values on the way."""
    pf = open_transitions(path)
    for batch in pf.iter_batches(batch_size=batch_size, columns=columns):
        if columns is None:
            _check_values(batch, str(path))
        yield batch


def read_transitions(path: str | Path) -> pa.Table:
    """Read a whole (small) transitions file, checked."""
    return pa.Table.from_batches(list(iter_batches(path)), schema=open_transitions(path).schema_arrow)


def iter_transitions(path: str | Path, batch_size: int = 4096) -> Iterator[Transition]:
    """Stream a file as ``Transition`` objects (optional columns other than ``valid`` are dropped)."""
    fields = set(Transition.__dataclass_fields__)
    for batch in iter_batches(path, batch_size):
        for row in batch.to_pylist():
            yield Transition(**{k: v for k, v in row.items() if k in fields})


def summarise(path: str | Path) -> dict[str, Any]:
    """Counts a user wants to see about a transitions file (after checking it)."""
    import pyarrow.compute as pc

    table = read_transitions(path)
    last = table.filter(table.column("done"))
    episodes = pc.count_distinct(table.column("episode_id")).as_py()
    return {
        "path": str(path),
        "transitions": table.num_rows,
        "episodes": episodes,
        "envs": sorted(set(table.column("env").to_pylist())),
        "policies": sorted(set(table.column("policy").to_pylist())),
        "tasks": pc.count_distinct(table.column("task_id")).as_py(),
        "success_rate": round(pc.sum(last.column("success")).as_py() / max(episodes, 1), 4) if episodes else 0.0,
        "mean_reward_per_step": round(pc.mean(table.column("reward")).as_py() or 0.0, 4),
    }
