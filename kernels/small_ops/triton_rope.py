"""Triton rotary embedding, in place, with a precomputed cos/sin cache (plain RoPE or DeepSeek YaRN).

Legend: T = tokens, N = q heads, K = k heads, R = rope dim, P = cache positions.
Versions: v1 (this file) one program per token rotates all q heads and all k heads of that token;
neox (halves) and GPT-J (interleaved pairs) styles; q/k may be strided views (e.g. the rope slice of a
wider q), only the last dim must be contiguous. Matches ref.rope_ref.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(base_ptr, stride_h, num_heads, off1, off2, mask_i, cos, sin, BLOCK_HEADS: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_HEADS)
    mask = (offs_h < num_heads)[:, None] & mask_i[None, :]
    ptr1 = base_ptr + offs_h[:, None] * stride_h + off1[None, :]          # [BLOCK_HEADS, BLOCK_HALF]
    ptr2 = base_ptr + offs_h[:, None] * stride_h + off2[None, :]
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr2, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr1, (x1 * cos[None, :] - x2 * sin[None, :]).to(base_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr2, (x2 * cos[None, :] + x1 * sin[None, :]).to(base_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(pos_ptr, q_ptr, k_ptr, cache_ptr,
                 stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_cache,
                 num_q_heads, num_k_heads,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr,
                 IS_NEOX: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_i = tl.arange(0, BLOCK_HALF)
    mask_i = offs_i < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + offs_i, mask=mask_i, other=1.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs_i, mask=mask_i, other=0.0).to(tl.float32)
    if IS_NEOX:
        off1 = offs_i
        off2 = offs_i + HALF
    else:
        off1 = 2 * offs_i
        off2 = 2 * offs_i + 1
    _rotate_heads(q_ptr + tok * stride_q_t, stride_q_h, num_q_heads, off1, off2, mask_i, cos, sin, BLOCK_QH)
    _rotate_heads(k_ptr + tok * stride_k_t, stride_k_h, num_k_heads, off1, off2, mask_i, cos, sin, BLOCK_KH)


def _as_heads(x: torch.Tensor) -> torch.Tensor:   # [T, R] -> [T, 1, R] view
    return x.unsqueeze(1) if x.dim() == 2 else x


def rope_triton(
    positions: torch.Tensor,       # [T] int
    q: torch.Tensor,               # [T, N, R] or [T, R], rotated in place
    k: torch.Tensor,               # [T, K, R] or [T, R], rotated in place
    cos_sin_cache: torch.Tensor,   # [P, R] (rope_cache.py), float32 preferred
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in place (views of wider tensors are fine); returns (q, k)."""
    q3, k3 = _as_heads(q), _as_heads(k)
    rope_dim = cos_sin_cache.shape[-1]
    assert q3.shape[-1] == rope_dim == k3.shape[-1], "rotary dim must equal the last dim of q and k"
    assert q3.stride(-1) == 1 and k3.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    num_tokens = q3.shape[0]
    if num_tokens:
        half = rope_dim // 2
        _rope_kernel[(num_tokens,)](
            positions, q3, k3, cos_sin_cache,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), cos_sin_cache.stride(0),
            q3.shape[1], k3.shape[1],
            HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
            BLOCK_QH=triton.next_power_of_2(q3.shape[1]), BLOCK_KH=triton.next_power_of_2(k3.shape[1]),
            IS_NEOX=is_neox_style, num_warps=4,
        )
    return q, k
