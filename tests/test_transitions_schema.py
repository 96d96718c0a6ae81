"""The transitions Parquet format: written in one place, checked on read, refused with the column."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dreamgym.data.transitions import (
    TRANSITION_SCHEMA,
    TransitionWriter,
    iter_transitions,
    read_transitions,
    summarise,
)
from dreamgym.errors import DataSchemaError
from dreamgym.types import Transition


def _t(i: int, done: bool = False, **kw) -> Transition:
    base = dict(episode_id="e0", step=i, task_id="twx:coin/0", env="twx:coin", instruction="find the coin",
                state=f"s{i}", action=f"a{i}", next_state=f"s{i + 1}", reward=1.0 if done else 0.0, done=done,
                success=done, admissible_actions=["look around", f"a{i}"], source="real", policy="random")
    base.update(kw)
    return Transition(**base)


def test_write_read_round_trip(tmp_path) -> None:
    rows = [_t(0), _t(1), _t(2, done=True)]
    path = tmp_path / "d.parquet"
    with TransitionWriter(path) as w:
        w.write(rows[:2])
        w.write(rows[2:])
    assert not (tmp_path / "d.parquet.partial").exists()
    assert pq.ParquetFile(path).metadata.num_row_groups == 2
    assert list(iter_transitions(path)) == rows
    s = summarise(path)
    assert (s["transitions"], s["episodes"], s["success_rate"]) == (3, 1, 1.0)


def test_failed_write_leaves_no_file(tmp_path) -> None:
    path = tmp_path / "d.parquet"
    with pytest.raises(RuntimeError), TransitionWriter(path) as w:
        w.write([_t(0)])
        raise RuntimeError("crash mid-collection")
    assert not path.exists() and not (tmp_path / "d.parquet.partial").exists()


def _write_table(path, table: pa.Table) -> None:
    pq.write_table(table, path)


def test_missing_column_is_named(tmp_path) -> None:
    table = pa.Table.from_batches([pa.RecordBatch.from_pylist([_t(0).to_dict()], schema=TRANSITION_SCHEMA)])
    _write_table(tmp_path / "m.parquet", table.drop_columns(["next_state"]))
    with pytest.raises(DataSchemaError, match="missing required column 'next_state'"):
        read_transitions(tmp_path / "m.parquet")


def test_wrong_type_is_named(tmp_path) -> None:
    table = pa.Table.from_batches([pa.RecordBatch.from_pylist([_t(0).to_dict()], schema=TRANSITION_SCHEMA)])
    idx = table.schema.get_field_index("reward")
    table = table.set_column(idx, "reward", pa.array(["high"]))
    _write_table(tmp_path / "t.parquet", table)
    with pytest.raises(DataSchemaError, match="column 'reward' has type string, expected double"):
        read_transitions(tmp_path / "t.parquet")


def test_unknown_column_and_bad_values(tmp_path) -> None:
    table = pa.Table.from_batches([pa.RecordBatch.from_pylist([_t(0).to_dict()], schema=TRANSITION_SCHEMA)])
    _write_table(tmp_path / "u.parquet", table.append_column("rewrd", pa.array([1.0])))
    with pytest.raises(DataSchemaError, match="unknown column 'rewrd'"):
        read_transitions(tmp_path / "u.parquet")
    bad = pa.Table.from_batches([pa.RecordBatch.from_pylist([_t(0, source="dreamed").to_dict()],
                                                            schema=TRANSITION_SCHEMA)])
    _write_table(tmp_path / "s.parquet", bad)
    with pytest.raises(DataSchemaError, match="column 'source' has value 'dreamed'"):
        read_transitions(tmp_path / "s.parquet")


def test_not_parquet_and_missing(tmp_path) -> None:
    (tmp_path / "x.parquet").write_text("this is not parquet")
    with pytest.raises(DataSchemaError, match="not a readable Parquet file"):
        read_transitions(tmp_path / "x.parquet")
    with pytest.raises(DataSchemaError, match="not found"):
        read_transitions(tmp_path / "none.parquet")
