"""``dreamgym config``, ``envs``, ``tasks``, ``prepare-models``, ``inspect-data``, ``serve-env`` and
``serve-synthetic``: the library alone (no Ray, no torch; ``serve-synthetic --backend local`` starts vLLM)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from dreamgym.config import load_config

if TYPE_CHECKING:
    from dreamgym.envs.server import Limits


def cmd_config(args: argparse.Namespace, overrides: list[str]) -> int:
    from dreamgym.config import config_to_yaml, explain

    if args.explain:
        for dotted, default, desc in explain():
            print(f"{dotted} = {default}\n    {desc}")
        return 0
    print(config_to_yaml(load_config(args.config, overrides)), end="")
    return 0


def cmd_envs(args: argparse.Namespace, overrides: list[str]) -> int:
    from dreamgym.envs.registry import FAMILIES, adapter_class

    for family, (_, _, desc) in FAMILIES.items():
        names = getattr(adapter_class(family), "known_names", lambda: [])()
        shown = ", ".join(names) if names else "(see description)"
        print(f"{family:9s} {desc}\n          names: {shown}")
    return 0


def cmd_tasks(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load_config(args.config, overrides)
    from dreamgym.curriculum.build import seed_tasks

    env = None
    if cfg.curriculum.task_file is None:
        from dreamgym.envs.registry import make_env

        env = make_env(cfg.env)
    try:
        tasks = seed_tasks(cfg, env)
    finally:
        if env is not None:
            env.close()
    for t in tasks:
        print(f"{t.task_id}\t{t.instruction}")
    print(f"{len(tasks)} seed tasks for {cfg.env.name}", file=sys.stderr)
    return 0


def cmd_prepare_models(args: argparse.Namespace, overrides: list[str]) -> int:
    from dreamgym.errors import ConfigError
    from dreamgym.models import ALIASES, resolve_model

    for name in args.models:
        if name not in ALIASES:
            raise ConfigError(f"unknown model alias {name!r}; known: {', '.join(ALIASES)}")
        print(f"{name}: {resolve_model(name, args.cache_dir)}")
    return 0


def cmd_inspect_data(args: argparse.Namespace, overrides: list[str]) -> int:
    from dreamgym.data.transitions import summarise

    for k, v in summarise(args.path).items():
        print(f"{k}: {v}")
    return 0


def _server_options(args: argparse.Namespace, command: str) -> tuple[str | None, Limits]:
    """The token (``--token``, else ``DREAMGYM_SERVE_ENV_TOKEN`` / the secrets file) and the limits of a server."""
    from dreamgym.envs.server import Limits
    from dreamgym.errors import ConfigError
    from dreamgym.secrets import SERVE_ENV_TOKEN, lookup

    token = args.token if args.token is not None else lookup(SERVE_ENV_TOKEN)
    if token is not None and not token.strip():
        raise ConfigError(f"{command}: the token is empty; give a non-empty --token or DREAMGYM_SERVE_ENV_TOKEN")
    for flag, value, low in (("--max-sessions", args.max_sessions, 1), ("--max-request-kb", args.max_request_kb, 1),
                             ("--session-timeout-s", args.session_timeout_s, 0)):
        if value < low:
            raise ConfigError(f"{command}: {flag} must be at least {low}, got {value:g}")
    return token, Limits(max_envs=args.max_sessions, session_timeout_s=args.session_timeout_s or None,
                         max_body_bytes=args.max_request_kb * 1024)


def cmd_serve_env(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load_config(args.config, overrides)
    from dreamgym.envs.server import serve

    token, limits = _server_options(args, "serve-env")
    serve(cfg.env, host=args.host, port=args.port, token=token, limits=limits)
    return 0


def cmd_serve_synthetic(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load_config(args.config, overrides)
    from dreamgym.experience.serve import serve_synthetic

    token, limits = _server_options(args, "serve-synthetic")
    serve_synthetic(cfg, host=args.host, port=args.port, token=token, limits=limits)
    return 0
