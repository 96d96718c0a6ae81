"""The experience model's backends that run without Ray: ``http``, ``local`` and ``copy``.

``http``: any OpenAI-compatible server at ``experience_model.url`` (``OpenAIClient``). ``local``: an
in-process async vLLM engine (``InProcessClient``). ``copy``: no model, the top-1 retrieved transition's outcome
(``CopyTop1Client``, the ``copy-sim`` control). The ``ray`` backend, replicas behind a least-loaded
router, is ``actors.experience_model.connect_experience_model``.
"""

from __future__ import annotations

from dreamgym.config import ExperienceModelConfig
from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.http_client import ExperienceBackendError, OpenAIClient
from dreamgym.secrets import resolve


def open_client(cfg: ExperienceModelConfig, model_path: str | None = None) -> ExperienceClient:
    """An ``ExperienceClient`` for ``cfg.backend`` ``http``, ``local`` or ``copy`` (``model_path``: the engine's
    weights; default: ``cfg.model`` resolved)."""
    if cfg.backend == "http":
        if not cfg.url:
            raise ExperienceBackendError("experience_model.backend is 'http' but experience_model.url is not set")
        key = resolve(cfg.api_key, "experience_model.api_key") or "EMPTY"  # local servers accept any key
        return OpenAIClient(cfg.url, cfg.served_model_name, key, cfg.request_timeout_s, cfg.http_concurrency)
    if cfg.backend == "copy":
        from dreamgym.experience.copy_client import CopyTop1Client

        return CopyTop1Client(with_reasoning=cfg.reasoning)
    if cfg.backend == "local":
        from dreamgym.experience.engine import InProcessClient
        from dreamgym.experience.setup import engine_options
        from dreamgym.models import resolve_model

        path = str(model_path or resolve_model(cfg.model))
        return InProcessClient(engine_options(cfg, path, 0), timeout_s=cfg.request_timeout_s)
    raise ValueError(
        f"experience_model.backend {cfg.backend!r} needs Ray: use actors.experience_model.connect_experience_model"
    )
