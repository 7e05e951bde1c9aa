"""Torch reference for the fused MoE expert computation (the correctness oracle for the Triton kernel).

Legend: T = tokens, H = hidden size, I = expert intermediate size, E = experts, K = experts per token.
Weight layout (SGLang's): w13 [E, 2I, H] holds gate (rows :I) then up (rows I:); w2 [E, H, I].
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
    """sum_k topk_weights[t, k] * w2[e] @ (silu(gate_e x_t) * up_e x_t), e = topk_ids[t, k].
    Loops over the experts that received tokens; computes in float32, returns hidden.dtype."""
    num_tokens, hidden_size = hidden.shape
    out = torch.zeros(num_tokens, hidden_size, dtype=torch.float32, device=hidden.device)
    if num_tokens == 0:
        return out.to(hidden.dtype)
    inter = w2.shape[2]
    flat_ids = topk_ids.reshape(-1)                                   # [T*K]
    flat_token = torch.arange(num_tokens, device=hidden.device).repeat_interleave(topk_ids.shape[1])
    flat_weight = topk_weights.reshape(-1).float()
    for expert in torch.unique(flat_ids).tolist():
        sel = (flat_ids == expert).nonzero(as_tuple=True)[0]          # [n]
        tokens = flat_token[sel]
        x = hidden[tokens].float()                                    # [n, H]
        gate_up = x @ w13[expert].float().t()                         # [n, 2I]
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]         # [n, I]
        y = act @ w2[expert].float().t()                              # [n, H]
        out.index_add_(0, tokens, y * flat_weight[sel, None])
    return out.to(hidden.dtype)
