"""``auto`` precision: bf16 only where the processor computes it natively."""

from __future__ import annotations

from pathlib import Path

import pytest

from dreamgym import hardware
from dreamgym.config import load_config


@pytest.mark.parametrize(("flags", "cpu_bf16"), [
    ({"avx2", "fma"}, False), ({"avx512f", "avx512_bf16"}, True), ({"amx_bf16", "amx_tile"}, True), (set(), False),
])
def test_native_bf16_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch, flags: set[str], cpu_bf16: bool) -> None:
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    assert hardware.native_bf16("cpu") is cpu_bf16
    assert hardware.native_bf16("cuda")  # GPUs compute bf16 natively


def test_this_machines_flags_are_read() -> None:
    flags = hardware.cpu_flags()
    assert not flags or "fpu" in flags  # a real /proc/cpuinfo flags line, or none where it does not exist


def test_the_default_run_leaves_training_precision_to_the_machine() -> None:
    from dreamgym.commands.train import default_train_config

    cfg = load_config(default_train_config())
    assert cfg.learner.precision == "auto" and cfg.experience_model.train.precision == "auto"


def test_an_auto_learner_uses_bf16_only_where_it_is_native(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from dreamgym.config import LearnerConfig
    from dreamgym.models import build_tiny_model
    from learner import learner as learner_module
    from learner.learner import Learner

    tiny = build_tiny_model(tmp_path / "tiny")
    for native in (False, True):
        monkeypatch.setattr(learner_module, "native_bf16", lambda device, n=native: n)
        assert Learner(LearnerConfig(device="cpu", precision="auto"), tiny, seed=0).bf16 is native
    assert Learner(LearnerConfig(device="cpu", precision="bf16-autocast"), tiny, seed=0).bf16


def test_native_engine_dtype_resolves_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from dreamgym.config import EngineConfig
    from dreamgym.replay.encoder import resolve_dtype

    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2"}))
    assert EngineConfig(dtype="native").resolved_dtype() == "float32"
    assert EngineConfig(dtype="native", device="cuda").resolved_dtype() == "bfloat16"
    assert EngineConfig(dtype="bfloat16").resolved_dtype() == "bfloat16"  # an explicit choice stays
    assert resolve_dtype("auto", "cpu") == "float32"  # the embedding model follows the same rule
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert EngineConfig(dtype="native").resolved_dtype() == "bfloat16" and resolve_dtype("auto") == "bfloat16"


def test_auto_engine_dtype_is_the_checkpoints_and_casting_refuses_an_unresolved_name(tmp_path: Path) -> None:
    """``dtype: auto`` (the model's own dtype) resolves from ``config.json``; a weight sync cast never sees
    ``auto`` (issue 31, defect 7: ``getattr(torch, "auto")`` broke every sync)."""
    import json

    import torch

    from dreamgym.config import EngineConfig
    from dreamgym.dtypes import torch_dtype
    from learner.weight_sync import cast_for_engine

    cases = (({"torch_dtype": "bfloat16"}, "bfloat16"), ({"dtype": "float16"}, "float16"), ({}, "float32"))
    for declared, expected in cases:
        folder = tmp_path / expected
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", **declared}))
        assert EngineConfig(dtype="auto").resolved_dtype(folder) == expected
    with pytest.raises(ValueError, match="'auto' and 'native' must be resolved first"):
        torch_dtype("auto")
    with pytest.raises(ValueError, match="'auto' and 'native' must be resolved first"):
        cast_for_engine([("w", torch.zeros(2))], "auto", clone=False)
    with pytest.raises(ValueError, match="unreadable"):
        EngineConfig(dtype="auto").resolved_dtype(tmp_path / "missing")
