#!/usr/bin/env bash
# The H200 runs behind experiments/results/h200/gqa_*: GPU tests, kernel and step benches, and mode=real serving
# runs of the MHA/GQA families. Usage (from the repo root, flashinfer/hydra wheels installed, results in $OUT):
#   bash experiments/gpu_jobs/gqa_fast_path.sh tests|kbench|steps|serve [MODEL run.py overrides...]
set -u
OUT=${OUT:-/tmp/gqa_out}
mkdir -p "$OUT"
stage=$1
shift
case "$stage" in
  tests)
    timeout "${CAP_S:-170}" python -m pytest -q -rs -p no:cacheprovider tests/kernels/test_gqa_attention.py \
      tests/kernels/test_gated_act.py tests/engine/test_gqa_backend.py -s 2>&1 | tee "$OUT/gpu_tests_gqa.log" | tail -25
    ;;
  kbench)
    timeout "${CAP_S:-90}" python -m kernels.gqa_attention.bench --quick --out "$OUT/gqa_attention.csv" 2>&1 \
      | tee "$OUT/gqa_attention.log" | tail -14
    ;;
  steps)
    for model in llama3_8b qwen2_moe; do
      timeout "${CAP_S:-150}" python experiments/bench_gqa_step.py --model "$model" --out "$OUT/gqa_step_$model.csv" 2>&1 \
        | tee "$OUT/gqa_step_$model.log" | tail -9
    done
    ;;
  serve)   # serve MODEL [overrides...]: one mode=real run, records under $OUT/real_MODEL
    model=$1
    shift
    timeout "${CAP_S:-200}" python run.py mode=real model="$model" "$@" hydra.run.dir="$OUT/real_$model" 2>&1 \
      | grep -v '%|' | tee "$OUT/real_$model.log" | tail -22
    ;;
esac
