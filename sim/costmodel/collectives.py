"""Collective communication cost: an alpha-beta model (latency + bytes over bus bandwidth), with
the latency of a collective inside a CUDA graph kept apart from an eagerly launched one.

numpy-free, torch-free, no clock. Measured tables override it (sim/costmodel/collective_table.py).
Sizes follow nccl-tests: all_reduce and reduce_scatter: the input tensor; all_gather: the
gathered output; all_to_all: everything one rank sends (its own share included); send_recv: the
message. Legend: n = ranks in the group, S = size in bytes, B = achieved bus bandwidth per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(op: str, num_ranks: int) -> float:
    """Bytes each GPU moves over its link per byte of S (nccl-tests' busbw / algbw): a ring
    all-reduce moves 2 (n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n."""
    n = num_ranks
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")


class CollectiveCost(Protocol):
    """time_s(op, size_bytes, num_ranks, graph): seconds one collective takes on every rank of a
    group of num_ranks GPUs; 0 for a group of one. `graph`: captured in a CUDA graph (no host
    launch, no per-call NCCL setup) rather than launched eagerly."""

    def time_s(self, op: str, size_bytes: float, num_ranks: int, graph: bool) -> float:
        ...


@dataclass(frozen=True)
class AlphaBetaCollectives:
    """t = latency + (n - 1) * per_rank_latency_s + bus_factor(op, n) * S / B.

    latency is graph_latency_s inside a CUDA graph, eager_latency_s outside one; a group wider
    than gpus_per_node adds inter_node_latency_s and moves its bytes at the NIC's bandwidth
    (the slowest link of a ring or tree that leaves the node).
    """

    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    gpus_per_node: int
    graph_latency_s: float
    eager_latency_s: float
    per_rank_latency_s: float
    inter_node_latency_s: float

    def __post_init__(self) -> None:
        if min(self.intra_node_bandwidth_bytes_per_s, self.inter_node_bandwidth_bytes_per_s) <= 0:
            raise ValueError("collective bandwidths must be > 0")
        if min(self.graph_latency_s, self.eager_latency_s, self.per_rank_latency_s,
               self.inter_node_latency_s) < 0:
            raise ValueError("collective latencies must be >= 0")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")

    def time_s(self, op: str, size_bytes: float, num_ranks: int, graph: bool) -> float:
        factor = bus_factor(op, num_ranks)
        if num_ranks <= 1:
            return 0.0
        latency_s = self.graph_latency_s if graph else self.eager_latency_s
        latency_s += (num_ranks - 1) * self.per_rank_latency_s
        bandwidth = self.intra_node_bandwidth_bytes_per_s
        if num_ranks > self.gpus_per_node:
            latency_s += self.inter_node_latency_s
            bandwidth = self.inter_node_bandwidth_bytes_per_s
        return latency_s + factor * size_bytes / bandwidth
