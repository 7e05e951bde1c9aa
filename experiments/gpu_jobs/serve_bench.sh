#!/usr/bin/env bash
# One device call: `python run.py mode=serve` (DeepSeek-V2-Lite, plain defaults) measured by
# experiments/bench_serving.py at three request rates, then the same workload replayed by mode=real
# (one runner, experiments/bench_real_serving.py --rates) for the HTTP-overhead comparison
# (SKIP_REPLAY=1 skips it). The server's dependencies (fastapi, uvicorn, uvloop, httptools, pyzmq,
# prometheus_client) must be among the carried wheels: pip download them for cp312 manylinux into .whl/.
# Besides the summaries, OUT gets each rate's records (the client's requests with their token times, the
# server's requests and steps, the replay's), so that per-token delivery lags and the step times and
# gaps of the two runs can be compared, and frontend_*.json: the HTTP front end alone on this host's CPU
# (experiments/bench_frontend.py, a fake model stepping like the served one). Everything is also packed
# into OUT/serve_bench.tgz (a device call brings back only a few files).
#   bash experiments/gpu_jobs/serve_bench.sh OUT
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-/tmp/out}; WORK=${WORK:-/tmp/serve_bench}; mkdir -p "$OUT" "$WORK"
W="workload=random workload.input_len=1024 workload.output_len=256 workload.range_ratio=0.5 workload.num_requests=600"
RATES=${RATES:-16 48 96}
SERVER_OVERRIDES=${SERVER_OVERRIDES:-}   # e.g. server.stream_interval=4, or server.tokenizer_workers=4 (HTTP workers)
CLIENTS=${CLIENTS:-4}           # client processes: one alone falls behind hundreds of streams
# client settings, ';'-separated, each run at every rate against the same server ('-': none), e.g.
# "-;--preconnect 64 --busy-poll": a second variant's files are named serve_rate_<r>_v2*
CLIENT_VARIANTS=${CLIENT_VARIANTS:-"-"}
IFS=';' read -ra VARIANTS <<< "$CLIENT_VARIANTS"
python3 -c "import uvloop, httptools" 2>/dev/null || echo "WARNING: uvloop/httptools missing: the server runs on asyncio + h11"
# the front end alone (~40 s; SKIP_FRONTEND=1 skips it): rate and fake step (ms), ~80 and ~500 streams of 256 tokens
for spec in "16 20" "48 40"; do
  [ -n "${SKIP_FRONTEND:-}" ] && break
  read -r rate step <<< "$spec"
  python experiments/bench_frontend.py --rate $rate --num-requests $((10 * rate)) --output-len 256 --step-ms $step \
    --client-processes $CLIENTS --out $WORK/frontend_$rate > $WORK/frontend_$rate.log 2>&1 \
    && cp $WORK/frontend_$rate/frontend.json $OUT/frontend_$rate.json || tail -3 $WORK/frontend_$rate.log
done
python run.py mode=serve progress=false $SERVER_OVERRIDES hydra.run.dir=$WORK/server > $WORK/serve.log 2>&1 & S=$!
for _ in $(seq 120); do curl -sf localhost:30000/health >/dev/null && break; sleep 2; done
grep -m1 "serving" $WORK/serve.log
for r in $RATES; do
  v=0
  for variant in "${VARIANTS[@]}"; do
    v=$((v + 1)); tag=$r; [ $v -gt 1 ] && tag=${r}_v$v
    [ "$variant" = "-" ] && variant=""
    [ ${#VARIANTS[@]} -gt 1 ] && echo "== rate $r, client: ${variant:-plain}"
    python experiments/bench_serving.py --url http://127.0.0.1:30000 --flush-cache --client-processes $CLIENTS \
      $variant --out $WORK/bench/rate_$tag $W workload.request_rate=$r 2>&1 | tail -4
    cp $WORK/bench/rate_$tag/summary.json $OUT/serve_rate_$tag.json
    cp $WORK/bench/rate_$tag/requests.parquet $OUT/serve_rate_${tag}_client_requests.parquet 2>/dev/null
    cp $WORK/bench/rate_$tag/server/requests.parquet $OUT/serve_rate_${tag}_requests.parquet 2>/dev/null
    cp $WORK/bench/rate_$tag/server/steps.parquet $OUT/serve_rate_${tag}_steps.parquet 2>/dev/null
  done
done
kill -INT $S; wait $S
if [ -z "${SKIP_REPLAY:-}" ]; then
  python experiments/bench_real_serving.py --out $WORK/replay --rates $RATES --workload $W 2>&1 | grep -v "capture decode" | tail -12
  cp $WORK/replay/serving.csv $OUT/replay_serving.csv
  for r in $RATES; do
    cp $WORK/replay/rate_$r/steps.parquet $OUT/replay_rate_${r}_steps.parquet 2>/dev/null
    cp $WORK/replay/rate_$r/requests.parquet $OUT/replay_rate_${r}_requests.parquet 2>/dev/null
  done
fi
tail -5 $WORK/serve.log
tar czf /tmp/serve_bench.tgz -C "$OUT" . && mv /tmp/serve_bench.tgz "$OUT/"
