#!/usr/bin/env bash
# One device call on one GPU: `python run.py mode=real model=M` with plain defaults for each model family
# (MLA+MoE, GQA+MoE, dense GQA), summaries to OUT/<model>.json and, per run, the slowest steps against
# the cost model's prediction (a step far above it is a cold kernel or a host stall inside serving).
#   bash experiments/gpu_jobs/plain_defaults.sh OUT [models...]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-${OUT:-/tmp/out}}; shift || true
MODELS=${*:-deepseek_v2_lite qwen2_moe llama3_8b}
mkdir -p "$OUT"
for m in $MODELS; do
  start=$(date +%s)
  timeout ${RUN_TIMEOUT_S:-200} python run.py mode=real model=$m progress=false hydra.run.dir=/tmp/plain/$m 2>&1 \
    | grep -v Warning | tail -3
  cp /tmp/plain/$m/summary.json "$OUT/$m.json" 2>/dev/null
  mkdir -p "$OUT/$m" && cp /tmp/plain/$m/steps.parquet "$OUT/$m/" 2>/dev/null
  echo "$m: $(( $(date +%s) - start )) s"
done
python - "$OUT" <<'PY'
import json, sys, pathlib
import pandas as pd
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    s = json.loads(f.read_text())
    steps = pd.read_parquet(f.with_suffix("") / "steps.parquet")
    ms, pred = (steps.end_s - steps.start_s) * 1e3, steps.predicted_s * 1e3
    worst = (ms - pred).idxmax()
    print(f"{f.stem}: {s['num_finished']}/{s['num_requests']} req, {s['throughput']['requests_per_s']:.2f} req/s, "
          f"TTFT {1e3 * s['ttft_s']['mean']:.1f} ms, TPOT {1e3 * s['tpot_s']['mean']:.2f} ms, load {s['load_time_s']:.1f} s, "
          f"warm-up {s['warmup_s']:.1f} s, leaked {s['leaked_kv_slots']}, steps {len(steps)}, step |err| median "
          f"{((ms - pred).abs() / ms).median():.3f}, worst step {ms[worst]:.1f} ms (pred {pred[worst]:.1f}, "
          f"{int(steps.num_prefill_tokens[worst])} new tokens, batch {int(steps.batch_size[worst])})")
PY
