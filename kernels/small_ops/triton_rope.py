"""Triton rotary embedding, in place, with a precomputed cos/sin cache (plain RoPE or DeepSeek YaRN).

Legend: T = tokens, N = q heads, K = k heads, R = rope dim, P = cache positions.
Versions: v1 one program per token rotates all q heads and all k heads of that token;
neox (halves) and GPT-J (interleaved pairs) styles; q/k may be strided views (e.g. the rope slice of a
wider q), only the last dim must be contiguous. Matches ref.rope_ref.
v1.1 (this file): optional q_out / k_out, so the rotated rows land in another (e.g. contiguous) buffer
in the same launch instead of a separate copy (MLA hands FlashInfer a contiguous q_rope).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_h, stride_dst_h, num_heads, off1, off2, mask_i, cos, sin,
                  BLOCK_HEADS: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_HEADS)
    mask = (offs_h < num_heads)[:, None] & mask_i[None, :]
    ptr1 = src_ptr + offs_h[:, None] * stride_h + off1[None, :]          # [BLOCK_HEADS, BLOCK_HALF]
    ptr2 = src_ptr + offs_h[:, None] * stride_h + off2[None, :]
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr2, mask=mask, other=0.0).to(tl.float32)
    out1 = dst_ptr + offs_h[:, None] * stride_dst_h + off1[None, :]
    out2 = dst_ptr + offs_h[:, None] * stride_dst_h + off2[None, :]
    tl.store(out1, (x1 * cos[None, :] - x2 * sin[None, :]).to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(out2, (x2 * cos[None, :] + x1 * sin[None, :]).to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(pos_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr, cache_ptr,
                 stride_q_t, stride_q_h, stride_k_t, stride_k_h,
                 stride_qo_t, stride_qo_h, stride_ko_t, stride_ko_h, stride_cache,
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
    _rotate_heads(q_ptr + tok * stride_q_t, qo_ptr + tok * stride_qo_t, stride_q_h, stride_qo_h, num_q_heads,
                  off1, off2, mask_i, cos, sin, BLOCK_QH)
    _rotate_heads(k_ptr + tok * stride_k_t, ko_ptr + tok * stride_ko_t, stride_k_h, stride_ko_h, num_k_heads,
                  off1, off2, mask_i, cos, sin, BLOCK_KH)


def _as_heads(x: torch.Tensor) -> torch.Tensor:   # [T, R] -> [T, 1, R] view
    return x.unsqueeze(1) if x.dim() == 2 else x


def rope_triton(
    positions: torch.Tensor,       # [T] int
    q: torch.Tensor,               # [T, N, R] or [T, R], rotated in place
    k: torch.Tensor,               # [T, K, R] or [T, R], rotated in place
    cos_sin_cache: torch.Tensor,   # [P, R] (rope_cache.py), float32 preferred
    is_neox_style: bool,
    q_out: torch.Tensor | None = None,   # same shape as q: written instead of q (q is then only read)
    k_out: torch.Tensor | None = None,   # same shape as k: written instead of k
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in place (views of wider tensors are fine), or into q_out / k_out when given;
    returns the rotated (q, k)."""
    q_out = q if q_out is None else q_out
    k_out = k if k_out is None else k_out
    q3, k3, qo3, ko3 = _as_heads(q), _as_heads(k), _as_heads(q_out), _as_heads(k_out)
    rope_dim = cos_sin_cache.shape[-1]
    assert q3.shape[-1] == rope_dim == k3.shape[-1], "rotary dim must equal the last dim of q and k"
    assert qo3.shape == q3.shape and ko3.shape == k3.shape, "q_out/k_out must have the shapes of q/k"
    assert all(t.stride(-1) == 1 for t in (q3, k3, qo3, ko3, cos_sin_cache))
    num_tokens = q3.shape[0]
    if num_tokens:
        half = rope_dim // 2
        _rope_kernel[(num_tokens,)](
            positions, q3, k3, qo3, ko3, cos_sin_cache,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
            qo3.stride(0), qo3.stride(1), ko3.stride(0), ko3.stride(1), cos_sin_cache.stride(0),
            q3.shape[1], k3.shape[1],
            HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
            BLOCK_QH=triton.next_power_of_2(q3.shape[1]), BLOCK_KH=triton.next_power_of_2(k3.shape[1]),
            IS_NEOX=is_neox_style, num_warps=4,
        )
    return q_out, k_out
