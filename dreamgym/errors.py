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


class DataSchemaError(DreamGymError):
    """A data file does not match the documented schema."""
