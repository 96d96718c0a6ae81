"""The ``copy`` backend: a synthetic environment with no experience model, the ``copy-sim`` control.

Each step's reply is the outcome of the top-1 demonstration the synthetic environment retrieved for
``(s_t, a_t)``: its next state, reward, done and success, written in the reply format the experience model
writes. Everything else is DreamGym's: the offline first states, the retrieval (the replay buffer in training),
the admissible and action-space checks that settle a step before any model call, the reply parser and the
family's reward rule (``ExperienceModel`` runs them on this reply as on a model's). So a study arm on this
backend measures what the synthetic environment gives a policy *without* a model that reasons: if DreamGym does
no better, the experience model adds nothing over retrieval and rules.

The client reads the structured query (``ExperienceClient.reads_query``), not the prompt text. It is
deterministic, so a reply the reward rule refuses is refused again on every retry and the step becomes an
invalid transition, counted like a model's. A query with no demonstration (an empty store) is answered with an
``error:`` completion, which the model turns into an invalid transition naming the reason. No engine, no GPU,
no Ray: it runs in the rollout worker's process.
"""

from __future__ import annotations

from collections.abc import Sequence

from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.prompts import format_reply
from dreamgym.experience.schema import Completion, CompletionRequest, ExperienceQuery

#: ``Completion.finish_reason`` of a query the copy backend cannot answer.
NO_DEMONSTRATION = "error:copy-no-demonstration"
NO_QUERY = "error:copy-needs-the-query"


def copy_top1_reply(q: ExperienceQuery, with_reasoning: bool = True) -> Completion:
    """The reply that copies ``q``'s top-1 demonstration (``NO_DEMONSTRATION`` when it has none)."""
    if not q.demonstrations:
        return Completion("", NO_DEMONSTRATION)
    t = q.demonstrations[0].transition
    why = (f"Copied from the most similar stored transition: '{t.action}' in a state like this one led to the "
           "next state, reward and end shown.")
    return Completion(format_reply(t.next_state, float(t.reward), bool(t.done), bool(t.success), why,
                                   with_reasoning=with_reasoning))


class CopyTop1Client(ExperienceClient):
    """Answers every query with its top-1 demonstration's outcome (see the module docstring)."""

    reads_query = True

    def __init__(self, with_reasoning: bool = True) -> None:
        self.with_reasoning = with_reasoning
        """Write a ``<think>`` line before the outcome (``experience_model.reasoning``: the parser expects one)."""
        self.calls = 0

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        out = []
        for r in requests:
            self.calls += 1
            out.append(Completion("", NO_QUERY) if r.query is None else copy_top1_reply(r.query, self.with_reasoning))
        return out
