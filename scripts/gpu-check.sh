#!/usr/bin/env bash
# GPU checks for a new machine or image, before a long run. Writes $OUT/summary.json (default ./gpu-check-out):
# versions (Python, torch, CUDA, driver, GPUs), pass/fail and seconds per check, the measured differences.
#
#   bash scripts/gpu-check.sh --torch-only   # the learner's CUDA paths on a tiny model (minutes): a GRPO step in
#                                            # bf16, checkpoint and exact resume, log-probs against CPU fp32.
#                                            # Needs CUDA PyTorch and the learner's Python dependencies
#                                            # (transformers, tokenizers, safetensors, pydantic, PyYAML) only:
#                                            # no vLLM, no Ray, no network; Python 3.11 or 3.12.
#   bash scripts/gpu-check.sh                # also the gpu-marked tests and a 3-iteration `dreamgym train` on CUDA
#                                            # (the full stack: the GPU image or `scripts/install.sh --gpu`)
#
# Exit codes: 0 passed, 1 a check failed, 2 a dependency is missing, 77 skipped (no CUDA GPU visible: the summary
# says "skipped: no CUDA"). PYTHON picks the interpreter (default: .venv/bin/python if present, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT
exec "$PY" scripts/gpu_check.py --out "$OUT" "$@"
