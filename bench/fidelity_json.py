"""Combine ``bench/fidelity.sh``'s evaluations into one fidelity JSON (``bench/results/fidelity-*.json``).

Per setting (3-room and 5-room coin): ``unseen`` and ``seen`` (and ``all``) ``(s, a)``, each with
``model_first_reply``, ``model_after_rules``, ``copy_top1`` and ``rules_only`` (``dreamgym.experience.fidelity``),
each with ``next_state_exact``, ``next_state_f1``, ``reward_acc``, ``done_acc``, ``success_acc``, ``invalid_rate``
and ``n``; beside them the data sizes, the fine-tune's summary and the model's call counts; under ``offlist``
the same on held-out steps whose action the admissible list rules out (``ruled_out``) and the rest. At the top: machine,
date, load average (at the start of the script and now), seeds, model and SFT recipe.

    python bench/fidelity_json.py runs/fidelity --out bench/results/fidelity-coin-vm-2026-12-07.json
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from benchlib import load_average, machine

from dreamgym.config import load_config

CONFIG = "configs/study-cpu.yaml"
ROOMS = (3, 5)



def setting(d: Path, rooms: int) -> dict[str, Any]:
    ev = json.loads((d / f"eval-{rooms}rooms.json").read_text())
    data = ev["data"]
    sft = json.loads((Path(data["model"]) / "dreamgym_sft.json").read_text())["summary"]
    return {
        "env": "twx:coin", "params": {"numLocations": rooms, "includeDoors": 0},
        "model": data["model"], "model_trained_on": data["store"],
        "data": {"offline_transitions": data["store_transitions"],
                 "offline_distinct_state_action": data["store_distinct"],
                 "heldout_transitions": data["heldout_transitions"], "evaluated": data["evaluated"],
                 "unseen": data["unseen"], "seen": data["evaluated"] - data["unseen"],
                 "offline": data["store"], "heldout": data["heldout"], "top_k": data["top_k"],
                 "history_steps": data["history_steps"]},
        "sft": {k: sft.get(k) for k in ("steps", "examples", "examples_seen", "transitions", "duplicates",
                                        "batch_size", "precision", "loss_first", "loss_last", "train_seconds",
                                        "tokens_per_s")},
        **{subset: ev["fidelity"][subset] for subset in ("unseen", "seen", "all")},
        "model_stats": ev.get("model_stats"), "model_seconds": ev["model"]["seconds"],
        "offlist": offlist(d, rooms),
    }


def offlist(d: Path, rooms: int) -> dict[str, Any] | None:
    """The evaluation on held-out steps with actions the admissible list rules out (bench/fidelity_offlist.py)."""
    path = d / f"eval-offlist-{rooms}rooms.json"
    if not path.is_file():
        return None
    ev = json.loads(path.read_text())
    return {"heldout": ev["data"]["heldout"], "heldout_transitions": ev["data"]["heldout_transitions"],
            "evaluated": ev["data"]["evaluated"], "policy": "offlist (bench/fidelity_offlist.py, share 0.5)",
            **ev["fidelity"], "model_stats": ev.get("model_stats")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="bench/fidelity.sh's run folder")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_config(CONFIG)
    start = args.dir / "loadavg-start.txt"
    result = {
        "what": "fidelity before the rules: the experience model's first reply, the model after retries and "
                "rules, copy-top-1 and the rules alone on held-out coin transitions (docs/results/"
                "fidelity-before-rules.md)",
        "command": f"bench/fidelity.sh {args.dir}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_average": {"start": [float(x) for x in start.read_text().split()[:3]] if start.is_file() else None,
                         "end": load_average()},
        "seeds": {"run": cfg.run.seed, "engine": cfg.experience_model.engine.seed,
                  "offline": "train split, task seeds 0-99, collect.policy mixed (gold_fraction 0.5)",
                  "heldout": "test split, task seeds 0-29", "eval_sample": f"random.Random({cfg.run.seed})"},
        "model": {"base": cfg.experience_model.train.base, "sft_steps": cfg.experience_model.train.max_steps,
                  "sft_examples": cfg.experience_model.train.max_examples, "lr": cfg.experience_model.train.lr,
                  "temperature": cfg.experience_model.temperature, "max_attempts": cfg.experience_model.max_attempts,
                  "config": CONFIG},
        "settings": {f"coin-{m}rooms": setting(args.dir, m) for m in ROOMS
                     if (args.dir / f"eval-{m}rooms.json").is_file()},
    }
    missing = [m for m in ROOMS if f"coin-{m}rooms" not in result["settings"]]
    if missing:
        print(f"not evaluated yet (rerun bench/fidelity.sh): {missing} rooms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
