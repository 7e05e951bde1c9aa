"""torch.distributed set-up of one rank: the process group, then per DP replica a TP group on the
device backend (NCCL on GPU, gloo on CPU; the model's all-reduce and logits all-gather) and the same
ranks on gloo for host messages (the step-plan broadcast), as SGLang keeps a CPU group beside each
device group. Global rank = replica * tp + tp_rank; the TP leader (tp_rank 0) runs the scheduler.
DP attention: the dp attention ranks split the tp GPUs (rank = attention rank * tp/dp + its rank in
the attention TP group); each attention TP group gets the two groups above, the MLP gets one device
group of all tp GPUs, and the attention ranks' leaders share a gloo group for their lockstep.
"""
from __future__ import annotations

import datetime
import os
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from runtime.core.layout import ParallelLayout

GRAPH_MIXING_ENV = "NCCL_GRAPH_MIXING_SUPPORT"


@dataclass(frozen=True)
class RankInfo:
    """What a spawned rank is told (picklable)."""

    rank: int
    world_size: int
    local_rank: int               # index on its node: picks the GPU
    tp: int
    ep: int
    dp: int
    init_method: str              # tcp://host:port of the rendezvous
    backend: str                  # nccl | gloo
    device: str                   # cuda:<local_rank> | cpu
    timeout_s: float              # collectives that wait longer fail (a peer hung or died)
    dp_attention: bool = False    # the dp ranks are attention ranks inside the tp GPUs (world = tp)
    nccl_graph_mixing: bool = False   # NCCL_GRAPH_MIXING_SUPPORT of this rank (real.nccl_graph_mixing)

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp, ep=self.ep, dp=self.dp, dp_attention=self.dp_attention)

    @property
    def attention_tp(self) -> int:
        """GPUs of one scheduling group: a replica's tp, or tp / dp under DP attention."""
        return self.layout.attention_tp

    @property
    def replica(self) -> int:
        """The DP replica (under DP attention: the attention rank) this rank serves."""
        return self.rank // self.attention_tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def attention_rank(self) -> int:
        """Rank inside the scheduling group (equals tp_rank without DP attention)."""
        return self.rank % self.attention_tp

    @property
    def is_leader(self) -> bool:
        return self.attention_rank == 0

    @property
    def leader_rank(self) -> int:
        return self.replica * self.attention_tp

    def describe(self) -> str:
        if self.dp_attention:
            return f"tp rank {self.tp_rank}, attention rank {self.replica} of {self.dp}"
        return f"tp rank {self.tp_rank} of replica {self.replica}"


# newer torch's name for all_gather_into_tensor (the old one warns there)
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class GroupComm:
    """runtime.distributed.sharding.TPComm over one process group."""

    def __init__(self, group: dist.ProcessGroup, size: int) -> None:
        self.group, self.size = group, size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:   # [B, N] -> [B, size * N]
        rows, cols = x.shape
        out = torch.empty(self.size * rows, cols, dtype=x.dtype, device=x.device)   # [size * B, N]
        _all_gather_single(out, x.contiguous(), group=self.group)
        return out.view(self.size, rows, cols).permute(1, 0, 2).reshape(rows, self.size * cols)

    def all_gather_rows(self, x: torch.Tensor) -> torch.Tensor:   # [n, H] -> [size * n, H], rank r's at r * n
        out = torch.empty(self.size * x.shape[0], *x.shape[1:], dtype=x.dtype, device=x.device)
        _all_gather_single(out, x.contiguous(), group=self.group)
        return out

    def reduce_scatter_rows(self, x: torch.Tensor) -> torch.Tensor:   # [size * n, H] -> [n, H]: rows r * n.. summed
        out = torch.empty(x.shape[0] // self.size, *x.shape[1:], dtype=x.dtype, device=x.device)
        _reduce_scatter_single(out, x.contiguous(), group=self.group)
        return out


_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class RankGroups:
    info: RankInfo
    device_group: dist.ProcessGroup | None   # the scheduling group (TP, or attention TP) on the device backend
    cpu_group: dist.ProcessGroup | None      # the same ranks on gloo (None: a group of one)
    mlp_group: dist.ProcessGroup | None = None      # DP attention: every tp rank, device backend
    leaders_group: dist.ProcessGroup | None = None  # DP attention: the attention ranks' leaders, gloo

    def comm(self) -> GroupComm:
        return GroupComm(self.device_group, self.info.attention_tp)

    def mlp_comm(self) -> GroupComm:
        return GroupComm(self.mlp_group, self.info.tp)


def init_rank_groups(info: RankInfo) -> RankGroups:
    """Join the rendezvous and build every replica's TP groups (each rank takes part in creating all
    of them, in the same order, as torch.distributed requires); returns this rank's."""
    if info.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(info.device))
    # read by NCCL as it creates this rank's communicators (at their first collective)
    os.environ[GRAPH_MIXING_ENV] = "1" if info.nccl_graph_mixing else "0"
    timeout = datetime.timedelta(seconds=info.timeout_s)
    dist.init_process_group(info.backend, init_method=info.init_method, rank=info.rank,
                            world_size=info.world_size, timeout=timeout)
    if info.dp_attention:
        return _dp_attention_groups(info, timeout)
    return RankGroups(info, *_scheduling_groups(info, timeout))


def _scheduling_groups(info: RankInfo, timeout: datetime.timedelta) -> tuple:
    """Every scheduling group's device and gloo groups (consecutive ranks, attention_tp of them: a replica,
    or an attention rank under DP attention), created in the same order on every rank; returns this
    rank's pair."""
    size, mine = info.attention_tp, (None, None)
    for replica in range(info.dp):
        ranks = list(range(replica * size, (replica + 1) * size))
        pair = (dist.new_group(ranks, backend=info.backend, timeout=timeout),
                dist.new_group(ranks, backend="gloo", timeout=timeout))
        if replica == info.replica:
            mine = pair
    return mine


def _dp_attention_groups(info: RankInfo, timeout: datetime.timedelta) -> RankGroups:
    """The MLP group (all tp ranks), each attention TP group (device and gloo; none for groups of one
    GPU) and the leaders' gloo group, created in the same order on every rank."""
    mlp_group = dist.new_group(list(range(info.tp)), backend=info.backend, timeout=timeout)
    device_group, cpu_group = _scheduling_groups(info, timeout) if info.attention_tp > 1 else (None, None)
    leaders_group = dist.new_group([r * info.attention_tp for r in range(info.dp)], backend="gloo", timeout=timeout)
    return RankGroups(info, device_group, cpu_group, mlp_group, leaders_group)


def destroy(timeout_s: float) -> bool:
    """Destroy this process's groups after the device's work is done; False when that did not end within
    timeout_s (NCCL's teardown is collective and can block for good: the caller then exits without it)."""
    if not dist.is_initialized():
        return True
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    worker = threading.Thread(target=dist.destroy_process_group, name="destroy-groups", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()
