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
    "tasks": {"--env": "env.name", "--task-file": "curriculum.task_file", "--count": "curriculum.seed_tasks"},
    "seed-replay": {"--path": "replay.path", "--shards": "replay.shards", "--backend": "replay.backend",
                    "--url": "replay.url", "--address": "ray.address"},
    "annotate": {"--data": "experience_model.annotate.data", "--out": "experience_model.annotate.out",
                 "--teacher": "experience_model.annotate.teacher_url",
                 "--teacher-model": "experience_model.annotate.teacher_model"},
    "train-experience-model": {"--data": "experience_model.train.data", "--base": "experience_model.train.base",
                               "--out": "experience_model.train.out", "--method": "experience_model.train.method",
                               "--store": "experience_model.train.store",
                               "--max-steps": "experience_model.train.max_steps"},
    "eval-experience-model": {"--data": "experience_model.eval.data", "--model": "experience_model.model",
                              "--store": "experience_model.eval.store", "--backend": "experience_model.backend",
                              "--url": "experience_model.url", "--limit": "experience_model.eval.limit",
                              "--out": "experience_model.eval.out", "--address": "ray.address"},
    "train": {"--env": "env.name", "--mode": "train.mode", "--iterations": "train.iterations",
              "--address": "ray.address", "--offline-data": "train.offline_data", "--warm-start": "train.warm_start"},
    "sft": {"--env": "env.name", "--data": "train.offline_data", "--steps": "train.sft_steps",
            "--episodes": "train.sft_episodes", "--address": "ray.address"},
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

    p = sub.add_parser("tasks", help="list the curriculum's seed tasks (validates curriculum.task_file)")
    _add_common(p, "tasks")

    p = sub.add_parser("seed-replay", help="seed the replay buffer from a transitions Parquet file (streamed)")
    _add_common(p, "seed-replay")
    p.add_argument("--data", required=True, metavar="PATH.parquet", help="transitions Parquet file to seed from")

    p = sub.add_parser("annotate", help="add reasoning traces to offline transitions (template or --teacher URL)")
    _add_common(p, "annotate")

    p = sub.add_parser("train-experience-model", help="SFT the reasoning experience model on annotated transitions")
    _add_common(p, "train-experience-model")

    p = sub.add_parser("eval-experience-model",
                       help="score an experience model on held-out transitions beside the copy baseline "
                            "(--model none: baseline only)")
    _add_common(p, "eval-experience-model")

    p = sub.add_parser("train", help="train the policy with GRPO in the experience model and/or the real "
                                      "environment (default config: dreamgym/configs/train.yaml)")
    _add_common(p, "train")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue a run from its latest checkpoint (its config.yaml; overrides still apply)")

    p = sub.add_parser("sft", help="behaviour cloning (warm start) of the policy on gold episodes; writes an HF "
                                    "folder usable as policy.model")
    _add_common(p, "sft")
    p.add_argument("--out", default=None, metavar="DIR", help="output HF folder (default: model/ in the run directory)")

    p = sub.add_parser("inspect-data", help="check a transitions Parquet file against the schema and summarise it")
    p.add_argument("path", help="Parquet file")

    p = sub.add_parser("prepare-models", help="build the local model folders (SmolLM2-135M from its GGUF, tiny)")
    p.add_argument("models", nargs="*", default=["smollm2-135m"], metavar="MODEL",
                   help="aliases to prepare (default: smollm2-135m; also: tiny)")
    p.add_argument("--cache-dir", default=None, help="where to put them (default ~/.cache/dreamgym/models)")
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


def _cmd_prepare_models(args: argparse.Namespace, extra: list[str]) -> int:
    from dreamgym.models import ALIASES, resolve_model

    for name in args.models:
        if name not in ALIASES:
            from dreamgym.errors import ConfigError

            raise ConfigError(f"unknown model alias {name!r}; known: {', '.join(ALIASES)}")
        print(f"{name}: {resolve_model(name, args.cache_dir)}")
    return 0


