"""The one prompt builder of the experience model, and the reply format it asks for.

Prompt (chat messages):

- system: what is simulated, the rules of the abstract state, the reward rules, the failure state of
  an inadmissible action, and the reply format. Constant per environment family, so the engine's
  prefix cache serves it for every request.
- user: the task instruction, the top-k demonstrations ``(s, a) -> (s', r, done, success)``, the last
  ``H`` steps of history, the current state ``s_t`` (with the valid actions where known) and the
  agent's action ``a_t``.

Reply (what SFT trains and ``parser.parse_reply`` accepts)::

    <think>reasoning</think>
    <next_state>s_{t+1}</next_state>
    <reward>r</reward>
    <done>true|false</done>
    <success>true|false</success>

Reasoning comes first so the next state is conditioned on it (the paper's reasoning experience
model); with ``reasoning=False`` (the "no reasoning" ablation) the ``<think>`` block is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from dreamgym.experience.schema import ExperienceQuery, Message
from dreamgym.experience.templates import state_rules_for, template_for
from dreamgym.types import Demonstration

#: Generation stops at the closing tag of the last field (the stop string itself is not returned).
STOP = ("</success>",)


@dataclass(frozen=True)
class PromptOptions:
    """How much context goes into a prompt (see ``config.ExperienceModelConfig``)."""

    history_steps: int = 4
    top_k: int = 3
    demo_state_max_chars: int = 600
    history_state_max_chars: int = 300
    state_max_chars: int = 2_000
    reasoning: bool = True
    reward_min: float = 0.0
    reward_max: float = 1.0


def format_number(x: float) -> str:
    """``1.0`` -> ``1``, ``0.25`` -> ``0.25`` (short, and what the parser reads back)."""
    return f"{float(x):.6g}"


def format_bool(b: bool) -> str:
    return "true" if b else "false"


def clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max(max_chars - 3, 0)].rstrip() + "..."


def system_prompt(env_spec: str, opts: PromptOptions) -> str:
    tpl = template_for(env_spec)
    lo, hi = format_number(opts.reward_min), format_number(opts.reward_max)
    think = "<think>your reasoning: what the action does in this state and why</think>\n" if opts.reasoning else ""
    first = "First reason step by step, then predict" if opts.reasoning else "Predict"
    return (
        f"You simulate {tpl.world}. Given the task, the recent history, the current state and the agent's "
        f"action, predict what the environment shows next. {first} the next state, the reward and whether "
        "the episode is done and succeeded.\n"
        f"State: {state_rules_for(env_spec)}\n"
        f"Reward: {tpl.reward_rules}\n"
        "If the action is not valid in the current state, the next state is the failure state "
        f'"{tpl.invalid_action_state}" with reward 0, and the episode goes on.\n'
        "Similar real transitions are given as evidence: follow them where they apply.\n"
        "Reply in exactly this format and nothing else:\n"
        f"{think}"
        "<next_state>the next state</next_state>\n"
        f"<reward>a number from {lo} to {hi}</reward>\n"
        "<done>true or false</done>\n"
        "<success>true or false</success>"
    )


def _demo_block(i: int, d: Demonstration, opts: PromptOptions) -> str:
    return (
        f"[{i}] State: {clip(d.state, opts.demo_state_max_chars)}\n"
        f"Action: {d.action}\n"
        f"Next state: {clip(d.next_state, opts.demo_state_max_chars)}\n"
        f"Reward: {format_number(d.reward)} Done: {format_bool(d.done)} Success: {format_bool(d.success)}"
    )


def user_prompt(q: ExperienceQuery, opts: PromptOptions) -> str:
    parts = [f"Task: {q.instruction.strip()}"]
    demos = q.demonstrations[: opts.top_k]
    if demos:
        blocks = [_demo_block(i + 1, d, opts) for i, d in enumerate(demos)]
        parts.append("Similar real transitions:\n" + "\n".join(blocks))
    history = q.history[-opts.history_steps :] if opts.history_steps > 0 else []
    if history:
        lines = [f"- Action: {h.action} -> State: {clip(h.state, opts.history_state_max_chars)}" for h in history]
        parts.append("Recent history (oldest first):\n" + "\n".join(lines))
    current = f"Current state:\n{clip(q.state, opts.state_max_chars)}"
    if q.admissible_actions:
        current += "\nValid actions: " + ", ".join(q.admissible_actions)
    parts.append(current)
    parts.append(f"Action: {q.action}")
    return "\n\n".join(parts)


def build_messages(q: ExperienceQuery, opts: PromptOptions) -> list[Message]:
    """The chat messages of one experience-model request."""
    return [
        {"role": "system", "content": system_prompt(q.env, opts)},
        {"role": "user", "content": user_prompt(q, opts)},
    ]


def format_reasoning(reasoning: str) -> str:
    """The reasoning part of a reply (empty without reasoning)."""
    return f"<think>{reasoning.strip()}</think>\n"


def format_outcome(next_state: str, reward: float, done: bool, success: bool) -> str:
    """The structured part of a reply, including the final closing tag."""
    return (
        f"<next_state>{next_state.strip()}</next_state>\n"
        f"<reward>{format_number(reward)}</reward>\n"
        f"<done>{format_bool(done)}</done>\n"
        f"<success>{format_bool(success)}</success>"
    )


def format_reply(
    next_state: str, reward: float, done: bool, success: bool, reasoning: str = "", with_reasoning: bool = True
) -> str:
    """The reply the experience model should write (the SFT target)."""
    head = format_reasoning(reasoning) if with_reasoning else ""
    return head + format_outcome(next_state, reward, done, success)
