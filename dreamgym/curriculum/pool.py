"""The task pool: seed tasks and generated ones, each with its reward history per iteration.

A ``TaskRecord`` holds one task ``tau`` and what the curriculum knows about it: the rewards of its
latest GRPO groups (one entry per iteration in which it was rolled out), the lifetime counters that
survive the history's truncation, and for generated tasks the parent and the kind of change.
``TaskPool`` keeps records in insertion order (selection and exploration order depend on it) and
indexes what duplicate checks need: task ids, parameter keys and normalised instructions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dreamgym.curriculum.scoring import reward_variance
from dreamgym.types import Task

#: Kinds of generated tasks: a real parameter change, or an instruction written by the experience model.
GENERATED_KINDS = ("param", "llm")


@dataclass
class GroupRecord:
    """The rewards of one GRPO group of a task, rolled out in iteration ``iteration``."""

    iteration: int
    rewards: list[float]
    successes: int
    """Rollouts of the group that succeeded."""

    @property
    def variance(self) -> float:
        """``V_tau`` of this group."""
        return reward_variance(self.rewards)


@dataclass
class TaskRecord:
    """One task of the pool and its history."""

    task: Task
    added_iteration: int = 0
    parent: str | None = None
    """Task id of the task it was generated from (``None`` for seed tasks)."""
    change: str = ""
    """What the generator changed (``numLocations 3->4``, ``text variant``); empty for seed tasks."""
    history: list[GroupRecord] = field(default_factory=list)
    """The latest groups, oldest first (at most ``history_per_task``)."""
    groups: int = 0
    """Groups recorded over the task's lifetime."""
    rollouts: int = 0
    successes: int = 0
    """Successful rollouts over the task's lifetime."""
    selected: int = 0
    """Times the task was put in a batch."""
    children: int = 0
    """Accepted generated tasks with this task as parent."""

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def generated(self) -> bool:
        return self.task.origin == "generated"

    @property
    def tried(self) -> bool:
        return self.groups > 0

    @property
    def variance(self) -> float:
        """``V_tau`` of the latest group (0 when never tried)."""
        return self.history[-1].variance if self.history else 0.0

    @property
    def last_iteration(self) -> int | None:
        return self.history[-1].iteration if self.history else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.to_dict(),
            "added_iteration": self.added_iteration,
            "parent": self.parent,
            "change": self.change,
            "history": [[g.iteration, list(g.rewards), g.successes] for g in self.history],
            "groups": self.groups,
            "rollouts": self.rollouts,
            "successes": self.successes,
            "selected": self.selected,
            "children": self.children,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TaskRecord:
        return TaskRecord(
            task=Task.from_dict(dict(d["task"])),
            added_iteration=int(d["added_iteration"]),
            parent=d["parent"],
            change=str(d["change"]),
            history=[GroupRecord(int(i), [float(r) for r in rs], int(s)) for i, rs, s in d["history"]],
            groups=int(d["groups"]),
            rollouts=int(d["rollouts"]),
            successes=int(d["successes"]),
            selected=int(d["selected"]),
            children=int(d["children"]),
        )


def normalise_instruction(text: str) -> str:
    """Lower-case, single-spaced, without trailing punctuation: the key of exact-duplicate checks."""
    return " ".join(text.lower().split()).rstrip(" .!?")


def param_key(task: Task) -> str:
    """The environment and parameters that reproduce a task (JSON with sorted keys), the key of
    duplicate checks for parameter variants: two tasks with the same key are the same game."""
    return json.dumps({"env": task.env, "params": task.params}, sort_keys=True, default=str)


class TaskPool:
    """Ordered task records with duplicate indexes."""

    def __init__(self, history_per_task: int = 16) -> None:
        self.history_per_task = history_per_task
        self._records: dict[str, TaskRecord] = {}
        self._param_keys: set[str] = set()
        self._instructions: dict[str, str] = {}

    # -- contents ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[TaskRecord]:
        return iter(self._records.values())

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._records

    def get(self, task_id: str) -> TaskRecord:
        try:
            return self._records[task_id]
        except KeyError:
            raise KeyError(f"task {task_id!r} is not in the curriculum's pool") from None

    def records(self) -> list[TaskRecord]:
        return list(self._records.values())

    def count(self, generated: bool | None = None, kind: str | None = None) -> int:
        return sum(
            1 for r in self
            if (generated is None or r.generated == generated) and (kind is None or r.task.kind == kind)
        )

    # -- duplicate indexes ---------------------------------------------------------------------
    def has_params(self, task: Task) -> bool:
        """A task of the pool runs the same game (same env and parameters).

        Text variants share their parent's parameters on purpose, so only tasks whose instruction
        comes from the environment (seed tasks and parameter variants) are indexed.
        """
        return param_key(task) in self._param_keys

    def instruction_owner(self, instruction: str) -> str | None:
        """Task id of a pool task with the same normalised instruction, if any."""
        return self._instructions.get(normalise_instruction(instruction))

    def instructions(self, env: str | None = None) -> list[str]:
        """The distinct instructions of the pool (of one environment)."""
        seen: dict[str, None] = {}
        for r in self:
            if env is None or r.task.env == env:
                seen.setdefault(r.task.instruction, None)
        return list(seen)

    # -- changes -------------------------------------------------------------------------------
    def add(self, record: TaskRecord) -> TaskRecord:
        tid = record.task_id
        if tid in self._records:
            raise ValueError(f"task id {tid!r} is already in the pool")
        self._records[tid] = record
        if record.task.kind != "llm":
            self._param_keys.add(param_key(record.task))
        if record.task.instruction:
            self._instructions.setdefault(normalise_instruction(record.task.instruction), tid)
        return record

    def record_group(self, task_id: str, iteration: int, rewards: Sequence[float], successes: int) -> GroupRecord:
        """Append one group's rewards to a task's history (truncated to ``history_per_task``)."""
        rec = self.get(task_id)
        group = GroupRecord(iteration, [float(r) for r in rewards], int(successes))
        rec.history.append(group)
        del rec.history[:-self.history_per_task]
        rec.groups += 1
        rec.rollouts += len(group.rewards)
        rec.successes += group.successes
        return group

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"history_per_task": self.history_per_task, "records": [r.to_dict() for r in self]}

    @staticmethod
    def from_state_dict(state: dict[str, Any]) -> TaskPool:
        pool = TaskPool(int(state["history_per_task"]))
        for d in state["records"]:
            pool.add(TaskRecord.from_dict(d))
        return pool
