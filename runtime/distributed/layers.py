"""Tensor-parallel building blocks the model families use when tp > 1: vocab-parallel embedding,
column/row-parallel annotations of plain linears, the logits gather of a vocab-parallel LM head and
the expert-parallel routing mask. At tp=1 the models never reach this module's collectives.

Legend: T = tokens, H = hidden, V = vocab, Vr = V / tp, K = experts per token, El = local experts.
Imports torch, never torch.distributed: collectives go through the TPComm the model was built with.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.distributed.sharding import ModelParallel, annotate, column_parallel, row_parallel
from runtime.models.layers import Linear, empty_param


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [r * Vr, (r + 1) * Vr) of the table; tokens outside them embed to zeros and
    the all-reduce fills each row from the rank that owns it."""

    def __init__(self, vocab: int, hidden: int, dtype: torch.dtype, device: torch.device | str,
                 parallel: ModelParallel) -> None:
        super().__init__()
        self.num_local = parallel.part(vocab, "vocab_size")
        self.start = parallel.tp_rank * self.num_local
        self.comm = parallel.comm
        self.weight = empty_param(self.num_local, hidden, dtype=dtype, device=device)   # [Vr, H]
        annotate(self.weight, parallel.column(vocab))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:        # [T] -> [T, H]
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_local)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0.0)
        return self.comm.all_reduce(out)


def shard_mla_heads(attn: nn.Module, parallel: ModelParallel, num_heads: int) -> None:
    """Mark an MLAttention built with N / tp heads: q_proj (or q_b_proj) and kv_b_proj are column-parallel
    by heads, o_proj row-parallel; q_a/kv_a projections and norms stay whole, so every rank computes and
    stores the full latent KV of every token (SGLang's MLA tensor parallelism)."""
    qk_dim, v_dim = attn.nope_dim + attn.rope_dim, attn.v_dim
    column_parallel(attn.q_proj if hasattr(attn, "q_proj") else attn.q_b_proj, parallel, num_heads * qk_dim)
    column_parallel(attn.kv_b_proj, parallel, num_heads * (attn.nope_dim + v_dim))
    row_parallel(attn.o_proj, parallel, num_heads * v_dim)


def vocab_parallel_lm_head(hidden: int, vocab: int, dtype: torch.dtype, device: torch.device | str,
                           parallel: ModelParallel) -> Linear:
    """The LM head's rows of this rank [Vr, H]; logits are gathered with `gather_logits`."""
    head = Linear(hidden, parallel.part(vocab, "vocab_size"), False, dtype, device)
    column_parallel(head, parallel, vocab)
    return head


def gather_logits(local_logits: torch.Tensor, parallel: ModelParallel) -> torch.Tensor:   # [B, Vr] -> [B, V]
    return parallel.comm.all_gather_last(local_logits)


def local_expert_routing(topk_weights: torch.Tensor, topk_ids: torch.Tensor, first_expert: int,
                         num_local: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert parallelism over tokens every rank holds (attention is TP, so the hidden states are
    replicated): dispatch is local selection, the combine is the decoder layer's all-reduce. Pairs
    routed to this rank's experts get local ids; the others get -1 (SGLang's id for an expert off this
    rank, kernels.fused_moe.align.SKIP_EXPERT), which the fused MoE and its reference leave out: no GEMM
    row, nothing added, so each rank computes only its own pairs while every shape stays static for
    CUDA graphs. Weights pass through unchanged (a skipped pair's weight is never read).
    [T, K], [T, K] -> weights [T, K], ids [T, K] in [0, El) or -1."""
    local = topk_ids - first_expert
    return topk_weights, local.masked_fill((local < 0) | (local >= num_local), -1)
