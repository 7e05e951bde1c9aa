#!/usr/bin/env bash
# One device call on 4 GPUs of one host (run from the repo root on the GPU machine), everything under OUT (and packed into OUT/four_gpu.tgz: the device tool returns only a few files):
#   bash experiments/gpu_jobs/four_gpu.sh OUT
# Switches: PARTS="decode collectives serve v3" (which parts, always in this order), BUDGET_S=560 (every part's
# timeout is cut to what is left of it, a part with too little left is skipped), DECODE_LAYOUTS="tp1 tp2 tp4 tp4ep4",
# SERVE_LAYOUTS="tp=4;tp=4 ep=4", V3_LAYOUTS="tp4", V3_LAYERS=5.
# 1. decode: DeepSeek-V2-Lite decode step per layout at batch 64 and 256, context 1024, bf16, CUDA graphs
#    (experiments/bench_parallel.py speed) -> OUT/decode/parallel_decode_deepseek_v2_lite.csv, and beside it
#    *_predicted.csv: the simulator's price of every row (experiments/parallel_predict.py, this run's collectives first)
# 2. collectives: NCCL all-reduce / all-gather / reduce-scatter / all-to-all on 4 GPUs, eager and in CUDA graphs
#    (experiments/bench_collectives.py --nproc 4) -> OUT/collectives.csv; committed as
#    experiments/results/<gpu>x4/collectives.csv the simulator reads its 4-rank rows (sim/costmodel/collective_table.py)
# 3. serve: `python run.py mode=real tp=4` and `tp=4 ep=4` with the default workload (hardware= the cards, so that the
#    KV pool is sized for them) -> OUT/serve/<layout>/ (summary.json, requests/steps parquet, ranks.json, run.log)
# 4. v3: DeepSeek-V3 at full width with V3_LAYERS layers (5: 3 dense + 2 MoE), bf16 weights (the runtime builds
#    every linear in bf16; model.weight_dtype=bfloat16 so the simulator prices the same bytes), decode step at batch
#    1 and 64 -> OUT/v3_<layers>l_bf16/parallel_decode_deepseek_v3.csv (+ _predicted.csv)
# After the run, on CPU (HW = h200 or h100, as OUT/hardware.txt says; the parts' outputs as above):
#   python -m experiments.parallel_predict OUT/decode/parallel_decode_deepseek_v2_lite.csv --hardware HW
#   python -m experiments.parallel_predict OUT/v3_5l_bf16/parallel_decode_deepseek_v3.csv --hardware HW
#   python run.py mode=sim tp=4 hardware=HW progress=false hydra.run.dir=/tmp/sim_tp4
#   python run.py mode=sim tp=4 ep=4 hardware=HW progress=false hydra.run.dir=/tmp/sim_tp4_ep4
#   python -m experiments.compare_runs /tmp/sim_tp4 OUT/serve/tp4
#   python -m experiments.compare_runs /tmp/sim_tp4_ep4 OUT/serve/tp4_ep4
# (once OUT/collectives.csv is committed under experiments/results/HWx4/, the first two need no --collectives)
set -uo pipefail
T0=$(date +%s)
source experiments/gpu_jobs/prelude.sh
PARTS=${PARTS:-decode collectives serve v3}
BUDGET_S=${BUDGET_S:-560}
V3_LAYERS=${V3_LAYERS:-5}
V3_DIR="$OUT/v3_${V3_LAYERS}l_bf16"
want() { [[ " $PARTS " == *" $1 "* ]]; }
mark() { echo "$1: $(( $(date +%s) - T0 )) s since start" | tee -a "$OUT/parts.txt"; }
# budget NAME MAX MIN: t = the seconds part NAME may take (MAX, cut to what is left of BUDGET_S); fails, noting
# the skip, when fewer than MIN are left
budget() { t=$(( BUDGET_S - $(date +%s) + T0 )); (( t > $2 )) && t=$2; (( t >= $3 )) || { mark "$1 skipped"; return 1; }; }
quiet() { grep -v Warning | cut -c1-300; }

