"""Rotary position embedding: inverse frequencies for default/linear/llama3/yarn scaling, and its application.

Legend: T = tokens, N = heads, R = rotary dim. cos/sin are computed per step from positions (no cache).
"""
from __future__ import annotations

import math

import torch

from runtime.models.config import RopeConfig


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN attention-temperature correction: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_softmax_mscale(rope: RopeConfig, max_position_embeddings: int) -> float:
    """Factor DeepSeek multiplies its softmax scale by: mscale(factor, mscale_all_dim)**2, if configured."""
    if rope.rope_type == "default" or not rope.mscale_all_dim:
        return 1.0
    mscale = yarn_get_mscale(_factor(rope, max_position_embeddings), rope.mscale_all_dim)
    return mscale * mscale


def _factor(rope: RopeConfig, max_position_embeddings: int | None) -> float:
    if rope.factor is not None:
        return float(rope.factor)
    if max_position_embeddings is None or not rope.original_max_position_embeddings:
        raise ValueError(f"rope_type={rope.rope_type} needs a factor")
    return max_position_embeddings / rope.original_max_position_embeddings


def inv_freq_and_scaling(rope: RopeConfig, dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [R/2] (float32, CPU) and the factor applied to cos/sin."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "default":
        return inv_freq, 1.0
    factor = _factor(rope, max_position_embeddings)
    if rope.rope_type == "linear":
        return inv_freq / factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope, factor), 1.0
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(rope, dim, factor), _yarn_attention_factor(rope, factor)
    raise NotImplementedError(f"rope_type {rope.rope_type!r}")


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: RopeConfig, factor: float) -> torch.Tensor:
    """Long wavelengths are divided by `factor`, short ones kept, the band between interpolated smoothly."""
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_attention_factor(rope: RopeConfig, factor: float) -> float:
    if rope.attention_factor is not None:
        return float(rope.attention_factor)
    if rope.mscale and rope.mscale_all_dim:
        return yarn_get_mscale(factor, rope.mscale) / yarn_get_mscale(factor, rope.mscale_all_dim)
    return yarn_get_mscale(factor)


def _yarn_inv_freq(rope: RopeConfig, dim: int, factor: float) -> torch.Tensor:
    """Blend of extrapolated (high-frequency) and interpolated (low-frequency) inverse frequencies."""
    base, orig_len = rope.theta, rope.original_max_position_embeddings

    def dim_for_rotations(num_rotations: float) -> float:
        # the rotary dim whose wavelength completes `num_rotations` turns over the original context
        return dim * math.log(orig_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_for_rotations(rope.beta_fast), dim_for_rotations(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep_extrapolated = 1 - ramp
    return interpolation * (1 - keep_extrapolated) + extrapolation * keep_extrapolated


class RotaryEmbedding(torch.nn.Module):
    """Holds inv_freq [R/2]; the model calls `cos_sin(positions)` once per step and every layer
    rotates its q/k with `apply_rotary`."""

    def __init__(self, rope: RopeConfig, dim: int, max_position_embeddings: int, device: torch.device | str):
        super().__init__()
        inv_freq, self.scaling = inv_freq_and_scaling(rope, dim, max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> cos, sin [T, R/2] float32, both times the yarn attention factor."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        return freqs.cos() * self.scaling, freqs.sin() * self.scaling

    def cos_sin_cache(self, max_positions: int) -> torch.Tensor:
        """[P, R] float32 for the fused rotary kernels: cos in [:, :R/2], sin in [:, R/2:] (the layout of
        kernels/small_ops/rope_cache.py), the same values `cos_sin` gives for positions 0..P-1."""
        cos, sin = self.cos_sin(torch.arange(max_positions, device=self.inv_freq.device))
        return torch.cat([cos, sin], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, N, R] or [T, R] -> same shape, rotated (float32 math). interleaved: pairs (x0, x1),
    (x2, x3)... rotate together (DeepSeek), else the two halves (NeoX/Llama)."""
    dtype = x.dtype
    x = x.float()
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]                     # [T, 1, R/2]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = x.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(dtype)
