"""Micro-batching by token budget and padding into tensors.

A micro-batch is a set of sequences whose padded size (``longest x count``) fits the token
budget; sequences are taken longest first so similar lengths share a micro-batch and little is
padded. A sequence longer than the budget on its own forms a micro-batch by itself. Because the
aggregation weights ``w_t`` are fixed per token before batching (``dreamgym.grpo``), summing the
micro-batch losses and stepping once gives the gradient of the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from learner.sequences import TokenSequence

if TYPE_CHECKING:
    import torch


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Partition sequence indices into micro-batches with ``max_len * count <= token_budget``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > token_budget:
            batches.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    return batches


def prefix_micro_batches(seqs: Sequence[Sequence[int]], token_budget: int) -> list[list[int]]:
    """Micro-batches for the shared-prefix forward (``learner.shared_prefix``), by the same budget counted the way
    that forward runs them: a micro-batch costs ``P + (max_len - P) * count``, ``P`` its sequences' common prefix
    (``shareable_prefix_len``: the prefix runs once; 0 below ``MIN_PREFIX``). Sequences are taken in token order,
    so those that share the longest prefixes (the steps of one state, the episodes of one task) sit side by side,
    and packed greedily."""
    from learner.shared_prefix import MIN_PREFIX, common_prefix_len

    order = sorted(range(len(seqs)), key=lambda i: (list(seqs[i]), i))
    batches: list[list[int]] = []
    cur: list[int] = []
    lcp = cur_max = cur_min = 0
    for i in order:
        n = len(seqs[i])
        if cur:
            new_lcp = min(lcp, common_prefix_len([seqs[cur[-1]], seqs[i]]))
            new_max, new_min = max(cur_max, n), min(cur_min, n)
            p = min(new_lcp, new_min - 1)
            p = p if p >= MIN_PREFIX else 0  # the forward would not share it
            if p + (new_max - p) * (len(cur) + 1) <= token_budget:
                cur.append(i)
                lcp, cur_max, cur_min = new_lcp, new_max, new_min
                continue
            batches.append(cur)
        cur, lcp, cur_max, cur_min = [i], n, n, n
    if cur:
        batches.append(cur)
    return batches


@dataclass
class MicroBatch:
    """Padded tensors of one micro-batch; per-target tensors are ``[B, T-1]`` (column ``j`` is token ``j+1``)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    behaviour_logprobs: torch.Tensor
    index: list[int]
    """Indices of the sequences in the batch, in row order."""
    engine_rows: torch.Tensor | None = None
    """``[B]`` bool: the row's ``behaviour_logprobs`` came from the engine (for the mismatch metrics / TIS)."""
    value_mask: torch.Tensor | None = None
    """PPO: True at each turn's value position (the target column of its first reply token); ``None``
    when no sequence carries value targets."""
    returns: torch.Tensor | None = None
    """PPO: ``R_t`` at the value positions."""
    old_values: torch.Tensor | None = None
    """PPO: ``V_old(s_t)`` at the value positions."""

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def collate(seqs: Sequence[TokenSequence], index: Sequence[int], pad_id: int, device: str | torch.device) -> MicroBatch:
    """Right-pad ``seqs[i] for i in index`` into a ``MicroBatch`` on ``device``."""
    import torch

    rows = [seqs[i] for i in index]
    t = max(len(s) for s in rows)
    b = len(rows)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    att = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.bool)
    adv = torch.zeros((b, t), dtype=torch.float32)
    w = torch.zeros((b, t), dtype=torch.float32)
    blp = torch.zeros((b, t), dtype=torch.float32)
    for r, s in enumerate(rows):
        n = len(s)
        ids[r, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        att[r, :n] = 1
        mask[r, :n] = torch.tensor(s.loss_mask, dtype=torch.bool)
        if s.token_advantages is not None:
            adv[r, :n] = torch.tensor(s.token_advantages, dtype=torch.float32)
        else:
            adv[r, :n] = s.advantage
        w[r, :n] = s.weight
        blp[r, :n] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
    value_mask = returns = old_values = None
    if any(s.turn_returns for s in rows):
        vm = torch.zeros((b, t), dtype=torch.bool)
        ret = torch.zeros((b, t), dtype=torch.float32)
        old = torch.zeros((b, t), dtype=torch.float32)
        for r, s in enumerate(rows):
            for start, rt, v in zip(s.turn_starts, s.turn_returns, s.turn_old_values, strict=True):
                vm[r, start], ret[r, start], old[r, start] = True, rt, v
        value_mask, returns, old_values = vm[:, 1:].to(device), ret[:, 1:].to(device), old[:, 1:].to(device)
    # Targets are tokens 1..T-1; drop column 0 from the per-target tensors.
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=att.to(device),
        mask=mask[:, 1:].to(device),
        advantages=adv[:, 1:].to(device),
        weights=w[:, 1:].to(device),
        behaviour_logprobs=blp[:, 1:].to(device),
        index=list(index),
        engine_rows=torch.tensor([s.engine_logprobs for s in rows], dtype=torch.bool).to(device),
        value_mask=value_mask,
        returns=returns,
        old_values=old_values,
    )
