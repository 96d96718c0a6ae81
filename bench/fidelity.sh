#!/usr/bin/env bash
# Fidelity before the rules (docs/results/fidelity-before-rules.md): for 3-room and 5-room coin, one experience
# model fine-tuned per setting with the study's recipe (configs/study-cpu.yaml: 100 offline episodes of that map
# size, mixed gold/random, 20 SFT steps on 80 examples), scored on LIMIT transitions of unseen test-seed maps:
# the model's first reply (before retries and rules), the model after the rules, copy-top-1 and the rules alone,
# on seen and unseen (s, a); then LIMIT_OFF queries with actions their state's admissible list rules out. About
# 35 min on a 2-core AVX2 CPU (two fine-tunes ~10 min each, four evaluations 2-5 min each). Reruns skip what is
# already there. bench/fidelity_json.py combines $D/eval-*.json into the result.
set -euo pipefail
D=${1:-runs/fidelity}
OUT=${2:-bench/results/fidelity-coin-vm-$(date -u +%F).json}
LIMIT=${LIMIT:-48}
DG=${DG:-.venv/bin/dreamgym}
PY=${PY:-.venv/bin/python}
CFG=configs/study-cpu.yaml
ROOMS=${ROOMS:-"3 5"}  # the settings to run now (a shared machine may run them in separate turns)
TRAIN_ROOMS=${TRAIN_ROOMS:-}  # e.g. 3: every setting is scored with that map size's offline data and model (no own SFT)
mkdir -p "$D"
[ -f "$D/loadavg-start.txt" ] || cat /proc/loadavg > "$D/loadavg-start.txt"
for m in $ROOMS; do
  t=${TRAIN_ROOMS:-$m}
  [ -f "$D/offline-${t}rooms.parquet" ] || $DG collect $CFG --env.params "{numLocations: $t, includeDoors: 0}" \
      --collect.out "$D/offline-${t}rooms.parquet"
  P="{numLocations: $m, includeDoors: 0}"
  [ -f "$D/test-${m}rooms.parquet" ] || $DG collect $CFG --env.split test --env.params "$P" --collect.episodes 30 \
      --collect.out "$D/test-${m}rooms.parquet"
done
for m in $ROOMS; do
  t=${TRAIN_ROOMS:-$m}
  [ -f "$D/model-${t}rooms/dreamgym_sft.json" ] || $DG train-experience-model $CFG \
      --data "$D/offline-${t}rooms.parquet" --out "$D/model-${t}rooms" --experience_model.train.step_budget 10
done
for m in $ROOMS; do
  t=${TRAIN_ROOMS:-$m}
  [ -f "$D/eval-${m}rooms.json" ] || $DG eval-experience-model $CFG --data "$D/test-${m}rooms.parquet" \
      --store "$D/offline-${t}rooms.parquet" --model "$D/model-${t}rooms" --backend local --limit "$LIMIT" \
      --experience_model.eval.step_budget 10 --experience_model.eval.fidelity true --out "$D/eval-${m}rooms.json" \
      --experience_model.engine.omp_threads 2 --experience_model.engine.cpu_binds "[]"  # alone on the machine
done
# Actions the state's admissible list rules out (what the rules settle in training; the collection above plays
# none): LIMIT_OFF queries of test episodes played by bench/fidelity_offlist.py, if the run is still within
# BUDGET_S seconds (the whole script shares one machine; 0 skips it).
LIMIT_OFF=${LIMIT_OFF:-16}
BUDGET_S=${BUDGET_S:-2100}
for m in $ROOMS; do
  [ "$LIMIT_OFF" -gt 0 ] && [ "$SECONDS" -lt "$BUDGET_S" ] || continue
  t=${TRAIN_ROOMS:-$m}
  [ -f "$D/offlist-${m}rooms.parquet" ] || $PY bench/fidelity_offlist.py --rooms $m --store "$D/offline-${t}rooms.parquet" \
      --out "$D/offlist-${m}rooms.parquet"
  [ -f "$D/eval-offlist-${m}rooms.json" ] || $DG eval-experience-model $CFG --data "$D/offlist-${m}rooms.parquet" \
      --store "$D/offline-${t}rooms.parquet" --model "$D/model-${t}rooms" --backend local --limit "$LIMIT_OFF" \
      --experience_model.eval.step_budget 10 --experience_model.eval.fidelity true \
      --out "$D/eval-offlist-${m}rooms.json" --experience_model.engine.omp_threads 2 \
      --experience_model.engine.cpu_binds "[]"
done
$PY bench/fidelity_json.py "$D" --out "$OUT"
