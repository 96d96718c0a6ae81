"""TRL's ``GRPOTrainer`` trains a policy in DreamGym's served synthetic environment: a peer trainer, plain HTTP.

What it shows: a trainer that knows nothing of this project trains in the simulator that ``dreamgym
serve-synthetic`` serves (docs/howto/serve-synthetic.md), over the AgentGym-style protocol alone
(``requests``; no ``dreamgym`` import in the loop):

1. the server's tasks (``GET /tasks``) and each task's first state (one ``POST /reset``) become TRL's prompts:
   the instruction, what the agent sees and the valid actions;
2. the policy writes one action per completion; the reward function plays it in a fresh session of the served
   simulator (``POST /create``, ``/reset`` to that task, ``/step``, ``/close``) and returns the step's reward:
   one-step episodes (a contextual bandit over first states), which any single-turn GRPO trainer runs as is;
3. ``GRPOTrainer`` on CPU (no vLLM) for ``--steps`` steps; the server's ``GET /metrics`` shows what it served.

    dreamgym collect --env twx:coin --policy mixed --episodes 50 --out coin.parquet
    dreamgym serve-synthetic --env twx:coin --offline-data coin.parquet --backend copy --port 36002 &
    .venv/bin/python examples/trl_grpo_synthetic.py --url http://127.0.0.1:36002 --model tiny --steps 2

``--model``: ``tiny`` (a random 2-layer Llama built locally), ``smollm2-135m`` (packaged) or an HF folder.
Needs ``trl`` (``pip install trl``; the ``trl`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

import requests


class Simulator:
    """The served synthetic environment over plain HTTP (what any trainer would write)."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, **kw: Any) -> Any:
        r = self.http.request(method, self.url + path, timeout=120, **kw)
        if not r.ok:
            raise RuntimeError(f"{method} {path}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def play(self, task: dict[str, Any], action: str | None) -> dict[str, Any]:
        """Reset a fresh session to ``task``; step ``action`` when given. Returns the last reply."""
        env_id = self.call("POST", "/create")["id"]
        try:
            reply = self.call("POST", "/reset", json={"id": env_id, "task": task})
            if action is not None:
                reply = self.call("POST", "/step", json={"id": env_id, "action": action})
            return reply  # type: ignore[no-any-return]
        finally:
            self.call("POST", "/close", json={"id": env_id})


def prompt_of(first: dict[str, Any]) -> str:
    actions = ", ".join(first["available_actions"] or [])
    return (f"Task: {first['instruction']}\nYou see: {first['observation']}\nValid actions: {actions}\n"
            "Answer with one valid action.\nAction:")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--url", required=True, help="base URL of `dreamgym serve-synthetic`")
    p.add_argument("--token", default=os.environ.get("DREAMGYM_ENV_TOKEN"), help="its token (DREAMGYM_ENV_TOKEN)")
    p.add_argument("--model", default="tiny", help="tiny, smollm2-135m or an HF folder")
    p.add_argument("--tasks", type=int, default=8, help="tasks taken from the server")
    p.add_argument("--steps", type=int, default=2, help="GRPO steps")
    p.add_argument("--generations", type=int, default=4, help="completions per prompt (the GRPO group)")
    args = p.parse_args(argv)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from dreamgym.models import resolve_model

    sim = Simulator(args.url, args.token)
    tasks = sim.call("GET", "/tasks", params={"count": args.tasks})
    rows = [{"prompt": prompt_of(sim.play(t, None)), "task": json.dumps(t)} for t in tasks]
    print(f"{len(rows)} prompts from {args.url} ({sim.call('GET', '/')['env']})")

    def simulator_reward(prompts: list[str], completions: list[str], task: list[str], **_: Any) -> list[float]:
        """The served simulator's reward for each completion's first line, played from its task's first state."""
        return [float(sim.play(json.loads(t), c.strip().split("\n")[0].strip() or "look around")["reward"])
                for c, t in zip(completions, task, strict=True)]

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.generations,
                            num_generations=args.generations, max_completion_length=8, learning_rate=1e-4,
                            logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", seed=0,
                            dataloader_num_workers=0)
        trainer = GRPOTrainer(model=str(resolve_model(args.model)), reward_funcs=simulator_reward, args=config,
                              train_dataset=Dataset.from_list(rows))
        trainer.train()
    for record in trainer.state.log_history:
        if "reward" in record:
            print(f"step {record.get('step')}: reward {record['reward']:.3f}, loss {record.get('loss', 0.0):.4f}")
    m = sim.call("GET", "/metrics")
    print(f"trained {trainer.state.global_step} GRPO steps; the simulator served {m['steps']} steps, paid "
          f"{m['reward_paid']:g}, settled {m['rule_settled']} by rule, {m['invalid_transitions']} invalid")


if __name__ == "__main__":
    main()
