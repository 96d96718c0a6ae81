"""Fidelity before the rules: what the experience model gets right on its own, what the rules add, and what
the rules alone and copying get right, on the same held-out queries.

A synthetic step's outcome comes from three things: the rules (an action outside the state's admissible list,
or outside the environment's action space, is settled as the family's failure state with no model call; the
family's reward rule refuses and resamples replies that break it), the retries of malformed replies, and the
model. Scoring only the final outcome credits the model with what the rules decided. So one evaluation scores
four systems on the same queries:

``model_first_reply``
    the model's first sampled reply as parsed (``Prediction.first_reply``, recorded by ``ExperienceModel``
    while it predicts, not re-derived): no retry, no reward rule, no admissible check. Every query is sent to
    the model, ruled-out actions included. An unparsable first reply counts as wrong on every metric.
``model_after_rules``
    the synthetic environment's path: the final prediction after retries and the reward rule, and the
    failure state for an action the rules rule out (``ExperienceModel.failure_state``, what settling returns
    without a model call). Same model, same call as the first reply.
``copy_top1``
    the next state, reward and done of the top-1 retrieved demonstration (``evaluate.copy_baseline``).
``rules_only``
    what the rules decide with no model and no retrieval: the failure state for a ruled-out action; for
    every other action the rules have no answer, and the fallback is the state unchanged, reward 0, not done,
    no success (``rules_only``). Its reward and done accuracy are the share of steps that neither pay nor end,
    the floor a constant guess reaches; its next-state scores are what "nothing changes" gets right.
"""

from __future__ import annotations

from collections.abc import Sequence

from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.schema import ExperienceQuery, Prediction

#: The systems a fidelity evaluation scores, in the order tables show them.
SYSTEMS = ("model_first_reply", "model_after_rules", "copy_top1", "rules_only")

#: ``Prediction.invalid_reason`` of a query that has no first reply to score.
NO_FIRST_REPLY = "no-first-reply"


def rules_only(q: ExperienceQuery) -> Prediction:
    """The rules' answer with no model: the failure state for a ruled-out action, else the fallback (state
    unchanged, reward 0, not done): the rules cannot tell what a valid action does."""
    if ExperienceModel.ruled_out(q):
        return ExperienceModel.failure_state(q)
    return Prediction(q.state, 0.0, False, False, reasoning="the rules have no answer: state unchanged, reward 0")


def after_rules(q: ExperienceQuery, pred: Prediction) -> Prediction:
    """The synthetic environment's outcome of ``q`` given the model's final prediction for it: the failure state
    where the rules rule the action out (settling answers before any model call), else the prediction."""
    return ExperienceModel.failure_state(q) if ExperienceModel.ruled_out(q) else pred


def first_reply(pred: Prediction) -> Prediction:
    """The first reply recorded on ``pred`` (an invalid prediction where there is none)."""
    if pred.first_reply is not None:
        return pred.first_reply
    return Prediction("", 0.0, False, False, valid=False, invalid_reason=NO_FIRST_REPLY)


def fidelity_predictions(queries: Sequence[ExperienceQuery], preds: Sequence[Prediction],
                         copied: Sequence[Prediction]) -> dict[str, list[Prediction]]:
    """Each system's prediction per query (``SYSTEMS``). ``preds``: the model's predictions with settling off
    (every query sent to the model: ``ExperienceModel(inadmissible='model')``); ``copied``: the copy baseline's."""
    settled = [i for i, p in enumerate(preds) if p.settled]
    if settled:
        raise ValueError(
            f"{len(settled)} of {len(preds)} predictions were settled without a model call, so they have no first "
            "reply to score: build the model with inadmissible='model' for a fidelity evaluation (the rules are "
            "applied afterwards, as model_after_rules)")
    return {
        "model_first_reply": [first_reply(p) for p in preds],
        "model_after_rules": [after_rules(q, p) for q, p in zip(queries, preds, strict=True)],
        "copy_top1": list(copied),
        "rules_only": [rules_only(q) for q in queries],
    }
