#!/usr/bin/env bash
# The experience-model fine-tune with and without rationales that cite the prompt's demonstrations
# (experience_model.train.cite_demonstrations), on the same offline data and the same 20 steps
# (configs/study-cpu.yaml), scored on unseen 3- and 5-room coin maps (test seeds) beside copy-top-1.
# About 45 min on a 2-core AVX2 CPU. Results: $D/eval-{natural,cite}-{3,5}rooms.json (docs/results/fidelity.md). Reruns skip what is already there.
set -euo pipefail
D=${1:-runs/em-rationales}
DG=${DG:-.venv/bin/dreamgym}
mkdir -p "$D"
[ -f "$D/offline.parquet" ] || $DG collect configs/study-cpu.yaml --collect.out "$D/offline.parquet"
for m in 3 5; do
  [ -f "$D/test-${m}rooms.parquet" ] || $DG collect configs/study-cpu.yaml --env.split test \
      --env.params "{numLocations: $m, includeDoors: 0}" --collect.episodes 30 --collect.out "$D/test-${m}rooms.parquet"
done
for arm in natural cite; do
  cite=false; [ "$arm" = cite ] && cite=true
  [ -f "$D/$arm/dreamgym_sft.json" ] || $DG train-experience-model configs/study-cpu.yaml --data "$D/offline.parquet" \
      --out "$D/$arm" --experience_model.train.step_budget 10 --experience_model.train.cite_demonstrations $cite
done
for arm in natural cite; do
  for m in 3 5; do
    [ -f "$D/eval-$arm-${m}rooms.json" ] || $DG eval-experience-model configs/study-cpu.yaml \
        --data "$D/test-${m}rooms.parquet" --store "$D/offline.parquet" --model "$D/$arm" --backend local \
        --limit 48 --experience_model.eval.step_budget 10 --out "$D/eval-$arm-${m}rooms.json"
  done
done
