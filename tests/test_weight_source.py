"""``actors.weight_sync.list_source_class``: one ``WeightSource`` for vLLM 0.32 (the CPU stack) and 0.33 (the
``gpu`` extra). 0.32 calls ``source.metadata()`` and iterates the source; 0.33 reads ``source.metadata`` (a
``functools.cached_property``) and sends ``source.iter_full()``. The 0.33 shape is a stand-in base here (the CPU
stack installs 0.32); the 0.32 test runs vLLM's own trainer-side helpers on CPU."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from actors.weight_sync import list_source_class


def _pairs() -> list[tuple[str, torch.Tensor]]:
    return [("model.embed_tokens.weight", torch.zeros(8, 4)), ("model.layers.0.mlp.up_proj.weight", torch.ones(6, 4)),
            ("lm_head.weight", torch.zeros(8, 4, dtype=torch.bfloat16))]


@dataclass
class Meta:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class WeightSource033(ABC):
    """vLLM 0.33's shape: ``metadata`` an abstract cached property, ``iter_full`` the sending iteration."""

    @functools.cached_property
    @abstractmethod
    def metadata(self) -> list[Any]: ...

    @abstractmethod
    def iter_full(self) -> Any: ...

    def send(self) -> list[tuple[str, list[int], str]]:  # what 0.33's NCCL trainer reads
        return [(m.name, list(m.shape), str(m.dtype)) for m in self.metadata] + [
            (n, list(t.shape), str(t.dtype)) for n, t in self.iter_full()]


def test_shim_has_the_vllm_033_shape() -> None:
    src = list_source_class(WeightSource033, Meta)(_pairs())
    assert isinstance(src, WeightSource033)
    assert isinstance(type(src).__dict__["metadata"], functools.cached_property)
    meta = src.metadata  # an attribute, not a call
    assert [m.name for m in meta] == [n for n, _ in _pairs()] and meta[2].dtype == torch.bfloat16
    assert src.metadata is meta  # cached
    sent = src.send()
    assert sent[:3] == [(n, list(t.shape), str(t.dtype)) for n, t in _pairs()] == sent[3:]


@pytest.mark.engine  # imports vLLM (0.32 on the CPU stack)
def test_shim_works_with_the_installed_vllm() -> None:
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    src = list_source_class()(_pairs())
    assert isinstance(src, WeightSource)
    meta = src.metadata()  # 0.32 calls it
    assert all(isinstance(m, ParamMeta) for m in meta) and [m.shape for m in meta] == [(8, 4), (6, 4), (8, 4)]
    assert src.metadata == meta  # and 0.33 reads it
    # vLLM's own trainer-side iteration check (what send_weights feeds the broadcast) and its gather groups.
    checked = list(NCCLTrainerWeightTransferEngine._checked_iter(src, meta))
    assert [n for n, _ in checked] == [n for n, _ in _pairs()]
    assert [n for g, _ in src.iter_groups() for n in g] == [n for n, _ in _pairs()]
    assert [n for n, _ in src.iter_full()] == [n for n, _ in _pairs()]
