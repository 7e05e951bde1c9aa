"""Torch reference for the fused MoE expert computation (the correctness oracle for the Triton kernel).

Legend: T = tokens, H = hidden size, I = expert intermediate size, E = experts, K = experts per token.
Weight layout (SGLang's): w13 [E, 2I, H] holds gate (rows :I) then up (rows I:); w2 [E, H, I].
A negative topk id (-1, align.SKIP_EXPERT: an expert another EP rank holds) marks a pair that adds
nothing, as in the Triton kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_moe_ref(
    hidden: torch.Tensor,        # [T, H]
    w13: torch.Tensor,           # [E, 2I, H]
    w2: torch.Tensor,            # [E, H, I]
    topk_weights: torch.Tensor,  # [T, K] float, already normalised/scaled as the model wants
    topk_ids: torch.Tensor,      # [T, K] int
) -> torch.Tensor:               # [T, H]
    """sum_k topk_weights[t, k] * w2[e] @ (silu(gate_e x_t) * up_e x_t), e = topk_ids[t, k], over the
    pairs with e >= 0. Loops over the experts that received tokens; computes in float32, returns
    hidden.dtype."""
    num_tokens, hidden_size = hidden.shape
    out = torch.zeros(num_tokens, hidden_size, dtype=torch.float32, device=hidden.device)
    if num_tokens == 0:
        return out.to(hidden.dtype)
    inter = w2.shape[2]
    flat_ids = topk_ids.reshape(-1)                                   # [T*K]
    flat_token = torch.arange(num_tokens, device=hidden.device).repeat_interleave(topk_ids.shape[1])
    flat_weight = topk_weights.reshape(-1).float()
    for expert in torch.unique(flat_ids).tolist():
        if expert < 0:
            continue                                                  # skipped pairs (another EP rank's)
        sel = (flat_ids == expert).nonzero(as_tuple=True)[0]          # [n]
        tokens = flat_token[sel]
        x = hidden[tokens].float()                                    # [n, H]
        gate_up = x @ w13[expert].float().t()                         # [n, 2I]
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]         # [n, I]
        y = act @ w2[expert].float().t()                              # [n, H]
        out.index_add_(0, tokens, y * flat_weight[sel, None])
    return out.to(hidden.dtype)


# ---- block-scaled fp8 (w8a8) references: appended helpers, the functions above are unchanged ----
# Legend as above, plus G = quant group / block length (128), R = rows.

def dequantize_block_fp8_ref(
    q: torch.Tensor,      # [E, N, D] float8_e4m3fn
    scale: torch.Tensor,  # [E, ceil(N/G), ceil(D/G)] float32
    block: int = 128,
) -> torch.Tensor:        # [E, N, D] float32
    """Each GxG block of q times its scale."""
    rows, cols = q.shape[1], q.shape[2]
    full = scale.repeat_interleave(block, dim=1).repeat_interleave(block, dim=2)[:, :rows, :cols]
    return q.float() * full


def per_token_group_quant_fp8_ref(
    x: torch.Tensor,  # [R, D]
    group: int = 128,
) -> tuple[torch.Tensor, torch.Tensor]:  # q [R, D] float8_e4m3fn, scale [R, ceil(D/G)] float32
    """scale = max(|x| over each 1xG group, 1e-10) / 448; q = clamp(x / scale) (what the kernel does)."""
    rows, cols = x.shape
    padded = torch.zeros(rows, -(-cols // group) * group, dtype=torch.float32, device=x.device)
    padded[:, :cols] = x.float()
    groups = padded.view(rows, -1, group)                                    # [R, D/G, G]
    scale = groups.abs().amax(dim=2).clamp_min(1e-10) / 448.0                # [R, D/G]
    q = (groups / scale[:, :, None]).clamp(-448.0, 448.0).view(rows, -1)[:, :cols]
    return q.to(torch.float8_e4m3fn), scale


def _fake_quant(x: torch.Tensor, group: int = 128) -> torch.Tensor:  # [R, D] float32, rounded through fp8
    q, scale = per_token_group_quant_fp8_ref(x, group)
    return q.float() * scale.repeat_interleave(group, dim=1)[:, :x.shape[1]]


def fused_moe_fp8_ref(
    hidden: torch.Tensor,        # [T, H] bf16/fp16
    w13: torch.Tensor,           # [E, 2I, H] float8_e4m3fn
    w2: torch.Tensor,            # [E, H, I] float8_e4m3fn
    w13_scale: torch.Tensor,     # [E, 2I/128, H/128] float32
    w2_scale: torch.Tensor,      # [E, H/128, I/128] float32
    topk_weights: torch.Tensor,  # [T, K]
    topk_ids: torch.Tensor,      # [T, K]
    *,
    quantize_activations: bool = True,
) -> torch.Tensor:               # [T, H] hidden.dtype
    """Dequantise the used experts' weights, then fused_moe_ref's math in float32. With
    quantize_activations the kernel's activation rounding is emulated too: hidden and the SiLU output
    (after rounding to hidden.dtype) pass through per-token-group fp8 quantisation."""
    num_tokens, hidden_size = hidden.shape
    out = torch.zeros(num_tokens, hidden_size, dtype=torch.float32, device=hidden.device)
    if num_tokens == 0:
        return out.to(hidden.dtype)
    inter = w2.shape[2]
    x_all = _fake_quant(hidden) if quantize_activations else hidden.float()
    flat_ids = topk_ids.reshape(-1)
    flat_token = torch.arange(num_tokens, device=hidden.device).repeat_interleave(topk_ids.shape[1])
    flat_weight = topk_weights.reshape(-1).float()
    for expert in torch.unique(flat_ids).tolist():
        if expert < 0:
            continue
        sel = (flat_ids == expert).nonzero(as_tuple=True)[0]
        tokens = flat_token[sel]
        w13_e = dequantize_block_fp8_ref(w13[expert:expert + 1], w13_scale[expert:expert + 1])[0]   # [2I, H]
        gate_up = x_all[tokens] @ w13_e.t()
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        if quantize_activations:
            act = _fake_quant(act.to(hidden.dtype))
        y = act @ dequantize_block_fp8_ref(w2[expert:expert + 1], w2_scale[expert:expert + 1])[0].t()
        out.index_add_(0, tokens, y * flat_weight[sel, None])
    return out.to(hidden.dtype)
