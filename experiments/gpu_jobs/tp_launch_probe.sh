#!/usr/bin/env bash
# One device call on 2 GPUs: where a tp=2 step's launch spends its host time on each rank
# (experiments/tp_launch_probe.py), with piecewise graphs (the default) and then without (eager extends):
#   bash experiments/gpu_jobs/tp_launch_probe.sh OUT [extra overrides for both runs...]
# OUT/<variant>.json (rows of both ranks), OUT/<variant>.log (the printed table); VARIANTS picks the runs
# (piecewise, eager, nomixing: piecewise with NCCL_GRAPH_MIXING_SUPPORT=0).
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
    # NCCL's support for graphs mixed with other NCCL work adds waits around captured collectives: without it
    nomixing) NCCL_GRAPH_MIXING_SUPPORT=0 probe nomixing ${SECOND_S:-200} "$@" ;;
  esac
done
