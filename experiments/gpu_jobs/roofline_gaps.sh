#!/usr/bin/env bash
# One device call on one GPU: the runs behind the roofline table's remaining misses.
#   bash experiments/gpu_jobs/roofline_gaps.sh OUT
# 1. Qwen2-MoE and Llama-3-8B served online (Poisson 16 req/s, private contexts) and at batch 1, with the
#    measured step time over its roofline per step kind (bench_real_serving.py --model M: step_roofline.csv);
# 2. DeepSeek-V2-Lite decode kernel by kernel at batch 4 (the 2-7 bucket) next to batch 1;
# 3. decode over contiguous, strided and scattered KV slots (does a served pool's layout cost time?).
# Everything also goes into OUT/roofline_gaps.tgz (the device tool returns at most 8 files).
set -uo pipefail
source experiments/gpu_jobs/prelude.sh
WORK=/tmp/roofline_gaps
mkdir -p "$WORK"
for m in ${MODELS:-qwen2_moe llama3_8b}; do
  start=$(date +%s)
  timeout ${SERVE_TIMEOUT_S:-200} python experiments/bench_real_serving.py --model "$m" --out "$WORK/$m" \
    --only online_poisson_16rps batch1_decode 2>&1 | grep -v "capture decode\|capture piecewise" | tail -14
  echo "$m: $(( $(date +%s) - start )) s"
done
timeout ${PROBE_TIMEOUT_S:-200} python experiments/decode_kernel_probe.py model=deepseek_v2_lite hardware=$HW \
  --batches 1 4 --out "$WORK/decode_kernels_b1_b4.csv" 2>&1 | grep -v Warning | head -100 | tee "$OUT/decode_kernels.txt"
timeout ${PROBE_TIMEOUT_S:-200} python experiments/kv_layout_probe.py model=deepseek_v2_lite hardware=$HW \
  --batches 16 64 128 256 2>&1 | grep -v Warning | tail -16 | tee "$OUT/kv_layout.txt"
cp "$OUT"/*.txt "$WORK"/ 2>/dev/null
tar -C "$WORK" --exclude='*.parquet' -czf "$OUT/roofline_gaps.tgz" . && ls -la "$OUT"
