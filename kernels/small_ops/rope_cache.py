"""cos/sin caches for rotary embedding: plain RoPE and DeepSeek YaRN. Torch only, built once per model.

Legend: R = rope dim, P = positions.
Layout (same as SGLang/vLLM and flashinfer.rope.apply_rope_with_cos_sin_cache_inplace): [P, R] float32,
cos(pos * inv_freq) in [:, :R/2], sin in [:, R/2:]. YaRN's magnitude scale (mscale) is folded into both.
"""
from __future__ import annotations

import math

import torch


def rope_inv_freq(rope_dim: int, base: float) -> torch.Tensor:   # [R/2]
    return 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))


def cos_sin_cache_from_inv_freq(inv_freq: torch.Tensor, max_positions: int, mscale: float = 1.0,
                                device: torch.device | str | None = None) -> torch.Tensor:   # [P, R]
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)   # [P, R/2]
    return (torch.cat([freqs.cos(), freqs.sin()], dim=-1) * mscale).to(device)


def rope_cos_sin_cache(rope_dim: int, max_positions: int, base: float = 10000.0,
                       device: torch.device | str | None = None) -> torch.Tensor:    # [P, R]
    return cos_sin_cache_from_inv_freq(rope_inv_freq(rope_dim, base), max_positions, 1.0, device)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(rope_dim: int, base: float, factor: float, original_max_positions: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:      # [R/2]
    """YaRN: keep high-frequency dims (many rotations over the original context) as they are,
    interpolate low-frequency dims by `factor`, linear ramp in between (HF `_compute_yarn_parameters`,
    truncate=True, and SGLang's DeepseekScalingRotaryEmbedding)."""
    def correction_dim(num_rotations: float) -> float:
        return rope_dim * math.log(original_max_positions / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001   # avoid a zero-width ramp
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1.0 - ramp                                # 1: keep original frequency
    inv_freq = rope_inv_freq(rope_dim, base)
    return inv_freq / factor * (1 - extrapolation_weight) + inv_freq * extrapolation_weight


def deepseek_yarn_cos_sin_cache(
    rope_dim: int, max_positions: int, base: float, factor: float, original_max_positions: int,
    beta_fast: float = 32.0, beta_slow: float = 1.0, mscale: float = 1.0, mscale_all_dim: float = 0.0,
    device: torch.device | str | None = None,
) -> torch.Tensor:                                                   # [P, R]
    """DeepSeek-V2/V3 `rope_scaling: {type: yarn, ...}`. cos/sin carry
    yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim) (HF `attention_factor`).
    The softmax scale also changes: multiply 1/sqrt(qk_head_dim) by deepseek_yarn_softmax_mscale(...)."""
    inv_freq = yarn_inv_freq(rope_dim, base, factor, original_max_positions, beta_fast, beta_slow)
    if mscale and mscale_all_dim:
        cache_mscale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    else:
        cache_mscale = yarn_get_mscale(factor)
    return cos_sin_cache_from_inv_freq(inv_freq, max_positions, cache_mscale, device)


def deepseek_yarn_softmax_mscale(factor: float, mscale_all_dim: float) -> float:
    """Factor on DeepSeek's softmax scale under YaRN: yarn_get_mscale(factor, mscale_all_dim) ** 2."""
    return yarn_get_mscale(factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0
