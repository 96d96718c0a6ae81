"""The policy's prompt and the parser of its replies.

One prompt shape for every environment family, with a family-specific introduction:

    system: what the agent is (text game / science lab / household / web shop / website agent)
            and the reply format: optional ``<think>...</think>``, then ``<action>...</action>``
    user:   Task, the last ``history_steps`` (action -> observation) pairs, the current
            observation, the admissible actions (when the environment knows them)

Two prompt styles (``policy.prompt_style``):

- ``windowed``: that prompt is rebuilt for every step, so the learner re-reads the system text, the
  worked example and the task once per action.
- ``chat``: one conversation per episode. The first step's prompt is the one above; each later step's
  prompt is the previous prompt's token ids + the sampled reply's ids + a short user turn (the task's
  line, this state's observation and admissible actions, ``turn_prompt``) tokenized on its own
  (``ChatPromptBuilder.extend``). The ids are concatenated, never re-rendered: a re-rendered template
  may tokenize a boundary differently, and the learner's sequence builder merges steps only when a
  prompt literally extends the previous sequence (``learner/sequences.py``), so every token is read
  once.

The reply's action is the content of its last ``<action>...</action>`` tag. A reply without a
well-formed tag is *not* dropped: the environment receives the stripped reply as the action (it
answers an invalid action the way it answers any invalid action) and the step is recorded as
unparsable (``ActionSample.parsed`` / ``Transition.action_parsed`` False).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from dreamgym.types import AgentTurn

ACTION_TAG = "action"
THINK_TAG = "think"
#: Generation stops after this string (kept in the reply).
ACTION_STOP = f"</{ACTION_TAG}>"

_ACTION_RE = re.compile(rf"<{ACTION_TAG}>(.*?)</{ACTION_TAG}>", re.DOTALL | re.IGNORECASE)
_THINK_RE = re.compile(rf"<{THINK_TAG}>(.*?)</{THINK_TAG}>", re.DOTALL | re.IGNORECASE)

#: How the policy's prompt grows over an episode (see the module docstring).
PromptStyle = Literal["chat", "windowed"]

#: environment family (``family`` of ``family:name``, or a remote environment's name) -> introduction
FAMILY_INTROS: dict[str, str] = {
    "twx": "You are an agent playing a text adventure game. You move between rooms, look at things and "
    "pick them up by typing short commands.",
    "textworld": "You are an agent playing a text adventure game. You move between rooms, open containers "
    "and use objects by typing short commands.",
    "sciworld": "You are an agent in a simulated science laboratory and household. You complete "
    "science experiments by typing short commands.",
    "alfworld": "You are an agent in a simulated household. You complete household chores by typing short "
    "commands such as 'go to countertop 1' or 'take apple 1 from countertop 1'.",
    "webshop": "You are an agent shopping on a web store. You search for products and click buttons, "
    "with commands such as 'search[red cotton shirt]' or 'click[Buy Now]'.",
    "webarena": "You are an agent operating a web browser to complete a task on a website. You act on "
    "page elements by their ids.",
}
DEFAULT_INTRO = "You are an agent acting in an interactive text environment by typing short commands."


@dataclass(frozen=True)
class ParsedReply:
    """A policy reply, split into what the environment receives and the reasoning."""

    action: str
    """The action for the environment (tag content, or the stripped reply when unparsable)."""
    parsed: bool
    """Whether a well-formed, non-empty action tag was found."""
    reasoning: str = ""
    """Content of the ``<think>`` tag, if any."""


def family_of(env_spec: str) -> str:
    """``twx:coin`` -> ``twx``; ``remote:webshop`` -> ``webshop``; ``synthetic:twx:coin`` -> ``twx``."""
    parts = env_spec.split(":")
    if parts[0] in ("remote", "synthetic") and len(parts) > 1:
        return parts[1]
    return parts[0]


def system_prompt(env_spec: str, reasoning: bool = False) -> str:
    intro = FAMILY_INTROS.get(family_of(env_spec), DEFAULT_INTRO)
    example = f"<{ACTION_TAG}>look around</{ACTION_TAG}>"
    if reasoning:
        fmt = (
            f"First think briefly inside <{THINK_TAG}>...</{THINK_TAG}>, then give exactly one command inside "
            f"<{ACTION_TAG}>...</{ACTION_TAG}>."
        )
        example = f"<{THINK_TAG}>I have not looked around here yet.</{THINK_TAG}>{example}"
    else:
        fmt = f"Reply with exactly one command inside <{ACTION_TAG}>...</{ACTION_TAG}> and nothing else."
    return f"{intro}\n{fmt}\nExample reply: {example}"


def _cut(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: max(0, limit - 3)].rstrip() + "..."


def user_prompt(
    turn: AgentTurn,
    history_steps: int = 4,
    max_admissible: int = 40,
    observation_max_chars: int = 1_500,
) -> str:
    obs = turn.observation
    instruction = turn.task.instruction or obs.instruction
    lines = [f"Task: {instruction.strip()}" if instruction else "Task: (see the observation)"]
    recent = turn.history[-history_steps:] if history_steps > 0 else []
    if recent:
        first = len(turn.history) - len(recent) + 1
        lines.append("Recent steps:")
        for k, (action, seen) in enumerate(recent):
            lines.append(f"{first + k}. > {action}\n{_cut(seen, observation_max_chars // 3)}")
    lines.append(f"Observation:\n{_cut(obs.state or obs.text, observation_max_chars)}")
    return _ask("\n".join(lines), obs.admissible_actions, max_admissible)


def _ask(head: str, actions: Sequence[str] | None, max_admissible: int) -> str:
    """``head``, then this state's admissible actions (at most ``max_admissible``) and the question."""
    lines = [head]
    if actions and max_admissible > 0:
        shown = actions[:max_admissible]
        more = f" (and {len(actions) - len(shown)} more)" if len(actions) > len(shown) else ""
        lines.append("Admissible actions: " + ", ".join(shown) + more)
    # Every turn ends with the question the worked example ends with: without it SmolLM2-135M reads a chat turn
    # as text to continue and answers with more room description (0 of 4 coin episodes solved, 83% unparsable).
    lines.append("What is your next command?")
    return "\n".join(lines)


