#!/usr/bin/env bash
# One device call on 2 GPUs: `python run.py mode=real` served with tp=2, tp=2 ep=2 and dp=2 against dp=1 on the same
# fixed offline workload (summaries copied to OUT/<layout>.json; the table printed at the end).
#   bash experiments/gpu_jobs/layouts_serve.sh OUT          (LAYOUTS='dp=1;tp=2' picks some;
#   LAYOUTS='tp=2 dp=2 dp_attention=true' serves with DP attention: decode graphs padded to the ranks' agreed size)
# A fresh machine JIT-compiles FlashInfer's prefill for the tp=2 head split first (~1.5 min).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
W="workload=random workload.range_ratio=1.0 real.as_fast_as_possible=true workload.num_requests=400 workload.input_len=1000 workload.output_len=100"
IFS=';' read -ra LAYOUT_LIST <<< "${LAYOUTS:-dp=1;dp=2;tp=2;tp=2 ep=2}"
for layout in "${LAYOUT_LIST[@]}"; do
  name=${layout//=/}; name=${name// /_}
  start=$(date +%s)
  timeout ${LAYOUT_TIMEOUT_S:-300} python run.py mode=real $layout $W progress=false real.cuda_graph_max_bs=${GRAPH_BS:-256} \
    hydra.run.dir=/tmp/layouts/$name 2>&1 | grep -v Warning | tail -4
  cp /tmp/layouts/$name/summary.json "$OUT/$name.json" 2>/dev/null
  mkdir -p "$OUT/$name" && cp /tmp/layouts/$name/*.parquet "$OUT/$name/" 2>/dev/null
  echo "$layout: $(( $(date +%s) - start )) s"
done
if [ "${GPU_TESTS:-1}" = 1 ]; then   # tp=2, tp=2 ep=2 and DP attention serve tp=1's greedy tokens in fp32 (the 2-GPU tests)
  timeout ${TESTS_TIMEOUT_S:-240} python -m pytest -q -m gpu tests/distributed/test_gpu_layouts.py -p no:cacheprovider 2>&1 \
    | grep -v Warning | tee "$OUT/gpu_layout_tests.log" | tail -4
fi
python - "$OUT" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    s = json.loads(f.read_text())
    print(f.stem, s["num_finished"], "req", round(s["duration_s"], 2), "s", round(s["throughput"]["requests_per_s"], 2), "req/s",
          "TPOT", round(1e3 * s["tpot_s"]["mean"], 2), "ms")
PY
