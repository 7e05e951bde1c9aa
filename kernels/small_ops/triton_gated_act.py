"""Triton SiLU-and-mul scaled by a per-token sigmoid gate (Qwen2-MoE's gated shared expert).

Legend: T = tokens, I = intermediate size.
Versions: v1 (this file) grid (T, I / BLOCK); act[t] = silu(gate[t]) * up[t] * sigmoid(gate_logit[t]) in float32,
so the shared expert's down projection (linear, no bias) of act equals sigmoid(gate_logit) * down(silu * up)
and can add straight into the routed output. Matches ref.silu_and_mul_gated_ref.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_gated_kernel(x_ptr, logit_ptr, out_ptr, stride_x, stride_logit, stride_out, inter,
                               BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    scale = tl.sigmoid(tl.load(logit_ptr + row * stride_logit).to(tl.float32))
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    act = gate * tl.sigmoid(gate) * up * scale
    tl.store(out_ptr + row * stride_out + offs, act.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_gated_triton(gate_up: torch.Tensor, gate_logit: torch.Tensor,
                              out: torch.Tensor | None = None) -> torch.Tensor:
    """gate_up [T, 2I] (gate first, then up), gate_logit [T, 1] or [T] (any row stride) -> [T, I]."""
    assert gate_up.dim() == 2 and gate_up.stride(-1) == 1 and gate_up.shape[1] % 2 == 0
    num_tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    assert gate_logit.shape[0] == num_tokens and gate_logit.numel() == num_tokens
    out = torch.empty((num_tokens, inter), dtype=gate_up.dtype, device=gate_up.device) if out is None else out
    block = min(1024, triton.next_power_of_2(inter))
    if num_tokens:
        _silu_and_mul_gated_kernel[(num_tokens, triton.cdiv(inter, block))](
            gate_up, gate_logit, out, gate_up.stride(0), gate_logit.stride(0), out.stride(0), inter,
            BLOCK=block, num_warps=4)
    return out
