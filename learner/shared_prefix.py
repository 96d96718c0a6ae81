"""A forward pass that runs the token prefix all rows of a batch share once, not once per row.

Windowed policy prompts (``policy.prompt_style: windowed``) repeat the system text, the worked example and
usually the task in every step's sequence, so most of a learner micro-batch is the same tokens: on the default
config's coin episodes about two thirds of every sequence. ``prefix_token_logprobs`` runs that common prefix
``P`` once (batch 1, ``use_cache=True``), repeats its key/value cache over the ``B`` rows and runs only the
``B`` suffixes on top of it (position ids ``P..``, the rows' own attention mask over prefix + suffix). The
result is the same ``[B, T-1]`` tensor of ``log pi(x_{j+1} | x_<=j)`` that ``learner.model.token_logprobs``
returns for the padded batch, within float rounding, and gradients flow through the prefix's keys/values
into the weights (the cache tensors are ordinary graph nodes), so a loss on it has the full forward's
gradient. Cost: ``P + sum(len_i - P)`` tokens forwarded instead of ``sum(len_i)``.

Inputs are a right-padded batch (``input_ids``, ``attention_mask``, as ``learner.batching.collate`` builds
it; ``pad_batch`` builds one from plain token-id lists). The prefix is found from the ids
(``common_prefix_len``), capped so that every row keeps at least one suffix token.

It falls back to the plain forward (and says why once in the log) when the shared prefix is shorter than
``min_prefix`` tokens, the batch has one row, the model is trained with gradient checkpointing (transformers
then drops the cache), is sharded with FSDP, or its cache is not a plain full-attention ``DynamicCache``
(sliding-window or hybrid layers). Tested on Llama (SmolLM2) and Qwen2.

    from learner.shared_prefix import pad_batch, prefix_token_logprobs
    ids, att = pad_batch([[1, 5, 6, 7, 8], [1, 5, 6, 9]], pad_id=0)
    out = prefix_token_logprobs(model, ids, att)       # out.logprobs: [B, T-1]; out.forwarded_tokens
    loss = -(out.logprobs * target_mask).sum() / target_mask.sum()
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from learner.model import _logprobs, is_peft, token_logprobs

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

#: Below this many shared tokens the plain forward is used: the extra batch-1 pass is not worth it.
MIN_PREFIX = 32

_reported: set[str] = set()


@dataclass
class PrefixForward:
    """What ``prefix_token_logprobs`` computed and what it cost."""

    logprobs: torch.Tensor
    """``[B, T-1]`` fp32: column ``j`` is ``log pi(x_{j+1} | x_<=j)``; 0 where ``needed`` is False or padding."""
    prefix_len: int
    """Tokens run once for every row (0 when the plain forward ran)."""
    forwarded_tokens: int
    """Token positions the model ran: ``P + sum(len_i - P)``, or ``sum(len_i)`` with the plain forward."""
    fallback: str | None = None
    """Why the plain forward ran instead (``None`` when the prefix was shared)."""


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix that every sequence of ``seqs`` starts with (0 for none)."""
    if not seqs:
        return 0
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
        if n == 0:
            break
    return n


def shareable_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """The prefix ``prefix_token_logprobs`` would share: the common prefix, less one token if a sequence is the
    prefix itself (every row keeps at least one suffix token). Used to budget micro-batches
    (``learner.batching.micro_batches``)."""
    if len(seqs) < 2:
        return 0
    return min(common_prefix_len(seqs), min(len(s) for s in seqs) - 1)


