"""Milliseconds per call of GPU work, for tune.py and bench.py: CUDA-graph replay on GPU (no launch
overhead, like a served decode step), perf_counter on CPU (interpreter smoke runs only).

Legend: fns = calls timed in rotation (e.g. one per routing, so a call does not find the weights the
previous call left in L2); n = calls captured in one graph.
"""
from __future__ import annotations

import statistics
import time
import warnings
from typing import Callable, Sequence

import torch

MAX_CALLS_PER_GRAPH = 256


def time_ms(fns: Sequence[Callable[[], object]], *, target_ms: float = 5.0, replays: int = 5,
            use_graph: bool = True) -> float:
    """Median over `replays` of the mean time of one call, cycling through fns."""
    if not torch.cuda.is_available():
        return _time_cpu_ms(fns)
    for fn in fns:  # compile, autotune caches, allocator warm-up: all outside the timed region
        fn()
    torch.cuda.synchronize()
    estimate = _time_events_ms(fns, len(fns), 1)
    num_calls = max(len(fns), min(MAX_CALLS_PER_GRAPH, int(target_ms / max(estimate, 1e-3))))
    if use_graph:
        try:
            return _time_graph_ms(fns, num_calls, replays)
        except Exception as exc:  # noqa: BLE001 - fall back to eager timing, but say so
            warnings.warn(f"CUDA graph timing failed ({type(exc).__name__}: {exc}); timing eagerly")
            torch.cuda.synchronize()
    return _time_events_ms(fns, num_calls, replays)


def _time_graph_ms(fns, num_calls: int, replays: int) -> float:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(num_calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / num_calls)
    del graph
    return statistics.median(samples)


def _time_events_ms(fns, num_calls: int, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(replays):
        start.record()
        for i in range(num_calls):
            fns[i % len(fns)]()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / num_calls)
    return statistics.median(samples)


def _time_cpu_ms(fns) -> float:
    for fn in fns:
        fn()
    begin = time.perf_counter()
    for fn in fns:
        fn()
    return (time.perf_counter() - begin) * 1e3 / len(fns)
