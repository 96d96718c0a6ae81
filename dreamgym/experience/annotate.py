"""Reasoning traces for offline transitions (``dreamgym annotate``).

The experience model is trained to reason before it predicts, so each real transition needs a
reasoning trace. Two annotators:

- ``TemplateAnnotator``: a rationale derived from the environment's own facts (was the action valid,
  did the location change, what appeared or disappeared, why the reward and the end are what they
  are). Deterministic, free, marked ``reasoning_source='template'``. The SFT prepends
  ``demonstration_evidence`` (the prompt's demonstrations are known only there).
- ``TeacherAnnotator``: the paper's strong-LLM annotator over any OpenAI-compatible endpoint: it sees
  the context and the true outcome and explains it; marked ``teacher``. A reply that is empty or the
  backend refused falls back to the template rationale (marked ``template``).

``annotate_file`` streams a transitions file into a new one with the optional ``reasoning`` and
``reasoning_source`` columns of the transitions schema (other columns unchanged).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.prompts import PromptOptions, clip, format_number, user_prompt
from dreamgym.experience.schema import CompletionRequest, ExperienceQuery, Sampling
from dreamgym.experience.templates import FamilyTemplate, template_for

if TYPE_CHECKING:
    from dreamgym.config import AnnotateConfig
    from dreamgym.types import Demonstration

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def _location(state: str, tpl: FamilyTemplate) -> str | None:
    if not tpl.location_prefix:
        return None
    i = state.find(tpl.location_prefix)
    if i < 0:
        return None
    rest = state[i + len(tpl.location_prefix):].strip()
    m = re.match(r"([^.\n]+)", rest)
    return m.group(1).strip() if m else None


def template_rationale(row: dict[str, Any], step_budget: int | None = None) -> str:
    """A short rationale for one transition row (a dict of the transitions columns), built from facts."""
    tpl = template_for(row["env"])
    state, action, nxt = row["state"], row["action"], row["next_state"]
    reward, done, success = float(row["reward"]), bool(row["done"]), bool(row["success"])
    out: list[str] = []
    admissible = row.get("admissible_actions")
    if admissible is not None and action not in admissible:
        out.append(f"'{action}' is not one of the valid actions here, so the environment does not carry it out "
                   "and shows its failure message.")
    elif nxt.strip() == state.strip():
        out.append(f"'{action}' does not change what the agent sees, so the state stays the same.")
    else:
        here, there = _location(state, tpl), _location(nxt, tpl)
        if here and there and here != there:
            evidence = next((x for x in _sentences(state) if there in x and x != _sentences(state)[0]), "")
            why = f" (the state says: '{evidence}')" if evidence else ""
            out.append(f"'{action}' takes the agent from the {here} to the {there}{why}, so the state becomes "
                       f"the description of the {there}.")
        elif there and not here:
            out.append(f"'{action}' brings the room description back: the agent is now in the {there}.")
        else:
            new = [s for s in _sentences(nxt) if s not in set(_sentences(state))]
            if len(nxt) < 120 or not new:
                out.append(f"The environment answers '{action}' with: {clip(nxt, 120)}")
            else:
                out.append(f"'{action}' changes the state: {clip(' '.join(new[:2]), 160)}")
    if reward > 0:
        out.append(f"This advances the task, so the reward is {format_number(reward)}"
                   + (" and the episode ends with success." if success else "."))
    elif done and not success:
        budget = step_budget is not None and int(row.get("step", 0)) + 1 >= step_budget
        out.append("The step budget is used up, so the episode ends without success." if budget
                   else "The episode ends here without success, so the reward is 0.")
    else:
        out.append("The task is not accomplished yet, so the reward is 0 and the episode goes on.")
    return " ".join(" ".join(out).split())


def _pay_words(reward: float, success: bool) -> str:
    return f"reward {format_number(reward)}" + (", ending the episode with success" if success else "")


def demonstration_evidence(state: str, action: str, reward: float, success: bool,
                           demonstrations: Sequence[Demonstration]) -> str:
    """The opening of a rationale that reads the prompt's top-k demonstrations ``[1..k]`` before it concludes:
    the first one with the same action, what it paid, and whether this step pays the same (reward and success;
    a demonstration's ``done`` may be its episode's step budget running out, which says nothing about the
    action).

    Retrieval puts the decisive evidence in the prompt (on coin, the one rewarding action ``take coin`` is found
    by its text), but a template rationale built from the transition alone never mentions it, so a short
    fine-tune learns to guess the rare rewarding outcome from the state and misses it. A rationale that cites
    the demonstration teaches the served model to take an outcome the evidence shows, and to say so when this
    step differs."""
    def key(a: str) -> str:  # spacing and case do not make another action
        return " ".join(a.split()).lower()

    same = next(((i, d) for i, d in enumerate(demonstrations, 1) if key(d.action) == key(action)), None)
    if same is None:
        return f"No demonstration shows '{action}', so the outcome follows from the current state." \
            if demonstrations else ""
    i, d = same
    where = "in the same state" if d.state.strip() == state.strip() else "in a similar state"
    agrees = (float(d.reward), bool(d.success)) == (float(reward), bool(success))
    return (f"Demonstration [{i}] shows the same action, '{d.action}', {where}: it paid "
            f"{_pay_words(d.reward, d.success)}. " + ("The same holds here." if agrees else "Here it is different."))


class TemplateAnnotator:
    source = "template"

    def __init__(self, step_budget: int | None = None) -> None:
        self.step_budget = step_budget

    def annotate(self, rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(template_rationale(r, self.step_budget), self.source) for r in rows]


TEACHER_INSTRUCTIONS = (
    "You annotate transitions of {world} for training a model of the environment. Given the context and "
    "the TRUE outcome of the agent's action, write the reasoning a careful simulator would write BEFORE "
    "seeing the outcome: 2 to 4 sentences on what the action does in this state, what the next state must "
    "therefore show, and why the reward and the episode's end are what they are. Plain text, no tags, do "
    "not copy the next state verbatim."
)


class TeacherAnnotator:
    """Reasoning from a teacher LLM (``client``: usually an ``OpenAIClient`` on the teacher's URL)."""

    source = "teacher"

    def __init__(self, client: ExperienceClient, sampling: Sampling | None = None, step_budget: int | None = None,
                 prompt: PromptOptions | None = None) -> None:
        self.client = client
        self.sampling = sampling or Sampling(temperature=0.0, max_tokens=200)
        self.fallback = TemplateAnnotator(step_budget)
        self.prompt = prompt or PromptOptions(top_k=0, history_steps=0)
        self.fallbacks = 0

    def messages(self, row: dict[str, Any]) -> list[dict[str, str]]:
        q = ExperienceQuery(env=row["env"], instruction=row["instruction"], state=row["state"],
                            action=row["action"], admissible_actions=row.get("admissible_actions"))
        outcome = (f"TRUE outcome:\nNext state: {row['next_state']}\nReward: {format_number(row['reward'])} "
                   f"Done: {str(bool(row['done'])).lower()} Success: {str(bool(row['success'])).lower()}")
        return [
            {"role": "system", "content": TEACHER_INSTRUCTIONS.format(world=template_for(row["env"]).world)},
            {"role": "user", "content": user_prompt(q, self.prompt) + "\n\n" + outcome},
        ]

    def annotate(self, rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
        replies = self.client.complete([CompletionRequest(self.messages(r), self.sampling) for r in rows])
        out = []
        for row, reply in zip(rows, replies, strict=True):
            text = re.sub(r"</?think>", "", reply.text).strip()
            if reply.finish_reason.startswith("error") or not text:
                self.fallbacks += 1
                out.extend(self.fallback.annotate([row]))
            else:
                out.append((" ".join(text.split()), self.source))
        return out


Annotator = TemplateAnnotator | TeacherAnnotator


def annotator_from_config(cfg: AnnotateConfig, step_budget: int | None = None) -> Annotator:
    """The teacher annotator when ``annotate.teacher_url`` names an endpoint, else the template annotator
    (the offline default: rationales written from the transition itself, labelled ``template``)."""
    if not cfg.teacher_url:
        return TemplateAnnotator(step_budget)
    from dreamgym.experience.http_client import OpenAIClient
    from dreamgym.secrets import resolve

    key = resolve(cfg.teacher_api_key, "experience_model.annotate.teacher_api_key") or "EMPTY"
    client = OpenAIClient(cfg.teacher_url, cfg.teacher_model, key, concurrency=cfg.concurrency)
    return TeacherAnnotator(client, Sampling(temperature=0.0, max_tokens=cfg.teacher_max_tokens), step_budget)


def annotate_file(
    src: str | Path, dst: str | Path, annotator: Annotator, batch_size: int = 256,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Stream ``src`` into ``dst`` with ``reasoning``/``reasoning_source`` columns; returns counts."""
    import pyarrow as pa

    from dreamgym.data.transitions import OPTIONAL, TransitionWriter, iter_batches, open_transitions

    present = [c for c in OPTIONAL if c in open_transitions(src).schema_arrow.names]
    optional = tuple(dict.fromkeys([*present, "reasoning", "reasoning_source"]))
    counts: dict[str, int] = {"rows": 0, "teacher": 0, "template": 0}
    with TransitionWriter(dst, optional=optional) as writer:
        for batch in iter_batches(src, batch_size=batch_size):
            rows = batch.to_pylist()
            notes = annotator.annotate(rows)
            for row, (reasoning, source) in zip(rows, notes, strict=True):
                row["reasoning"], row["reasoning_source"] = reasoning, source
                counts[source] += 1
            writer.write(pa.RecordBatch.from_pylist(rows, schema=writer.schema))
            counts["rows"] += len(rows)
            if progress:
                progress(len(rows))
    return {"out": str(dst), **counts}