def forwarded_tokens(lengths: Sequence[int], prefix_len: int) -> int:
    """Token positions run for sequences of ``lengths`` sharing ``prefix_len`` tokens (no padding counted)."""
    return prefix_len + sum(n - prefix_len for n in lengths) if prefix_len else sum(lengths)


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, device: str | torch.device = "cpu"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` (``[B, max_len]``) of token-id lists."""
    import torch

    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), t), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        att[r, : len(s)] = 1
    return ids.to(device), att.to(device)


def unsupported(model: nn.Module) -> str | None:
    """Why ``model`` cannot share a prefix through its KV cache, or ``None`` when it can."""
    inner = model.get_base_model() if is_peft(model) else model
    try:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule) or isinstance(inner, FSDPModule):
            return "the model is sharded with FSDP"
    except ImportError:  # pragma: no cover - torch without distributed
        pass
    if model.training and getattr(inner, "is_gradient_checkpointing", False):
        return "gradient checkpointing drops the KV cache in training"
    if not hasattr(inner, "config"):
        return f"{type(inner).__name__} is not a transformers model (no config for its KV cache)"
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if any(type(layer) is not DynamicLayer for layer in DynamicCache(config=inner.config).layers):
        return f"{type(inner).__name__}'s cache has sliding-window or other non-full layers"
    return None


def _fallback(reason: str) -> str:
    if reason not in _reported:
        _reported.add(reason)
        log.info("shared-prefix forward off, plain forward instead: %s", reason)
    return reason


def prefix_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    needed: torch.Tensor | None = None,
    *,
    min_prefix: int = MIN_PREFIX,
) -> PrefixForward:
    """``token_logprobs`` of a right-padded batch, with the rows' common token prefix run once.

    ``needed`` (``[B, T-1]`` bool): only these entries are wanted (the LM head runs on their columns only),
    as in ``learner.model.token_logprobs``. Falls back to that plain forward when sharing does not pay or the
    model does not support it (``PrefixForward.fallback`` says why).
    """
    import torch

    lengths = attention_mask.sum(dim=1).tolist()
    b = input_ids.shape[0]
    reason = unsupported(model)
    p = 0
    if reason is None:
        rows = [input_ids[r, : int(n)].tolist() for r, n in enumerate(lengths)]
        p = shareable_prefix_len(rows)
        if b < 2:
            reason = "a batch of one row has nothing to share"
        elif p < min_prefix:
            reason = f"the rows share fewer than {min_prefix} tokens"
    if reason is not None:
        lp = token_logprobs(model, input_ids, attention_mask, temperature, needed)
        return PrefixForward(lp, 0, int(sum(lengths)), _fallback(reason))

    from transformers import DynamicCache

    inner = model.get_base_model() if is_peft(model) else model
    cache = DynamicCache(config=inner.config)
    device = input_ids.device
    t = input_ids.shape[1]
    targets = input_ids[:, 1:]
    # Column j (hidden state at position j) predicts token j+1: columns < p come from the prefix pass (column
    # p-1 predicts each row's first suffix token), columns p..t-2 from the suffix pass.
    want = needed if needed is not None else attention_mask[:, 1:].bool()
    pre_cols = want[:, :p].any(dim=0).nonzero().squeeze(1)
    suf_cols = want[:, p:].any(dim=0).nonzero().squeeze(1) + p
    keep = pre_cols if len(pre_cols) else torch.tensor([p - 1], device=device)
    prefix_out = model(input_ids=input_ids[:1, :p], attention_mask=attention_mask[:1, :p], past_key_values=cache,
                       use_cache=True, logits_to_keep=keep)
    if cache.get_seq_length() != p:
        raise RuntimeError(f"the prefix pass left {cache.get_seq_length()} cached positions, expected {p}: "
                           f"{type(inner).__name__} does not fill the KV cache it was given")
    cache.batch_repeat_interleave(b)
    out = torch.zeros(targets.shape, dtype=torch.float32, device=device)
    if len(pre_cols):
        logits = prefix_out.logits[0].float()
        if temperature != 1.0:
            logits = logits / temperature
        logsm = torch.log_softmax(logits, dim=-1)  # [k, V], one row per prefix column, shared by the rows
        lp = logsm[torch.arange(len(pre_cols), device=device)[None, :], targets[:, pre_cols]]
        out = out.index_copy(1, pre_cols, lp.masked_fill(~want[:, pre_cols], 0.0))
    del prefix_out
    positions = torch.arange(p, t, device=device)[None, :].expand(b, -1)
    # The suffix pass's hidden state at relative position j - p predicts column j; t-1 predicts nothing.
    keep_suf = suf_cols - p if len(suf_cols) else torch.tensor([0], device=device)
    suffix_out = model(input_ids=input_ids[:, p:], attention_mask=attention_mask, position_ids=positions,
                       past_key_values=cache, use_cache=True, logits_to_keep=keep_suf)
    if len(suf_cols):
        lp = _logprobs(suffix_out.logits, targets[:, suf_cols], temperature)
        out = out.index_copy(1, suf_cols, lp.masked_fill(~want[:, suf_cols], 0.0))
    return PrefixForward(out, p, forwarded_tokens([int(n) for n in lengths], p))
