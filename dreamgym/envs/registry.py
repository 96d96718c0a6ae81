"""Environment specs (``family:name``) to adapters.

Adapters are imported lazily so that listing or validating specs does not start a JVM or import
heavy engines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dreamgym.errors import EnvironmentSpecError

if TYPE_CHECKING:
    from dreamgym.config import EnvConfig
    from dreamgym.envs.base import Environment

#: family -> (module, class, one-line description)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "twx": ("dreamgym.envs.textworld_express", "TextWorldExpressEnv", "TextWorldExpress games (Java engine)"),
    "sciworld": ("dreamgym.envs.scienceworld", "ScienceWorldEnv", "ScienceWorld tasks (Java engine)"),
    "alfworld": ("dreamgym.envs.alfworld", "AlfWorldEnv", "an ALFWorld game file: alfworld:/path/game.tw-pddl"),
    "remote": ("dreamgym.envs.remote", "RemoteEnv", "an environment served over HTTP (env.url)"),
}


def split_spec(spec: str) -> tuple[str, str]:
    """``'twx:coin'`` -> ``('twx', 'coin')``, refusing unknown families with the valid ones."""
    family, sep, name = spec.partition(":")
    if not sep or not name:
        raise EnvironmentSpecError(f"environment spec {spec!r} must look like 'family:name', e.g. 'twx:coin'")
    if family not in FAMILIES:
        raise EnvironmentSpecError(
            f"unknown environment family {family!r} in {spec!r}; valid families: {', '.join(sorted(FAMILIES))}"
        )
    return family, name


def adapter_class(family: str) -> type[Environment]:
    module, cls, _ = FAMILIES[family]
    return getattr(importlib.import_module(module), cls)


def make_env(cfg: EnvConfig) -> Environment:
    """Build the environment that ``cfg.name`` names, with the config's parameters."""
    family, name = split_spec(cfg.name)
    return adapter_class(family).from_config(name, cfg)  # type: ignore[attr-defined]