def turn_prompt(turn: AgentTurn, max_admissible: int = 40, observation_max_chars: int = 1_500) -> str:
    """A later user turn of a ``chat`` conversation: the task's one line, this state's observation and admissible
    actions, and the question.

    The system text and the worked example were said once, in the first turn; the reply that led here is the
    assistant turn just before, so no history is repeated either."""
    obs = turn.observation
    instruction = turn.task.instruction or obs.instruction
    # The task again, one line: every turn then has the worked example's shape (Task, Observation, Admissible
    # actions, question), which a small model copies far more reliably than a shape seen once.
    lines = [f"Task: {instruction.strip()}" if instruction else "Task: (see the observation)",
             f"Observation:\n{_cut(obs.state or obs.text, observation_max_chars)}"]
    return _ask("\n".join(lines), obs.admissible_actions, max_admissible)


#: environment family -> one worked example: (user prompt of an earlier decision, the reply to it).
#: Shown as a first chat exchange when ``worked_example`` is on: a small model copies the reply format
#: from it (SmolLM2-135M acts validly in 1-3% of coin steps without one, succeeds ~52% with one; see the
#: measured baselines in docs/stack-notes.md).
WORKED_EXAMPLES: dict[str, tuple[str, str]] = {
    "twx": (
        "Task: Your task is to search the environment and find the coin. Once you find the coin, take it.\n"
        "Observation:\nYou are in the corridor. You see a key holder, that has nothing on it. "
        "To the North you see the kitchen. To the East you see the living room.\n"
        "Admissible actions: inventory, look around, move east, move north\n"
        "What is your next command?",
        f"<{ACTION_TAG}>move east</{ACTION_TAG}>",
    ),
}


def build_messages(
    turn: AgentTurn,
    reasoning: bool = False,
    history_steps: int = 4,
    max_admissible: int = 40,
    observation_max_chars: int = 1_500,
    worked_example: bool = False,
) -> list[dict[str, str]]:
    """Chat messages (system, [worked example user + assistant], user) for one policy decision."""
    messages = [{"role": "system", "content": system_prompt(turn.task.env, reasoning)}]
    example = WORKED_EXAMPLES.get(family_of(turn.task.env)) if worked_example and not reasoning else None
    if example is not None:
        messages += [{"role": "user", "content": example[0]}, {"role": "assistant", "content": example[1]}]
    user = user_prompt(turn, history_steps, max_admissible, observation_max_chars)
    messages.append({"role": "user", "content": user})
    return messages


