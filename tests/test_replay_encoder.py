"""``phi(s, a)``: the packaged MiniLM runs on torch alone and gives sentence-transformers' vectors; other layouts
still load through sentence-transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from dreamgym.replay.bert import plain_bert_layout
from dreamgym.replay.encoder import Encoder, default_model_dir

TEXTS = ["  You are in the kitchen. To the north you see a closed door.  || open door to north",
         "take coin", "", "a " * 400,  # empty, and longer than the 256-token budget (truncated as ST does)
         "Ärger mit dem Schlüssel\n\tinventory"]


def _sentence_transformers(folder: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(TEXTS, normalize_embeddings=True,
                                                                  convert_to_numpy=True)


def test_the_packaged_model_gives_sentence_transformers_vectors_without_importing_it() -> None:
    layout = plain_bert_layout(default_model_dir())
    assert layout is not None and layout.pooling == "mean" and layout.max_tokens == 256 and layout.hidden == 384
    # In a fresh process: the buffer's encoder must not import sentence-transformers (or scikit-learn, SciPy)
    probe = ("import sys, json; from dreamgym.replay.encoder import Encoder; e = Encoder(dtype='float32'); "
             "v = e.encode_texts(json.loads(sys.argv[1])); "
             "print(json.dumps({'v': v.tolist(), 'dim': e.dim, 'heavy': sorted(m for m in "
             "('sentence_transformers', 'sklearn', 'scipy') if m in sys.modules)}))")
    r = subprocess.run([sys.executable, "-c", probe, json.dumps(TEXTS)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["heavy"] == [] and out["dim"] == 384
    ours = np.asarray(out["v"], dtype=np.float32)
    theirs = _sentence_transformers(default_model_dir())
    assert ours.shape == theirs.shape == (len(TEXTS), 384)
    assert np.abs(ours - theirs).max() < 1e-5, np.abs(ours - theirs).max()
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)


def test_bf16_vectors_stay_close_to_fp32() -> None:
    fp32 = Encoder(dtype="float32").encode_texts(TEXTS)
    bf16 = Encoder(dtype="bfloat16").encode_texts(TEXTS)
    assert (fp32 * bf16).sum(1).min() > 0.99


def test_another_layout_loads_through_sentence_transformers(tmp_path: Path) -> None:
    """A folder with two pooling modes (concatenated by sentence-transformers) is not the plain layout: it loads
    through sentence-transformers and gets its vectors."""
    folder = tmp_path / "two-poolings"
    shutil.copytree(default_model_dir(), folder)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling["pooling_mode_cls_token"] = True
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert plain_bert_layout(folder) is None
    enc = Encoder(folder, dtype="float32")
    assert enc.dim == 768
    theirs = _sentence_transformers(folder)
    assert np.abs(enc.encode_texts(TEXTS) - theirs).max() < 1e-5


def test_cls_pooling_matches_sentence_transformers(tmp_path: Path) -> None:
    folder = tmp_path / "cls"
    shutil.copytree(default_model_dir(), folder)
    cfg = json.loads((folder / "1_Pooling" / "config.json").read_text())
    cfg.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    assert plain_bert_layout(folder) is not None
    ours = Encoder(folder, dtype="float32").encode_texts(TEXTS)
    assert np.abs(ours - _sentence_transformers(folder)).max() < 1e-5
