"""The server's inter-process channels (runtime/server/channel.py): every message arrives, whole and in its
sender's order, whatever the sizes and however sends, flushes and reads interleave; sends never block; a
sender that comes before its receiver is delivered once it is there; the asyncio ends on a real loop."""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.server.channel import AsyncInbox, AsyncOutbox, Inbox, Outbox
from runtime.server.ipc import resolve_busy_poll_s


def receive(inbox: Inbox, count: int, timeout_s: float = 10.0) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(inbox.drain())
        if len(got) < count:
            inbox.poll(50)
    return got


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 600_000), min_size=1, max_size=12),
       reads_between=st.lists(st.booleans(), min_size=12, max_size=12))
def test_messages_arrive_whole_and_in_order_whatever_the_sizes(tmp_path_factory, sizes, reads_between):
    """Messages of up to 600 kB (beyond the socket's buffer: sends leave the rest pending) arrive complete
    and in order, with reads between the sends or only at the end; a send never blocks."""
    path = str(tmp_path_factory.mktemp("ch") / "in")
    inbox, outbox = Inbox(path), Outbox(path)
    try:
        got = []
        for i, size in enumerate(sizes):
            started = time.perf_counter()
            outbox.send_pyobj((i, os.urandom(size)))
            assert time.perf_counter() - started < 1.0
            if reads_between[i]:
                got.extend(inbox.drain())
                outbox.flush()
        while outbox.pending_bytes:
            got.extend(inbox.drain())
            outbox.flush()
        got.extend(receive(inbox, len(sizes) - len(got)))
        assert [i for i, _ in got] == list(range(len(sizes)))
        assert [len(b) for _, b in got] == sizes
    finally:
        outbox.close(0)
        inbox.close()


def test_a_sender_before_its_receiver_is_delivered_once_it_binds(tmp_path):
    path = str(tmp_path / "late")
    outbox = Outbox(path)
    outbox.send_pyobj("early")
    assert not outbox.connected and outbox.pending_bytes > 0
    inbox = Inbox(path)
    try:
        assert outbox.flush() and outbox.connected
        assert receive(inbox, 1) == ["early"]
    finally:
        outbox.close(0)
        inbox.close()


def _send_numbered(path: str, tag: str, count: int) -> None:
    outbox = Outbox(path)
    for i in range(count):
        outbox.send_pyobj((tag, i))
    outbox.close(5000)


def test_several_senders_each_keep_their_order(tmp_path):
    path = str(tmp_path / "many")
    inbox = Inbox(path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_send_numbered, args=(path, tag, 500)) for tag in "abc"]
    try:
        for p in procs:
            p.start()
        got = receive(inbox, 1500, timeout_s=60)
    finally:
        for p in procs:
            p.join(30)
        inbox.close()
    assert len(got) == 1500
    for tag in "abc":
        assert [i for t, i in got if t == tag] == list(range(500))


def test_a_receiver_that_is_gone_drops_messages_without_blocking(tmp_path):
    path = str(tmp_path / "gone")
    inbox = Inbox(path)
    outbox = Outbox(path)
    outbox.send_pyobj("seen")
    assert receive(inbox, 1) == ["seen"]
    inbox.close()
    for _ in range(200):
        outbox.send_pyobj(b"x" * 10_000)
    assert outbox.dropped > 0 and outbox.pending_bytes == 0
    outbox.close(0)


def test_poll_waits_up_to_its_timeout_and_busy_polling_receives_as_well(tmp_path):
    for busy in (0.0, 0.05):
        path = str(tmp_path / f"poll{busy}")
        inbox, outbox = Inbox(path, busy_poll_s=busy), Outbox(path)
        try:
            started = time.monotonic()
            assert not inbox.poll(30)
            assert 0.025 <= time.monotonic() - started < 1.0
            outbox.send_pyobj(1)
            assert inbox.poll(1000) and inbox.recv_pyobj() == 1
            outbox.send_pyobj(2)                       # within the busy window: found while spinning
            assert inbox.poll(1000) and inbox.try_recv() == 2
            assert inbox.try_recv() is None
        finally:
            outbox.close(0)
            inbox.close()


@pytest.mark.parametrize("busy_poll_s", [0.0, 0.05])
def test_asyncio_ends_deliver_a_backlog_larger_than_the_socket_buffer(tmp_path, busy_poll_s):
    """An AsyncOutbox whose receiver is slow keeps the rest and writes it when the socket drains; an
    AsyncInbox on the loop receives everything in order (with and without busy polling)."""
    to_peer, back = str(tmp_path / "peer"), str(tmp_path / "back")
    count, size = 40, 100_000                          # 4 MB: far beyond the socket's buffer

    async def main():
        peer = AsyncInbox(Inbox(to_peer, busy_poll_s=busy_poll_s))
        sender = AsyncOutbox(Outbox(to_peer))
        for i in range(count):
            sender.send_pyobj((i, b"y" * size))
        assert sender.outbox.pending_bytes > 0
        got = [await asyncio.wait_for(peer.recv_pyobj(), 10) for _ in range(count)]
        assert [i for i, _ in got] == list(range(count))
        assert sender.outbox.pending_bytes == 0
        reply = AsyncOutbox(Outbox(back))              # no receiver yet: retried until one binds
        reply.send_pyobj("late")
        await asyncio.sleep(0.02)
        late = AsyncInbox(Inbox(back))
        assert await asyncio.wait_for(late.recv_pyobj(), 5) == "late"
        for box in (sender, reply):
            box.close(0)
        for box in (peer, late):
            box.close()

    asyncio.run(main())


def test_busy_poll_auto_spins_only_where_cores_are_plenty():
    assert resolve_busy_poll_s(None, cpu_count=2) == 0.0
    assert resolve_busy_poll_s(None, cpu_count=16) > 0.0
    assert resolve_busy_poll_s(0.25, cpu_count=2) == 0.25
    with pytest.raises(ValueError, match="busy_poll_s=-1"):
        resolve_busy_poll_s(-1.0)


def test_closing_twice_is_harmless(tmp_path):
    async def main():
        inbox = AsyncInbox(Inbox(str(tmp_path / "twice")))
        inbox.close()
        inbox.close()
        inbox.inbox.close()

    asyncio.run(main())


def test_a_path_too_long_for_a_unix_socket_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="TMPDIR"):
        Inbox(str(tmp_path / ("x" * 120)))
