"""Where a step's launch spends its host time: wraps a ModelRunner's launch parts (prepare, the hand-off to the
tensor-parallel peers, to_device, the attention plan, graph replays, attention cores, logits, sampling, the
future ring) with host timers. Used by experiments/tp_launch_probe.py and, with TWINSERVE_LAUNCH_PARTS=1, by the
fidelity runs' launch timer. Imports torch only in `install`; never imported by the runtime's serving path.
"""
from __future__ import annotations

import collections
import time

PARTS = ("send", "recv", "prepare", "to_device", "plan", "graph", "core", "logits", "sample", "ring",
         "core_store", "core_expand", "core_attend")    # inside an MHA-form attention core: KV store, kv_b_proj, attention


class PartTimers:
    """Host seconds spent in each wrapped call since the last `reset` (a call inside another counts in both)."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.alloc_retries = None        # () -> the caching allocator's retries so far (set by `install` on CUDA)
        self._retries_at_reset = 0

    def reset(self) -> None:
        self.acc.clear()
        self.calls.clear()
        if self.alloc_retries:
            self._retries_at_reset = self.alloc_retries()

    def wrap(self, fn, part: str):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.acc[part] += time.perf_counter() - start
                self.calls[part] += 1
        return timed

    def patch(self, owner, name: str, part: str) -> None:
        setattr(owner, name, self.wrap(getattr(owner, name), part))

    def ms(self) -> dict[str, float]:
        """{part}_ms for every part, and how many graph replays and attention cores ran."""
        out = {f"{p}_ms": round(1e3 * self.acc.get(p, 0.0), 4) for p in PARTS}
        out.update({f"{p}_calls": self.calls.get(p, 0) for p in ("graph", "core")})
        if self.alloc_retries:   # cudaMalloc retries after freeing cached blocks: each synchronises the device
            out["alloc_retries"] = self.alloc_retries() - self._retries_at_reset
        return out


def install(runner, timers: PartTimers, leader: bool) -> None:
    """Wrap the runner's launch parts (its own attributes) and the classes every replay goes through (graph
    replays on CUDA, piecewise attention cores). `leader`: time its step_sender (the hand-off); otherwise the
    wait in StepChannel.recv."""
    import torch

    from runtime.distributed.step_channel import StepChannel
    from runtime.engine import piecewise_graph_runner as pw

    timers.patch(runner, "prepare", "prepare")
    timers.patch(runner.batches, "to_device", "to_device")
    timers.patch(runner.sampler, "sample", "sample")
    timers.patch(runner.future, "store", "ring")
    if runner.piecewise is not None:
        timers.patch(runner.piecewise, "_prepare", "plan")
        timers.patch(runner.piecewise, "_logits", "logits")
    timers.patch(pw._Core, "run", "core")
    if runner.device.type == "cuda":
        timers.patch(torch.cuda.CUDAGraph, "replay", "graph")
        timers.alloc_retries = lambda: torch.cuda.memory_stats(runner.device).get("num_alloc_retries", 0)
        timers.reset()
    backend = runner.piecewise.backend if runner.piecewise is not None else None
    if backend is not None and hasattr(backend, "mla_mha"):
        timers.patch(backend, "mla_store", "core_store")
        timers.patch(backend, "mla_mha", "core_attend")
    for module in runner.model.modules():
        if hasattr(module, "kv_b_proj"):
            timers.patch(module.kv_b_proj, "forward", "core_expand")
    if leader and runner.step_sender is not None:
        runner.step_sender = timers.wrap(runner.step_sender, "send")
    if not leader:
        timers.patch(StepChannel, "recv", "recv")
