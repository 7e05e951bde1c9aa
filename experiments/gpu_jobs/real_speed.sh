#!/usr/bin/env bash
# One device call for the mode=real speed work (run from the repo root on the GPU machine):
#   bash experiments/gpu_jobs/real_speed.sh tests|quick|full|models [OUT]
# tests: the gpu-marked tests; quick: three short serving scenarios; full: every scenario + Engine;
# models: `python run.py mode=real` with plain defaults for each model family.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${2:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
case "$1" in
  tests) timeout 420 python -m pytest -q -m gpu -x tests/engine tests/kernels tests/runtime tests/models 2>&1 | tail -25 | tee "$OUT/gpu_tests.log" ;;
  quick) python experiments/bench_real_serving.py --out "$OUT/real_serving" --quick 2>&1 | tail -40 ;;
  full) python experiments/bench_real_serving.py --out "$OUT/real_serving" --engine 2>&1 | tail -60 ;;
  models)
    for m in deepseek_v2_lite qwen2_moe llama3_8b; do
      python run.py mode=real model=$m progress=false hydra.run.dir="$OUT/models/$m" 2>&1 | tail -9
    done ;;
esac
