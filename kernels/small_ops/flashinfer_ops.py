"""FlashInfer equivalents of the small ops, same contracts as the Triton versions (GPU only).

Legend: T = tokens, H = hidden size, I = intermediate size, N = q heads, K = k heads, R = rope dim.
flashinfer is imported inside each function: importing this module never needs it.
Differences from the Triton versions: fused_add_rmsnorm is in place only, and rope needs q and k whose
heads flatten to [T, heads * R] without a copy (contiguous rope tensors), because FlashInfer rotates a
2-D view in place; the Triton rope accepts strided slices of a wider q.
"""
from __future__ import annotations

import torch


def rmsnorm_flashinfer(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:   # [T, H]
    from flashinfer.norm import rmsnorm
    return rmsnorm(x, weight, eps)


def fused_add_rmsnorm_flashinfer(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual <- x + residual; x <- rmsnorm(residual) * weight. Returns (x, residual)."""
    from flashinfer.norm import fused_add_rmsnorm
    fused_add_rmsnorm(x, residual, weight, eps)
    return x, residual


def silu_and_mul_flashinfer(gate_up: torch.Tensor) -> torch.Tensor:   # [T, 2I] -> [T, I]
    from flashinfer.activation import silu_and_mul
    return silu_and_mul(gate_up)


def rope_flashinfer(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                    cos_sin_cache: torch.Tensor, is_neox_style: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """In place on q [T, N, R] / k [T, K, R] (or [T, R]); cos_sin_cache [P, R] float32 (rope_cache.py)."""
    from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace
    rope_dim = cos_sin_cache.shape[-1]
    q2 = q.view(q.shape[0], -1)     # raises if q cannot be flattened without a copy
    k2 = k.view(k.shape[0], -1)
    apply_rope_with_cos_sin_cache_inplace(positions, q2, k2, rope_dim, cos_sin_cache.float(),
                                          is_neox=is_neox_style)
    return q, k
