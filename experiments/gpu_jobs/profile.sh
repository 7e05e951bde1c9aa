#!/usr/bin/env bash
# mode=profile on the GPU machine (run from the repo root):
#   TWINSERVE_GIT_REVISION=<rev> bash experiments/gpu_jobs/profile.sh OUT [hydra overrides...]
# Writes the tables straight into OUT/profile (copy them to sim/profiles/<hardware>/<model>/).
# Several GPUs: pass the layout through, e.g. `bash experiments/gpu_jobs/profile.sh OUT tp=2` on 2 GPUs
# (tp=4, or tp=4 ep=4, on 4): one replica's ranks, every table but ops; copy OUT/profile to
# sim/profiles/<hardware>/<model>/tp2/ (tp4/, tp4ep4/), where costmodel=auto finds it for that layout.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-${OUT:-/tmp/out}}; shift || true
mkdir -p "$OUT/profile"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
timeout ${PROFILE_TIMEOUT_S:-480} python run.py mode=profile progress=false profile.out_dir="$OUT/profile" hydra.run.dir=/tmp/profile_run "$@" 2>&1 \
  | grep -v "capture decode" | tail -30
wc -l "$OUT"/profile/*.csv
