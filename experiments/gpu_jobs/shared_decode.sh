#!/usr/bin/env bash
# One device call on one GPU: decode over shared prefixes, measured and served.
#   PARTS="profile real" MODELS="deepseek_v2_lite qwen2_moe llama3_8b" bash experiments/gpu_jobs/shared_decode.sh OUT
# profile: `mode=profile profile.sections=$SECTIONS` (default decode_shared) for each model into a copy of its
#   committed profile without the tables named in FRESH (measured anew; default none) (OUT/profiles/<model>/:
#   copy back to sim/profiles/h200/<model>/);
# real: the shared-prefix workloads of experiments/fidelity_runs.py served by each model (records, summaries,
#   step_shapes.parquet with each step's shared tokens) into OUT/real/<model>/. Packs OUT/shared_decode.tgz.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-${OUT:-/tmp/out}}
PARTS=${PARTS:-profile real}
MODELS=${MODELS:-deepseek_v2_lite qwen2_moe llama3_8b}
WORK=${WORK:-/tmp/shared_decode}
RUNS=${RUNS:-shared_prefix_lpm shared_prefix_4x32_4k shared_prefix_32x8_1k_16rps}
mkdir -p "$OUT" "$WORK/profiles" "$WORK/real"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
for m in $MODELS; do
  if [[ " $PARTS " == *" profile "* ]]; then
    start=$(date +%s)
    rm -rf "$WORK/profiles/$m" && cp -r "sim/profiles/h200/$m" "$WORK/profiles/$m"
    for t in ${FRESH:-}; do rm -f "$WORK/profiles/$m/$t.csv"; done
    timeout ${PROFILE_TIMEOUT_S:-300} python run.py mode=profile model=$m progress=false "profile.sections='${SECTIONS:-decode_shared}'" \
      profile.out_dir="$WORK/profiles/$m" hydra.run.dir=/tmp/profile_run/$m 2>&1 | grep -v "capture\|Warning" | tail -4
    echo "$m profile: $(( $(date +%s) - start )) s, $(cat "$WORK"/profiles/$m/*.csv | wc -l) rows"
  fi
  if [[ " $PARTS " == *" real "* ]]; then
    start=$(date +%s)
    timeout ${REAL_TIMEOUT_S:-300} python experiments/fidelity_runs.py --real --out "$WORK/real/$m" --base model=$m \
      --only $RUNS 2>&1 | grep -v Warning | tail -6
    echo "$m real: $(( $(date +%s) - start )) s"
  fi
done
tar -C "$WORK" -czf "$OUT/shared_decode.tgz" profiles real
ls -la "$OUT"
