"""Learner checkpoints: everything needed for a resumed run to take exactly the step it would have taken.

Layout of ``<run>/checkpoints/step-000012/``::

    model/             full fine-tuning: an HF folder (weights + tokenizer) vLLM can serve directly
    adapter/           LoRA: the peft adapter (the base model is ``learner.json: base_model``)
    trainer_state.pt   AdamW state, LR scheduler, optimizer-step counter, weight version,
                       RNG states (torch CPU/CUDA, Python, NumPy, the learner's shuffling generator)
    learner.json       base model, LoRA flag, seed, version, optimizer steps (human-readable)

A checkpoint is written to a temporary folder and renamed into place, so a crash never leaves a
half-written ``step-*`` folder. With FSDP the full (unsharded) state is gathered to rank 0, which
writes it; every rank loads it.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym.types import WeightVersion

if TYPE_CHECKING:
    from dreamgym.config import LearnerConfig
    from learner.learner import Learner

STATE_FILE = "trainer_state.pt"
META_FILE = "learner.json"


def checkpoint_name(version: int) -> str:
    return f"step-{version:06d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / META_FILE).is_file())


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns the deleted folders."""
    old = list_checkpoints(root)[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


def _rng_state(learner: Learner) -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "generator": learner.generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(learner: Learner, state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    learner.generator.set_state(state["generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def save_checkpoint(learner: Learner, directory: Path) -> Path:
    """Write ``learner``'s full training state to ``directory`` (atomically)."""
    import torch
    from transformers import AutoTokenizer

    from learner.model import is_peft

    model_sd = optim_sd = None
    if learner.cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd = get_model_state_dict(learner.model, options=opts)
        optim_sd = get_optimizer_state_dict(learner.model, learner.optimizer, options=opts)
    if not _is_rank0():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    tmp.chmod(0o755)
    try:
        lora = is_peft(learner.model)
        if lora:
            learner.model.save_pretrained(tmp / "adapter", state_dict=model_sd)
        else:
            learner.model.save_pretrained(tmp / "model", state_dict=model_sd)
            AutoTokenizer.from_pretrained(str(learner.model_path), local_files_only=True).save_pretrained(tmp / "model")
        torch.save(
            {
                "optimizer": optim_sd if optim_sd is not None else learner.optimizer.state_dict(),
                "scheduler": learner.scheduler.state_dict(),
                "optimizer_steps": learner.optimizer_steps,
                "version": [learner.version.version, learner.version.step],
                "rng": _rng_state(learner),
            },
            tmp / STATE_FILE,
        )
        meta = {
            "base_model": str(learner.reference_path),
            "lora": lora,
            "seed": learner.seed,
            "temperature": learner.temperature,
            "version": learner.version.version,
            "optimizer_steps": learner.optimizer_steps,
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def load_checkpoint(
    cls: type[Learner], cfg: LearnerConfig, directory: Path, temperature: float | None = None
) -> Learner:
    """Rebuild a learner from ``directory`` so that its next ``step`` equals the uninterrupted run's."""
    import torch

    meta = json.loads((directory / META_FILE).read_text())
    if bool(meta["lora"]) != cfg.lora.enabled:
        raise ValueError(f"checkpoint {directory} has lora={meta['lora']} but learner.lora.enabled={cfg.lora.enabled}")
    temp = meta["temperature"] if temperature is None else temperature
    base = meta["base_model"]
    if meta["lora"]:
        learner = cls(cfg, base, seed=meta["seed"], temperature=temp, reference_path=base)
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(learner.model, load_file(str(directory / "adapter" / "adapter_model.safetensors")))
    else:
        learner = cls(cfg, directory / "model", seed=meta["seed"], temperature=temp, reference_path=base)
        learner.model_path = directory / "model"
    state = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
    if cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            learner.model, learner.optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True)
        )
    else:
        learner.optimizer.load_state_dict(state["optimizer"])
    learner.scheduler.load_state_dict(state["scheduler"])
    learner.optimizer_steps = int(state["optimizer_steps"])
    learner.version = WeightVersion(*state["version"])
    _set_rng_state(learner, state["rng"])
    return learner
