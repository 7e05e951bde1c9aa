#!/usr/bin/env bash
# One device call: tune the fused MoE launch configs for the served MoE models' expert shapes on this GPU
# (DeepSeek-V2-Lite: E=64, H=2048, top-6, I=1408; Qwen2-MoE: E=60, H=2048, top-4, I=1408), report tuned vs
# untuned time per M, then re-measure the offline 1000-in/100-out serving run with the tuned tables.
#   bash experiments/gpu_jobs/moe_tune.sh OUT
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
M="1 8 32 64 128 256 512 1024 2048 4096 8192"
python -m kernels.fused_moe.tune --experts 64 --hidden 2048 --top-k 6 --inter 1408 --m $M --budget-s ${BUDGET_S:-200} \
  --report "$OUT/moe_tune_report.csv" 2>&1 | grep -v "it/s\|s/it" | grep -v "^\s*$" | tail -15
python -m kernels.fused_moe.tune --experts 60 --hidden 2048 --top-k 4 --inter 1408 --m $M --budget-s ${BUDGET_S:-150} \
  --report "$OUT/moe_tune_report.csv" 2>&1 | grep -v "it/s\|s/it" | grep -v "^\s*$" | tail -15
# the tables' names (SGLang's "E=..,N=..,device_name=..") do not travel back as files: pack them
tar czf "$OUT/moe_configs.tgz" kernels/fused_moe/configs/E=64,N=1408,*.json kernels/fused_moe/configs/E=60,N=1408,*.json
cat "$OUT/moe_tune_report.csv"
if [ -z "${SKIP_SERVING:-}" ]; then
  python experiments/bench_real_serving.py --out /tmp/moe_tune/real_serving --only offline_1000in_100out 2>&1 \
    | grep -v "capture decode" | tail -12
  cp /tmp/moe_tune/real_serving/*.csv "$OUT"/ 2>/dev/null
fi
true
