"""Kernels compiled inside serving steps (GPU probe): builds the mode=real runner (weights, graphs, warm-up),
then serves one fidelity workload twice on it, and after each pass lists the Triton kernels that compiled
while serving (new entries of TRITON_CACHE_DIR) and the steps furthest over their predicted time. A kernel
listed after the first pass is a JIT compile the warm-up missed (~0.5 s inside one step on an H200).

  TRITON_CACHE_DIR=/tmp/tc python experiments/serving_jit_probe.py [--workload random_long_8k_2rps]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
from pathlib import Path

import pandas as pd
import torch

from experiments.compose import compose_config
from experiments.fidelity_runs import ALL_WORKLOADS, QUIET, run_real_workload
from runtime.build import build_core
from runtime.engine.build_runner import build_model_runner


def cache_entries() -> set[str]:
    return set(glob.glob(os.path.join(os.environ["TRITON_CACHE_DIR"], "*", "*.json")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="random_long_8k_2rps", choices=list(ALL_WORKLOADS))
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--out", default="/tmp/serving_jit_probe")
    args = parser.parse_args()
    if "TRITON_CACHE_DIR" not in os.environ:
        raise SystemExit("error: set TRITON_CACHE_DIR to an empty folder (the probe lists what compiles into it)")
    cfg = compose_config(["mode=real"] + QUIET)
    runner = build_model_runner(cfg, build_core(cfg))
    before = cache_entries()
    for index in range(args.passes):
        out = Path(args.out) / str(index)
        summary = run_real_workload(runner, ALL_WORKLOADS[args.workload], out)
        steps = pd.read_parquet(out / "steps.parquet")
        steps["ratio"] = (steps.end_s - steps.start_s) / steps.predicted_s
        worst = steps.sort_values("ratio").tail(3)[["num_prefill_tokens", "num_decode_requests", "ratio"]]
        retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
        print(f"pass {index}: TTFT p99 {summary['ttft_s']['p99']:.3f} s, allocator retries {retries}, "
              f"steps furthest over prediction {worst.round(2).values.tolist()}", flush=True)
        now = cache_entries()
        for entry in sorted(now - before):
            if "__grp__" not in entry:
                print(f"  compiled while serving: {json.load(open(entry)).get('name', os.path.basename(entry))}")
        before = now


if __name__ == "__main__":
    main()
