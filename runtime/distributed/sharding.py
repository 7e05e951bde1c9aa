"""Where one rank sits in its tensor/expert-parallel group (`ModelParallel`) and how each of its
parameters is cut from the full tensor (`ShardSpec`), so that dummy init and checkpoint loading give
every layout the same weights as tp=1. Imports torch, never torch.distributed (the model talks to
its peers only through the `TPComm` it is handed).

Legend: P = pieces a part is cut into, i = the piece this rank keeps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn


class TPComm(Protocol):
    """The collectives a sharded model calls inside its forward (CUDA-graph safe on NCCL)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the TP group, in place; returns x."""
        ...

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N] on each rank -> [B, tp * N], rank r's columns at r * N."""
        ...


class TokenExchange(Protocol):
    """DP attention (SGLang --enable-dp-attention): moves tokens between the attention ranks, which
    each run attention on their own requests, and the MLP/MoE, which runs tensor-parallel over every
    GPU on the tokens of all of them. Legend: n = this attention rank's tokens, D = attention ranks,
    M = rows per rank after padding (the step's largest n, rounded up)."""

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[n, H] this rank's tokens -> [D * M, H] every rank's, rank d's at rows d * M (zero padded)."""
        ...

    def scatter(self, y: torch.Tensor, num_local: int) -> torch.Tensor:
        """[D * M, H] this GPU's partial sums of the MLP over the gathered rows -> [num_local, H] this
        rank's rows, summed over the TP group."""
        ...


@dataclass(frozen=True)
class Piece:
    """One stacked part of a parameter along the split dim: its full size, cut into `pieces` equal
    pieces of which this rank keeps piece `index`."""

    full_size: int
    pieces: int
    index: int

    @property
    def local_size(self) -> int:
        return self.full_size // self.pieces


@dataclass(frozen=True)
class Split:
    """A parameter's dim `dim` is the concatenation of `parts` (e.g. gate then up); each is cut on
    its own, and the rank's tensor concatenates its pieces in the same order."""

    dim: int
    parts: tuple[Piece, ...]

    def narrow(self, full: torch.Tensor) -> torch.Tensor:
        chunks, offset = [], 0
        for part in self.parts:
            chunks.append(full.narrow(self.dim, offset + part.index * part.local_size, part.local_size))
            offset += part.full_size
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=self.dim)

    def narrow_part(self, tensor: torch.Tensor, part: int) -> torch.Tensor:
        """The rank's piece of `tensor`, which is the whole of part `part` (one HF linear of a merged one)."""
        piece = self.parts[part]
        return tensor.narrow(self.dim, piece.index * piece.local_size, piece.local_size)


