"""What a model's ``config.json`` says about its size, read without loading a weight: parameter count, context
length and KV-cache bytes per token. The memory plan (``dreamgym.memory_plan``) and the context check of every
engine (``context_problem``) use it, so a layout that cannot fit is refused before anything starts.

The count covers decoder-only transformers of the Llama family (Llama, Qwen2/2.5/3, Mistral, SmolLM): embeddings,
per layer the attention projections (with Qwen2's q/k/v biases and Qwen3's q/k norms) and the gated MLP (times the
experts of a mixture-of-experts config), the norms, and an untied LM head. Checked against published sizes:
Qwen2.5-3B 3.09 B, Qwen2.5-7B 7.62 B, SmolLM2-135M 135 M (``tests/test_gpu_layout.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym.dtypes import HF_DTYPE_NAMES


@dataclass(frozen=True)
class ModelFacts:
    """The sizes of one model, from its ``config.json``."""

    name: str
    params: int
    """Parameters (an untied LM head counted once more)."""
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int | None
    """The longest context the model was built for (``None``: the config does not say)."""
    dtype: str = "float32"
    """The checkpoint's dtype (what an engine with ``dtype: auto`` serves)."""

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token takes in an engine serving this model (keys and values of every layer)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def facts_from_config(cfg: dict[str, Any], name: str = "model") -> ModelFacts:
    """``ModelFacts`` of an HF ``config.json`` mapping (a multimodal config's ``text_config`` if it has one);
    ``ValueError`` for a config without the Llama-family size fields."""
    try:
        return _facts(cfg, name)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"the config.json of {name} lacks the sizes of a Llama-family decoder ({type(e).__name__}: "
                         f"{e}); its memory is not estimated") from None


def _facts(cfg: dict[str, Any], name: str) -> ModelFacts:
    c = cfg.get("text_config") or cfg
    h, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or h // heads)
    inter = int(c["intermediate_size"])
    experts = int(c.get("num_local_experts") or c.get("num_experts") or 1)
    moe_inter = int(c.get("moe_intermediate_size") or inter)
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = h * q + 2 * h * kv + q * h
    model_type = str(c.get("model_type", ""))
    if c.get("attention_bias") or model_type in ("qwen2", "qwen2_moe"):
        attention += q + 2 * kv
    if model_type.startswith("qwen3"):
        attention += 2 * head_dim  # q_norm, k_norm
    mlp = 3 * h * inter if experts == 1 else experts * 3 * h * moe_inter + h * experts
    per_layer = attention + mlp + 2 * h
    tied = bool(cfg.get("tie_word_embeddings", c.get("tie_word_embeddings", False)))
    params = vocab * h + layers * per_layer + h + (0 if tied else vocab * h)
    mpe = c.get("max_position_embeddings")
    raw = cfg.get("dtype") or cfg.get("torch_dtype") or c.get("dtype") or c.get("torch_dtype") or "float32"
    dtype = HF_DTYPE_NAMES.get(str(raw).removeprefix("torch."), "float32")
    return ModelFacts(name, params, h, layers, heads, kv_heads, head_dim, inter, int(mpe) if mpe else None, dtype)


def read_model_config(name_or_path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a model named as in a config: a folder, an alias (built or prepared on first use,
    ``dreamgym.models.resolve_model``), or a hub id (its ``config.json`` in the local HF cache only: a plan touches
    no network). Raises ``ValueError`` saying why it is unavailable."""
    from dreamgym.models import ALIASES, is_hub_id, resolve_model

    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        folder = path
    elif name in ALIASES:
        folder = resolve_model(name)
    elif is_hub_id(name):
        try:
            from huggingface_hub import hf_hub_download

            return json.loads(Path(hf_hub_download(name, "config.json", local_files_only=True)).read_text())
        except Exception as e:
            raise ValueError(f"config.json of hub model {name!r} is not in the local HF cache ({type(e).__name__}); "
                             f"`hf download {name} config.json` fetches just that file") from None
    else:
        raise ValueError(f"model {name!r} is neither a folder, an alias nor a hub id")
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{folder / 'config.json'} is unreadable ({type(e).__name__}: {e})") from None


def model_facts(name_or_path: str | Path) -> ModelFacts:
    """``ModelFacts`` of a model named as in a config (``read_model_config``)."""
    return facts_from_config(read_model_config(name_or_path), str(name_or_path))


def context_problem(where: str, max_model_len: int, facts: ModelFacts) -> str | None:
    """Why an engine at ``where`` (a config path) cannot serve ``max_model_len`` tokens of this model (vLLM refuses
    a length beyond ``max_position_embeddings``); ``None`` when it can."""
    limit = facts.max_position_embeddings
    if limit is None or max_model_len <= limit:
        return None
    return (f"{where}.max_model_len {max_model_len} is longer than the context of {facts.name} "
            f"(max_position_embeddings {limit}); set {where}.max_model_len to at most {limit}")
