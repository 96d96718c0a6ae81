"""The ``dreamgym`` command: the argument parser.

Thin on purpose: it parses arguments and imports the body of the subcommand that runs from
``dreamgym.commands`` (``COMMANDS``); every heavy import (Ray, torch, vLLM, Java engines) is deferred to
that body, so ``dreamgym --help`` answers at once. Every subcommand accepts an optional YAML config and
``--section.field VALUE`` overrides.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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
    "serve-synthetic": {"--env": "env.name", "--offline-data": "train.offline_data",
                        "--backend": "experience_model.backend", "--model": "experience_model.model",
                        "--url": "experience_model.url"},
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
                              "--out": "experience_model.eval.out", "--address": "ray.address",
                              "--simulator": "experience_model.eval.simulator_url"},
    "train": {"--env": "env.name", "--mode": "train.mode", "--iterations": "train.iterations",
              "--address": "ray.address", "--offline-data": "train.offline_data",
              "--warm-start": "train.warm_start.method"},
    "sft": {"--env": "env.name", "--data": "train.offline_data", "--steps": "train.warm_start.steps",
            "--episodes": "train.warm_start.episodes", "--address": "ray.address"},
    "study": {"--env": "env.name", "--iterations": "train.iterations", "--offline-data": "train.offline_data"},
}


def _add_common(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("config", nargs="?", help="YAML config file (optional; defaults are used otherwise)")
    for flag, dotted in SHORTCUTS.get(command, {}).items():
        p.add_argument(flag, dest=dotted, default=None, metavar=dotted.split(".")[-1].upper(),
                       help=f"same as --{dotted}")
    p.epilog = "Any config field can be overridden with --section.field VALUE (see `dreamgym config --explain`)."


def _add_server_flags(p: argparse.ArgumentParser, port: int) -> None:
    """Where an environment server listens and what it admits (``serve-env`` and ``serve-synthetic``)."""
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default 127.0.0.1: this machine only; for others set a token too)")
    p.add_argument("--port", type=int, default=port, help=f"port to bind (default {port})")
    p.add_argument("--token", default=None,
                   help="require 'Authorization: Bearer TOKEN' on every request (default: DREAMGYM_SERVE_ENV_TOKEN "
                        "or serve_env_token in the secrets file; the env var keeps it out of `ps`)")
    p.add_argument("--max-sessions", type=int, default=256, metavar="N",
                   help="environments (sessions) open at once; POST /create past it answers 429 (default 256)")
    p.add_argument("--session-timeout-s", type=float, default=1800.0, metavar="S",
                   help="close a session with no request for S seconds (default 1800; 0: never)")
    p.add_argument("--max-request-kb", type=int, default=64, metavar="KB",
                   help="largest request body in KiB; larger ones answer 413 (default 64)")


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
    _add_server_flags(p, 36001)

    p = sub.add_parser("serve-synthetic",
                       help="serve the synthetic environment (experience model + retrieval over offline transitions) "
                            "over HTTP, so any trainer can train in it (AgentGym-style protocol, GET /metrics)")
    _add_common(p, "serve-synthetic")
    _add_server_flags(p, 36002)

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
    p.add_argument("--dry-run", action="store_true",
                   help="print the placement plan (every actor's CPUs, GPUs and bundle; total GPUs) and check it "
                        "against the cluster (ray.address / RAY_ADDRESS, else this machine) or the shape given "
                        "below; starts no actor")
    p.add_argument("--cluster-cpus", type=float, default=None, metavar="N",
                   help="with --dry-run: check against a cluster of N CPUs instead of a live one")
    p.add_argument("--cluster-gpus", type=float, default=None, metavar="N",
                   help="with --dry-run: check against a cluster of N GPUs instead of a live one")
    p.add_argument("--node-gpus", type=float, default=None, metavar="N",
                   help="with --dry-run: GPUs of the largest node (a packed placement group must fit on one)")
    p.add_argument("--gpu-memory-gib", type=float, default=None, metavar="GIB",
                   help="with --dry-run: memory of each GPU for the per-GPU memory plan (default 79.6, an 80 GB GPU)")

    p = sub.add_parser("sft", help="behaviour cloning (warm start) of the policy on gold episodes; writes an HF "
                                    "folder usable as policy.model")
    _add_common(p, "sft")
    p.add_argument("--out", default=None, metavar="DIR", help="output HF folder (default: model/ in the run directory)")

    p = sub.add_parser("study", help="the paper's Table 1 on one environment: base, real GRPO, DreamGym, DreamGym-S2R "
                                      "and ablations over training seeds; writes a table, a plot and JSON")
    _add_common(p, "study")
    p.add_argument("--arm", action="append", default=None, metavar="NAME",
                   help="run only this arm (repeatable): base, real, dreamgym, dreamgym-s2r, no-retrieval, "
                        "no-reasoning, no-task-generation (default: study.arms)")
    p.add_argument("--resume", default=None, metavar="STUDY_DIR",
                   help="continue a study: finished arm-seeds (summary.json) are skipped, unfinished ones continue "
                        "from their last checkpoint (its study.yaml; overrides such as --study.seeds 3 still apply)")
    p.add_argument("--report", default=None, metavar="STUDY_DIR",
                   help="only rebuild the table, plot and JSON of a study from its finished arm-seeds")
    p.add_argument("--export", nargs=2, default=None, metavar=("STUDY_DIR", "OUT_DIR"),
                   help="copy a study's finished arm-seeds without weights or checkpoints (small enough to commit); "
                        "--resume on a copy of OUT_DIR runs only the arm-seeds still missing")

    p = sub.add_parser("inspect-data", help="check a transitions Parquet file against the schema and summarise it")
    p.add_argument("path", help="Parquet file")

    p = sub.add_parser("prepare-models", help="build the local model folders (SmolLM2-135M from its GGUF, tiny)")
    p.add_argument("models", nargs="*", default=["smollm2-135m"], metavar="MODEL",
                   help="aliases to prepare (default: smollm2-135m; also: tiny)")
    p.add_argument("--cache-dir", default=None, help="where to put them (default ~/.cache/dreamgym/models)")
    return parser


#: subcommand -> its body in ``dreamgym.commands`` (``module:function``), imported only when it runs
COMMANDS: dict[str, str] = {
    "train": "dreamgym.commands.train:cmd_train",
    "study": "dreamgym.commands.study:cmd_study",
    "sft": "dreamgym.commands.train:cmd_sft",
    "collect": "dreamgym.commands.data:cmd_collect",
    "seed-replay": "dreamgym.commands.data:cmd_seed_replay",
    "serve-env": "dreamgym.commands.setup:cmd_serve_env",
    "serve-synthetic": "dreamgym.commands.setup:cmd_serve_synthetic",
    "envs": "dreamgym.commands.setup:cmd_envs",
    "config": "dreamgym.commands.setup:cmd_config",
    "inspect-data": "dreamgym.commands.setup:cmd_inspect_data",
    "tasks": "dreamgym.commands.setup:cmd_tasks",
    "prepare-models": "dreamgym.commands.setup:cmd_prepare_models",
    "annotate": "dreamgym.commands.experience:cmd_annotate",
    "train-experience-model": "dreamgym.commands.experience:cmd_train_experience_model",
    "eval-experience-model": "dreamgym.commands.experience:cmd_eval_experience_model",
}


def command_overrides(args: argparse.Namespace, extra: list[str], command: str) -> list[str]:
    """The shortcut flags given, as ``--section.field VALUE`` tokens, followed by the free-form overrides
    (which win)."""
    tokens: list[str] = []
    for dotted in SHORTCUTS.get(command, {}).values():
        value = getattr(args, dotted, None)
        if value is not None:
            tokens += [f"--{dotted}", value]
    return tokens + extra


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
    module, _, name = COMMANDS[args.command].partition(":")
    body = getattr(importlib.import_module(module), name)
    try:
        return body(args, command_overrides(args, extra, args.command))
    except DreamGymError as e:
        print(f"dreamgym {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dreamgym {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
