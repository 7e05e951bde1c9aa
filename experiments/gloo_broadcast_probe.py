"""How long a gloo broadcast of a host buffer takes between two local processes (the TP leader's per-step message
to its peers travels so): a 16 KB frame, a 240 KB and a 1 MB buffer, broadcast and send/recv, median of 20 each.
Run it with and without GLOO_SOCKET_IFNAME=lo to see whether the interface gloo picked is the slow part.

  python experiments/gloo_broadcast_probe.py
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES_BYTES = (16384, 246140, 1 << 20)     # the step channel's frame, an 8,192-token step's message, 1 MB
REPEATS = 20


def _median_ms(op, rank: int) -> float:
    times = []
    for _ in range(REPEATS):
        dist.barrier()
        start = time.perf_counter()
        op(rank)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def run(rank: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "29533"
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for size in SIZES_BYTES:
        x = torch.zeros(size, dtype=torch.uint8)
        broadcast = _median_ms(lambda r: dist.broadcast(x, src=0), rank)
        send_recv = _median_ms(lambda r: dist.send(x, 1) if r == 0 else dist.recv(x, 0), rank)
        if rank == 0:
            print(f"bcast {size} median {broadcast:.3f} ms\nsend {size} median {send_recv:.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
