"""A gymnasium agent loop (``reset`` / ``step``) in DreamGym's synthetic environment, on CPU, without Ray.

What it shows: ``TextGymEnv`` (``dreamgym/experience/gym_env.py``) makes the synthetic environment a
``gymnasium.Env`` with text observations and text actions. The pieces are the real ones, at their smallest:

1. a few real ``twx:coin`` episodes, played here by the scripted ``mixed`` policy (TextWorldExpress, Java):
   the experience model's retrieval store, and the source of tasks, initial states and valid actions;
2. the experience model, ``--model``:
   - ``smollm2-135m`` (default, packaged), ``tiny`` (a random Llama) or a folder written by
     ``dreamgym train-experience-model``: a vLLM engine in this process. Neither packaged model is trained
     for the reply format, so their replies are invalid transitions, which end an episode as truncated;
   - ``copy``: no LLM; the retrieval-only baseline replies with the top demonstration's outcome, so
     episodes run to the coin or to the step budget;
3. a random agent choosing among the valid actions of the current state.

    .venv/bin/python examples/gym_agent.py --model copy --episodes 3
    .venv/bin/python examples/gym_agent.py --episodes 1 --max-steps 3
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # before vLLM is imported

from dreamgym.collect import collect_range
from dreamgym.config import EnvConfig, ExperienceModelConfig
from dreamgym.envs.registry import make_env
from dreamgym.experience.backends import open_client
from dreamgym.experience.client import FunctionClient
from dreamgym.experience.gym_env import TextGymEnv
from dreamgym.experience.prompts import format_reply
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.experience.schema import Message, Sampling
from dreamgym.experience.setup import build_model
from dreamgym.experience.synthetic_env import synthetic_env_from_index
from dreamgym.policies import make_policy

ENV = "twx:coin"
TOP_DEMO = re.compile(r"\[1\] State: .*?\nNext state: (.*?)\nReward: (\S+) Done: (\S+) Success: (\S+)", re.S)


def copy_top_demonstration(messages: list[Message], sampling: Sampling) -> str:
    """The retrieval-only baseline as an experience model: the outcome of demonstration [1] of the prompt."""
    m = TOP_DEMO.search(messages[-1]["content"])
    if m is None:
        return "no demonstration to copy"  # not the reply format: an invalid transition
    state, reward, done, success = m.groups()
    return format_reply(state, float(reward), done == "true", success == "true", "copied the closest real step")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m, tiny, an HF folder, or copy (no LLM)")
    p.add_argument("--real-episodes", type=int, default=20, help="real twx:coin episodes behind the model")
    p.add_argument("--episodes", type=int, default=2, help="synthetic episodes the agent plays")
    p.add_argument("--max-steps", type=int, default=8, help="step budget of a synthetic episode")
    p.add_argument("--max-tokens", type=int, default=128, help="reply budget of the experience model")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    real = make_env(EnvConfig(name=ENV))
    try:
        transitions, _ = collect_range(real, make_policy("mixed"), 0, args.real_episodes, "train", args.seed, "demo")
    finally:
        real.close()
    index = TransitionIndex(transitions)
    print(f"{args.real_episodes} real episodes, {len(transitions)} transitions ({time.perf_counter() - t0:.0f} s)")

    copying = args.model == "copy"
    # One demonstration per prompt: copied whole, or clipped so an LLM prompt fits the tiny model's 2048 tokens.
    em = ExperienceModelConfig(model=args.model, backend="local", max_tokens=args.max_tokens, max_attempts=2,
                               top_k=1, demo_state_max_chars=2_000 if copying else 300,
                               engine={"dtype": "float32", "max_model_len": 2048})
    client = FunctionClient(copy_top_demonstration) if copying else open_client(em)  # local: vLLM in this process
    print(f"experience model: {args.model} ({time.perf_counter() - t0:.0f} s)")
    model = build_model(em, client)
    env = TextGymEnv(synthetic_env_from_index(model, index, ENV, max_steps=args.max_steps))
    rng = random.Random(args.seed)
    try:
        for episode in range(args.episodes):
            obs, info = env.reset(seed=args.seed if episode == 0 else None)
            print(f"\n== episode {episode}: {info['instruction']}\n{obs}")
            actions: list[str] = info["admissible_actions"] or ["look around"]
            total, done, step = 0.0, False, 0
            while not done:
                action = rng.choice(actions)
                obs, reward, terminated, truncated, info = env.step(action)
                total, done, step = total + reward, terminated or truncated, step + 1
                end = " terminated" if terminated else " truncated" if truncated else ""
                why = "" if info["valid"] else f" (invalid transition: {info['invalid_reason']})"
                print(f"-- step {step}: > {action}  reward {reward:g}{end}{why}\n{obs}")
                actions = info["admissible_actions"] or actions  # a state the data never saw: keep the last list
            print(f"== episode {episode}: return {total:g}, success {info['success']}, {step} steps")
    finally:
        env.close()
        client.close()
    print(f"\nexperience model stats: {model.stats.as_dict()} ({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
