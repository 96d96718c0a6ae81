"""Held-out real transitions with actions the state's admissible list rules out, for ``bench/fidelity.sh``.

The collection policies (``gold``, ``random``, ``mixed``) only play admissible actions, so on their held-out data
the rules of the synthetic environment settle nothing. In training the policy often writes actions that are
valid somewhere in the game but not in this state ("move south" with no door south, "take coin" away from the
coin); the admissible list settles those steps without a model call. This script plays test-split episodes in the
real game with the ``offlist`` policy: at each step, with probability ``--offlist``, an action of the offline
data's action space (``TransitionIndex.action_space``: every action real data accepted somewhere) that this state's
list does not hold, else a random admissible action. What the real game answered is recorded, as by
``dreamgym collect``, so the rules' answer (the family's failure state) is checked against the game, not assumed.

    python bench/fidelity_offlist.py --rooms 3 --store runs/fidelity/offline-3rooms.parquet \
        --out runs/fidelity/offlist-3rooms.parquet
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from dreamgym.collect import collect_range
from dreamgym.config import load_config
from dreamgym.data.transitions import TransitionWriter
from dreamgym.envs.registry import make_env
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.policies import RandomPolicy
from dreamgym.types import Observation


class OffListPolicy(RandomPolicy):
    """A random admissible action, or with probability ``share`` one of ``space`` this state does not admit."""

    name = "offlist"

    def __init__(self, space: frozenset[str], share: float) -> None:
        self.space = sorted(space)
        self.share = share

    def act(self, obs: Observation, rng: random.Random) -> str:
        off = [a for a in self.space if a not in set(obs.admissible_actions or ())]
        if off and rng.random() < self.share:
            return rng.choice(off)
        return super().act(obs, rng)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rooms", type=int, required=True, help="coin's numLocations")
    ap.add_argument("--store", type=Path, required=True, help="the offline transitions (their action space)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--offlist", type=float, default=0.5, help="share of steps that play an off-list action")
    ap.add_argument("--config", default="configs/study-cpu.yaml")
    args = ap.parse_args()
    cfg = load_config(args.config, {"env": {"split": "test", "params": {"numLocations": args.rooms,
                                                                         "includeDoors": 0}}})
    space = TransitionIndex.from_parquet(args.store).action_space()
    if not space:
        raise SystemExit(f"{args.store} records no admissible actions: no action space to draw off-list actions from")
    env = make_env(cfg.env)
    try:
        rows, stats = collect_range(env, OffListPolicy(space, args.offlist), 0, args.episodes, "test", cfg.run.seed,
                                    f"{cfg.env.name}/offlist/test")
    finally:
        env.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with TransitionWriter(args.out) as w:
        w.write(rows)
    off = sum(t.action not in (t.admissible_actions or ()) for t in rows)
    print(f"{stats.episodes} episodes, {len(rows)} transitions ({off} off-list actions) -> {args.out}")


if __name__ == "__main__":
    main()
