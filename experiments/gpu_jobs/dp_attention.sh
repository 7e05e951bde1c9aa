#!/usr/bin/env bash
# One device call on 2 GPUs: DeepSeek-V2-Lite served with DP attention (`tp=2 dp=2 dp_attention=true`: each GPU an
# attention rank with its own requests and MLA cache behind the round-robin router, the MLP/MoE tensor-parallel over
# both GPUs on the gathered tokens; eager, CUDA graphs off) on layouts_serve.sh's fixed offline workload (400 requests
# of 1000 in / 100 out at t=0, dummy weights, bf16). Writes OUT/summary.json (with its `dp` section: requests, steps
# and idle steps per attention rank), OUT/steps.parquet and OUT/requests.parquet (a `replica` column; each step's
# `predicted_s` is the simulator's DP attention price of that lockstep round), and prints one line to compare with
# OUT/dp2.json and OUT/tp2.json of layouts_serve.sh.
#   bash experiments/gpu_jobs/dp_attention.sh OUT
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
W="workload=random workload.range_ratio=1.0 real.as_fast_as_possible=true workload.num_requests=400 workload.input_len=1000 workload.output_len=100"
start=$(date +%s)
timeout ${RUN_TIMEOUT_S:-270} python run.py mode=real tp=2 dp=2 dp_attention=true $W progress=false \
  hydra.run.dir=/tmp/dp_attention 2>&1 | grep -v Warning | tail -12
echo "tp=2 dp=2 dp_attention: $(( $(date +%s) - start )) s"
cp /tmp/dp_attention/summary.json /tmp/dp_attention/*.parquet "$OUT/" 2>/dev/null
python - "$OUT" <<'PY'
import json, sys, pathlib
path = pathlib.Path(sys.argv[1]) / "summary.json"
if not path.exists():
    sys.exit("no summary.json: the run did not finish")
s = json.loads(path.read_text())
print("tp2_dp2_dp_attention", s["num_finished"], "req", round(s["duration_s"], 2), "s",
      round(s["throughput"]["requests_per_s"], 2), "req/s", "TPOT", round(1e3 * s["tpot_s"]["mean"], 2), "ms",
      "| dp", {k: s["dp"][k] for k in ("requests_per_replica", "steps_per_replica", "idle_steps_per_replica")},
      "| step prediction error", s.get("step_prediction_error"))
PY
