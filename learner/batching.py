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
        adv[r, :n] = s.advantage
        w[r, :n] = s.weight
        blp[r, :n] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
    # Targets are tokens 1..T-1; drop column 0 from the per-target tensors.
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=att.to(device),
        mask=mask[:, 1:].to(device),
        advantages=adv[:, 1:].to(device),
        weights=w[:, 1:].to(device),
        behaviour_logprobs=blp[:, 1:].to(device),
        index=list(index),
    )
