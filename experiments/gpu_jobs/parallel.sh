#!/usr/bin/env bash
# One device call for the parallel layouts on 2 GPUs (run from the repo root on the GPU machine):
#   bash experiments/gpu_jobs/parallel.sh [OUT]
# 1. DeepSeek-V2-Lite tp1 / tp2 / tp2ep2: greedy tokens at batch 8 (bf16, against tp1) and decode step
#    times at batch 8 / 64 / 256, context 1024 (experiments/bench_parallel.py speed --tokens)
# 2. NCCL collectives table (experiments/bench_collectives.py --nproc 2)
# 3. a short `python run.py mode=real tp=2` serving run (records copied to OUT/serve_tp2)
set -uo pipefail
source experiments/gpu_jobs/prelude.sh
start=$(date +%s)
timeout 170 python experiments/bench_parallel.py speed --tokens --batch 8 64 256 --repeats 20 --out "$OUT" 2>&1 \
  | grep -v Warning | cut -c1-300 | tee "$OUT/bench_parallel.log" | tail -30
echo "bench_parallel: $(( $(date +%s) - start )) s"
timeout 60 python experiments/bench_collectives.py --nproc 2 > "$OUT/collectives.log" 2>&1
tail -3 "$OUT/collectives.log"; cp experiments/results/h200/collectives.csv "$OUT/" 2>/dev/null
echo "collectives: $(( $(date +%s) - start )) s"
timeout 75 python run.py mode=real tp=2 progress=false workload.num_groups=2 workload.prompts_per_group=16 \
  workload.output_len=64 real.cuda_graph_max_bs=32 hydra.run.dir="$OUT/serve_tp2" 2>&1 | grep -v Warning | tail -12
rm -f "$OUT"/serve_tp2/*.png
echo "serve: $(( $(date +%s) - start )) s"
true
