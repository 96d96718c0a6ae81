"""The agent prompt per environment family and the action parser."""

from __future__ import annotations

import pytest

from dreamgym.agent_prompt import (
    ChatPromptBuilder,
    ChatTurnTemplate,
    build_messages,
    family_of,
    parse_reply,
    system_prompt,
    turn_prompt,
)
from dreamgym.types import AgentTurn, Observation, Task


def _turn(env: str = "twx:coin", history: int = 6, actions: int = 5) -> AgentTurn:
    return AgentTurn(
        task=Task("t", env, "Find the coin."),
        observation=Observation("raw <b>kitchen</b>", "You are in the kitchen.", [f"go {i}" for i in range(actions)]),
        history=[(f"act{i}", f"saw{i}") for i in range(history)],
    )


def test_messages_carry_task_recent_history_observation_and_actions() -> None:
    msgs = build_messages(_turn(), reasoning=False, history_steps=2, max_admissible=3)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "text adventure" in msgs[0]["content"] and "<action>" in msgs[0]["content"]
    user = msgs[1]["content"]
    assert "Task: Find the coin." in user
    assert "act5" in user and "act4" in user and "act3" not in user  # only the last two steps
    assert "5. > act4" in user  # steps keep their episode numbering
    assert "You are in the kitchen." in user and "<b>" not in user  # the abstract state, not the raw text
    assert "go 0, go 1, go 2 (and 2 more)" in user
    assert "Recent steps" not in build_messages(_turn(), history_steps=0)[1]["content"]
    assert "Admissible" not in build_messages(_turn(), max_admissible=0)[1]["content"]


def test_family_intros_and_reasoning_format() -> None:
    assert family_of("twx:coin") == "twx"
    assert family_of("remote:webshop") == "webshop"
    assert family_of("synthetic:alfworld:x") == "alfworld"
    assert "web store" in system_prompt("remote:webshop")
    assert "household" in system_prompt("alfworld:/x/game.tw-pddl")
    assert "science" in system_prompt("sciworld:boil")
    assert "interactive text environment" in system_prompt("unknown:thing")
    assert "<think>" in system_prompt("twx:coin", reasoning=True)
    assert "<think>" not in system_prompt("twx:coin", reasoning=False)


def test_parse_reply() -> None:
    p = parse_reply("<think>coin is east</think><action> go   east </action>")
    assert (p.action, p.parsed, p.reasoning) == ("go east", True, "coin is east")
    assert parse_reply("<action>look</action> then <ACTION>take coin</ACTION>").action == "take coin"  # last tag
    # Unparsable replies are passed on as they are (whitespace-normalised) and flagged.
    p = parse_reply("  take\n coin  ")
    assert (p.action, p.parsed) == ("take coin", False)
    assert parse_reply("<action>   </action>").parsed is False
    assert parse_reply("<action>go north").parsed is False  # no closing tag
    assert parse_reply("").action == ""


# -- chat-style prompts: each step's prompt extends the previous one by token concatenation ------------------


class _TemplateTokenizer:
    """A real tokenizer (the tiny model's byte-level BPE, ChatML template) or one whose template renders a
    conversation's length up front, so a longer conversation does not extend a shorter one."""

    def __init__(self, tok: object, prefix_count: bool = False) -> None:
        self.tok, self.prefix_count = tok, prefix_count

    def apply_chat_template(self, conversation: list[dict[str, str]], **kw: object) -> object:
        text = self.tok.apply_chat_template(conversation, **kw)  # type: ignore[attr-defined]
        return f"{len(conversation)} turns\n{text}" if self.prefix_count else text

    def encode(self, text: str, **kw: object) -> list[int]:
        return list(self.tok.encode(text, **kw))  # type: ignore[attr-defined]


def _tiny_tokenizer() -> object:
    from transformers import AutoTokenizer

    from dreamgym.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("tiny"))