def parse_reply(reply: str) -> ParsedReply:
    """Extract the action from a reply; an unparsable reply becomes the action as-is (stripped)."""
    think = _THINK_RE.search(reply)
    reasoning = think.group(1).strip() if think else ""
    found: Sequence[str] = _ACTION_RE.findall(reply)
    if found and found[-1].strip():
        return ParsedReply(action=" ".join(found[-1].split()), parsed=True, reasoning=reasoning)
    return ParsedReply(action=" ".join(reply.split()), parsed=False, reasoning=reasoning)


class ChatTokenizer(Protocol):
    """What ``ChatPromptBuilder`` needs of a Hugging Face tokenizer."""

    def apply_chat_template(self, conversation: Any, **kw: Any) -> Any: ...

    def encode(self, text: str, **kw: Any) -> list[int]: ...


#: Placeholder contents for finding the template's turn boundaries (never sent to a model).
_SENTINEL_REPLY = "\u2063REPLY\u2063"
_SENTINEL_USER = "\u2063USER\u2063"


@dataclass(frozen=True)
class ChatTurnTemplate:
    """The text a chat template puts around a new user turn that follows an assistant reply.

    Found once per tokenizer by rendering a short conversation with placeholder contents, so any template
    whose renderings of a conversation and of that conversation plus one more turn agree on the common
    part works (ChatML, Llama-3, ...)."""

    close_reply: str
    """What ends an assistant reply (ChatML: ``<|im_end|>\\n``)."""
    user_prefix: str
    """What opens a user turn (ChatML: ``<|im_start|>user\\n``)."""
    user_suffix: str
    """What closes the user turn and opens the assistant's (ChatML: ``<|im_end|>\\n<|im_start|>assistant\\n``)."""

    @classmethod
    def from_tokenizer(cls, tokenizer: ChatTokenizer) -> ChatTurnTemplate:
        head = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": _SENTINEL_REPLY}]
        base = str(tokenizer.apply_chat_template(head, tokenize=False))
        full = str(tokenizer.apply_chat_template([*head, {"role": "user", "content": _SENTINEL_USER}],
                                                 tokenize=False, add_generation_prompt=True))
        if not full.startswith(base) or _SENTINEL_REPLY not in base or full[len(base):].count(_SENTINEL_USER) != 1:
            raise ValueError("this tokenizer's chat template renders a longer conversation differently from the "
                             "shorter one it extends, so a chat prompt cannot grow by concatenation; set "
                             "policy.prompt_style: windowed")
        close = base[base.rindex(_SENTINEL_REPLY) + len(_SENTINEL_REPLY):]
        prefix, suffix = full[len(base):].split(_SENTINEL_USER)
        return cls(close, prefix, suffix)


class ChatPromptBuilder:
    """Token ids of the next prompt of a ``chat`` conversation: the conversation so far (the previous prompt
    and its sampled reply) + the end of the reply + a new user turn + the assistant header."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self.template = ChatTurnTemplate.from_tokenizer(tokenizer)
        self.close_ids = self._encode(self.template.close_reply)

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def extend(self, context_ids: Sequence[int], user_content: str) -> list[int]:
        """``context_ids`` followed by the ids of the new user turn. A reply that stopped on its own end-of-turn
        token (e.g. ``<|im_end|>``) already holds the start of the closing text; only the rest is added, so the
        end-of-turn token never appears twice. A reply cut at the closing action tag or at ``max_tokens`` gets
        the whole closing text."""
        ctx = [int(i) for i in context_ids]
        close = self.close_ids
        overlap = next((k for k in range(min(len(close), len(ctx)), 0, -1) if ctx[-k:] == close[:k]), 0)
        t = self.template
        return ctx + close[overlap:] + self._encode(t.user_prefix + user_content + t.user_suffix)
