"""The PPO critic: a value head on a transformer backbone, its targets and its training.

The backbone is a separate copy of the policy's initial weights (default) or a smaller model of the same
tokenizer (``learner.critic_model``); a zero-initialised linear head maps each position's last hidden
state to a scalar, so ``V = 0`` everywhere before the first update. The critic has its own AdamW
(``learner.critic_lr``, the policy's betas, weight decay and schedule), is always fp32 master weights
(matmuls under the policy's ``precision``) and is never LoRA-wrapped or sharded.

The value of turn ``t`` is read at its value position (the last prompt/observation token before the
reply; ``learner.batching.MicroBatch.value_mask``). ``assign_targets`` runs turn-level GAE
(``dreamgym.ppo``) from the critic's values before the step and writes the per-token advantages and the
per-turn returns onto the sequences; ``Critic.train_part`` is one AdamW step on a mini-batch's turns with
the clipped value loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dreamgym.ppo import explained_variance, gae, mean_std, normalize, value_loss
from learner.batching import collate, micro_batches
from learner.sequences import PpoBatch, TokenSequence

if TYPE_CHECKING:
    from dreamgym.config import LearnerConfig


class ValueModel(nn.Module):
    """``backbone`` (an HF base model returning hidden states) + a scalar head: ``[B, T]`` values in fp32."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(int(backbone.config.hidden_size), 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden).squeeze(-1).float()


def load_value_model(path: str | Path, device: str) -> ValueModel:
    """The base model of an HF causal-LM folder (its LM head dropped) with a fresh value head, fp32."""
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    backbone.config.use_cache = False
    return ValueModel(backbone).to(device).train()


class Critic:
    """The critic model, its optimizer and schedule, and the counters a checkpoint keeps."""

    def __init__(
        self,
        cfg: LearnerConfig,
        path: str | Path,
        device: str,
        lr_lambda: Callable[[int], float],
        autocast: Callable[[], AbstractContextManager[Any]],
        vocab_size: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.autocast = autocast
        self.model = load_value_model(path, device)
        critic_vocab = int(self.model.backbone.config.vocab_size)
        if vocab_size is not None and critic_vocab != vocab_size:
            raise ValueError(f"learner.critic_model {path} has a vocabulary of {critic_vocab} tokens, the policy "
                             f"{vocab_size}: the critic must share the policy's tokenizer")
        if cfg.gradient_checkpointing:
            self.model.backbone.gradient_checkpointing_enable()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.critic_lr or cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda)
        self.steps = 0
        """Learner steps the critic has trained in (``critic_warmup_steps`` counts these)."""
        self.optimizer_steps = 0

    # -- values ------------------------------------------------------------------------------------------
    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, T-1]`` values aligned with the per-target columns (column ``j``: the state after token ``j``)."""
        with self.autocast():
            v = self.model(input_ids, attention_mask)
        return v[:, :-1].float()

    def turn_values(self, seqs: Sequence[TokenSequence], pad_id: int) -> list[list[float]]:
        """``V(s_t)`` of every turn of every sequence (no grad, eval mode), aligned with ``turn_starts``."""
        out: list[list[float]] = [[] for _ in seqs]
        was_training = self.model.training
        self.model.eval()
        try:
            for idx in micro_batches([len(s) for s in seqs], self.cfg.micro_batch_tokens):
                mb = collate(seqs, idx, pad_id, self.device)
                with torch.no_grad():
                    v = self.values(mb.input_ids, mb.attention_mask).cpu()
                for row, i in enumerate(idx):
                    out[i] = [float(v[row, start - 1]) for start in seqs[i].turn_starts]
        finally:
            self.model.train(was_training)
        return out

    # -- training ----------------------------------------------------------------------------------------
    def train_part(self, part: Sequence[TokenSequence], pad_id: int) -> dict[str, float]:
        """One AdamW step of the clipped value loss over the turns of ``part`` (mean over its turns)."""
        c = self.cfg
        turns = sum(len(s.turn_starts) for s in part)
        sums = {"value_loss": 0.0, "turns": 0.0, "value_clipped": 0.0, "value_sq_err": 0.0}
        if turns == 0:
            return sums | {"critic_grad_norm": 0.0}
        self.optimizer.zero_grad(set_to_none=True)
        for idx in micro_batches([len(s) for s in part], c.micro_batch_tokens):
            mb = collate(part, idx, pad_id, self.device)
            assert mb.value_mask is not None and mb.returns is not None and mb.old_values is not None
            v = self.values(mb.input_ids, mb.attention_mask)
            w = torch.full_like(v, 1.0 / turns)
            terms = value_loss(v, mb.old_values, mb.returns, w, mb.value_mask, c.value_clip, c.value_coef)
            terms.loss.backward()
            sums["value_loss"] += float(terms.loss.detach())
            sums["turns"] += terms.turns
            sums["value_clipped"] += terms.clipped
            sums["value_sq_err"] += terms.sq_err_sum
        clip = c.grad_clip if c.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        return sums | {"critic_grad_norm": norm}

    # -- checkpoints -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps": self.steps,
            "optimizer_steps": self.optimizer_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])
        self.optimizer_steps = int(state["optimizer_steps"])


def assign_targets(
    batch: PpoBatch, values: Sequence[Sequence[float]], gamma: float, lam: float, norm_adv: bool, eps: float
) -> dict[str, float]:
    """Turn-level GAE from ``values`` (``turn_values`` of ``batch.sequences``); writes ``token_advantages``,
    ``turn_returns`` and ``turn_old_values`` onto the sequences. Returns the advantage/value metrics."""
    all_adv: list[float] = []
    all_ret: list[float] = []
    all_val: list[float] = []
    per_traj: list[tuple[list[float], list[float], list[float]]] = []
    for where, rewards in zip(batch.turns, batch.turn_rewards, strict=True):
        v = [values[si][k] for si, k in where]
        adv, ret = gae(rewards, v, gamma, lam)
        per_traj.append((adv, ret, v))
        all_adv += adv
        all_ret += ret
        all_val += v
    normed = normalize(all_adv, eps) if norm_adv else list(all_adv)
    for s in batch.sequences:
        s.token_advantages = [0.0] * len(s)
        s.turn_returns = [0.0] * len(s.turn_starts)
        s.turn_old_values = [0.0] * len(s.turn_starts)
    pos = 0
    for where, (adv, ret, v) in zip(batch.turns, per_traj, strict=True):
        for t, (si, k) in enumerate(where):
            s = batch.sequences[si]
            a = normed[pos + t]
            toks = s.token_advantages
            assert toks is not None
            for j in range(s.turn_starts[k], s.turn_ends[k]):
                toks[j] = a
            s.turn_returns[k] = ret[t]
            s.turn_old_values[k] = v[t]
        pos += len(adv)
    adv_mean, adv_std = mean_std(all_adv)
    ret_mean, _ = mean_std(all_ret)
    val_mean, _ = mean_std(all_val)
    return {
        "turns": float(len(all_adv)),
        "adv_mean": adv_mean,
        "adv_std": adv_std,
        "return_mean": ret_mean,
        "value_mean": val_mean,
        "explained_variance": explained_variance(all_val, all_ret),
    }