def _template_ids(tok: object, messages: list[dict[str, str]]) -> list[int]:
    """The chat template applied and tokenized in one go, like the engine's first prompt (``VllmPolicy.prompt_ids``)."""
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)  # type: ignore[attr-defined]
    return [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


def test_turn_prompt_is_the_task_line_observation_and_actions() -> None:
    user = turn_prompt(_turn(), max_admissible=3)
    assert user == ("Task: Find the coin.\nObservation:\nYou are in the kitchen.\n"
                    "Admissible actions: go 0, go 1, go 2 (and 2 more)\nWhat is your next command?")
    assert "act5" not in user and "Recent steps" not in user  # the history is already in the conversation
    assert "Admissible" not in turn_prompt(_turn(), max_admissible=0)


def test_chat_template_boundaries_are_found_from_the_tokenizer() -> None:
    t = ChatTurnTemplate.from_tokenizer(_tiny_tokenizer())  # type: ignore[arg-type]
    assert (t.close_reply, t.user_prefix, t.user_suffix) == (
        "<|im_end|>\n", "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="prompt_style: windowed"):
        ChatTurnTemplate.from_tokenizer(_TemplateTokenizer(_tiny_tokenizer(), prefix_count=True))


def test_chat_prompt_extends_the_previous_prompt_and_reply_token_for_token() -> None:
    tok = _tiny_tokenizer()
    builder = ChatPromptBuilder(tok)  # type: ignore[arg-type]
    messages = build_messages(_turn(history=0), worked_example=True)
    prompt = _template_ids(tok, messages)
    reply = tok.encode("<action>go 1</action>", add_special_tokens=False)  # type: ignore[attr-defined]
    user = turn_prompt(_turn(), max_admissible=3)
    nxt = builder.extend(prompt + reply, user)
    assert nxt[: len(prompt) + len(reply)] == prompt + reply  # literally extends: the learner merges the steps
    # ... and is what the template renders for the whole conversation (ChatML: the pieces meet at special tokens)
    whole = [*messages, {"role": "assistant", "content": "<action>go 1</action>"}, {"role": "user", "content": user}]
    assert nxt == _template_ids(tok, whole)
    # a reply that stopped on its own end-of-turn token does not get a second one
    eot = tok.convert_tokens_to_ids("<|im_end|>")  # type: ignore[attr-defined]
    after_eot = builder.extend([*prompt, *reply, eot], user)
    assert after_eot == nxt[: len(prompt) + len(reply) + 1] + nxt[len(prompt) + len(reply) + 1:]
    assert after_eot.count(eot) == nxt.count(eot)


def test_chat_steps_become_one_learner_sequence_with_the_mask_on_replies_only() -> None:
    from dreamgym.types import Trajectory, Transition
    from learner.sequences import trajectory_sequences

    tok = _tiny_tokenizer()
    builder = ChatPromptBuilder(tok)  # type: ignore[arg-type]
    prompt = _template_ids(tok, build_messages(_turn(history=0)))
    steps, replies = [], []
    for k in range(3):
        reply = tok.encode(f"<action>go {k}</action>", add_special_tokens=False)  # type: ignore[attr-defined]
        steps.append(Transition(episode_id="e", step=k, task_id="t", env="twx:coin", instruction="i", state="s",
                                action=f"go {k}", next_state="s", reward=0.0, done=k == 2, success=False,
                                admissible_actions=None,
                                prompt_token_ids=prompt, action_token_ids=reply, action_logprobs=[-0.5] * len(reply)))
        replies.append(reply)
        prompt = builder.extend(prompt + reply, turn_prompt(_turn()))
    (seq,) = trajectory_sequences(Trajectory(Task("t", "twx:coin", "i"), steps, success=False, total_reward=0.0))
    masked = [i for i, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m]
    assert masked == [i for r in replies for i in r]
    assert len(seq) == len(steps[-1].prompt_token_ids) + len(replies[-1])  # every token once
