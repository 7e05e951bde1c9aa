#!/usr/bin/env bash
# The real side of the fidelity table (run from the repo root on the GPU machine, with .whl and .traces
# carried): TWINSERVE_GIT_REVISION=<rev> bash experiments/gpu_jobs/fidelity.sh OUT
# OUT/fidelity_real.tgz holds every run's records; OUT/profile_meta.json the device's versions.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-${OUT:-/tmp/out}}; shift || true
mkdir -p "$OUT" /tmp/fidelity
python - <<'PY' 2>&1 | tail -2
import json, os, torch
from runtime.profile.tables import write_meta
write_meta("/tmp/meta", {"device_name": torch.cuda.get_device_name(0), "hardware": "h200", "model": "deepseek_v2_lite"},
           command="versions of the device machine (no profiling)")
print(json.load(open("/tmp/meta/meta.json"))["runs"][0]["versions"])
PY
cp /tmp/meta/meta.json "$OUT/profile_meta.json" 2>/dev/null
timeout ${FIDELITY_TIMEOUT_S:-470} python experiments/fidelity_runs.py --real --out /tmp/fidelity/real "$@" 2>&1 \
  | grep -v "capture decode" | tail -20
tar czf "$OUT/fidelity_real.tgz" -C /tmp/fidelity real && ls -la "$OUT"
