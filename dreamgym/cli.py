"""The ``dreamgym`` command.

Thin on purpose: it parses arguments, loads the config and defers every heavy import (Ray, torch,
vLLM, Java engines) to the subcommand that needs it, so ``dreamgym --help`` answers at once.
Every subcommand accepts an optional YAML config and ``--section.field VALUE`` overrides.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from dreamgym.errors import DreamGymError

#: subcommand -> shortcut flag -> dotted config path
SHORTCUTS: dict[str, dict[str, str]] = {
    "collect": {
        "--env": "env.name",
        "--policy": "collect.policy",
        "--episodes": "collect.episodes",
        "--out": "collect.out",
        "--workers": "collect.workers",
        "--address": "ray.address",
    },
    "serve-env": {"--env": "env.name"},
    "config": {"--env": "env.name"},
}


def _add_common(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("config", nargs="?", help="YAML config file (optional; defaults are used otherwise)")
    for flag, dotted in SHORTCUTS.get(command, {}).items():
        p.add_argument(flag, dest=dotted, default=None, metavar=dotted.split(".")[-1].upper(),
                       help=f"same as --{dotted}")
    p.epilog = "Any config field can be overridden with --section.field VALUE (see `dreamgym config --explain`)."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dreamgym",
        description="DreamGym on Ray: RL for LLM agents in a reasoning experience model.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("collect", help="collect real transitions with a scripted policy into Parquet")
    _add_common(p, "collect")

    p = sub.add_parser("serve-env", help="serve a local environment over HTTP (AgentGym-style protocol)")
    _add_common(p, "serve-env")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=36001, help="port to bind (default 36001)")

    p = sub.add_parser("envs", help="list environment families and their names")

    p = sub.add_parser("config", help="print the resolved config (or every field with --explain)")
    _add_common(p, "config")
    p.add_argument("--explain", action="store_true", help="list every field with its default and meaning")

    p = sub.add_parser("inspect-data", help="check a transitions Parquet file against the schema and summarise it")
    p.add_argument("path", help="Parquet file")
    return parser


def _load(args: argparse.Namespace, extra: list[str], command: str) -> Any:
    from dreamgym.config import load_config

    # Shortcut flags and free-form overrides merge into one override list (free-form wins).
    tokens: list[str] = []
    for dotted in SHORTCUTS.get(command, {}).values():
        value = getattr(args, dotted, None)
        if value is not None:
            tokens += [f"--{dotted}", value]
    return load_config(args.config, tokens + extra)


def _cmd_collect(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _load(args, extra, "collect")
    from actors.collect import run_collect

    summary = run_collect(cfg)
    print(
        f"wrote {summary['transitions']} transitions from {summary['episodes']} episodes to {summary['out']} "
        f"({summary['transitions_per_s']:.0f} transitions/s, success {summary['success_rate']:.1%}); "
        f"run directory {summary['run_dir']}"
    )
    return 0


def _cmd_serve_env(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _load(args, extra, "serve-env")
    from dreamgym.envs.server import serve

    serve(cfg.env, host=args.host, port=args.port)
    return 0


def _cmd_envs(args: argparse.Namespace, extra: list[str]) -> int:
    from dreamgym.envs.registry import FAMILIES, adapter_class

    for family, (_, _, desc) in FAMILIES.items():
        names = getattr(adapter_class(family), "known_names", lambda: [])()
        shown = ", ".join(names) if names else "(see description)"
        print(f"{family:9s} {desc}\n          names: {shown}")
    return 0


def _cmd_config(args: argparse.Namespace, extra: list[str]) -> int:
    from dreamgym.config import config_to_yaml, explain

    if args.explain:
        for dotted, default, desc in explain():
            print(f"{dotted} = {default}\n    {desc}")
        return 0
    print(config_to_yaml(_load(args, extra, "config")), end="")
    return 0


def _cmd_inspect_data(args: argparse.Namespace, extra: list[str]) -> int:
    from dreamgym.data.transitions import summarise

    for k, v in summarise(args.path).items():
        print(f"{k}: {v}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "collect": _cmd_collect,
    "serve-env": _cmd_serve_env,
    "envs": _cmd_envs,
    "config": _cmd_config,
    "inspect-data": _cmd_inspect_data,
}


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate ``--section.field VALUE`` / ``--section.field=VALUE`` overrides from the rest.

    Done before argparse so an override's value is never mistaken for the CONFIG positional.
    """
    rest: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok[2:].partition("=")[0]
        if tok.startswith("--") and "." in name:
            overrides.append(tok)
            if "=" not in tok and i + 1 < len(argv):
                overrides.append(argv[i + 1])
                i += 1
        else:
            rest.append(tok)
        i += 1
    return rest, overrides


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    rest, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(rest)
    extra += overrides
    if args.command is None:
        parser.print_help()
        return 0
    if extra and args.command not in SHORTCUTS:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return COMMANDS[args.command](args, extra)
    except DreamGymError as e:
        print(f"dreamgym {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dreamgym {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
