"""The agent prompt per environment family and the action parser."""

from __future__ import annotations

from dreamgym.agent_prompt import build_messages, family_of, parse_reply, system_prompt
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
