"""The TP leader's per-step message to the other ranks of its group: pickled, broadcast over the
gloo CPU group, as SGLang's broadcast_pyobj does. One broadcast of a fixed-size frame (its first 8
bytes the payload length) carries a typical decode step whole; a larger payload (a long prefill
chunk) sends its remainder in a second. Messages are the runner's StepInputs, KEEPALIVE (an idle
leader, so waiting ranks do not time out) or STOP.
"""
from __future__ import annotations

import pickle

import torch
import torch.distributed as dist

KEEPALIVE = "keepalive"
STOP = "stop"
FRAME_BYTES = 16384        # a decode step of a few hundred requests fits one frame
_LEN = 8                   # little-endian payload length at the head of the frame


class StepChannel:
    """One TP group's channel; `src` is the global rank of the group's leader."""

    def __init__(self, group: dist.ProcessGroup, src: int) -> None:
        self.group, self.src = group, src
        self.frame = torch.zeros(FRAME_BYTES, dtype=torch.uint8)
        self.bytes_sent = 0

    def send(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        head = len(data).to_bytes(_LEN, "little") + data[:FRAME_BYTES - _LEN]
        self.frame[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        dist.broadcast(self.frame, src=self.src, group=self.group)
        rest = data[FRAME_BYTES - _LEN:]
        if rest:
            dist.broadcast(torch.frombuffer(bytearray(rest), dtype=torch.uint8), src=self.src, group=self.group)
        self.bytes_sent += len(data)

    def recv(self) -> object:
        dist.broadcast(self.frame, src=self.src, group=self.group)
        frame = self.frame.numpy().tobytes()
        size = int.from_bytes(frame[:_LEN], "little")
        data = frame[_LEN:_LEN + size]
        if size > FRAME_BYTES - _LEN:
            rest = torch.empty(size - (FRAME_BYTES - _LEN), dtype=torch.uint8)
            dist.broadcast(rest, src=self.src, group=self.group)
            data += rest.numpy().tobytes()
        return pickle.loads(data)
