#!/usr/bin/env bash
# One device call on 2 GPUs: does `python run.py mode=real tp=2` serve, and where does it wait if not?
# Runs short tp=2 serving runs (overlap off, then on); a run still going after PROBE_S seconds gets its
# launcher's Python stacks printed (SIGUSR1) before it is stopped; ranks print theirs every DUMP_S seconds.
#   bash experiments/gpu_jobs/tp2_serve_probe.sh OUT
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export TWINSERVE_DUMP_STACKS_S=${DUMP_S:-30}   # every rank prints its stacks every DUMP_S seconds
OUT=${1:-${OUT:-/tmp/out}}
PROBE_S=${PROBE_S:-100}
mkdir -p "$OUT"
W="workload=random workload.range_ratio=1.0 real.as_fast_as_possible=true workload.num_requests=${NREQ:-64} workload.input_len=512 workload.output_len=32"
probe() {  # name, overrides...
  local name=$1; shift
  local dir=/tmp/probe/$name start=$(date +%s)
  python -c "import faulthandler, runpy, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); sys.argv=['run.py']+sys.argv[1:]; runpy.run_path('run.py', run_name='__main__')" \
    mode=real tp=2 $W "$@" progress=true hydra.run.dir=$dir > "$OUT/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 "$PROBE_S"); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    echo "== $name still running after ${PROBE_S}s: stacks" >> "$OUT/$name.log"
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader >> "$OUT/$name.log"
    for p in $(python3 -c "import json,sys; print(' '.join(map(str, json.load(open('$dir/ranks.json')).values())))" 2>/dev/null); do
      kill -USR1 "$p"; done
    kill -USR1 $pid; sleep 4; kill $pid; sleep 2; kill -9 $pid 2>/dev/null
  fi
  wait $pid 2>/dev/null
  cp $dir/summary.json "$OUT/$name.json" 2>/dev/null
  echo "== $name: $(( $(date +%s) - start )) s, summary: $(test -f $dir/summary.json && echo yes || echo no)"
  grep -E 'Thread|/work/main|error|rank|finished|s/it|it/s' "$OUT/$name.log" | grep -v Warning | tail -${TAIL:-40} | cut -c1-200
}
if [ "${ONLY_OVERLAP:-0}" = 1 ]; then probe tp2_overlap; else probe tp2_no_overlap overlap=false; probe tp2_overlap; fi
python - "$OUT" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    s = json.loads(f.read_text())
    print(f.stem, s["num_finished"], "req", round(s["duration_s"], 2), "s", round(s["throughput"]["requests_per_s"], 2), "req/s",
          "TPOT", round(1e3 * s["tpot_s"]["mean"], 2), "ms")
PY
