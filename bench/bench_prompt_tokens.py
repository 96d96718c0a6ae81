"""Where an experience-model call's tokens go, part by part (issue 34: "find where the tokens go").

For real transitions of an offline file (``dreamgym collect``'s parquet, e.g. a run directory's
``offline.parquet``), builds each step's query as the evaluation does (history from its own episode, top-k
demonstrations from a ``TransitionIndex`` over the file, leaving the episode out) with the config's prompt
options, renders it as the served model sees it (its chat template) and counts, in the model's tokenizer:

- the prompt's parts: ``system`` (constant per environment family: what the prefix cache can share across calls),
  ``task``, ``demonstrations``, ``history``, ``current_state`` (with the valid actions), ``action``, and
  ``template`` (the chat template's own tokens: the rendered prompt minus the parts);
- the reply the fine-tune teaches (``learner.sft_experience``'s target): ``reasoning`` (the cited demonstration
  and the template rationale of ``dreamgym.experience.annotate``) and ``outcome`` (next state, reward, done,
  success in the reply format).

No engine runs (the tokenizer only): a second or two of CPU.

    .venv/bin/python bench/bench_prompt_tokens.py --data RUN/offline.parquet [--config dreamgym/configs/train.yaml]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import emit

from dreamgym.config import load_config
from dreamgym.experience.annotate import demonstration_evidence, template_rationale
from dreamgym.experience.engine import render_chat
from dreamgym.experience.evaluate import build_items, done_label
from dreamgym.experience.prompts import build_messages, format_outcome, format_reasoning, system_prompt
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.experience.setup import prompt_options

PARTS = ("system", "task", "demonstrations", "history", "current_state", "action", "template")
REPLY = ("reasoning", "outcome")


def user_parts(user: str) -> dict[str, str]:
    """The user message split at the blank lines ``prompts.user_prompt`` joins its parts with, by their headings."""
    out = dict.fromkeys(PARTS[1:-1], "")
    for block in user.split("\n\n"):
        key = ("task" if block.startswith("Task:") else "demonstrations" if block.startswith("Similar real")
               else "history" if block.startswith("Recent history") else "current_state"
               if block.startswith("Current state") else "action" if block.startswith("Action:") else None)
        if key is None:  # a blank line inside a state: it belongs to the part before
            key = next(k for k in reversed(out) if out[k])
        out[key] = f"{out[key]}\n\n{block}" if out[key] else block
    return out


def measure(data: Path, config: str | None, limit: int) -> dict[str, Any]:
    from dreamgym.models import resolve_model

    cfg = load_config(config)
    em = cfg.experience_model
    opts = prompt_options(em, cfg.env.state_max_chars)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(resolve_model(em.model)))

    def n(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    from dreamgym.data.transitions import iter_transitions

    transitions = list(iter_transitions(data))
    index = TransitionIndex(transitions)
    items = build_items(transitions[:limit], index, opts, leave_episode_out=True)
    rows: list[dict[str, int]] = []
    for it in items:
        msgs = build_messages(it.query, opts)
        full = n(render_chat(tok, msgs))
        parts = {"system": n(msgs[0]["content"]), **{k: n(v) for k, v in user_parts(msgs[1]["content"]).items()}}
        parts["template"] = full - sum(parts.values())
        t = it.transition
        row = {k: getattr(t, k) for k in ("env", "state", "action", "next_state", "reward", "done", "success", "step")}
        row["admissible_actions"] = t.admissible_actions
        evidence = demonstration_evidence(t.state, t.action, t.reward, t.success, it.query.demonstrations)
        reasoning = " ".join(x for x in (evidence, template_rationale(row, cfg.env.max_steps)) if x)
        reply = {"reasoning": n(format_reasoning(reasoning)),
                 "outcome": n(format_outcome(t.next_state, t.reward, done_label(t, cfg.env.max_steps), t.success))}
        rows.append({**parts, "prompt": full, **reply})
    mean = {k: round(statistics.fmean(r[k] for r in rows), 1) for k in (*PARTS, "prompt", *REPLY)}
    share = {k: round(mean[k] / mean["prompt"], 3) for k in PARTS}
    return {"data": str(data), "config": config, "transitions": len(rows), "model": em.model,
            "prompt_options": {"top_k": opts.top_k, "history_steps": opts.history_steps,
                               "demo_state_max_chars": opts.demo_state_max_chars,
                               "history_state_max_chars": opts.history_state_max_chars},
            "mean_tokens": mean, "prompt_share": share,
            "system_prompt_chars": len(system_prompt(cfg.env.name, opts)),
            "p90_prompt_tokens": sorted(r["prompt"] for r in rows)[int(0.9 * (len(rows) - 1))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="an offline transitions parquet (a run's offline.parquet)")
    ap.add_argument("--config", default="dreamgym/configs/train.yaml")
    ap.add_argument("--limit", type=int, default=400, help="transitions measured (the file's first ones)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    out = measure(Path(args.data), args.config, args.limit)
    emit(out, args.out)


if __name__ == "__main__":
    main()
