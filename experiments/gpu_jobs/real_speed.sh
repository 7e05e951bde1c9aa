#!/usr/bin/env bash
# One device call for the mode=real speed work (run from the repo root on the GPU machine):
#   bash experiments/gpu_jobs/real_speed.sh tests|quick|full|models|engine|gputest|piecewise [OUT] [scenario names...]
# tests: the gpu-marked tests; quick: three short serving scenarios; full: every scenario (or the
# named ones) + Engine; models: `python run.py mode=real` with plain defaults for each model family.
# Records stay under /tmp/real_speed; the tables (CSV/JSON) are copied to OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${2:-${OUT:-/tmp/out}}
WORK=/tmp/real_speed
mkdir -p "$OUT" "$WORK"
mode=$1; shift; shift || true
case "$mode" in
  tests) timeout 420 python -m pytest -q -m gpu -x tests/engine tests/kernels tests/runtime tests/models 2>&1 | tail -25 | tee "$OUT/gpu_tests.log" ;;
  quick) python experiments/bench_real_serving.py --out "$WORK/real_serving" --quick 2>&1 | grep -v "capture decode" | tail -40 ;;
  full) python experiments/bench_real_serving.py --out "$WORK/real_serving" --engine ${@:+--only "$@"} 2>&1 | grep -v "capture decode" | tail -60 ;;
  models)
    for m in ${@:-deepseek_v2_lite qwen2_moe llama3_8b}; do
      python run.py mode=real model=$m progress=false hydra.run.dir="$WORK/models/$m" 2>&1 | tail -9
      cp "$WORK/models/$m/summary.json" "$OUT/summary_$m.json" 2>/dev/null
      python -m experiments.step_roofline "$WORK/models/$m" --model $m > "$OUT/step_roofline_$m.txt" 2>&1
    done ;;
  engine) python experiments/bench_real_serving.py --out "$WORK/real_serving" --engine --only batch1_decode 2>&1 | grep -v "capture decode" | tail -6 ;;
  gputest) timeout 300 python -m pytest -q -m gpu "$@" 2>&1 | tail -5 ;;
  piecewise)   # piecewise CUDA graphs: their GPU tests, then serving with them on and off side by side
    timeout 240 python -m pytest -q -m gpu -x tests/engine/test_piecewise_graphs.py 2>&1 | tail -8 | tee "$OUT/gpu_tests_piecewise.log"
    python experiments/bench_real_serving.py --out "$WORK/real_serving" --only ${@:-offline_1000in_100out \
      offline_1000in_100out_no_piecewise online_poisson_16rps online_poisson_16rps_no_piecewise batch1_decode \
      default_shared_prefix} 2>&1 | grep -v "capture decode\|capture piecewise" | tail -40 ;;
esac
cp "$WORK"/real_serving/*.csv "$WORK"/real_serving/*.json "$OUT"/ 2>/dev/null
true
