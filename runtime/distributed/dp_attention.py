"""DP attention's model side (SGLang --enable-dp-attention): the token exchange between the attention
ranks and the tensor-parallel MLP/MoE over every GPU, and the ModelParallel a rank builds its model with.
Calls collectives only through the row communicators it is handed (runtime.distributed.groups.GroupComm).

Legend: D = attention ranks (dp), A = GPUs per attention rank (tp / dp), n = this attention rank's
tokens, M = rows per attention rank after padding (the step's largest n, rounded up to a multiple of A).
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from runtime.distributed.sharding import ModelParallel


class RowComm(Protocol):
    """Row collectives over one group of `size` ranks, in rank order."""

    size: int

    def all_gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """[n, H] on each rank -> [size * n, H], rank r's rows at r * n."""
        ...

    def reduce_scatter_rows(self, x: torch.Tensor) -> torch.Tensor:
        """[size * n, H] on each rank -> [n, H]: rows r * n .. (r + 1) * n summed over the group, on rank r."""
        ...


class PaddedTokenExchange:
    """runtime.distributed.sharding.TokenExchange by padded all-gather and reduce-scatter, as SGLang's
    all-gather mode: every attention rank pads its tokens to M rows; each of its A GPUs sends 1/A of
    them, so one all-gather over all tp GPUs (rank order = attention rank, then GPU in it) lays out
    [D * M, H] with rank d's rows at d * M; the MLP's partial sums are reduce-scattered back (each GPU
    its 1/A, summed over all tp GPUs) and all-gathered inside the attention TP group.

    `step_tokens` (every attention rank's n this step) is set before each forward of a run, since the
    others' counts cannot be read from this rank's batch; None (warm-up, where every rank runs the same
    forward) means every rank has this rank's n."""

    def __init__(self, mlp_comm: RowComm, attention_comm: RowComm | None, attention_rank: int,
                 num_attention_ranks: int, gpu_in_attention: int = 0) -> None:
        self.mlp_comm, self.attention_comm = mlp_comm, attention_comm
        self.attention_rank, self.num_attention_ranks = attention_rank, num_attention_ranks
        self.gpus_per_rank = attention_comm.size if attention_comm is not None else 1
        self.gpu_in_attention = gpu_in_attention
        if mlp_comm.size != num_attention_ranks * self.gpus_per_rank:
            raise ValueError(f"the MLP group has {mlp_comm.size} GPUs, not {num_attention_ranks} attention "
                             f"ranks x {self.gpus_per_rank}")
        self.step_tokens: list[int] | None = None

    def set_step_tokens(self, tokens: Sequence[int] | None) -> None:
        if tokens is not None and len(tokens) != self.num_attention_ranks:
            raise ValueError(f"{len(tokens)} token counts for {self.num_attention_ranks} attention ranks")
        self.step_tokens = None if tokens is None else list(tokens)

    def padded_rows(self, num_local: int) -> int:
        """M for a step in which this rank runs num_local tokens."""
        if self.step_tokens is None:
            most = num_local
        elif self.step_tokens[self.attention_rank] != num_local:
            raise RuntimeError(f"attention rank {self.attention_rank} runs {num_local} tokens but the step "
                               f"agreed on {self.step_tokens[self.attention_rank]}")
        else:
            most = max(self.step_tokens)
        a = self.gpus_per_rank
        return -(-most // a) * a

    def gather(self, x: torch.Tensor) -> torch.Tensor:   # [n, H] -> [D * M, H]
        chunk = self.padded_rows(x.shape[0]) // self.gpus_per_rank
        first = self.gpu_in_attention * chunk
        part = x[first:first + chunk]                                  # [<= M / A, H]
        if part.shape[0] < chunk:
            padded = x.new_zeros(chunk, x.shape[1])                    # [M / A, H]
            padded[:part.shape[0]] = part
            part = padded
        return self.mlp_comm.all_gather_rows(part)

    def scatter(self, y: torch.Tensor, num_local: int) -> torch.Tensor:   # [D * M, H] -> [n, H]
        mine = self.mlp_comm.reduce_scatter_rows(y)                   # [M / A, H], summed over all GPUs
        if self.attention_comm is not None:
            mine = self.attention_comm.all_gather_rows(mine)          # [M, H]
        return mine[:num_local]


def dp_attention_parallel(info, groups) -> tuple[ModelParallel, PaddedTokenExchange]:
    """A DP attention rank's ModelParallel (runtime.distributed.groups.RankInfo / RankGroups): attention
    over its attention TP group, the MLP/MoE over all tp ranks (experts over ep of them), and the token
    exchange between them, which the caller keeps to set each step's token counts."""
    size = info.attention_tp
    attention_comm = groups.comm() if size > 1 else None
    attention = ModelParallel(info.attention_rank, size, 1, attention_comm)
    mlp_comm = groups.mlp_comm()
    exchange = PaddedTokenExchange(mlp_comm, attention_comm, info.replica, info.dp, info.attention_rank)
    return ModelParallel(info.tp_rank, info.tp, info.ep, mlp_comm, attention, exchange), exchange
