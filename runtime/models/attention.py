"""Multi-head / grouped-query attention layer (Llama, Qwen2-MoE) over the paged KV pool; with fused small
ops (ctx.ops) it rotates q/k from positions in one kernel instead of the reference's per-step cos/sin.

Legend: T = new tokens, H = hidden, N = query heads, Hkv = KV heads, D = head dim.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from runtime.distributed.sharding import SINGLE, ModelParallel, Piece, column_parallel_pieces, row_parallel
from runtime.models.config import ModelConfig
from runtime.models.layers import Linear, MergedLinear, SmallOps
from runtime.models.rotary import apply_rotary

if TYPE_CHECKING:
    from runtime.models.base import StepContext


class Attention(nn.Module):
    """q/k/v merged into one `qkv_proj` (HF q_proj, k_proj, v_proj are its shards 0, 1, 2). Tensor
    parallel: each rank keeps N / tp query heads and their KV heads (split, or one replicated head when
    tp > Hkv); o_proj is row-parallel (a partial sum the decoder layer all-reduces)."""

    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device | str,
                 parallel: ModelParallel = SINGLE):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = parallel.local_heads(config.num_attention_heads)
        kv_piece = parallel.kv_heads(config.num_key_value_heads)
        self.num_kv_heads = kv_piece.local_size
        self.head_dim = config.head_dim
        self.interleaved = config.rope.interleaved
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv_bias = config.qkv_bias or config.attention_bias
        self.qkv_proj = MergedLinear(config.hidden_size, [q_size, kv_size, kv_size], qkv_bias, dtype, device)
        self.o_proj = Linear(q_size, config.hidden_size, config.attention_bias, dtype, device)
        self.scale = self.head_dim ** -0.5
        if parallel.sharded:
            d = self.head_dim
            kv = Piece(config.num_key_value_heads * d, kv_piece.pieces, kv_piece.index)
            column_parallel_pieces(self.qkv_proj, parallel.piece(config.num_attention_heads * d), kv, kv)
            row_parallel(self.o_proj, parallel, config.num_attention_heads * d)

    def forward(self, x: torch.Tensor, ctx: "StepContext") -> torch.Tensor:    # [T, H] -> [T, H]
        if ctx.ops is not None:
            return self._forward_fused(x, ctx, ctx.ops)
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.out_sizes, dim=-1)
        q = apply_rotary(q.view(num_tokens, self.num_heads, self.head_dim), ctx.cos, ctx.sin, self.interleaved)
        k = apply_rotary(k.view(num_tokens, self.num_kv_heads, self.head_dim), ctx.cos, ctx.sin, self.interleaved)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = ctx.backend.mha(self.layer_id, q, k, v, ctx.fb, ctx.pool, self.scale)   # [T, N, D]
        return self.o_proj(out.reshape(num_tokens, -1))

    def _forward_fused(self, x: torch.Tensor, ctx: "StepContext", ops: SmallOps) -> torch.Tensor:
        """The same math in fewer launches: one rotary kernel for q and k from positions (q lands in a
        contiguous buffer, as the attention kernels want it; k is rotated in place inside the qkv output),
        and the backend stores k and v straight from their strided views of that output (no copies).
        The KV store + attention runs through ctx.run_attention, where piecewise CUDA graphs split."""
        num_tokens, q_size, kv_size = x.shape[0], self.qkv_proj.out_sizes[0], self.qkv_proj.out_sizes[1]
        qkv = self.qkv_proj(x)                                                     # [T, (N + 2 Hkv) D]
        q = qkv[:, :q_size].view(num_tokens, self.num_heads, self.head_dim)        # row-strided views
        k = qkv[:, q_size:q_size + kv_size].view(num_tokens, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_size + kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        q_rot = x.new_empty(num_tokens, self.num_heads, self.head_dim)             # [T, N, D]
        ops.rope(ctx.fb.positions, q, k, self.interleaved, q_out=q_rot)
        out = ctx.run_attention(self._attend_fused, (self.num_heads, self.head_dim), q_rot, k, v)   # [T, N, D]
        return self.o_proj(out.reshape(num_tokens, -1))

    def _attend_fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: "StepContext") -> torch.Tensor:
        """[T, N, D] rotated, [T, Hkv, D] rotated, [T, Hkv, D] -> [T, N, D]: KV store + attention."""
        return ctx.backend.mha(self.layer_id, q, k, v, ctx.fb, ctx.pool, self.scale)
