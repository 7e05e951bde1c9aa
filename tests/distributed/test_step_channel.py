"""The step broadcast delivers every message whole and in order, small (one frame) or large (a
second broadcast), to every rank of the group."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from runtime.distributed.spawn import run_on_ranks  # noqa: E402
from runtime.distributed.step_channel import FRAME_BYTES, STOP, StepChannel  # noqa: E402


def messages() -> list:
    return [{"ids": list(range(10))}, np.arange(FRAME_BYTES, dtype=np.int64), "x" * (FRAME_BYTES - 40),
            "y" * (FRAME_BYTES + 1), None, STOP]


def exchange(info, groups) -> list:
    channel = StepChannel(groups.cpu_group, info.leader_rank)
    if info.is_leader:
        for message in messages():
            channel.send(message)
        return []
    got = []
    while not (isinstance(message := channel.recv(), str) and message == STOP):
        got.append(message)
    return got


def test_every_message_arrives_whole_and_in_order():
    received = run_on_ranks(exchange, 3)
    for got in received[1:]:
        expected = messages()[:-1]
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b
