#!/usr/bin/env bash
# One device call on 2 GPUs: where a tp=2 step's launch spends its host time on each rank
# (experiments/tp_launch_probe.py), with piecewise graphs (the default) and then without (eager extends):
#   bash experiments/gpu_jobs/tp_launch_probe.sh OUT [extra overrides for both runs...]
# OUT/<variant>.json (rows of both ranks), OUT/<variant>.log (the printed table); VARIANTS picks the runs
# (piecewise, eager, mixing: piecewise with NCCL's graph mixing support on, real.nccl_graph_mixing=true).
set -uo pipefail
T0=$(date +%s)
source experiments/gpu_jobs/prelude.sh
shift || true
probe() {  # name, seconds, overrides...
  local name=$1 limit=$2; shift 2
  timeout $limit python experiments/tp_launch_probe.py --out "$OUT/$name.json" tp=2 hardware=$HW "$@" 2>&1 \
    | grep -v -i "warn\|capture" | cut -c1-400 > "$OUT/$name.log"
  cat "$OUT/$name.log" | tail -14
  echo "$name: $(( $(date +%s) - T0 )) s since start" | tee -a "$OUT/parts.txt"
}
for v in ${VARIANTS:-piecewise eager}; do
  case $v in
    piecewise) probe piecewise ${FIRST_S:-240} "$@" ;;
    eager) probe eager ${SECOND_S:-200} real.piecewise_cuda_graph=false "$@" ;;
    # NCCL's support for graphs mixed with other NCCL work (its default; off in the runtime) fences captured collectives
    mixing) probe mixing ${SECOND_S:-200} real.nccl_graph_mixing=true "$@" ;;
  esac
done