def _cmd_tasks(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _load(args, extra, "tasks")
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


def _cmd_seed_replay(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _load(args, extra, "seed-replay")
    from actors.replay import run_seed_replay

    s = run_seed_replay(cfg, args.data)
    print(
        f"seeded {s['stored']} transitions from {s['rows']} rows of {s['data']} ({s['duplicates']} duplicates, "
        f"{s['invalid']} invalid skipped; {s['rows_per_s']:.0f} rows/s) into {s['shards']} shard(s) at "
        f"{s['replay_path']}; run directory {s['run_dir']}"
    )
    return 0


def _cmd_annotate(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _load(args, extra, "annotate")
    from dreamgym.experience.commands import run_annotate

    s = run_annotate(cfg)
    print(f"annotated {s['rows']} transitions ({s['teacher']} by the teacher, {s['template']} by template) "
          f"into {s['out']} in {s['seconds']:.1f} s; run directory {s['run_dir']}")
    return 0


def _cmd_train_experience_model(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _load(args, extra, "train-experience-model")
    from dreamgym.experience.commands import run_train

    s = run_train(cfg)
    print(f"trained on {s['examples_seen']} of {s['examples']} examples ({s['transitions']} transitions, "
          f"{s['duplicates']} duplicates) for "
          f"{s['steps']} steps in {s['train_seconds']:.0f} s: loss {s['loss_first']:.3f} -> {s['loss_last']:.3f}; "
          f"model in {s['out']}; run directory {s['run_dir']}")
    return 0


def _cmd_eval_experience_model(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _load(args, extra, "eval-experience-model")
    from dreamgym.experience.commands import run_eval

    result, table = run_eval(cfg)
    d = result["data"]
    print(f"{d['evaluated']} held-out transitions ({d['unseen']} with an unseen (state, action)); "
          f"store {d['store_transitions']} transitions; model {d['model']} ({d['backend']})")
    print(table)
    if "model_stats" in result:
        st = result["model_stats"]
        print(f"model calls {st['model_calls']}, retries {st['retries']}, invalid {st['invalid']}, "
              f"reasons {st['reasons']}")
    print(f"JSON: {result['json']}")
    return 0


def default_train_config() -> str:
    """The packaged default config of ``dreamgym train`` (and ``dreamgym sft``)."""
    from importlib.resources import files

    return str(files("dreamgym") / "configs" / "train.yaml")


def _cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    from dreamgym.config import parse_overrides

    tokens: list[str] = []
    if args.resume:
        tokens = [t for d in SHORTCUTS["train"].values() if getattr(args, d, None) is not None
                  for t in (f"--{d}", getattr(args, d))]
        parse_overrides(tokens + extra)  # malformed overrides fail before anything starts
        cfg = None
    else:
        args.config = args.config or default_train_config()
        cfg = _load(args, extra, "train")
    from actors.driver import run_train

    s = run_train(cfg, resume=args.resume, overrides=tokens + extra if args.resume else None)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    print(f"trained {s['iterations']} iterations ({s['mode']}) in {s['wall_seconds'] / 60:.1f} min: held-out real "
          f"success {pct(s['success_start'])} -> {pct(s['success_final'])} (random valid action "
          f"{pct(s['baseline_success'])}); real transitions {s['real_transitions']} for training, "
          f"{s['synthetic_transitions']} synthetic; report {s.get('report', '-')}; run directory {s['run_dir']}")
    return 0


def _cmd_sft(args: argparse.Namespace, extra: list[str]) -> int:
    args.config = args.config or default_train_config()
    cfg = _load(args, extra, "sft")
    from learner.bc import run_sft_command

    s = run_sft_command(cfg, out=args.out)
    print(f"behaviour cloning on {s['episodes']} gold episodes, {s['steps']} steps: gold-reply NLL "
          f"{s['nll_first']:.3f} -> {s['nll_last']:.3f} in {s['seconds']:.0f} s; model in {s['out']} (use it as "
          f"--policy.model {s['out']}); run directory {s['run_dir']}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "train": _cmd_train,
    "sft": _cmd_sft,
    "collect": _cmd_collect,
    "serve-env": _cmd_serve_env,
    "envs": _cmd_envs,
    "config": _cmd_config,
    "inspect-data": _cmd_inspect_data,
    "tasks": _cmd_tasks,
    "prepare-models": _cmd_prepare_models,
    "seed-replay": _cmd_seed_replay,
    "annotate": _cmd_annotate,
    "train-experience-model": _cmd_train_experience_model,
    "eval-experience-model": _cmd_eval_experience_model,
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
