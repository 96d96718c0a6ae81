"""A BERT sentence encoder in plain torch, for the replay buffer's ``phi(s, a)``.

Loading the packaged all-MiniLM-L6-v2 through sentence-transformers costs about 14 s of CPU per process on a
2-core machine, nearly all of it imports (sentence-transformers pulls in scikit-learn and SciPy; transformers'
model classes pull in its generation stack); every replay shard of every run pays it while the policy engines
start. The model itself is six small BERT layers, so this module runs the forward pass with torch alone and
reads the tokenizer with ``tokenizers``: the same vectors (cosine 1 - 1e-6 to sentence-transformers', checked by
``tests/test_replay.py``) for the price of importing torch.

It serves exactly the layout the packaged model has: a BERT ``Transformer`` module followed by one ``Pooling``
mode (mean or CLS) and optionally ``Normalize``. :func:`plain_bert_layout` says whether a folder has it; other
folders go through sentence-transformers (``dreamgym.replay.encoder``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The pooling modes this module implements, by sentence-transformers' config key.
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}


@dataclass(frozen=True)
class BertLayout:
    """What a sentence-transformers folder needs from this module: BERT sizes, pooling and the token budget."""

    hidden: int
    layers: int
    heads: int
    eps: float
    pooling: str
    max_tokens: int


def single_pooling(folder: Path) -> tuple[list[dict[str, Any]], str, dict[str, Any]] | None:
    """``(modules, pooling mode, pooling config)`` of a sentence-transformers folder laid out as Transformer ->
    Pooling (-> Normalize) with exactly one pooling mode; None for any other layout (several modes are concatenated,
    a Dense head, ...) or an unreadable one."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return None
        pooling_cfg = json.loads((folder / modules[1]["path"] / "config.json").read_text())
        modes = [k for k, v in pooling_cfg.items() if k.startswith("pooling_mode_") and v]
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return (modules, modes[0], pooling_cfg) if len(modes) == 1 else None


def plain_bert_layout(folder: Path) -> BertLayout | None:
    """The layout of ``folder`` when it is BERT -> one supported pooling (-> Normalize) with safetensors weights
    and a fast tokenizer; None for anything else (another architecture, several pooling modes, a Dense head)."""
    found = single_pooling(folder)
    if found is None:
        return None
    modules, mode, _ = found
    if mode not in POOLING_MODES or modules[0].get("path", "") != "":
        return None
    try:
        cfg = json.loads((folder / "config.json").read_text())
        if cfg.get("model_type") != "bert" or cfg.get("hidden_act") != "gelu" \
                or cfg.get("position_embedding_type", "absolute") != "absolute":
            return None
        if not (folder / "model.safetensors").is_file() or not (folder / "tokenizer.json").is_file():
            return None
        st_path = folder / "sentence_bert_config.json"
        st_cfg = json.loads(st_path.read_text()) if st_path.is_file() else {}
        if st_cfg.get("do_lower_case"):
            return None  # sentence-transformers lowercases before the tokenizer; not reproduced here
        max_tokens = min(int(st_cfg.get("max_seq_length") or cfg["max_position_embeddings"]),
                         int(cfg["max_position_embeddings"]))
        return BertLayout(hidden=int(cfg["hidden_size"]), layers=int(cfg["num_hidden_layers"]),
                          heads=int(cfg["num_attention_heads"]), eps=float(cfg["layer_norm_eps"]),
                          pooling=POOLING_MODES[mode], max_tokens=max_tokens)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


class PlainBertEncoder:
    """``encode(texts) -> float32 array`` of pooled (not normalised) BERT embeddings, in batches."""

    def __init__(self, folder: Path, layout: BertLayout, device: str = "cpu", dtype: str = "float32") -> None:
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.layout = layout
        self.max_seq_length = layout.max_tokens
        self.device = device
        self.dtype = getattr(torch, dtype)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # The file's own padding/truncation (fixed 128) is not what sentence-transformers applies: it pads to the
        # longest text of the batch and truncates at max_seq_length.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=layout.max_tokens)
        weights = load_file(str(folder / "model.safetensors"), device=device)
        self.w: dict[str, Any] = {k.removeprefix("bert."): v.to(self.dtype) for k, v in weights.items()
                                  if v.is_floating_point()}

    def embedding_dimension(self) -> int:
        return self.layout.hidden

    def encode(self, texts: list[str], batch_size: int = 64) -> Any:
        import numpy as np
        import torch

        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                out.append(self._batch(texts[i:i + batch_size]).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.layout.hidden), dtype=np.float32)

    def _batch(self, texts: list[str]) -> Any:
        import torch
        import torch.nn.functional as F

        encs = self.tokenizer.encode_batch([t.strip() for t in texts])  # as sentence-transformers does
        n = max(len(e.ids) for e in encs)
        ids = torch.zeros((len(encs), n), dtype=torch.long)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for row, e in enumerate(encs):
            k = len(e.ids)
            ids[row, :k] = torch.tensor(e.ids)
            types[row, :k] = torch.tensor(e.type_ids)
            mask[row, :k] = 1
        ids, types, mask = ids.to(self.device), types.to(self.device), mask.to(self.device)
        w, lay = self.w, self.layout

        def ln(x: Any, name: str) -> Any:
            return F.layer_norm(x, (lay.hidden,), w[f"{name}.weight"], w[f"{name}.bias"], lay.eps)

        def dense(x: Any, name: str) -> Any:
            return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

        pos = torch.arange(n, device=self.device)
        h = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][pos]
             + w["embeddings.token_type_embeddings.weight"][types])
        h = ln(h, "embeddings.LayerNorm")
        b, d = len(encs), lay.hidden // lay.heads
        # Padded keys get -inf-like scores in the dtype's range, as BERT's extended attention mask does.
        bias = (1.0 - mask[:, None, None, :].to(self.dtype)) * torch.finfo(self.dtype).min

        def heads(x: Any) -> Any:
            return x.view(b, n, lay.heads, d).transpose(1, 2)

        for i in range(lay.layers):
            p = f"encoder.layer.{i}"
            q, k, v = (heads(dense(h, f"{p}.attention.self.{m}")) for m in ("query", "key", "value"))
            scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, lay.hidden)
            h = ln(dense(ctx, f"{p}.attention.output.dense") + h, f"{p}.attention.output.LayerNorm")
            ff = dense(F.gelu(dense(h, f"{p}.intermediate.dense")), f"{p}.output.dense")
            h = ln(ff + h, f"{p}.output.LayerNorm")
        if lay.pooling == "cls":
            return h[:, 0]
        m = mask[:, :, None].to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
