"""User-facing errors.

Every error a user can cause by bad input (a wrong config, an unknown environment, a missing Java
runtime, an unreachable server, a malformed file) is a ``DreamGymError`` whose message says what
was wrong, where, and how to fix it. The CLI prints these without a traceback.
"""

from __future__ import annotations


class DreamGymError(Exception):
    """Base class for errors caused by input the user can fix."""


class ConfigError(DreamGymError):
    """The configuration is invalid (wrong type, unknown key, impossible value)."""


class EnvironmentSpecError(DreamGymError):
    """An unknown environment family, environment name or task name."""


class EnvironmentUnavailableError(DreamGymError):
    """The environment cannot start: missing runtime (Java), unreachable server, bad game file."""


class RemoteEnvironmentError(DreamGymError):
    """An environment server answered a request with an error or with a reply the client cannot read."""


class DataSchemaError(DreamGymError):
    """A data file does not match the documented schema."""


class ReplayError(DreamGymError):
    """The replay buffer was given input it cannot use (see the subclasses)."""


class VectorSizeError(ReplayError):
    """A vector's length differs from the replay collection's dimension."""


class FilterFieldError(ReplayError):
    """A retrieval filter names a field the replay buffer does not index, or has a malformed value."""


class ReplayStorageUnavailableError(ReplayError):
    """The replay storage cannot be opened: unreachable Qdrant server, locked or mismatched folder."""


class SnapshotError(ReplayError):
    """A replay snapshot is missing, incomplete, corrupt or does not fit the buffer it is restored into."""


class TrainingFaultError(DreamGymError):
    """A part of a running training died or failed (a policy engine, the learner, a weight sync) and the run
    stopped; the message names the part and the weight version, and how to resume from the last checkpoint."""


class ActorDiedStartingError(TrainingFaultError):
    """An actor of the run died while it started (killed, its node lost): a fault like a death mid-run, so
    ``train.auto_resume`` starts the session again instead of the run ending with a traceback."""


class ActorHungError(TrainingFaultError):
    """A call to an actor made no progress within its bound (``train.watchdog``): the actor is alive but stuck
    (a frozen process, a GPU kernel that never returns, a node behind a network partition). The message names
    the actor, what was waited for and the bound; the driver treats it as a fault."""


class WeightUpdateStalledError(ActorHungError):
    """A policy engine refused to generate because a weight update did not complete: it stayed open past its
    bound (``learner.sync_timeout_s``) or past the caller's (``train.watchdog.engine_s``), or it failed after it
    had touched the weights (``dreamgym.weight_gate``). A fault like a hung actor: the run resumes with new
    engines."""


class EngineAsleepError(DreamGymError):
    """A policy engine asked to generate while it sleeps for the learner step (``train.sleep_engines``): a driver
    bug (rollouts overlapping the step) or a wake-up that failed, not a fault to resume from."""


class ReplayTimeoutError(ReplayError):
    """The replay shards did not answer a call within ``replay.call_timeout_s`` (a shard stuck or not restarted
    in time); inside training a fault like a dead learner (``train.auto_resume``)."""
