"""Which decode CUDA graph a DP-attention step replays (SGLang --enable-dp-attention): one rule for the
runtime, whose every GPU replays it (runtime.distributed.lockstep), and for the simulator, which prices
it (sim.costmodel.dp_attention). Torch-free and clock-free.

A captured graph fixes every shape inside it, the token exchange's padded rows included, so all ranks
of a step replay the graph of one size: the smallest captured batch size P >= the largest decode batch
of any rank; a rank with fewer requests pads to P (padding rows at a dummy KV slot), an idle rank runs
P padding rows. A step with a prefill (extend) on any rank runs eagerly on every rank.

Legend: D = attention ranks, n_r = decode requests of rank r this step, P = the replayed batch size.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from runtime.core.graph_grids import padded_size


class RankStepShape(Protocol):
    """What the rule reads of one rank's step (sim.costmodel.base.StepShape; an idle rank: all empty)."""

    extend_new_tokens: tuple[int, ...]
    num_decode_reqs: int
    decode_context_tokens: int


def dp_attention_graph_bs(shapes: Sequence[RankStepShape], batch_sizes: Sequence[int] | None,
                          max_kv_tokens: int | None = None) -> int | None:
    """P, the captured batch size every rank replays this step; None: every rank runs it eagerly.

    A step replays when no rank extends, at least one decodes, and max_r n_r fits a captured size.
    batch_sizes: the captured sizes, ascending ([]: no graphs; None: any batch replays at its own size,
    as a cost model without a graph limit prices it). max_kv_tokens (the runtime's static KV index
    buffer; None: unbounded): every rank's KV tokens plus one per padding row must fit it."""
    if any(s.extend_new_tokens for s in shapes):
        return None
    most = max((s.num_decode_reqs for s in shapes), default=0)
    if most == 0:
        return None
    bs = most if batch_sizes is None else padded_size(most, list(batch_sizes))
    if bs is None:
        return None
    if max_kv_tokens is not None and any(
            s.decode_context_tokens + bs - s.num_decode_reqs > max_kv_tokens for s in shapes):
        return None
    return bs