if want decode && budget decode 220 60; then
  timeout $t python experiments/bench_parallel.py speed --layouts ${DECODE_LAYOUTS:-tp1 tp2 tp4 tp4ep4} --batch 64 256 \
    --context 1024 --repeats 20 --out "$OUT/decode" 2>&1 | quiet > "$OUT/decode.log"; tail -2 "$OUT/decode.log"
  mark "decode (limit $t s)"
fi
if want collectives && budget collectives 100 40; then
  timeout $t python experiments/bench_collectives.py --nproc 4 --hardware $HW --out "$OUT/collectives.csv" \
    > "$OUT/collectives.log" 2>&1; tail -2 "$OUT/collectives.log"
  mark "collectives (limit $t s)"
fi
if want serve; then
  IFS=';' read -ra SERVE_LIST <<< "${SERVE_LAYOUTS:-tp=4;tp=4 ep=4}"
  first=220   # the first serving run JIT-compiles FlashInfer's prefill for the tp=4 head split on a fresh machine
  for layout in "${SERVE_LIST[@]}"; do
    name=${layout//=/}; name=${name// /_}
    budget "serve $layout" $first 60 || continue
    first=160
    timeout $t python run.py mode=real $layout hardware=$HW progress=false hydra.run.dir=/tmp/four_gpu/$name 2>&1 \
      | quiet > "$OUT/serve_$name.log"; tail -3 "$OUT/serve_$name.log"
    mkdir -p "$OUT/serve/$name"
    cp /tmp/four_gpu/$name/{summary.json,requests.parquet,steps.parquet,ranks.json,run.log} "$OUT/serve/$name/" 2>/dev/null
    mark "serve $layout (limit $t s)"
  done
fi
if want v3 && budget v3 150 60; then
  timeout $t python experiments/bench_parallel.py speed --model deepseek_v3 --layouts ${V3_LAYOUTS:-tp4} --batch 1 64 \
    --context 1024 --repeats 10 --out "$V3_DIR" \
    --override model.hf_config.num_hidden_layers=$V3_LAYERS model.weight_dtype=bfloat16 2>&1 | quiet > "$OUT/v3.log"
  tail -2 "$OUT/v3.log"
  mark "v3 (limit $t s)"
fi

echo "== summary ($HW x4; $(( $(date +%s) - T0 )) s) =="
COLL=""; [ -s "$OUT/collectives.csv" ] && COLL="--collectives $OUT/collectives.csv"
for csv in "$OUT/decode/parallel_decode_deepseek_v2_lite.csv" "$V3_DIR/parallel_decode_deepseek_v3.csv"; do
  [ -s "$csv" ] && timeout 60 python -m experiments.parallel_predict "$csv" --hardware $HW $COLL 2>&1 | quiet
done
python - "$OUT" <<'PY'
import csv, json, pathlib, sys
out = pathlib.Path(sys.argv[1])
table = out / "collectives.csv"
if table.exists():
    rows = [r for r in csv.DictReader(table.open())
            if r["collective"] == "all_reduce" and r["size_bytes"] in ("4096", "262144", "16777216")]
    rows and print("all_reduce n=4:", ", ".join(
        f"{int(r['size_bytes']) // 1024} KiB {'graph' if r['graph'] == '1' else 'eager'} {1e6 * float(r['time_s']):.1f} us"
        for r in rows))
for f in sorted(out.glob("serve/*/summary.json")):
    s = json.loads(f.read_text())
    err = (s.get("step_prediction_error") or {}).get("median", float("nan"))
    print(f"{f.parent.name}: {s['num_finished']}/{s['num_requests']} req, {s['throughput']['requests_per_s']:.2f} req/s, "
          f"TTFT {1e3 * s['ttft_s']['mean']:.1f} ms, TPOT {1e3 * s['tpot_s']['mean']:.2f} ms, "
          f"load {s['load_time_s']:.1f} s, warm-up {s.get('warmup_s', 0):.1f} s, leaked {s['leaked_kv_slots']}, "
          f"step |err| median {err:.3f}")
PY
cat "$OUT/parts.txt" 2>/dev/null
# the device tool brings back only a few files of OUT: everything also goes in one archive beside them
rm -f "$OUT"/serve/*/*.png
tar czf "/tmp/four_gpu.tgz" -C "$OUT" . && mv /tmp/four_gpu.tgz "$OUT/four_gpu.tgz" && ls -la "$OUT/four_gpu.tgz"
true
