"""Retrieval filters: a small, backend-neutral language checked before any storage is touched.

A filter is a mapping ``{field: value}`` whose conditions must all hold:

- a scalar (``"twx:coin"``, ``3``, ``True``) matches equal values;
- a list (``["real", "synthetic"]``) matches any of its values (strings or integers);
- a mapping with any of ``gte``, ``gt``, ``lte``, ``lt`` matches a range of an integer field.

Only the fields in ``FILTER_FIELDS`` can be filtered on; anything else is an error naming the valid
ones, so a typo never silently returns unfiltered demonstrations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dreamgym.errors import FilterFieldError

#: Field -> value kind: the payload keys of their own (``records.PAYLOAD_KEYS``).
FILTER_FIELDS: dict[str, Literal["keyword", "integer"]] = {
    "env": "keyword",
    "env_family": "keyword",
    "task_id": "keyword",
    "task_family": "keyword",
    "source": "keyword",
    "policy": "keyword",
    "iteration": "integer",
    "policy_version": "integer",
    "seq": "integer",
}

#: Fields with a payload index (filters on the others scan the candidates). Each index costs every
#: write some work (about 3-4 us a point each in qdrant-edge, measured), so only the fields retrieval and
#: eviction use all the time get one: ``env`` (rollouts retrieve within their environment), ``task_family``,
#: ``source`` (demonstration sources, eviction) and ``seq`` (FIFO eviction and paging order by it).
INDEXED_FIELDS = ("env", "task_family", "source", "seq")

_RANGE_KEYS = ("gte", "gt", "lte", "lt")


@dataclass(frozen=True)
class Condition:
    """One checked condition: ``field`` equals / is any of / lies in a range."""

    field: str
    op: Literal["eq", "any", "range"]
    value: Any


Filters = Mapping[str, Any]


def _type_ok(kind: str, v: Any) -> bool:
    if kind == "keyword":
        return isinstance(v, str)
    if kind == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, int | float) and not isinstance(v, bool)  # range bounds


def parse_filters(filters: Filters | None, where: str = "retrieve") -> list[Condition]:
    """Check a filter mapping and turn it into conditions (raises ``FilterFieldError`` on anything odd)."""
    if not filters:
        return []
    if not isinstance(filters, Mapping):
        raise FilterFieldError(f"{where}: filters must be a mapping {{field: value}}, got {type(filters).__name__}")
    out: list[Condition] = []
    valid = ", ".join(FILTER_FIELDS)
    for field, value in filters.items():
        kind = FILTER_FIELDS.get(field)
        if kind is None:
            raise FilterFieldError(
                f"{where}: unknown filter field {field!r}; the replay buffer can filter on: {valid}"
            )
        if isinstance(value, Mapping):
            bad = [k for k in value if k not in _RANGE_KEYS]
            if bad or not value or kind == "keyword":
                raise FilterFieldError(
                    f"{where}: filter {field!r}={dict(value)!r} is not a range; ranges are mappings with "
                    f"{'/'.join(_RANGE_KEYS)} on numeric fields"
                )
            if not all(_type_ok("float", v) for v in value.values()):
                raise FilterFieldError(f"{where}: range bounds of {field!r} must be numbers, got {dict(value)!r}")
            out.append(Condition(field, "range", {k: float(v) for k, v in value.items()}))
        elif isinstance(value, list | tuple | set | frozenset):
            values = sorted(value) if isinstance(value, set | frozenset) else list(value)
            if not values or not all(_type_ok(kind, v) for v in values):
                raise FilterFieldError(
                    f"{where}: filter {field!r} with a list needs a non-empty list of {kind} values, got {value!r}"
                )
            out.append(Condition(field, "any", values))
        else:
            if not _type_ok(kind, value):
                raise FilterFieldError(f"{where}: filter {field!r} expects a {kind} value, got {value!r}")
            out.append(Condition(field, "eq", value))
    return out

