"""Local model folders: tiny random Llama + local tokenizer, SmolLM2 from the packaged GGUF, aliases, CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dreamgym.models import ModelUnavailableError, build_tiny_model, build_tokenizer, resolve_model


def test_bpe_tokenizer_is_lossless_with_chatml_specials() -> None:
    tok = build_tokenizer("bpe", vocab_size=400)
    text = "Task: take the apple 🍎 <action>go north</action>\n  spaces"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tok.eos_token_id == 2 and tok.pad_token_id == 2
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_word_tokenizer_has_a_small_vocabulary() -> None:
    tok = build_tokenizer("word", words=["apple", "ball"], punctuation=False)
    assert len(tok) == 3 + 1 + 3 + 2  # specials, [UNK], roles, words
    ids = tok.encode("apple zebra ball", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["apple", "[UNK]", "ball"]


def test_tiny_model_is_deterministic_per_seed(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    a = load_file(str(build_tiny_model(tmp_path / "a", seed=1) / "model.safetensors"))
    b = load_file(str(build_tiny_model(tmp_path / "b", seed=1) / "model.safetensors"))
    c = load_file(str(build_tiny_model(tmp_path / "c", seed=2) / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)
    assert any(not (a[k] == c[k]).all() for k in a)
    assert "lm_head.weight" not in a  # tied, as in SmolLM2


def test_resolve_model(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "m")
    assert resolve_model(folder) == folder
    built = resolve_model("tiny", cache_dir=tmp_path / "cache")
    assert (built / "config.json").is_file() and resolve_model("tiny", cache_dir=tmp_path / "cache") == built
    with pytest.raises(ModelUnavailableError):
        resolve_model(tmp_path / "missing")


@pytest.mark.slow
def test_smollm2_is_converted_from_the_packaged_gguf() -> None:
    """~1 minute the first time (then cached under ~/.cache/dreamgym/models)."""
    import json

    from transformers import AutoTokenizer

    path = resolve_model("smollm2-135m")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["hidden_size"] == 576 and cfg["num_hidden_layers"] == 30 and cfg["tie_word_embeddings"] is True
    tok = AutoTokenizer.from_pretrained(str(path))
    assert len(tok) == 49152 and "<|im_start|>" in (tok.chat_template or "")


def test_prepare_models_help_does_not_import_torch() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from dreamgym.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['prepare-models', '--help'])\n"
        "    except SystemExit: pass\n"
        "print('torch' in sys.modules, 'vllm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
