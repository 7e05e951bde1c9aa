"""Synthetic MoE inputs for tests, tuning and benchmarks: routings (no gate network) and expert weights.

Legend: M = tokens, K = experts per token (top-k), E = experts, N = weight rows, D = fan-in.
"""
from __future__ import annotations

import torch


def balanced_topk_ids(
    num_tokens: int, num_experts: int, top_k: int, *, generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:  # [M, K] int32
    """Every expert receives M*K/E tokens (up to one), each token K distinct experts.

    Scheme: concatenate independent random permutations of the E experts and deal them out K at a
    time; when E % K == 0 a token's K slots never straddle two permutations, so they are distinct.
    Otherwise (DeepSeek-V2-Lite: E=64, K=6) slot s of the step reads one random permutation at s mod E:
    K <= E consecutive positions of a cycle are distinct, and each expert gets floor or ceil of M*K/E.
    """
    if not 0 < top_k <= num_experts:
        raise ValueError(f"need 0 < K <= E, got E={num_experts}, K={top_k}")
    num_slots = num_tokens * top_k
    if num_experts % top_k:
        perm = torch.randperm(num_experts, generator=generator)
        flat = perm[torch.arange(num_slots) % num_experts]                  # [M*K]
        return flat.view(num_tokens, top_k).to(device=device, dtype=torch.int32)
    num_perms = max(1, -(-num_slots // num_experts))
    perms = [torch.randperm(num_experts, generator=generator) for _ in range(num_perms)]
    flat = torch.cat(perms)[:num_slots]                                  # [M*K]
    return flat.view(num_tokens, top_k).to(device=device, dtype=torch.int32)


def random_topk_ids(
    num_tokens: int, num_experts: int, top_k: int, *, generator: torch.Generator | None = None,
    device: torch.device | str = "cpu", num_active_experts: int | None = None,
) -> torch.Tensor:  # [M, K] int32
    """K distinct experts per token drawn uniformly from the first `num_active_experts` (default E),
    so the remaining experts receive no tokens."""
    active = num_experts if num_active_experts is None else num_active_experts
    if not top_k <= active <= num_experts:
        raise ValueError(f"need K <= active experts <= E, got K={top_k}, active={active}, E={num_experts}")
    scores = torch.rand(num_tokens, active, generator=generator)
    ids = scores.topk(top_k, dim=1).indices                              # [M, K] distinct per row
    return ids.to(device=device, dtype=torch.int32)


def random_topk_weights(
    num_tokens: int, top_k: int, *, generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:  # [M, K] float32, rows sum to 1 like a renormalised softmax gate
    raw = torch.rand(num_tokens, top_k, generator=generator) + 0.1
    return (raw / raw.sum(dim=1, keepdim=True)).to(device)


def random_expert_weights(
    num_experts: int, rows: int, fan_in: int, dtype: torch.dtype, *, generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:  # [E, N, D] ~ N(0, 1/D), so activations keep unit scale through the layer
    """Generated one expert at a time: tp=1 DeepSeek-V3 experts are 22.5 GB in bf16, fp32 would not fit."""
    out = torch.empty(num_experts, rows, fan_in, dtype=dtype, device=device)
    for expert in range(num_experts):
        out[expert] = (torch.randn(rows, fan_in, generator=generator, device=device) / fan_in ** 0.5).to(dtype)
    return out
