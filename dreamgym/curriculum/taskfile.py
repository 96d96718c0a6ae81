"""Seed tasks from a file: YAML (a list of tasks, or a mapping with a ``tasks`` list) or JSONL (one
task per line). Each task is a mapping::

    instruction: "Find the coin and take it."   # required, non-empty text
    task_id: coin-7                              # optional, unique; default <env>/file/<index>
    env: twx:coin                                # optional; must be the run's environment
    params: {seed: 7, numLocations: 4}           # optional; scalars only

Every problem is reported with the file, the task's position (JSONL: its line) and what is allowed.
For TextWorldExpress and ScienceWorld the parameters are checked against the game's grammar without
starting the engine (twx: known game parameters and a ``seed``; sciworld: a ``variation``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dreamgym.errors import ConfigError, DreamGymError
from dreamgym.types import Task

_KEYS = ("task_id", "instruction", "env", "params")
_SCALARS = (str, int, float, bool)


def load_task_file(path: str | Path, env: str) -> list[Task]:
    """Read and validate the seed tasks of ``path`` for environment ``env`` (``family:name``)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"task file not found: {p}")
    entries = _read_entries(p)
    if not entries:
        raise ConfigError(f"task file {p} holds no tasks")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for where, entry in entries:
        task = _task(entry, env, default_id=f"{env}/file/{len(tasks)}", where=f"{p} {where}")
        if task.task_id in seen:
            raise ConfigError(f"{p} {where}: task_id {task.task_id!r} repeats the one at {seen[task.task_id]}")
        seen[task.task_id] = where
        tasks.append(task)
    return tasks


def _read_entries(p: Path) -> list[tuple[str, Any]]:
    text = p.read_text()
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        out = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append((f"line {lineno}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{p} line {lineno}: not valid JSON ({e.msg})") from None
        return out
    if p.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"task file {p} must end in .yaml, .yml, .json or .jsonl")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"task file {p} is not valid YAML: {e}") from None
    if isinstance(data, dict) and set(data) == {"tasks"}:
        data = data["tasks"]
    if not isinstance(data, list):
        raise ConfigError(f"task file {p} must hold a list of tasks (or a mapping with one key 'tasks')")
    return [(f"task {i}", d) for i, d in enumerate(data)]


def _task(entry: Any, env: str, default_id: str, where: str) -> Task:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: a task must be a mapping with keys {', '.join(_KEYS)}, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed keys: {', '.join(_KEYS)}")
    instruction = entry.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise ConfigError(f"{where}: 'instruction' must be non-empty text")
    task_env = entry.get("env", env)
    if task_env != env:
        raise ConfigError(f"{where}: env {task_env!r} is not this run's environment {env!r} (env.name)")
    task_id = entry.get("task_id", default_id)
    if not isinstance(task_id, str | int) or not str(task_id).strip():
        raise ConfigError(f"{where}: 'task_id' must be non-empty text")
    params = entry.get("params") or {}
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        raise ConfigError(f"{where}: 'params' must be a mapping of names to values")
    bad = sorted(k for k, v in params.items() if not isinstance(v, _SCALARS))
    if bad:
        raise ConfigError(f"{where}: params {', '.join(bad)} must be scalars (text, number or boolean)")
    _check_params(env, params, where)
    return Task(task_id=str(task_id), env=env, instruction=" ".join(instruction.split()), params=dict(params))


def _check_params(env: str, params: dict[str, Any], where: str) -> None:
    family, _, name = env.partition(":")
    try:
        if family == "twx":
            from dreamgym.envs.textworld_express import GAME_PARAMS, game_params

            if name not in GAME_PARAMS:
                raise ConfigError(f"{where}: unknown TextWorldExpress game {name!r}")
            if "seed" not in params:
                raise ConfigError(f"{where}: twx tasks need a 'seed' in params")
            game_params(name, params)
        elif family == "sciworld" and "variation" not in params:
            raise ConfigError(f"{where}: sciworld tasks need a 'variation' in params")
    except ConfigError:
        raise
    except DreamGymError as e:
        raise ConfigError(f"{where}: {e}") from None
