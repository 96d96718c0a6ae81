"""A vLLM worker extension that loads new policy weights in place.

vLLM instantiates its workers with this class mixed in when the engine is built with
``worker_extension_cls="dreamgym.vllm_worker.WeightUpdateExtension"``; the engine then calls its
methods through ``collective_rpc``. With the engine in the caller's process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the tensors are passed by reference, without pickling.

Why not ``model.load_weights`` directly: on CPU the backend repacks linear weights after loading,
and ``load_weights`` on the repacked module fails (``'Parameter' object has no attribute
'weight_loader'``). vLLM's ``reload_weights`` restores the checkpoint layout, loads, and repacks
again. Two traps remain and are handled here or by the caller:

1. Tied embeddings (SmolLM2): the LM head shares the embedding's parameter, but on CPU vLLM
   computes logits from a pre-packed copy of it that is rebuilt only when the head layer itself
   receives ``lm_head.weight``. An update without that name leaves the *old* head in use (measured:
   log-probs off by ~0.8 nats on the tiny model, the embedding itself updated). The sender therefore
   always includes ``lm_head.weight`` for tied models (``VllmPolicy.load_weights`` adds it from the
   embedding when it is missing). ``dg_retie`` additionally restores the parameter sharing should a
   reload ever break it.
2. The prefix cache holds KV computed with the old weights; the engine owner resets it after each
   update (``LLM.reset_prefix_cache``), see ``dreamgym.vllm_engine``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class WeightUpdateExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (``self.model_runner``, ``self.reload_weights``)."""

    def dg_load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Load checkpoint-format ``(name, tensor)`` pairs (HF names) in place; returns a summary."""
        pairs = list(weights)
        self.reload_weights(weights_iterator=iter(pairs), is_checkpoint_format=True)  # type: ignore[attr-defined]
        retied = self.dg_retie()
        return {"tensors": len(pairs), "retied": retied}

    # -- the same load in steps: start, one chunk per call, finish (``VllmPolicy.start_update`` ..) ------------
    # ``reload_weights`` is exactly these three steps in one call (vLLM's ``reload.inplace``); the layerwise
    # reload moves every layer to the meta device at the start and fills each one as its tensors arrive, so
    # between the steps the model is half-loaded and must not serve (``dreamgym.weight_gate``).
    def dg_start_reload(self) -> None:
        """Begin a layerwise in-place reload (what vLLM's NCCL engine does in ``start_weight_update``)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(self.model_runner.get_model())  # type: ignore[attr-defined]

    def dg_load_chunk(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load one chunk of checkpoint-format pairs into the reload begun by ``dg_start_reload``."""
        from vllm.config import set_current_vllm_config

        pairs = list(weights)
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            self.model_runner.get_model().load_weights(iter(pairs))  # type: ignore[attr-defined]
        return len(pairs)

    def dg_finish_reload(self) -> bool:
        """Finish the reload (process and place every layer), drop state derived from the old weights, re-tie."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner  # type: ignore[attr-defined]
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            finalize_layerwise_reload(runner.get_model(), self.vllm_config.model_config)  # type: ignore[attr-defined]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as reload_weights does
            getattr(runner, reset, lambda: None)()
        return self.dg_retie()

    def dg_retie(self) -> bool:
        """Make a tied LM head use the (new) input embedding again; True if it had come apart."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        cfg = getattr(model, "config", None)
        if not getattr(cfg, "tie_word_embeddings", False):
            return False
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if head is None or embed is None or not hasattr(head, "weight") or not hasattr(embed, "weight"):
            return False
        if head.weight.data_ptr() == embed.weight.data_ptr():
            return False
        if head.weight.shape != embed.weight.shape:
            raise RuntimeError(
                f"cannot re-tie the LM head {tuple(head.weight.shape)} to the embedding {tuple(embed.weight.shape)}"
            )
        import torch

        with torch.no_grad():
            head.weight.data = embed.weight.data
        return True

    def dg_param_checksum(self, name: str) -> float:
        """Sum of one parameter of the served model (vLLM names), to check an update landed."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(dict(model.named_parameters())[name].detach().float().sum())
