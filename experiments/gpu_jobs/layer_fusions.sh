#!/usr/bin/env bash
# The fast path's layer fusions (shared experts stacked into the fused MoE, one-kernel routing of few-token
# steps, one GEMM for the MLA input projections, one-program MoE align), on one GPU, side by side with
# real.layer_fusions=false. Run from the repo root on the GPU machine:
#   bash experiments/gpu_jobs/layer_fusions.sh tests|decode|serving [OUT]
# tests: the gpu tests these paths touch; decode: experiments/bench_decode_step.py with and without;
# serving: experiments/bench_real_serving.py scenarios with and without (records under /tmp/layer_fusions).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${2:-${OUT:-/tmp/out}}
WORK=/tmp/layer_fusions
mkdir -p "$OUT" "$WORK"
BATCHES=${BATCHES:-1 2 4 8 16 32 64 256}
SCENARIOS=${SCENARIOS:-batch1_decode online_poisson_16rps default_shared_prefix offline_1000in_1000out}
case "$1" in
  tests)
    timeout 500 python -m pytest -q -m gpu -x tests/kernels/test_router_topk.py tests/kernels/test_fused_moe.py \
      tests/engine/test_fast_path.py tests/engine/test_piecewise_graphs.py tests/engine/test_fused_small_ops.py \
      tests/engine/test_agreed_decode_graph.py tests/engine/test_mla_mha_prefill.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.log" ;;
  decode)
    for variant in on off; do
      flag=""; [ "$variant" = off ] && flag="--no-layer-fusions"
      python experiments/bench_decode_step.py --batch $BATCHES --no-unfused --reference-repeats 1 $flag \
        --out "$OUT/decode_step_fusions_$variant.csv" 2>&1 | grep -v "^{" | tail -12
    done ;;
  serving)
    for variant in on off; do
      python experiments/bench_real_serving.py --out "$WORK/$variant" \
        real.layer_fusions=$([ "$variant" = on ] && echo true || echo false) --only $SCENARIOS 2>&1 \
        | grep -v "capture decode\|capture piecewise" | grep -A12 "^ *scenario " | head -14
      cp "$WORK/$variant/serving.csv" "$OUT/serving_fusions_$variant.csv"
      cp "$WORK/$variant/step_roofline.csv" "$OUT/step_roofline_fusions_$variant.csv"
    done ;;
esac
true
