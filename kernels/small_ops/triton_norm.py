"""Triton RMSNorm and fused residual-add + RMSNorm.

Legend: T = tokens (rows), H = hidden size.
Versions: v1 (this file) one program per row, the whole row in registers (BLOCK = next_pow2(H), so
H up to ~16k), float32 statistics; matches ref.rmsnorm_ref / ref.fused_add_rmsnorm_ref.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
                    stride_x, stride_res, stride_out, stride_res_out, eps,
                    H: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res + offs, mask=mask, other=0.0).to(tl.float32)
        summed = (x + res).to(res_out_ptr.dtype.element_ty)       # the stream keeps its dtype
        tl.store(res_out_ptr + row * stride_res_out + offs, summed, mask=mask)
        x = summed.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (x * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask)


def _warps(hidden: int) -> int:
    return 4 if hidden <= 2048 else 8 if hidden <= 8192 else 16


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   out: torch.Tensor | None = None) -> torch.Tensor:      # x [T, H] -> [T, H]
    assert x.dim() == 2 and x.stride(-1) == 1
    out = torch.empty_like(x) if out is None else out
    hidden = x.shape[1]
    if x.shape[0]:
        _rmsnorm_kernel[(x.shape[0],)](x, x, weight, out, out, x.stride(0), 0, out.stride(0), 0, eps,
                                       H=hidden, BLOCK=triton.next_power_of_2(hidden), HAS_RESIDUAL=False,
                                       num_warps=_warps(hidden))
    return out


def fused_add_rmsnorm_triton(
    x: torch.Tensor,          # [T, H] sublayer output
    residual: torch.Tensor,   # [T, H] residual stream
    weight: torch.Tensor,     # [H]
    eps: float,
    inplace: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:   # (normed [T, H], new residual [T, H])
    """residual <- x + residual; x <- rmsnorm(residual) * weight. inplace=True overwrites x and residual
    (FlashInfer's convention, no allocation) and returns them; inplace=False leaves both untouched."""
    assert x.shape == residual.shape and x.dim() == 2 and x.stride(-1) == 1 and residual.stride(-1) == 1
    out = x if inplace else torch.empty_like(x)
    res_out = residual if inplace else torch.empty_like(residual)
    hidden = x.shape[1]
    if x.shape[0]:
        # each program reads its row fully before writing it, so aliasing in/out is safe
        _rmsnorm_kernel[(x.shape[0],)](x, residual, weight, out, res_out,
                                       x.stride(0), residual.stride(0), out.stride(0), res_out.stride(0), eps,
                                       H=hidden, BLOCK=triton.next_power_of_2(hidden), HAS_RESIDUAL=True,
                                       num_warps=_warps(hidden))
    return out, res_out
