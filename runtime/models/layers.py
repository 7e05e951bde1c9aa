"""Building blocks shared by the model families: uninitialised linears (weights come from a loader),
merged linears that load HF shards, RMSNorm, the SiLU-and-mul MLP, vocab embedding and LM head, and
the `SmallOps` contract through which a fused-kernel implementation replaces the torch small ops.

Legend: T = tokens, H = hidden, I = intermediate, V = vocab, N = heads, R = rotary dim.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from runtime.distributed.sharding import SINGLE, ModelParallel, column_parallel, row_parallel


def empty_param(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    # no init here: dummy init or a checkpoint fills it, directly on `device`
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T (+ b). W [out, in], same layout as torch/HF, left uninitialised."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.weight = empty_param(out_features, in_features, dtype=dtype, device=device)
        self.bias = empty_param(out_features, dtype=dtype, device=device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several HF linears with the same input stacked along the output dim (e.g. q/k/v, gate/up),
    so one GEMM computes them all. `load_shard(i, w)` copies HF linear i into its rows."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool,
                 dtype: torch.dtype, device: torch.device | str):
        super().__init__(in_features, sum(out_sizes), bias, dtype, device)
        self.out_sizes = list(out_sizes)
        self.offsets = [sum(out_sizes[:i]) for i in range(len(out_sizes))]

    def shard(self, tensor: torch.Tensor, index: int) -> torch.Tensor:
        """The rows of `tensor` (weight or bias of this layer) that belong to HF linear `index`."""
        return tensor.narrow(0, self.offsets[index], self.out_sizes[index])


class RMSNorm(nn.Module):
    """x / rms(x) * weight, normalised in float32 and cast back before the weight (as HF does)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.eps = eps
        self.weight = empty_param(dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate | up) -> [T, I] = silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class SmallOps(Protocol):
    """Fused kernels for the small ops of a forward (runtime/engine/fast_path.FusedSmallOps on CUDA).
    A model whose `small_ops` is None runs the torch code of this package instead (the reference).
    Implementations may overwrite their inputs where noted; none may sync with the host.
    `routes_few_tokens`: whether MoE layers may call `route` for steps of up to
    runtime.core.fusion_limits.ROUTER_KERNEL_MAX_TOKENS tokens."""

    routes_few_tokens: bool

    def rmsnorm(self, x: torch.Tensor, norm: "RMSNorm") -> torch.Tensor:
        """x [T, W] (rows may be strided) -> new [T, W]."""

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor,
                    norm: "RMSNorm") -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); overwrites x and residual with them."""

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] -> [T, I]."""

    def silu_and_mul_gated(self, gate_up: torch.Tensor, gate_logit: torch.Tensor) -> torch.Tensor:
        """[T, 2I], gate_logit [T, 1] -> [T, I] = silu(gate) * up * sigmoid(gate_logit)."""

    def rope(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, interleaved: bool,
             q_out: torch.Tensor | None = None) -> None:
        """Rotate q [T, N, R] (into q_out when given) and k [T, R] or [T, N, R] in place, at positions [T]."""

    def route(self, x: torch.Tensor, router_rows: torch.Tensor, num_experts: int, top_k: int, scoring_func: str,
              norm_topk_prob: bool, routed_scaling_factor: float, num_shared: int,
              gate_row: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Greedy MoE routing in two launches: x [T, H] against router_rows [E (+1 gate row), H] -> topk_weights
        [T, K + S] float32, topk_ids [T, K + S] int32 (runtime.models.moe.select_experts' greedy choice, then
        append_shared_pairs' S shared pairs, weighed by the gate row when gate_row), and the float32
        logits [T, E (+1)]."""


class GatedMLP(nn.Module):
    """down(silu(gate x) * up x); gate and up merged into `gate_up_proj` [2I, H]. With a sharded
    `parallel` (runtime.distributed) each rank holds I / tp of the intermediate dim and returns a
    partial sum (the decoder layer all-reduces it)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool,
                 dtype: torch.dtype, device: torch.device | str, parallel: ModelParallel = SINGLE):
        super().__init__()
        local = parallel.part(intermediate, "intermediate_size")
        self.gate_up_proj = MergedLinear(hidden, [local, local], bias, dtype, device)
        self.down_proj = Linear(local, hidden, bias, dtype, device)
        if parallel.sharded:
            column_parallel(self.gate_up_proj, parallel, intermediate, intermediate)
            row_parallel(self.down_proj, parallel, intermediate)

    def forward(self, x: torch.Tensor, ops: SmallOps | None = None) -> torch.Tensor:    # [T, H] -> [T, H]
        if ops is None:
            return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))

    def forward_add(self, x: torch.Tensor, out: torch.Tensor, ops: SmallOps) -> torch.Tensor:
        """out + mlp(x) [T, H] with the fused ops; overwrites out: the add rides in the down GEMM
        (beta = 1 into out itself, one launch fewer; an out-of-place addmm would first copy out)."""
        act = ops.silu_and_mul(self.gate_up_proj(x))                     # [T, I]
        if self.down_proj.bias is not None:
            return out + self.down_proj(act)
        return out.addmm_(act, self.down_proj.weight.t())

    def forward_add_gated(self, x: torch.Tensor, out: torch.Tensor, ops: SmallOps,
                          gate_logit: torch.Tensor) -> torch.Tensor:
        """out + sigmoid(gate_logit) * mlp(x) [T, H] (gate_logit [T, 1]); overwrites out. The sigmoid scales
        the activation rows (down is linear), so the add still rides in the down GEMM. Needs no down bias."""
        assert self.down_proj.bias is None, "the gate can only move before a bias-free down projection"
        act = ops.silu_and_mul_gated(self.gate_up_proj(x), gate_logit)   # [T, I]
        return out.addmm_(act, self.down_proj.weight.t())


class Embedding(nn.Module):
    """Token embedding table [V, H]."""

    def __init__(self, vocab: int, hidden: int, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.weight = empty_param(vocab, hidden, dtype=dtype, device=device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:   # [T] -> [T, H]
        return F.embedding(ids, self.weight)
