#!/usr/bin/env bash
# One device call on 2 GPUs: piecewise CUDA graphs for extend steps under tensor parallelism, side by side
# (run from the repo root on the GPU machine; everything under OUT and packed into OUT/tp_piecewise.tgz):
#   bash experiments/gpu_jobs/tp_piecewise.sh OUT
# 1. GPU tests: tp=2, tp=2 ep=2 and DP attention serve tp=1's greedy tokens (fp32, the tiny model; prefills
#    replayed as pieces except under DP attention), DP attention's padded graphs
# 2. `python run.py mode=real tp=2` on the online workload (Poisson 16 req/s, 128-512-token prompts: prefill steps
#    of a few hundred tokens between decodes), piecewise graphs on, then `real.piecewise_cuda_graph=false`
#    -> OUT/serve/<name>/ (summary.json, requests/steps parquet)
# After the run, on CPU (HW as OUT/hardware.txt says):
#   python run.py mode=sim tp=2 hardware=HW <the workload below> hydra.run.dir=/tmp/sim_tp2   (and with the switch)
#   python -m experiments.compare_runs /tmp/sim_tp2 OUT/serve/tp2_piecewise
set -uo pipefail
T0=$(date +%s)
source experiments/gpu_jobs/prelude.sh
mkdir -p "$OUT/serve"
ONLINE="workload=random workload.num_requests=400 workload.input_len=512 workload.output_len=128 workload.range_ratio=0.25 workload.request_rate=16"
mark() { echo "$1: $(( $(date +%s) - T0 )) s since start" | tee -a "$OUT/parts.txt"; }
serve() {  # name, seconds, overrides...
  local name=$1 limit=$2; shift 2
  timeout $limit python run.py mode=real tp=2 hardware=$HW $ONLINE progress=false "$@" hydra.run.dir=/tmp/tpp/$name 2>&1 \
    | grep -v Warning | cut -c1-300 > "$OUT/serve_$name.log"; tail -2 "$OUT/serve_$name.log"
  mkdir -p "$OUT/serve/$name"
  cp /tmp/tpp/$name/{summary.json,requests.parquet,steps.parquet,ranks.json} "$OUT/serve/$name/" 2>/dev/null
  mark "serve $name (limit $limit s)"
}
serve tp2_piecewise ${FIRST_S:-260}
serve tp2_no_piecewise ${SECOND_S:-150} real.piecewise_cuda_graph=false
if [ "${GPU_TESTS:-1}" = 1 ]; then
  timeout ${TESTS_S:-150} python -m pytest -q -m gpu -p no:cacheprovider tests/distributed/test_gpu_layouts.py \
    -k "tiny_mla_moe or uneven" 2>&1 | grep -v Warning | tee "$OUT/gpu_tests.log" | tail -4
  mark "gpu tests"
fi
python - "$OUT" <<'PY'
import json, pathlib, sys
import pandas as pd
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("serve/*/summary.json")):
    s = json.loads(f.read_text())
    steps = pd.read_parquet(f.parent / "steps.parquet")
    ext = steps[steps.num_prefill_tokens > 0] if "num_prefill_tokens" in steps else steps.iloc[0:0]
    print(f"{f.parent.name}: {s['num_finished']}/{s['num_requests']} req, {s['throughput']['requests_per_s']:.2f} req/s, "
          f"TTFT {1e3 * s['ttft_s']['mean']:.1f} / p99 {1e3 * s['ttft_s']['p99']:.1f} ms, TPOT {1e3 * s['tpot_s']['mean']:.2f} ms, "
          f"extend steps {len(ext)} median {1e3 * (ext.end_s - ext.start_s).median() if len(ext) else float('nan'):.1f} ms, "
          f"load {s['load_time_s']:.1f} s, leaked {s['leaked_kv_slots']}")
PY
cat "$OUT/parts.txt"
tar czf /tmp/tp_piecewise.tgz -C "$OUT" . && mv /tmp/tp_piecewise.tgz "$OUT/tp_piecewise.tgz" && ls -la "$OUT/tp_piecewise.tgz"
true
