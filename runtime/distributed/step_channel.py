"""The TP leader's per-step message to the other ranks of its group: pickled, broadcast over the
gloo CPU group (a size, then the bytes), as SGLang's broadcast_pyobj does. Messages are the runner's
StepInputs, KEEPALIVE (an idle leader, so waiting ranks do not time out) or STOP.
"""
from __future__ import annotations

import pickle

import torch
import torch.distributed as dist

KEEPALIVE = "keepalive"
STOP = "stop"


class StepChannel:
    """One TP group's channel; `src` is the global rank of the group's leader."""

    def __init__(self, group: dist.ProcessGroup, src: int) -> None:
        self.group, self.src = group, src
        self.bytes_sent = 0

    def send(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        dist.broadcast(torch.tensor([len(data)], dtype=torch.long), src=self.src, group=self.group)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=self.src, group=self.group)
        self.bytes_sent += len(data)

    def recv(self) -> object:
        size = torch.empty(1, dtype=torch.long)
        dist.broadcast(size, src=self.src, group=self.group)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(data, src=self.src, group=self.group)
        return pickle.loads(data.numpy().tobytes())
