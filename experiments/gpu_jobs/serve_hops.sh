#!/usr/bin/env bash
# One device call: where a served token's delivery lag goes, hop by hop (experiments/serving_hops.py:
# scheduler -> detokenizer -> HTTP process -> client, and the intake), DeepSeek-V2-Lite plain defaults at
# RATE req/s, once per server setting in SETTINGS (';'-separated override lists, '-' for none, e.g.
# "-;server.tokenizer_workers=2;server.detokenizer=inline"); first, the CUDA event clock against the host's
# over 30 s (the server places device step times on the host clock once per run: drift skews them;
# SKIP_CLOCK=1 skips it).
# Needs the server's wheels in .whl/ (see serve_bench.sh).
#   bash experiments/gpu_jobs/serve_hops.sh OUT
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-/tmp/out}; WORK=${WORK:-/tmp/serve_hops}; mkdir -p "$OUT" "$WORK"
RATE=${RATE:-16}; NREQ=${NREQ:-300}; CLIENTS=${CLIENTS:-4}; PRECONNECT=${PRECONNECT:-0}   # warm client connections
SETTINGS=${SETTINGS:-"-"}
W="workload=random workload.input_len=1024 workload.output_len=256 workload.range_ratio=0.5 workload.num_requests=$NREQ workload.request_rate=$RATE"
[ -n "${SKIP_CLOCK:-}" ] || python3 - > "$OUT/gpu_clock.txt" 2>&1 <<'EOF'
import time, torch
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); start.record(); start.synchronize(); t0 = time.perf_counter()
time.sleep(30.0)
end.record(); end.synchronize(); t1 = time.perf_counter()
gpu_s, host_s = start.elapsed_time(end) / 1e3, t1 - t0
print(f"host {host_s:.6f} s, CUDA events {gpu_s:.6f} s: events - host = {1e6 * (gpu_s - host_s):.1f} us "
      f"({1e6 * (gpu_s - host_s) / host_s:.1f} ppm)")
EOF
cat "$OUT/gpu_clock.txt" 2>/dev/null
i=0
IFS=';' read -ra LIST <<< "$SETTINGS"
for setting in "${LIST[@]}"; do
  i=$((i + 1)); dir=$WORK/hops_$i
  echo "== $setting"; mkdir -p "$dir"; echo "$setting" > "$dir/setting.txt"
  [ "$setting" = "-" ] && setting=""
  python -m experiments.serving_hops --out "$dir" --client-processes "$CLIENTS" --preconnect "$PRECONNECT" $W $setting 2>&1 | tail -28
  cp "$dir/hops.json" "$OUT/hops_$i.json" 2>/dev/null
  cp "$dir/bench/summary.json" "$OUT/hops_${i}_summary.json" 2>/dev/null
done
(cd "$WORK" && tar czf "$OUT/serve_hops.tgz" hops_*/hops hops_*/setting.txt hops_*/bench/*.json hops_*/bench/*.parquet \
  hops_*/bench/server 2>/dev/null)
ls -la "$OUT"
