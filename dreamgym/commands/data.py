"""``dreamgym collect`` and ``seed-replay``: real transitions into Parquet, Parquet into the replay buffer
(both on Ray actors)."""

from __future__ import annotations

import argparse

from dreamgym.config import load_config


def cmd_collect(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load_config(args.config, overrides)
    from actors.collect import run_collect

    s = run_collect(cfg)
    print(
        f"wrote {s['transitions']} transitions from {s['episodes']} episodes to {s['out']} "
        f"({s['transitions_per_s']:.0f} transitions/s, success {s['success_rate']:.1%}); "
        f"run directory {s['run_dir']}"
    )
    return 0


def cmd_seed_replay(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load_config(args.config, overrides)
    from actors.replay import run_seed_replay

    s = run_seed_replay(cfg, args.data)
    print(
        f"seeded {s['stored']} transitions from {s['rows']} rows of {s['data']} ({s['duplicates']} duplicates, "
        f"{s['invalid']} invalid skipped; {s['rows_per_s']:.0f} rows/s) into {s['shards']} shard(s) at "
        f"{s['replay_path']}; run directory {s['run_dir']}"
    )
    return 0
