#!/usr/bin/env bash
# One device call for MLA prefill in MHA form (run from the repo root on the GPU machine):
#   bash experiments/gpu_jobs/mla_mha_prefill.sh [OUT]
# the feature's gpu tests (+ the fast-path regression tests), the prefill micro-timing (absorbed vs MHA
# form, with a kernel profile), then the two serving scenarios with per-step roofline ratios.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
timeout 210 python -m pytest -q -rs -m gpu -x -s tests/kernels/test_mla_mha_prefill.py tests/engine/test_mla_mha_prefill.py \
  tests/engine/test_fast_path.py > "$OUT/gpu_tests.log" 2>&1
grep -E "rel err|agreement|passed|failed|Error|error" "$OUT/gpu_tests.log" | tail -30
timeout 100 python experiments/bench_mla_prefill.py --out "$OUT" --profile > "$OUT/prefill_forms.log" 2>&1
tail -45 "$OUT/prefill_forms.log"
timeout 160 python experiments/bench_real_serving.py --out "$OUT/real_serving" \
  --only offline_1000in_100out default_shared_prefix > "$OUT/real_serving.log" 2>&1
tail -16 "$OUT/real_serving.log"
