"""The driver's own state for ``dreamgym train``: counters that survive ``--resume``, and run checkpoints.

A run checkpoint is ``<run>/checkpoints/step-NNNNNN/`` (``NNNNNN`` = completed iterations) holding

    model/, trainer_state.pt, learner.json   the learner's checkpoint (``learner.checkpoint``)
    curriculum.json                           the curriculum's ``state_dict`` (pool, histories, RNG)
    driver.json                               ``TrainState`` below, written last

so a folder with ``driver.json`` is complete. The replay buffer persists by itself in its storage folder
(``replay.path``, default ``<run>/replay``) and is reopened as it is: transitions stored after the last
checkpoint stay (content ids make re-adding them a no-op).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DRIVER_FILE = "driver.json"
CURRICULUM_FILE = "curriculum.json"


@dataclass
class TrainState:
    """Counters of a training run (everything the report's x-axes need)."""

    iteration: int = 0
    """Completed training iterations."""
    real_transitions: int = 0
    """Real transitions spent by training rollouts (the paper's x-axis; evaluation counted apart)."""
    synthetic_transitions: int = 0
    """Transitions produced by the experience model for training."""
    invalid_transitions: int = 0
    """Synthetic transitions the experience model could not produce (malformed after every retry)."""
    eval_transitions: int = 0
    """Real transitions spent by evaluations (policy and random baseline)."""
    offline_transitions: int = 0
    """Real transitions in the offline data (collected or loaded before training)."""
    real_resets: int = 0
    """Real-environment resets made to read synthetic tasks' initial states (no transition spent)."""
    learner_steps: int = 0
    """Learner steps that updated the weights (steps whose groups all had equal rewards are skipped)."""
    warm_started: bool = False
    replay_seeded: bool = False
    wall_seconds: float = 0.0
    """Wall time of all sessions of the run so far (resumed sessions add up)."""
    phase_seconds: dict[str, float] = field(default_factory=dict)
    """Wall time per phase (``setup``, ``warm_start``, ``synthetic``, ``real``, ``learner``, ``sync``, ``eval``...)."""
    phase_episodes: dict[str, int] = field(default_factory=dict)
    phase_steps: dict[str, int] = field(default_factory=dict)
    eval_tasks: list[dict[str, Any]] = field(default_factory=list)
    """The fixed held-out tasks (``Task.to_dict``)."""
    baseline: dict[str, Any] | None = None
    """The random-valid-action baseline on the held-out tasks."""
    evals: list[dict[str, Any]] = field(default_factory=list)
    """Every evaluation: iteration, real transitions so far, policy and baseline results."""
    sessions: int = 0
    """How many times the run was started (1 + resumes)."""

    def add_phase(self, phase: str, seconds: float, episodes: int = 0, steps: int = 0) -> None:
        self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds
        if episodes or steps:
            self.phase_episodes[phase] = self.phase_episodes.get(phase, 0) + episodes
            self.phase_steps[phase] = self.phase_steps.get(phase, 0) + steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TrainState:
        known = set(TrainState.__dataclass_fields__)
        return TrainState(**{k: v for k, v in d.items() if k in known})


class IterationLog:
    """Timers and the metric record of one loop iteration.

    Each timed phase adds its wall time to the run's counters (``TrainState.add_phase``) and to the record;
    ``note`` adds facts. ``record()`` is what ``metrics.jsonl`` gets as the iteration's event."""

    def __init__(self, state: TrainState) -> None:
        self.state = state
        self.fields: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}

    @contextmanager
    def timed(self, phase: str, episodes: int = 0, steps: int = 0) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.add(phase, time.perf_counter() - t0, episodes, steps)

    def add(self, phase: str, seconds: float, episodes: int = 0, steps: int = 0) -> None:
        """A phase timed elsewhere (the rollouts run from their launch to their collection)."""
        self.state.add_phase(phase, seconds, episodes, steps)
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def note(self, **fields: Any) -> None:
        self.fields.update(fields)

    def record(self) -> dict[str, Any]:
        return {**self.fields, "phase_seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


#: The folders ``checkpoint_dir`` names, as a glob.
CHECKPOINT_GLOB = "step-*"


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{iteration:06d}"


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def save_driver_state(directory: Path, state: TrainState, curriculum_state: dict[str, Any]) -> None:
    """Write the curriculum and then the driver state (last: it marks the checkpoint complete)."""
    write_json_atomic(directory / CURRICULUM_FILE, curriculum_state)
    write_json_atomic(directory / DRIVER_FILE, state.to_dict())


def latest_run_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete run checkpoint (one with ``driver.json``), if any."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob(CHECKPOINT_GLOB) if (p / DRIVER_FILE).is_file())
    return done[-1] if done else None


def load_driver_state(directory: Path) -> tuple[TrainState, dict[str, Any]]:
    state = TrainState.from_dict(json.loads((directory / DRIVER_FILE).read_text()))
    curriculum = json.loads((directory / CURRICULUM_FILE).read_text())
    return state, curriculum
