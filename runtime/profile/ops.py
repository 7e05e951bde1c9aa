"""Operator timings that the step tables cannot separate: one MoE layer (the router's own routing vs
perfectly balanced routing) and the LM head + sampler, per token count. Imports torch.

Legend: T = tokens, H = hidden size, K = experts per token, E = experts, V = vocab.
"""
from __future__ import annotations

import torch

from runtime.models.moe import MoE
from runtime.profile.plans import PROFILE_SAMPLING
from runtime.profile.timing import time_op


def balanced_ids(num_tokens: int, top_k: int, num_experts: int, device: torch.device) -> torch.Tensor:
    """[T, K] expert ids spreading every token's K choices evenly over the experts (distinct per row)."""
    base = torch.arange(num_tokens, device=device)[:, None] * top_k            # [T, 1]
    return (base + torch.arange(top_k, device=device)[None, :]) % num_experts  # [T, K]


@torch.no_grad()
def op_rows(runner, num_tokens: int, repeats: int, max_logit_rows: int) -> list[dict]:
    """Rows (op, num_tokens, device_s) for one token count; the LM head + sampler only up to
    `max_logit_rows` rows (a step samples one row per sequence: at most max_running_requests)."""
    model, device = runner.model, runner.device
    dtype = next(model.parameters()).dtype
    hidden = model.config.hidden_size
    x = torch.randn(num_tokens, hidden, dtype=dtype, device=device) * 0.5      # [T, H]
    rows = []
    moe = next((m for m in model.modules() if isinstance(m, MoE)), None)
    if moe is not None:
        ops = getattr(model, "small_ops", None)
        weights, ids = moe.gate(x)                                              # [T, K], [T, K]
        w13, w2 = moe.experts.w13, moe.experts.w2
        balanced = balanced_ids(num_tokens, ids.shape[1], moe.experts.num_local, device)   # routed experts only
        uniform = torch.full_like(weights, 1.0 / ids.shape[1])
        rows += [
            _row("moe_layer", num_tokens, time_op(lambda: moe(x, ops), device, repeats)),
            _row("moe_experts_routed", num_tokens,
                 time_op(lambda: moe.experts_fn(x, w13, w2, weights, ids), device, repeats)),
            _row("moe_experts_balanced", num_tokens,
                 time_op(lambda: moe.experts_fn(x, w13, w2, uniform, balanced), device, repeats)),
        ]
    if num_tokens > max_logit_rows:
        return rows
    params = [PROFILE_SAMPLING] * num_tokens
    positions = [0] * num_tokens

    def head_and_sample() -> torch.Tensor:
        logits = model.lm_head(x).float()                                       # [T, V]
        return runner.sampler.sample(logits, params, positions)

    rows.append(_row("lm_head_sampler", num_tokens, time_op(head_and_sample, device, repeats)))
    return rows


def _row(op: str, num_tokens: int, seconds: float) -> dict:
    return {"op": op, "num_tokens": num_tokens, "device_s": seconds}
