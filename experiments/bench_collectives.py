"""All-reduce / all-gather / reduce-scatter / all-to-all latency on N GPUs (torch.distributed,
NCCL), launched eagerly and replayed from a CUDA graph, written as the table the simulator's
collective cost model reads (sim/costmodel/collective_table.py).

  python experiments/bench_collectives.py --nproc 2                 # -> experiments/results/h200/collectives.csv
  python experiments/bench_collectives.py --nproc 4                 # -> experiments/results/h200x4/collectives.csv
  python experiments/bench_collectives.py --nproc 2 --hardware h100 --out /tmp/c.csv
  python experiments/bench_collectives.py --nproc 2 --backend gloo  # CPU smoke run (eager only)

Sizes follow nccl-tests: all_reduce / reduce_scatter: the input; all_gather: the gathered
output; all_to_all: what one rank sends. Eager: median over isolated calls, each timed by CUDA
events from before its launch (host launch included). Graph: `--graph-calls` calls captured in
one CUDA graph, replay time / calls (no launch). Each row is the slowest rank's time.
Bus bandwidth (busbw_gb_s) as nccl-tests computes it, for reading; the simulator uses time_s.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
COLUMNS = ("collective", "num_ranks", "size_bytes", "graph", "time_s", "busbw_gb_s")


def bus_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def make_call(op: str, size_bytes: int, n: int, device: torch.device) -> Callable[[], None]:
    """One call of `op` on preallocated bf16 buffers (nccl-tests size convention)."""
    numel = max(n, size_bytes // 2 // n * n)          # divisible by n, 2 bytes per element
    full = torch.ones(numel, dtype=torch.bfloat16, device=device)
    part = torch.ones(numel // n, dtype=torch.bfloat16, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":       # *_single: newer torch's names for *_into_tensor / *_tensor
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, part)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, full)
    out = torch.empty_like(full)
    return lambda: dist.all_to_all_single(out, full)


def time_eager_s(call: Callable[[], None], iters: int, device: torch.device) -> float:
    for _ in range(3):
        call()
    if device.type != "cuda":
        dist.barrier()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()                                  # ranks start each call together
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def time_graph_s(call: Callable[[], None], graph_calls: int, replays: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                       # warm-up outside capture (NCCL communicator set-up)
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(graph_calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / graph_calls)
    return statistics.median(times)


def slowest_rank(value_s: float, device: torch.device) -> float:
    t = torch.tensor([value_s], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def worker(rank: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    cuda = args.backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group(args.backend, rank=rank, world_size=args.nproc)
    rows = []
    sizes = [2 ** p for p in range(args.min_log2, args.max_log2 + 1, args.step_log2)]
    for op in args.collectives:
        for size in sizes:
            call = make_call(op, size, args.nproc, device)
            modes = [False, True] if cuda and not args.eager_only else [False]
            for graph in modes:
                t = time_graph_s(call, args.graph_calls, args.iters) if graph else time_eager_s(call, args.iters, device)
                t = slowest_rank(t, device)
                busbw = bus_factor(op, args.nproc) * size / t / 1e9
                rows.append((op, args.nproc, size, int(graph), f"{t:.9g}", f"{busbw:.4g}"))
                if rank == 0:
                    print(f"{op:15s} n={args.nproc} {size:>11d} B  {'graph' if graph else 'eager'}  "
                          f"{t * 1e6:9.2f} us  busbw {busbw:7.2f} GB/s", flush=True)
    if rank == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            writer.writerows(rows)
        print(f"wrote {args.out}")
    dist.barrier()
    dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="GPUs (one process each)")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--hardware", default="h200", help="names the output folder experiments/results/<hardware>/ "
                   "(2 GPUs), experiments/results/<hardware>x<nproc>/ (any other number)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--collectives", nargs="+", choices=COLLECTIVES, default=list(COLLECTIVES))
    p.add_argument("--min-log2", type=int, default=10, help="smallest size 2**this bytes (1 KiB)")
    p.add_argument("--max-log2", type=int, default=28, help="largest size 2**this bytes (256 MiB)")
    p.add_argument("--step-log2", type=int, default=1)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--graph-calls", type=int, default=20, help="collectives captured in one CUDA graph")
    p.add_argument("--eager-only", action="store_true")
    p.add_argument("--port", type=int, default=29531)
    args = p.parse_args(argv)
    if args.out is None:     # the simulator reads both (sim/costmodel/collective_table.py)
        folder = args.hardware if args.nproc == 2 else f"{args.hardware}x{args.nproc}"
        args.out = ROOT / "experiments" / "results" / folder / "collectives.csv"
    if args.backend == "nccl" and torch.cuda.device_count() < args.nproc:
        p.error(f"--nproc {args.nproc} needs that many GPUs; {torch.cuda.device_count()} visible")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    mp.spawn(worker, args=(args,), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
