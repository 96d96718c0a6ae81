"""The experience-model client seam: chat messages in, text out.

``ExperienceClient.complete`` takes a batch of requests and returns one ``Completion`` each, in order.
Batches let a backend run requests concurrently (vLLM batches them in one engine step). Three real
implementations:

- ``dreamgym.experience.engine.InProcessClient``: an async vLLM engine in this process;
- ``actors.experience_model.RayExperienceClient``: N ``ExperienceModelReplica`` Ray actors behind a
  least-loaded router;
- ``dreamgym.experience.http_client.OpenAIClient``: any OpenAI-compatible chat endpoint
  (``python -m vllm.entrypoints.openai.api_server``, a hosted API, ...).

``FunctionClient`` wraps a plain Python function (a scripted environment model, a test double, a
model the user runs some other way).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

from dreamgym.experience.schema import Completion, CompletionRequest, Message, Sampling


class ExperienceClient(ABC):
    """Generates replies for batches of chat requests."""

    reads_query: ClassVar[bool] = False
    """Whether the client answers from ``CompletionRequest.query`` (the structured query) rather than the text
    of the messages: ``ExperienceModel`` attaches the query only then (the ``copy`` backend)."""

    @abstractmethod
    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        """One completion per request, in order. Backend failures on one request come back as a
        ``Completion`` with ``finish_reason='error:...'`` rather than raising, so one bad request does
        not sink a batch; an unreachable backend raises."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend (engine, connections)."""

    def __enter__(self) -> ExperienceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FunctionClient(ExperienceClient):
    """A client backed by ``fn(messages, sampling) -> str`` (or ``-> Completion``)."""

    def __init__(self, fn: Callable[[list[Message], Sampling], str | Completion]) -> None:
        self.fn = fn
        self.calls = 0

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        out = []
        for r in requests:
            self.calls += 1
            reply = self.fn(r.messages, r.sampling)
            out.append(reply if isinstance(reply, Completion) else Completion(text=reply))
        return out