@dataclass(frozen=True)
class ShardSpec:
    """How a rank's parameter comes from the full one: `splits` on distinct dims; `zero`: the rank
    holds zeros (a row-parallel bias lives on the first rank only, so the all-reduce adds it once)."""

    splits: tuple[Split, ...] = ()
    zero: bool = False

    def full_shape(self, local_shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
        shape = list(local_shape)
        for split in self.splits:
            shape[split.dim] = sum(p.full_size for p in split.parts)
        return tuple(shape)

    def narrow(self, full: torch.Tensor) -> torch.Tensor:
        if self.zero:
            return torch.zeros_like(full)
        for split in self.splits:
            full = split.narrow(full)
        return full

    def narrow_part(self, tensor: torch.Tensor, part: int) -> torch.Tensor:
        """For a merged parameter (first split on dim 0 lists its HF linears): the rank's piece of HF
        linear `part`; any further split is applied whole (dims shifted by nothing: same rank)."""
        first, *rest = self.splits
        tensor = first.narrow_part(tensor, part)
        for split in rest:
            tensor = split.narrow(tensor)
        return tensor


def shard_spec(param: torch.Tensor) -> ShardSpec | None:
    """The spec `annotate` attached, or None (the parameter is the full tensor on every rank)."""
    return getattr(param, "shard_spec", None)


def annotate(param: torch.Tensor | None, *splits: Split, zero: bool = False) -> None:
    """Attach a ShardSpec to `param` when it differs from the full tensor (no-op at tp=1)."""
    if param is None:
        return
    real = tuple(s for s in splits if any(p.pieces > 1 for p in s.parts))
    if real or zero:
        param.shard_spec = ShardSpec(real, zero)


def _divide(size: int, pieces: int, what: str) -> int:
    if size % pieces:
        raise ValueError(f"{what}={size} is not divisible by {pieces} (tensor/expert parallel degree)")
    return size // pieces


@dataclass(frozen=True, eq=False)
class ModelParallel:
    """A rank's place in its TP group and how MoE layers split inside it (runtime.core.layout's
    semantics): experts are partitioned over `ep_size` ranks, each expert's intermediate dim split
    over the moe_tp_size = tp_size / ep_size ranks that share it. The default is one rank (tp=1).

    DP attention: `attention` is the rank's place in its attention TP group (tp / dp ranks: attention
    heads, the embedding and the LM head split that way), and `tokens` gathers every attention rank's
    tokens before each MLP/MoE and scatters the output back; this object then describes the MLP's
    tensor parallelism over all tp ranks. Without DP attention both are None (attention = this)."""

    tp_rank: int = 0
    tp_size: int = 1
    ep_size: int = 1
    comm: TPComm | None = field(default=None, repr=False)
    attention: ModelParallel | None = field(default=None, repr=False)
    tokens: TokenExchange | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.tp_size % self.ep_size or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"bad model parallel ranks: tp_rank={self.tp_rank} tp={self.tp_size} ep={self.ep_size}")
        if self.tp_size > 1 and self.comm is None:
            raise ValueError("tp_size > 1 needs a TPComm")

    @property
    def sharded(self) -> bool:
        return self.tp_size > 1

    @property
    def attention_parallel(self) -> ModelParallel:
        """Where attention, the embedding and the LM head are split: the attention TP group under DP
        attention, else the TP group itself."""
        return self.attention if self.attention is not None else self

    @property
    def moe_tp_size(self) -> int:
        return self.tp_size // self.ep_size

    @property
    def moe_tp_rank(self) -> int:
        return self.tp_rank % self.moe_tp_size

    @property
    def ep_rank(self) -> int:
        return self.tp_rank // self.moe_tp_size

    def part(self, size: int, what: str) -> int:
        """This rank's share of a TP-split dimension."""
        return _divide(size, self.tp_size, what)

    def piece(self, full_size: int) -> Piece:
        return Piece(full_size, self.tp_size, self.tp_rank)

    def column(self, *full_sizes: int) -> Split:
        """Output rows (dim 0) of a column-parallel linear, each stacked part split tp ways."""
        return Split(0, tuple(self.piece(s) for s in full_sizes))

    def row(self, full_size: int) -> Split:
        """Input columns (dim 1) of a row-parallel linear."""
        return Split(1, (self.piece(full_size),))

    def local_heads(self, num_heads: int) -> int:
        return _divide(num_heads, self.tp_size, "num_attention_heads")

    def kv_heads(self, num_kv_heads: int) -> Piece:
        """KV heads of GQA: split when tp <= num_kv_heads, else each rank keeps the one head its query
        heads read (replicated over tp / num_kv_heads ranks)."""
        pieces = min(num_kv_heads, self.tp_size)
        if num_kv_heads % pieces or self.tp_size % pieces:
            raise ValueError(f"tp={self.tp_size} neither divides nor is a multiple of num_key_value_heads={num_kv_heads}")
        return Piece(num_kv_heads, pieces, self.tp_rank * pieces // self.tp_size)


def column_parallel(linear: nn.Module, parallel: ModelParallel, *full_sizes: int) -> None:
    """Mark `linear` (already built with its local output rows) as cut along its outputs; for a
    MergedLinear, `full_sizes` lists each HF linear's full output size."""
    split = parallel.column(*full_sizes)
    annotate(linear.weight, split)
    annotate(linear.bias, split)


def column_parallel_pieces(linear: nn.Module, *parts: Piece) -> None:
    """Like column_parallel with an explicit piece per stacked part (GQA k/v replicated past Hkv ranks)."""
    split = Split(0, tuple(parts))
    annotate(linear.weight, split)
    annotate(linear.bias, split)


def row_parallel(linear: nn.Module, parallel: ModelParallel, full_in: int) -> None:
    """Mark `linear` as cut along its inputs: each rank's output is a partial sum (the decoder layer
    all-reduces it); its bias lives on the first rank only, so the sum adds it once."""
    annotate(linear.weight, parallel.row(full_in))
    if linear.bias is not None and parallel.sharded:
        annotate(linear.bias, zero=parallel.tp_rank != 0)


SINGLE = ModelParallel()   # tp=1: every parameter is the full tensor, no collectives
