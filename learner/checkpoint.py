"""Learner checkpoints: everything needed for a resumed run to take exactly the step it would have taken.

Layout of ``<run>/checkpoints/step-000012/``::

    model/             full fine-tuning: an HF folder (weights + tokenizer) vLLM can serve directly
    adapter/           LoRA: the peft adapter (the base model is ``learner.json: base_model``)
    trainer_state.pt   AdamW state, LR scheduler, optimizer-step counter, weight version,
                       RNG states (torch CPU/CUDA, Python, NumPy, the learner's shuffling generator)
    learner.json       base model, LoRA flag, seed, version, optimizer steps, algorithm (human-readable)
    critic.pt          PPO only: the critic's weights (backbone + value head), its AdamW and LR
                       scheduler state and counters (its randomness is the global RNG state above)

A checkpoint is written to a temporary folder and renamed into place, so a crash never leaves a
half-written ``step-*`` folder (the names come from ``dreamgym.train_state.checkpoint_dir``). With FSDP
the full (unsharded) state is gathered to rank 0, which writes it; every rank loads it.

This module is the format (files, atomic writes, RNG capture, listing and pruning); what goes in is the
learner's business: ``Learner.save_checkpoint`` and ``Learner.from_checkpoint`` call it.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dreamgym.train_state import CHECKPOINT_GLOB

STATE_FILE = "trainer_state.pt"
META_FILE = "learner.json"
MODEL_DIR = "model"
ADAPTER_DIR = "adapter"
CRITIC_FILE = "critic.pt"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(CHECKPOINT_GLOB) if (p / META_FILE).is_file())


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns the deleted folders."""
    old = list_checkpoints(root)[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


def rng_state(generator: Any) -> dict[str, Any]:
    """Every random stream a learner step draws from: torch CPU/CUDA, Python, NumPy and ``generator``."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "generator": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(generator: Any, state: dict[str, Any]) -> None:
    """Put back what ``rng_state`` captured."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    generator.set_state(state["generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def is_rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def write_checkpoint(directory: Path, write_model: Callable[[Path], None], state: dict[str, Any],
                     meta: dict[str, Any]) -> Path:
    """Write a checkpoint atomically: ``write_model(folder)`` writes ``model/`` or ``adapter/`` into the
    temporary folder, then ``state`` (``trainer_state.pt``) and ``meta`` (``learner.json``) follow and the
    folder is renamed to ``directory``."""
    import torch

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    tmp.chmod(0o755)
    try:
        write_model(tmp)
        torch.save(state, tmp / STATE_FILE)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def read_meta(directory: Path) -> dict[str, Any]:
    return json.loads((directory / META_FILE).read_text())


def read_state(directory: Path) -> dict[str, Any]:
    import torch

    return torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)


def load_adapter(model: Any, directory: Path) -> None:
    """Load a LoRA checkpoint's adapter weights into ``model`` (a peft model over the base)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(directory / ADAPTER_DIR / "adapter_model.safetensors")))


def write_critic(folder: Path, state: dict[str, Any]) -> None:
    """Write the PPO critic's state (``Critic.state_dict``) into a checkpoint folder being written."""
    import torch

    torch.save(state, folder / CRITIC_FILE)


def has_critic(directory: Path) -> bool:
    return (directory / CRITIC_FILE).is_file()


def read_critic(directory: Path) -> dict[str, Any]:
    import torch

    return torch.load(directory / CRITIC_FILE, map_location="cpu", weights_only=False)
