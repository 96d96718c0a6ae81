"""Screen candidate settings for the study by what the game alone says (no model, seconds per setting).

For each candidate (a TextWorldExpress game with parameters and a step budget) it plays the held-out test
seeds the study evaluates on (``train.eval``: split ``test``, seeds from 0) with the random-valid-action agent
and records the expert plan's length. A setting with headroom for the study needs a random agent well below
the base policy and a plan long enough that one lucky action does not win; the base policy and real GRPO are
then probed with ``dreamgym study --arm base --arm real`` on the survivors (docs/results/headroom.md).

    python bench/headroom_env_probe.py --episodes 64 --out bench/results/headroom-env-vm-DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from dreamgym.collect import run_episode
from dreamgym.config import EnvConfig
from dreamgym.envs.registry import make_env
from dreamgym.policies import RandomPolicy

#: (label, game, parameters, step budget): coin with more rooms or doors, and the other games the issue names.
CANDIDATES: list[tuple[str, str, dict[str, int], int]] = [
    ("coin-3", "coin", {"numLocations": 3, "includeDoors": 0}, 10),
    ("coin-5", "coin", {"numLocations": 5, "includeDoors": 0}, 10),
    ("coin-5-doors", "coin", {"numLocations": 5, "includeDoors": 1}, 15),
    ("coin-8", "coin", {"numLocations": 8, "includeDoors": 0}, 15),
    ("twc-1x2", "twc", {"numLocations": 1, "numItemsToPutAway": 2, "includeDoors": 0}, 10),
    ("twc-2x2", "twc", {"numLocations": 2, "numItemsToPutAway": 2, "includeDoors": 0}, 15),
    ("cooking-1x1", "cookingworld", {"numLocations": 1, "numIngredients": 1, "numDistractorItems": 0,
                                     "includeDoors": 0, "limitInventorySize": 0}, 10),
    ("cooking-1x2", "cookingworld", {"numLocations": 1, "numIngredients": 2, "numDistractorItems": 0,
                                     "includeDoors": 0, "limitInventorySize": 0}, 15),
    ("mapreader-3", "mapreader", {"numLocations": 3, "maxDistanceApart": 2, "includeDoors": 0}, 15),
]


def probe(game: str, params: dict[str, int], max_steps: int, episodes: int) -> dict[str, Any]:
    env = make_env(EnvConfig(name=f"twx:{game}", params=params, max_steps=max_steps))
    tasks = env.tasks(episodes, first=0, split="test")
    wins, steps, plan_lengths = 0, [], []
    try:
        for i, task in enumerate(tasks):
            rng = random.Random(i)
            transitions = run_episode(env, task, RandomPolicy(), rng, episode_id=f"random-{i}")
            wins += transitions[-1].success
            steps.append(len(transitions))
            env.reset(task)  # the expert plan is the fresh game's, not the one the random agent left
            plan_lengths.append(len(env.gold_actions() or []))
    finally:
        env.close()
    return {"random_valid_success": wins / episodes, "random_valid_wins": wins,
            "random_mean_steps": statistics.fmean(steps), "gold_plan_mean": statistics.fmean(plan_lengths),
            "gold_plan_max": max(plan_lengths), "episodes": episodes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.episodes < 1:
        ap.error(f"--episodes must be at least 1 (got {args.episodes}): the held-out test seeds to play per setting")
    t0 = time.time()
    rows = []
    for label, game, params, max_steps in CANDIDATES:
        row = {"setting": label, "env": f"twx:{game}", "params": params, "max_steps": max_steps,
               **probe(game, params, max_steps, args.episodes)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"bench": "headroom_env_probe", "machine": platform.processor() or platform.machine(),
           "load_avg": os.getloadavg(), "wall_s": round(time.time() - t0, 1), "split": "test", "first_seed": 0,
           "agent_seed": "episode index", "settings": rows}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
