"""``dreamgym config``, ``envs``, ``tasks``, ``prepare-models``, ``inspect-data`` and ``serve-env``: the
library alone (no Ray, no torch)."""

from __future__ import annotations

import argparse
import sys

from dreamgym.config import load_config


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


def cmd_serve_env(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load_config(args.config, overrides)
    from dreamgym.envs.server import serve
    from dreamgym.errors import ConfigError
    from dreamgym.secrets import SERVE_ENV_TOKEN, lookup

    token = args.token if args.token is not None else lookup(SERVE_ENV_TOKEN)
    if token is not None and not token.strip():
        raise ConfigError("serve-env: the token is empty; give a non-empty --token or DREAMGYM_SERVE_ENV_TOKEN")
    serve(cfg.env, host=args.host, port=args.port, token=token)
    return 0
