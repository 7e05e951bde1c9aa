"""Median CUDA-event time of a kernel call with a cold L2 (shared by the kernel bench scripts).

Imports torch; CUDA only.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch


def median_event_ms(fn: Callable[[], object], iters: int, flush: torch.Tensor) -> float:
    """Median over `iters` calls of `fn`, each timed by CUDA events right after zeroing `flush`
    (a buffer larger than L2). One untimed call first compiles and warms up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
