"""API keys and tokens: where they come from, and how they stay out of everything a run writes.

Each secret is a config field typed ``SecretStr | None``: every dump of the config (``config.yaml`` of a
run, ``dreamgym config``, the config sent to W&B/MLflow) shows ``'**********'`` when it is set and ``null``
when it is not, never the value. Besides the field (``--replay.api_key ...`` or YAML), each secret can come
from an environment variable or from a secrets file (a YAML mapping ``key: value``, its path in
``DREAMGYM_SECRETS_FILE`` or ``run.secrets_file``).

Resolution happens where the key is used (``resolve``), in this order: the field's own value, the
environment variable, the secrets file. A saved config holds only the placeholder, so a resumed run (or a
Ray actor that receives a dumped config) takes the key from the environment or the secrets file; when it
finds none, it stops with a message saying where to put it.

``publish`` puts the keys given on the command line or in YAML into this process's environment (memory,
never a file), so that the local Ray workers and subprocesses it starts later resolve them too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr

from dreamgym.errors import ConfigError

#: What pydantic writes for a set ``SecretStr`` in a JSON/YAML dump; read back, it means "set, hidden".
MASK = "**********"
#: Environment variable naming the secrets file.
SECRETS_FILE_ENV = "DREAMGYM_SECRETS_FILE"


@dataclass(frozen=True)
class Secret:
    """One secret: its config field (dotted), environment variable and key in the secrets file."""

    field: str
    env: str
    key: str


#: Every secret the config can hold, by dotted field.
SECRETS: dict[str, Secret] = {s.field: s for s in (
    Secret("replay.api_key", "DREAMGYM_QDRANT_API_KEY", "qdrant_api_key"),
    Secret("experience_model.api_key", "DREAMGYM_EXPERIENCE_API_KEY", "experience_api_key"),
    Secret("experience_model.annotate.teacher_api_key", "DREAMGYM_TEACHER_API_KEY", "teacher_api_key"),
    Secret("env.token", "DREAMGYM_ENV_TOKEN", "env_token"),
)}
#: Secrets outside the config tree.
SERVE_ENV_TOKEN = Secret("serve-env --token", "DREAMGYM_SERVE_ENV_TOKEN", "serve_env_token")
WANDB_API_KEY = Secret("W&B", "WANDB_API_KEY", "wandb_api_key")
_ALL = (*SECRETS.values(), SERVE_ENV_TOKEN, WANDB_API_KEY)


def as_secret(value: Any) -> Any:
    """Before validation: a key is text even when it looks like a number (YAML reads ``12345`` as an int)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value  # anything else is validated (and refused) as it is


def read_secrets_file(path: str | Path) -> dict[str, str]:
    """The ``key: value`` mapping of a secrets file, checked (unknown keys are refused: likely a typo)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"secrets file not found: {p} (from {SECRETS_FILE_ENV} or run.secrets_file)")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError:
        # The parser's message quotes the offending line, which may hold a key: say only where it is.
        raise ConfigError(f"secrets file {p} is not valid YAML") from None
    if not isinstance(data, dict):
        raise ConfigError(f"secrets file {p} must be a mapping of key: value")
    known = {s.key for s in _ALL}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise ConfigError(f"secrets file {p}: unknown key(s) {', '.join(unknown)}; valid keys: "
                          f"{', '.join(sorted(known))}")
    return {str(k): str(v) for k, v in data.items() if v is not None}


def lookup(secret: Secret) -> str | None:
    """The secret from the environment, else from the secrets file, else ``None``."""
    value = os.environ.get(secret.env)
    if value:
        return value
    path = os.environ.get(SECRETS_FILE_ENV)
    if path:
        return read_secrets_file(path).get(secret.key) or None
    return None


def resolve(value: SecretStr | str | None, field: str) -> str | None:
    """The key to use for config field ``field``: its own value, else the environment, else the secrets file.

    ``None`` when it is given nowhere (no authentication). A field that holds the placeholder of a saved
    config must be found elsewhere, or this raises a ``ConfigError`` that says where to put it.
    """
    secret = SECRETS[field]
    raw = value.get_secret_value() if isinstance(value, SecretStr) else value
    if raw and raw != MASK:
        return raw
    found = lookup(secret)
    if found is None and raw == MASK:
        raise ConfigError(
            f"{field} is set, but its value is not stored in saved configs and did not reach this process: "
            f"set {secret.env}, add '{secret.key}' to the secrets file ({SECRETS_FILE_ENV}), or pass --{field}")
    return found


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def publish(cfg: Any) -> None:
    """Put the keys ``cfg`` was given (command line, YAML) and its ``run.secrets_file`` into ``os.environ``.
    (``cfg`` is a ``DreamGymConfig``, typed ``Any``: ``dreamgym.config`` imports this module.)

    Why: Ray actors receive the config as a dump, which holds only placeholders; the local Ray this process
    starts, and its workers, inherit the environment instead. Nothing is written to a file.
    """
    if cfg.run.secrets_file is not None:
        read_secrets_file(cfg.run.secrets_file)  # a wrong path fails now, not in the first actor that needs it
        os.environ[SECRETS_FILE_ENV] = str(Path(cfg.run.secrets_file).expanduser().resolve())
    for field, secret in SECRETS.items():
        value = _get(cfg, field)
        raw = value.get_secret_value() if isinstance(value, SecretStr) else None
        if raw and raw != MASK:
            os.environ[secret.env] = raw


def export_wandb_key() -> None:
    """W&B reads its key from ``WANDB_API_KEY``; take it from the secrets file when the environment lacks it."""
    if not os.environ.get(WANDB_API_KEY.env):
        key = lookup(WANDB_API_KEY)
        if key:
            os.environ[WANDB_API_KEY.env] = key


def scrub(data: Any) -> Any:
    """A config dump with every secret field replaced by the placeholder (defence in depth for sinks)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for field in SECRETS:
        *parents, leaf = field.split(".")
        d: Any = out
        chain = []
        for p in parents:
            if not isinstance(d, dict) or not isinstance(d.get(p), dict):
                d = None
                break
            chain.append(p)
            d = d[p]
        if isinstance(d, dict) and d.get(leaf) is not None:
            # copy the path down to the leaf so the caller's dict is left untouched
            node = out
            for p in chain:
                node[p] = dict(node[p])
                node = node[p]
            node[leaf] = MASK
    return out


def secrets_table() -> list[tuple[str, str, str]]:
    """``(where it is used, environment variable, secrets-file key)`` for the docs and ``--help``."""
    return [(s.field, s.env, s.key) for s in _ALL]
