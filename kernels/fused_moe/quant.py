"""Block-scaled fp8 (w8a8) quantisation for the fused MoE: per-token-group activation quant (Triton)
and 128x128 block weight quant (torch, done once at load time).

Legend: R = rows (tokens or routed slots), D = row length, G = group length (128), E = experts,
N = weight rows. Scales are float32 and multiply the fp8 values back: x ~= q * scale.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.fused_moe.config import FP8_GROUP

FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)
FP8_MAX = 448.0          # largest finite float8_e4m3fn
SCALE_FLOOR = 1e-10      # an all-zero group gets a tiny scale instead of a division by zero


@triton.jit
def _per_token_group_quant_kernel(
    x_ptr, q_ptr, s_ptr, size_d, num_groups, stride_xm, stride_qm, stride_sm,
    GROUP: tl.constexpr, QMAX: tl.constexpr, FLOOR: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // num_groups).to(tl.int64)
    group = pid % num_groups
    cols = group * GROUP + tl.arange(0, GROUP)
    mask = cols < size_d
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), FLOOR) / QMAX
    q = tl.minimum(tl.maximum(x / scale, -QMAX), QMAX)
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + group, scale)


def per_token_group_quant_fp8(x: torch.Tensor, group: int = FP8_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, D] (unit column stride) -> (q [R, D] float8_e4m3fn, scale [R, ceil(D/G)] float32)."""
    num_rows, size_d = x.shape
    assert x.stride(1) == 1
    num_groups = triton.cdiv(size_d, group)
    q = torch.empty(num_rows, size_d, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(num_rows, num_groups, dtype=torch.float32, device=x.device)
    if num_rows:
        _per_token_group_quant_kernel[(num_rows * num_groups,)](
            x, q, scale, size_d, num_groups, x.stride(0), q.stride(0), scale.stride(0),
            GROUP=group, QMAX=FP8_MAX, FLOOR=SCALE_FLOOR, num_warps=1)
    return q, scale


def quantize_weight_block_fp8(w: torch.Tensor, block: int = FP8_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, N, D] -> (q [E, N, D] float8_e4m3fn, scale [E, ceil(N/B), ceil(D/B)] float32), one scale per
    BxB block (DeepSeek-V3's checkpoint format). Edge blocks are zero-padded for the max."""
    num_experts, rows, cols = w.shape
    rows_pad, cols_pad = triton.cdiv(rows, block) * block, triton.cdiv(cols, block) * block
    padded = torch.zeros(num_experts, rows_pad, cols_pad, dtype=torch.float32, device=w.device)
    padded[:, :rows, :cols] = w.float()
    blocks = padded.view(num_experts, rows_pad // block, block, cols_pad // block, block)
    scale = blocks.abs().amax(dim=(2, 4)).clamp_min(SCALE_FLOOR) / FP8_MAX      # [E, N/B, D/B]
    q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.view(num_experts, rows_pad, cols_pad)[:, :rows, :cols].to(FP8_DTYPE).contiguous()
    return q, scale
