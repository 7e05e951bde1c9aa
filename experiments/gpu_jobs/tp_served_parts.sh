#!/usr/bin/env bash
# One device call on 2 GPUs: served tp=2 fidelity workloads with every launch's parts on the leader and every step
# timed on the other rank, then the two side by side (experiments/tp_launch_report.py):
#   TWINSERVE_GIT_REVISION=<rev> bash experiments/gpu_jobs/tp_served_parts.sh OUT [workloads...]
# (default: random_poisson_32rps azure_conversation_300_4x). OUT/fidelity_real.tgz (records, launch_times.parquet,
# follower_steps_rank1.parquet), OUT/tp_launch_report.csv (one row per step), OUT/report.txt (medians per kind, size).
set -uo pipefail
OUT=${1:-${OUT:-/tmp/out}}; shift || true
WORKLOADS=${*:-random_poisson_32rps azure_conversation_300_4x}
mkdir -p "$OUT"
TWINSERVE_LAUNCH_PARTS=1 FIDELITY_TIMEOUT_S=${FIDELITY_TIMEOUT_S:-360} bash experiments/gpu_jobs/fidelity.sh "$OUT" \
  --base tp=2 hardware=h200 --only $WORKLOADS | tail -6 | cut -c1-300
export PYTHONPATH=/tmp/site:$PWD            # the wheels fidelity.sh installed
python -m experiments.tp_launch_report /tmp/fidelity/real | tee "$OUT/report.txt"
cp /tmp/fidelity/real/tp_launch_report.csv "$OUT/" 2>/dev/null
