"""SiLU-and-mul for the unfused path (v1 of gemm.py): act[s, j] = silu(gate_up[s, j]) * gate_up[s, I + j].

Legend: S = routed slots (M*K), I = intermediate size, BLOCK = columns per program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_COLS = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, inter, stride_xm, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_xm + inter + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty),
             mask=mask)


def silu_and_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gate_up [S, 2I] (unit column stride) -> [S, I]."""
    num_rows, two_inter = gate_up.shape
    inter = two_inter // 2
    assert gate_up.stride(1) == 1
    if out is None:
        out = torch.empty(num_rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    assert out.stride(1) == 1
    if num_rows:
        block = min(BLOCK_COLS, triton.next_power_of_2(inter))
        grid = (num_rows, triton.cdiv(inter, block))
        _silu_and_mul_kernel[grid](gate_up, out, inter, gate_up.stride(0), out.stride(0), BLOCK=block,
                                   num_warps=4)
    return out
