"""The policy model on the learner side: loading, LoRA, token log-probs, weights for the engines.

Master weights are always fp32 (``learner.precision`` only decides whether matmuls run under
bf16 autocast). With LoRA the frozen base keeps its weights and the engines receive the merged
matrices ``W + (alpha / r) B A``; the reference policy for the KL penalty is then the base model
itself (adapters disabled), so it costs no memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

    from dreamgym.config import LoraConfig


def load_causal_lm(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """An HF causal LM from a local folder, fp32, in training mode, without a KV cache."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    model.config.use_cache = False
    return model.to(device).train()


def add_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Wrap ``model`` with peft LoRA adapters (only the adapters are trainable)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg)


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _full(t: torch.Tensor) -> torch.Tensor:
    """A full local tensor (FSDP2 ``DTensor`` shards are all-gathered)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def sync_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint-format ``(HF name, tensor)`` pairs of the current policy, LoRA merged, detached.

    A tied LM head is sent explicitly as ``lm_head.weight`` (the embedding tensor again): vLLM on
    CPU serves the head from a pre-packed copy that is rebuilt only when that name is loaded.
    """
    inner = model.get_base_model() if is_peft(model) else model
    tied = bool(getattr(inner.config, "tie_word_embeddings", False))
    embed = None
    for name, tensor in _policy_tensors(model):
        if name == "lm_head.weight":
            tied = False
        if name == "model.embed_tokens.weight":
            embed = tensor
        yield name, tensor
    if tied and embed is not None:
        yield "lm_head.weight", embed


def _policy_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    import torch

    if not is_peft(model):
        for name, p in model.named_parameters():
            yield name, _full(p.detach())
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapter = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    lora_modules = {n: m for n, m in base.named_modules() if isinstance(m, LoraLayer)}
    with torch.no_grad():
        for name, p in base.named_parameters():
            if ".lora_" in name:
                continue
            module_name, _, leaf = name.rpartition(".")
            owner = module_name.removesuffix(".base_layer")
            tensor = _full(p.detach())
            if module_name.endswith(".base_layer") and leaf == "weight" and owner in lora_modules:
                tensor = tensor + _full(lora_modules[owner].get_delta_weight(adapter)).to(tensor.dtype)
            yield name.replace(".base_layer.", "."), tensor


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    needed: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log pi(x_{j+1} | x_<=j)`` for every position: ``[B, T-1]`` in fp32.

    ``needed`` (``[B, T-1]`` bool, e.g. the loss mask): only these entries are wanted. The LM head and the
    softmax then run only on the columns some row needs (``logits_to_keep``), and every other entry is 0. A
    policy turn is a long prompt and a short reply, so this skips most of the ``T x vocab`` logits: the head
    of a 49k-token vocabulary costs about a fifth of a small model's forward, and its softmax as much again.
    """
    import torch

    targets = input_ids[:, 1:]
    if needed is None:
        return _logprobs(model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1], targets,
                         temperature)
    cols = needed.any(dim=0).nonzero().squeeze(1)  # hidden position j predicts target column j
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=cols).logits
    logp = _logprobs(logits, targets[:, cols], temperature).masked_fill(~needed[:, cols], 0.0)
    out = torch.zeros(targets.shape, dtype=logp.dtype, device=logp.device)
    return out.index_copy(1, cols, logp)


def _logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    import torch.nn.functional as F

    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    b, t, v = logits.shape
    return -F.cross_entropy(logits.reshape(b * t, v), targets.reshape(b * t), reduction="none").view(b, t)


def shard_fsdp(model: nn.Module) -> nn.Module:
    """FSDP2 (``fully_shard``) per decoder layer and at the root, over the default process group.

    GPU only (``learner.fsdp``); the caller initialises ``torch.distributed`` (one process per GPU,
    e.g. torchrun or a Ray Train worker group) and every rank runs the same learner steps.
    """
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        raise RuntimeError("learner.fsdp needs an initialised torch.distributed process group (one rank per GPU)")
    import torch

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    inner = model.get_base_model() if is_peft(model) else model
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if layers is None:
        raise RuntimeError(f"do not know the decoder layers of {type(inner).__name__} for FSDP")
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model
