"""Median CUDA-event time of a kernel call with a cold L2 (shared by the kernel bench scripts), and the host
time of work enqueued behind a sleep kernel (does a call wait for the device?).

Imports torch; CUDA only.
"""
from __future__ import annotations

import statistics
import time
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


def sleep_cycles(seconds: float) -> int:
    """Clock cycles `torch.cuda._sleep` spins for about `seconds` (measured once)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * seconds / (start.elapsed_time(end) / 1e3))


def behind_sleep_ms(fn: Callable[[], object], cycles: int) -> float:
    """Host milliseconds of fn() enqueued behind a sleep kernel of `cycles` (the device is busy throughout
    unless fn waits for it); the device is idle again on return."""
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    fn()
    host_ms = 1e3 * (time.perf_counter() - t0)
    torch.cuda.synchronize()
    return host_ms
