"""Benchmark linears of few tokens on one GPU: cuBLAS (F.linear) against the Triton skinny linear over a small
config sweep, at the projection shapes of DeepSeek-V2-Lite, Llama-3-8B and Qwen2-MoE.

Each case is timed as decode runs it: a CUDA graph of one call per weight copy, over enough copies (> 200 MB)
that every call streams its weight from HBM; per-call microseconds = the graph's median replay / copies.
Prints per shape and M the cuBLAS time, the best Triton config and its ratio; writes every row as CSV.

    python -m kernels.small_ops.bench_skinny [--rows 1 4 16] [--out experiments/results/h200/skinny_linear.csv]
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

import torch

from kernels.small_ops.triton_skinny_linear import SkinnyConfig, skinny_linear

# (model, what, N, K)
SHAPES = [
    ("deepseek_v2_lite", "q + kv_a (stacked)", 3648, 2048),
    ("deepseek_v2_lite", "o_proj", 2048, 2048),
    ("llama3_8b", "qkv", 6144, 4096),
    ("llama3_8b", "o_proj", 4096, 4096),
    ("llama3_8b", "gate_up", 28672, 4096),
    ("llama3_8b", "down", 4096, 14336),
    ("qwen2_moe", "qkv", 6144, 2048),
]
CONFIGS = [SkinnyConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
           for bn in (16, 32) for bk in (128, 256) for w in (4,) for s in (3, 4, 6)] + \
          [SkinnyConfig(block_n=64, block_k=128, num_warps=4, num_stages=4),
           SkinnyConfig(block_n=16, block_k=512, num_warps=8, num_stages=3)]
FIELDS = ["model", "what", "N", "K", "M", "impl", "us", "gbps"]


def graph_us(fn_per_copy, copies: int, replays: int = 20) -> float:
    """Median per-call microseconds of a CUDA graph calling fn_per_copy(i) for every copy i."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn_per_copy(i)                                   # compile, autotune, allocate outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn_per_copy(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / copies)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--out", default="experiments/results/h200/skinny_linear.csv")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench needs a CUDA GPU")
    rows = []
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'model':<18} {'what':<20} {'N':>6} {'K':>6} {'M':>3} | {'cublas us':>9} | {'best triton':<34} {'us':>7} {'ratio':>6}")
    for model, what, n, k in SHAPES:
        weight_bytes = n * k * 2
        copies = max(4, -(-200 * 2**20 // weight_bytes))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            ref = torch.nn.functional.linear(x, weights[0])
            here = []

            def record(impl: str, us: float) -> None:
                here.append(dict(model=model, what=what, N=n, K=k, M=m, impl=impl, us=round(us, 2),
                                 gbps=round(weight_bytes / us / 1e3, 1)))

            record("cublas", graph_us(lambda i: torch.nn.functional.linear(x, weights[i], out=outs[i]), copies))
            for cfg in CONFIGS:
                got = skinny_linear(x, weights[0], config=cfg)
                err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
                if err > 2e-2:
                    print(f"  {cfg}: rel err {err:.2e} -- skipped", file=sys.stderr)
                    continue
                name = f"triton[n{cfg.block_n},k{cfg.block_k},w{cfg.num_warps},s{cfg.num_stages}]"
                record(name, graph_us(lambda i, c=cfg: skinny_linear(x, weights[i], config=c, out=outs[i]), copies))
            cublas = here[0]
            best = min(here[1:], key=lambda r: r["us"])
            print(f"{model:<18} {what:<20} {n:>6} {k:>6} {m:>3} | {cublas['us']:>9.2f} | {best['impl']:<34} "
                  f"{best['us']:>7.2f} {best['us'] / cublas['us']:>6.2f}", flush=True)
            rows += here
        del weights
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
