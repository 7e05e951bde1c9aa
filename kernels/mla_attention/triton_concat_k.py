"""Triton: the per-head key of MLA's MHA form, k = [k_nope | k_pe] -- k_nope a strided per-head slice of
kv_b_proj's output, k_pe one rope key per token shared by every head.

Legend: K = tokens, N = heads, Dn = qk_nope dim, R = rope dim. Versions: v1 (this file) one program per
token and block of heads, one load and two stores per head row. torch.cat of the broadcast k_pe measured
~0.75 TB/s on the H200 (3 ms of a 8,192-token DeepSeek-V2-Lite prefill); this is a plain streaming copy.
Matches torch.cat([k_nope, k_pe[:, None].expand(-1, N, -1)], -1) exactly (a copy).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _concat_k_kernel(nope_ptr, pe_ptr, out_ptr, num_heads,
                     stride_nope_t, stride_nope_h, stride_pe_t, stride_out_t, stride_out_h,
                     DN: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)                 # [BLOCK_H]
    in_range = (heads < num_heads)[:, None]
    dn, r = tl.arange(0, DN), tl.arange(0, R)
    nope = tl.load(nope_ptr + tok * stride_nope_t + heads[:, None] * stride_nope_h + dn[None, :], mask=in_range)
    row = out_ptr + tok * stride_out_t + heads[:, None] * stride_out_h           # [BLOCK_H, 1]
    tl.store(row + dn[None, :], nope, mask=in_range)
    pe = tl.load(pe_ptr + tok * stride_pe_t + r)                                  # [R]
    tl.store(row + DN + r[None, :], tl.broadcast_to(pe[None, :], (BLOCK_H, R)), mask=in_range)


def concat_mla_k_triton(k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """k_nope [K, N, Dn] (any token/head strides, last dim contiguous), k_pe [K, R] -> k [K, N, Dn + R].
    Dn and R must be powers of two (DeepSeek: 128, 64)."""
    num_tokens, num_heads, dn = k_nope.shape
    rope = k_pe.shape[-1]
    assert k_nope.stride(-1) == 1 and k_pe.stride(-1) == 1, "last dims must be contiguous"
    assert dn == triton.next_power_of_2(dn) and rope == triton.next_power_of_2(rope), "Dn, R: powers of two"
    out = k_nope.new_empty(num_tokens, num_heads, dn + rope)
    if num_tokens:
        block_h = min(16, triton.next_power_of_2(num_heads))
        grid = (num_tokens, triton.cdiv(num_heads, block_h))
        _concat_k_kernel[grid](k_nope, k_pe, out, num_heads, k_nope.stride(0), k_nope.stride(1),
                               k_pe.stride(0), out.stride(0), out.stride(1),
                               DN=dn, R=rope, BLOCK_H=block_h, num_warps=4)
    return out
