"""The profiling grids (`profile.grid=smoke|quick|full`) and the points they give once clipped to
what the runtime can hold (KV pool, context length, decode batch limit, prefill chunk). Torch-free.

Decode points are CUDA-graph capture sizes (the runtime pads a batch up to one), so the profiled
cost model can look a batch up at its padded size.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.core.graph_grids import capture_batch_sizes


@dataclass(frozen=True)
class Grid:
    decode_batches: tuple[int, ...]           # graph replay (and eager where listed below)
    decode_contexts: tuple[int, ...]          # KV tokens each decode request attends
    eager_batches: tuple[int, ...]
    eager_contexts: tuple[int, ...]
    prefill_tokens: tuple[int, ...]           # new tokens of one sequence
    prefill_prefixes: tuple[int, ...]         # its cached prefix
    multi_seqs: tuple[int, ...]               # several sequences sharing a step's new tokens
    multi_tokens: tuple[int, ...]
    multi_prefixes: tuple[int, ...]           # per sequence
    mixed_tokens: tuple[int, ...]             # a prefill chunk (no prefix) ...
    mixed_batches: tuple[int, ...]            # ... plus this many decodes ...
    mixed_context: int                        # ... of this context each
    host_decode_batches: tuple[int, ...]
    host_prefill: tuple[tuple[int, int], ...]  # (requests, new tokens each)
    op_tokens: tuple[int, ...]                # MoE layer, LM head + sampler
    repeats: int                              # timed launches per point (after one untimed)
    host_steps: int                           # timed scheduler steps per host point
    # decode over shared prefixes: `group` requests read one prefix's KV slots, then private ones
    shared_batches: tuple[int, ...] = ()
    shared_groups: tuple[int, ...] = ()       # requests per shared prefix (1: nothing shared)
    shared_prefixes: tuple[int, ...] = ()     # shared tokens per group
    shared_private: tuple[int, ...] = ()      # private tokens per request after the shared ones
    # launches after the host idled: (kind, size) steps (runtime/profile/idle_launch.py), each gap, rounds each
    idle_points: tuple[tuple[str, int], ...] = ()
    idle_gaps_s: tuple[float, ...] = ()
    idle_rounds: int = 0
    # one sequence's prefill of these new tokens launched right behind decode steps of after_decode_batch requests
    # at after_decode_context (runtime/profile/timing.time_behind_decodes), and a decode right after it
    after_decode_tokens: tuple[int, ...] = ()
    after_decode_batch: int = 0
    after_decode_context: int = 0


def _capture_sizes_to(max_bs: int) -> tuple[int, ...]:
    """Every decode capture size up to max_bs. The attention kernels split a step's KV work by the padded
    batch, so a step's time is not smooth in batch (DeepSeek-V2-Lite on an H200 at 16k contexts: batch 48
    17.9 ms, 56 17.5, 64 17.1, 72 23.3): sizes the runtime pads to are measured, not interpolated."""
    return tuple(capture_batch_sizes(max_bs))


# One sequence's prefill below 2,048 new tokens is not linear in its tokens between sparse points (DeepSeek-V2-Lite
# on an H200: served steps of 128-192 tokens ran 1.15x a chord drawn between 64 and 256, 320-384 tokens 1.08x one
# between 256 and 512, while steps at the points themselves ran 1.00-1.04x), so these are measured densely, each a
# piecewise-graph capture size (runtime/core/graph_grids.extend_token_buckets: a step pads up to one).
_SMALL_PREFILL_TOKENS = (16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1536)

GRIDS = {
    "smoke": Grid(decode_batches=(1, 4), decode_contexts=(16, 64), eager_batches=(1, 4), eager_contexts=(64,),
                  prefill_tokens=(16, 64), prefill_prefixes=(0, 32), multi_seqs=(2,), multi_tokens=(32,),
                  multi_prefixes=(0,), mixed_tokens=(16,), mixed_batches=(2,), mixed_context=32,
                  host_decode_batches=(1, 4), host_prefill=((1, 16), (2, 16)), op_tokens=(1, 16),
                  repeats=2, host_steps=2, shared_batches=(4,), shared_groups=(1, 2, 4), shared_prefixes=(32,),
                  shared_private=(8,), idle_points=(("prefill", 16), ("decode", 2)), idle_gaps_s=(0.01, 0.05),
                  idle_rounds=2, after_decode_tokens=(16, 64), after_decode_batch=2, after_decode_context=32),
    "quick": Grid(decode_batches=_capture_sizes_to(128) + (160, 192, 224, 256, 384, 512, 1024),
                  decode_contexts=(128, 1024, 2048, 4096, 16384, 65536),
                  eager_batches=(1, 8, 64, 256, 1024), eager_contexts=(128, 1024, 4096),
                  prefill_tokens=_SMALL_PREFILL_TOKENS + (2048, 3072, 4096, 8192),
                  prefill_prefixes=(0, 1024, 4096, 16384, 65536),
                  multi_seqs=(4, 16, 64), multi_tokens=(1024, 8192), multi_prefixes=(0, 2048),
                  mixed_tokens=(512, 4096), mixed_batches=(8, 64, 256), mixed_context=1024,
                  host_decode_batches=(1, 4, 16, 64, 256, 1024),
                  host_prefill=((1, 128), (1, 1024), (1, 3072), (1, 5120), (1, 8192), (8, 128), (8, 1024), (64, 128)),
                  op_tokens=(1, 8, 64, 256, 1024, 4096, 8192), repeats=5, host_steps=8,
                  shared_batches=(16, 64, 128, 256), shared_groups=(1, 4, 16, 64), shared_prefixes=(512, 2048, 4096, 8192),
                  shared_private=(128, 1024), idle_points=(("prefill", 256), ("decode", 1)),
                  idle_gaps_s=(0.1, 1.0, 4.0, 12.0), idle_rounds=3,
                  after_decode_tokens=(64, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192), after_decode_batch=64,
                  after_decode_context=1024),
    "full": Grid(decode_batches=_capture_sizes_to(1024),
                 decode_contexts=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
                 eager_batches=(1, 4, 16, 64, 128, 256, 512, 1024), eager_contexts=(128, 1024, 4096, 16384),
                 prefill_tokens=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384),
                 prefill_prefixes=(0, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
                 multi_seqs=(2, 4, 8, 16, 32, 64, 128), multi_tokens=(512, 2048, 8192, 16384),
                 multi_prefixes=(0, 512, 2048, 8192),
                 mixed_tokens=(256, 1024, 4096, 8192), mixed_batches=(1, 8, 32, 64, 128, 256, 512),
                 mixed_context=2048, host_decode_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                 host_prefill=tuple((k, n) for k in (1, 4, 16, 64) for n in (64, 256, 1024, 4096) if k * n <= 16384),
                 op_tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                 repeats=10, host_steps=16,
                 shared_batches=(8, 16, 32, 64, 128, 256, 512), shared_groups=(1, 2, 4, 8, 16, 32, 64, 128),
                 shared_prefixes=(256, 1024, 2048, 4096, 8192, 16384), shared_private=(64, 256, 1024, 4096),
                 idle_points=(("prefill", 256), ("prefill", 2048), ("decode", 1), ("decode", 64)),
                 idle_gaps_s=(0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0), idle_rounds=5,
                 after_decode_tokens=(64, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192), after_decode_batch=64,
                 after_decode_context=2048),
}


@dataclass(frozen=True)
class Limits:
    """What one step may hold on this runner: KV slots, tokens per sequence, decode batch, new tokens."""

    kv_slots: int
    max_context_tokens: int
    max_batch: int
    max_new_tokens: int


def decode_points(batches: tuple[int, ...], contexts: tuple[int, ...], limits: Limits) -> list[tuple[int, int]]:
    """(batch, context) pairs that fit: distinct KV slots for every request. Where the pool or the
    context limit cuts a batch's contexts short, the largest context that fits is added, so each
    batch's row reaches as far as the runtime can go."""
    points = []
    for batch in (b for b in batches if b <= limits.max_batch):
        room = min(limits.kv_slots // batch, limits.max_context_tokens - 1)
        fitting = [c for c in contexts if c <= room]
        if room >= 2 and len(fitting) < len(contexts) and room not in fitting:
            fitting.append(room)
        points += [(batch, c) for c in sorted(fitting) if c >= 2]
    return points


def prefill_points(tokens: tuple[int, ...], prefixes: tuple[int, ...], seqs: int, limits: Limits) -> list[tuple[int, int, int]]:
    """(sequences, new tokens in all, prefix per sequence) that fit the chunk, the context and the pool."""
    points = []
    for total in (t for t in tokens if seqs <= t <= limits.max_new_tokens):
        for prefix in prefixes:
            per_seq = total // seqs + prefix
            if per_seq < limits.max_context_tokens and seqs * per_seq <= limits.kv_slots:
                points.append((seqs, total, prefix))
    return points


def shared_decode_points(grid: Grid, limits: Limits) -> list[tuple[int, int, int, int]]:
    """(batch, group size, shared tokens, private tokens) that fit: the batch splits into whole groups,
    each group's prefix and every request's private tokens on their own KV slots."""
    points = []
    for batch in (b for b in grid.shared_batches if b <= limits.max_batch):
        for group in (g for g in grid.shared_groups if g <= batch and batch % g == 0):
            for shared in grid.shared_prefixes:
                for private in grid.shared_private:
                    slots = batch // group * shared + batch * private
                    if slots <= limits.kv_slots and shared + private < limits.max_context_tokens:
                        points.append((batch, group, shared, private))
    return points
