"""Torch references for the fused small ops (the correctness oracles for the Triton versions).

Legend: T = tokens, H = hidden size, I = MLP intermediate size, N = q heads, K = k heads,
R = rope dim, P = positions in the cos/sin cache, S = KV slots, W = row width.
All math in float32; results are returned in the input dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:   # x [T, H] -> [T, H]
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def fused_add_rmsnorm_ref(
    x: torch.Tensor,          # [T, H] sublayer output
    residual: torch.Tensor,   # [T, H] residual stream
    weight: torch.Tensor,     # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:   # (normed [T, H], new residual [T, H])
    """new_residual = x + residual (rounded to the stream dtype); normed = rmsnorm(new_residual) * weight.
    Same as the unfused model code (`h = x + r; norm(h)`), and FlashInfer's/vLLM's in-place pair."""
    new_residual = (x.float() + residual.float()).to(residual.dtype)
    return rmsnorm_ref(new_residual, weight, eps).to(x.dtype), new_residual


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:   # [T, 2I] -> [T, I]
    """silu(gate) * up with gate = gate_up[:, :I], up = gate_up[:, I:] (SGLang/vLLM layout)."""
    inter = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :inter].float(), gate_up[..., inter:].float()
    return (F.silu(gate) * up).to(gate_up.dtype)


def silu_and_mul_gated_ref(gate_up: torch.Tensor, gate_logit: torch.Tensor) -> torch.Tensor:   # -> [T, I]
    """silu(gate) * up * sigmoid(gate_logit[t]) per token t (gate_logit [T, 1]): Qwen2-MoE's shared expert
    activation with its sigmoid gate folded in before the (linear, bias-free) down projection."""
    inter = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :inter].float(), gate_up[..., inter:].float()
    return (F.silu(gate) * up * torch.sigmoid(gate_logit.float().reshape(-1, 1))).to(gate_up.dtype)


def rope_ref(
    positions: torch.Tensor,       # [T] int
    x: torch.Tensor,               # [T, N, R] (or [T, R] for one head)
    cos_sin_cache: torch.Tensor,   # [P, R]: cos in [:, :R/2], sin in [:, R/2:] (rope_cache.py)
    is_neox_style: bool,
) -> torch.Tensor:                 # same shape as x, out of place
    """Rotate pairs (x1, x2) by angle theta_i: (x1 cos - x2 sin, x2 cos + x1 sin).
    neox style: pair i = (x[i], x[i + R/2]). GPT-J / interleaved style (is_neox_style=False, DeepSeek in SGLang
    and vLLM): pair i = (x[2i], x[2i + 1]), written back in place, so the output stays interleaved.
    HF DeepSeek-V2 (complex multiply on interleaved pairs) equals the interleaved style exactly; HF
    DeepSeek-V3 (rope_interleave=True) returns the same values de-interleaved (evens then odds). Since q and
    k get the same permutation, q.k and hence attention are identical under all three."""
    half = cos_sin_cache.shape[-1] // 2
    cos_sin = cos_sin_cache[positions.long()].float()              # [T, R]
    cos, sin = cos_sin[:, :half], cos_sin[:, half:]                 # [T, R/2]
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    xf = x.float()
    if is_neox_style:
        x1, x2 = xf[..., :half], xf[..., half:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return out.to(x.dtype)


def store_rows_ref(dst: torch.Tensor, slots: torch.Tensor, src: torch.Tensor) -> None:
    """dst[slots[t]] = src[t]  (dst [S, ...], src [T, ...]); in place."""
    dst[slots.long()] = src.to(dst.dtype)


def store_mla_kv_ref(kv_cache: torch.Tensor, slots: torch.Tensor, c_kv: torch.Tensor,
                     k_rope: torch.Tensor) -> None:
    """Latent pool [S, C + R]: kv_cache[slots] = [c_kv | k_rope]  (c_kv [T, C], k_rope [T, R]); in place."""
    store_rows_ref(kv_cache, slots, torch.cat([c_kv, k_rope.to(c_kv.dtype)], dim=-1))
