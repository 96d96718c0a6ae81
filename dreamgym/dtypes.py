"""Weight dtypes by name: the one place where a config's ``native`` / ``auto`` becomes a concrete dtype.

A config may say ``native`` (bf16 where the device computes it natively, else fp32; ``dreamgym.hardware``) or
``auto`` (the model's own dtype, from its ``config.json``). Everything that casts, allocates or plans memory
needs a concrete name (``float32``, ``bfloat16``, ``float16``): ``engine_dtype`` resolves it once, from the
model folder the engine serves, and ``torch_dtype`` refuses anything unresolved with a message instead of
``getattr(torch, "auto")``'s ``AttributeError`` deep in a weight sync.

No torch import at module level (``dreamgym --help`` stays light).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The dtype names an engine, a weight sync or a memory plan works with.
CONCRETE_DTYPES = ("float32", "bfloat16", "float16")

#: Bytes per element of each concrete dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

#: Spellings of ``torch_dtype`` / ``dtype`` in HF ``config.json`` files, mapped to the names above.
HF_DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float": "float32", "bfloat16": "bfloat16",
                  "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16"}


def checkpoint_dtype(model_path: str | Path) -> str:
    """The dtype a model folder's ``config.json`` declares (``dtype``, or the older ``torch_dtype``); a config
    that declares none is float32 (transformers' default)."""
    path = Path(model_path) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"dtype 'auto' reads the model's own dtype from {path}, which is unreadable "
                         f"({type(e).__name__}: {e}); name a dtype (float32, bfloat16, float16) instead") from None
    raw = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    name = HF_DTYPE_NAMES.get(str(raw).removeprefix("torch."))
    if name is None:
        raise ValueError(f"{path} declares dtype {raw!r}, which an engine cannot serve; name a dtype "
                         f"({', '.join(CONCRETE_DTYPES)}) instead of 'auto'")
    return name


def engine_dtype(dtype: str, device: str, model_path: str | Path | None) -> str:
    """The concrete dtype an engine configured with ``dtype`` serves on ``device``.

    ``native``: bf16 where native on ``device``, else fp32. ``auto``: the dtype of the checkpoint at ``model_path``
    (needed then). Concrete names pass through.
    """
    if dtype in CONCRETE_DTYPES:
        return dtype
    if dtype == "native":
        from dreamgym.hardware import native_dtype

        return native_dtype(device)
    if dtype == "auto":
        if model_path is None:
            raise ValueError("dtype 'auto' (the model's own dtype) needs the model folder to read it from")
        return checkpoint_dtype(model_path)
    raise ValueError(f"unknown dtype {dtype!r}: use one of native, auto, {', '.join(CONCRETE_DTYPES)}")


def torch_dtype(name: str) -> torch.dtype:
    """``torch.float32`` / ``torch.bfloat16`` / ``torch.float16`` for a concrete name; anything else (an
    unresolved ``auto`` or ``native`` included) raises ``ValueError`` saying so."""
    if name not in CONCRETE_DTYPES:
        raise ValueError(f"dtype {name!r} is not a concrete weight dtype ({', '.join(CONCRETE_DTYPES)}); "
                         "'auto' and 'native' must be resolved first (dreamgym.dtypes.engine_dtype)")
    import torch

    return getattr(torch, name)
