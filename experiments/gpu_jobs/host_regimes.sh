#!/usr/bin/env bash
# One device call: do served launches switch between host speed regimes, and does pinning the runtime to a few
# CPUs change that? The machine's CPU facts; every CPU's clock and time split sampled every 0.2 s
# (experiments/cpu_clock_sampler.py) while fidelity workloads run for real with each launch's parts, its thread
# CPU time and its CPU (TWINSERVE_LAUNCH_PARTS=1); then the first workload again under `taskset -c $PIN`.
#   TWINSERVE_GIT_REVISION=<rev> bash experiments/gpu_jobs/host_regimes.sh OUT
# Workloads: WORKLOADS (default "random_poisson_32rps random_poisson_4rps"); PIN (default 2-5).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TWINSERVE_LAUNCH_PARTS=1
OUT=${1:-/tmp/out}; WORK=/tmp/host_regimes; mkdir -p "$OUT" "$WORK"
WORKLOADS=${WORKLOADS:-"random_poisson_32rps random_poisson_4rps"}; PIN=${PIN:-2-5}
{ nproc; lscpu; echo; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>&1; nvidia-smi topo -m 2>&1;
  echo; nvidia-smi --query-gpu=name,uuid --format=csv; } > "$OUT/host_facts.txt"
grep -E "^(CPU\(s\)|Model name|Thread|Core|Socket|NUMA|Hypervisor|CPU max|CPU min)" "$OUT/host_facts.txt"
python3 experiments/cpu_clock_sampler.py "$WORK/cpu_clock.csv" --period-s 0.2 & SAMPLER=$!
echo "== free"
timeout ${FREE_TIMEOUT_S:-330} python experiments/fidelity_runs.py --real --out "$WORK/free" --only $WORKLOADS 2>&1 \
  | grep -v "capture decode" | tail -6
echo "== pinned to CPUs $PIN"
timeout ${PINNED_TIMEOUT_S:-200} taskset -c "$PIN" python experiments/fidelity_runs.py --real --out "$WORK/pinned" \
  --only ${WORKLOADS%% *} 2>&1 | grep -v "capture decode" | tail -4
kill $SAMPLER; wait $SAMPLER 2>/dev/null
gzip -c "$WORK/cpu_clock.csv" > "$OUT/cpu_clock.csv.gz"
tar czf "$OUT/host_regimes.tgz" -C "$WORK" free pinned && ls -la "$OUT"
