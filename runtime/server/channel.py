"""Pickled messages between the server's processes over Unix stream sockets, written by the sending thread
straight into the kernel and read by the receiver's own loop: one thread wake-up per message. (ZeroMQ
hands each message to an I/O thread on both sides: three wake-ups, ~0.66 ms from scheduler to HTTP worker
on an H200 host against ~0.37 ms here and ~0.17 ms with busy polling; `experiments/ipc_latency_bench.py`.)

An `Inbox` binds a path and takes messages from any number of `Outbox`es, each sender's in order. Sends
never block: what the socket does not take waits in the sender's buffer until `flush` (a receiver that is
not there yet is connected to by a later `flush`). Each frame is an 8-byte little-endian length and a
pickle. Stdlib only; no torch.
"""
from __future__ import annotations

import asyncio
import os
import pickle
import select
import selectors
import socket
import struct
import time
from collections import deque
from collections.abc import Iterator
from itertools import islice

FRAME = struct.Struct("<Q")
READ_CHUNK_BYTES = 1 << 20
LISTEN_BACKLOG = 128
MAX_FRAMES_PER_SEND = 64          # buffers handed to one sendmsg (a backlog is written a slice at a time)
MAX_PATH_BYTES = 107              # sockaddr_un's sun_path holds 108 bytes with its terminating NUL


class Inbox:
    """The receiving end, bound to `path`. `busy_poll_s`: for this long after its last message a wait
    spins on the sockets instead of sleeping in the kernel (a sleeping process takes 0.1-0.3 ms to wake;
    0: never spins). Callers use `poll`, `drain`, `recv_pyobj`, `try_recv`, `pump`, `fileno`, `closed`
    and `close`."""

    def __init__(self, path: str, busy_poll_s: float = 0.0) -> None:
        if len(os.fsencode(path)) > MAX_PATH_BYTES:
            raise ValueError(f"socket path {path!r} is longer than the {MAX_PATH_BYTES} bytes a Unix socket takes: "
                             f"set TMPDIR to a shorter directory")
        self.path = path
        self.busy_poll_s = float(busy_poll_s)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(LISTEN_BACKLOG)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._buffers: dict[socket.socket, bytearray] = {}
        self._ready: deque = deque()
        self._last_message_s = float("-inf")

    @property
    def last_message_s(self) -> float:
        """perf_counter time at which the latest message was taken off a socket (-inf before the first)."""
        return self._last_message_s

    def fileno(self) -> int:
        """A descriptor that becomes readable when a sender connects or writes (the selector's own), for an
        event loop's `add_reader`."""
        return self._selector.fileno()

    def poll(self, timeout_ms: float | None = None) -> bool:
        """Whether a message is ready, waiting up to `timeout_ms` (None: until one is)."""
        if self._ready:
            return True
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1e3
        while True:
            now = time.monotonic()
            remaining = None if deadline is None else max(0.0, deadline - now)
            spinning = time.perf_counter() - self._last_message_s < self.busy_poll_s
            self._pump(0.0 if spinning else remaining)
            if self._ready:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    @property
    def closed(self) -> bool:
        return self._listener.fileno() < 0

    def pump(self) -> bool:
        """Take in what has arrived, without waiting; whether a message is ready."""
        self._pump(0.0)
        return bool(self._ready)

    def drain(self) -> Iterator:
        """Every message ready now, without waiting."""
        self.pump()
        while self._ready:
            yield self._ready.popleft()

    def recv_pyobj(self):
        """The next message, waiting for it."""
        self.poll(None)
        return self._ready.popleft()

    def try_recv(self):
        """The next message if one is ready now, else `None`."""
        return self._ready.popleft() if self._ready or self.pump() else None

    def close(self) -> None:
        if self.closed:
            return
        for sock in list(self._buffers):
            self._drop(sock)
        self._selector.close()
        self._listener.close()

    # -- reading ------------------------------------------------------------------------------------
    def _pump(self, timeout_s: float | None) -> None:
        for key, _ in self._selector.select(timeout_s):
            if key.data is None:
                self._accept()
            else:
                self._read(key.fileobj)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self._buffers[sock] = bytearray()
            self._selector.register(sock, selectors.EVENT_READ, sock)
            self._read(sock)                               # what it sent before it was accepted

    def _read(self, sock: socket.socket) -> None:
        buf = self._buffers[sock]
        while True:
            try:
                data = sock.recv(READ_CHUNK_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionError:
                data = b""
            if not data:                                   # the sender closed: what it sent is kept
                self._parse(buf)
                self._drop(sock)
                return
            buf += data
            if len(data) < READ_CHUNK_BYTES:
                break
        self._parse(buf)

    def _parse(self, buf: bytearray) -> None:
        start, size = 0, len(buf)
        view = memoryview(buf)
        try:
            while size - start >= FRAME.size:
                (length,) = FRAME.unpack_from(view, start)
                end = start + FRAME.size + length
                if end > size:
                    break
                self._ready.append(pickle.loads(view[start + FRAME.size:end]))
                start = end
        finally:
            view.release()
        if start:
            del buf[:start]
            self._last_message_s = time.perf_counter()

    def _drop(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        del self._buffers[sock]
        sock.close()


class Outbox:
    """The sending end, to the Inbox at `path`. `send_pyobj` never blocks; `pending_bytes` is what the
    receiver has not taken yet, which `flush` (or the next send) retries. A receiver that went away makes
    later messages vanish (`dropped` counts them), as its process is gone."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._pending: deque[memoryview] = deque()
        self.pending_bytes = 0
        self.dropped = 0
        self._closed_by_peer = False
        self._connect()

    def fileno(self) -> int:
        """The socket's descriptor (-1 before the receiver was reached), for an event loop's `add_writer`."""
        return self._sock.fileno() if self._sock is not None else -1

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def send_pyobj(self, obj) -> None:
        if self._closed_by_peer:
            self.dropped += 1
            return
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._pending.append(memoryview(FRAME.pack(len(data))))
        self._pending.append(memoryview(data))
        self.pending_bytes += FRAME.size + len(data)
        self.flush()

    def flush(self) -> bool:
        """Write what the socket takes now; True when nothing is left."""
        if not self._pending:
            return True
        if self._sock is None and not self._connect():
            return False
        while self._pending:
            try:
                sent = self._sock.sendmsg(list(islice(self._pending, MAX_FRAMES_PER_SEND)))
            except (BlockingIOError, InterruptedError):
                return False
            except (BrokenPipeError, ConnectionResetError):
                self._peer_gone()
                return True
            self.pending_bytes -= sent
            while sent:
                head = self._pending[0]
                if sent >= len(head):
                    sent -= len(head)
                    self._pending.popleft()
                else:
                    self._pending[0] = head[sent:]
                    sent = 0
        return True

    def close(self, linger_ms: int = 1000) -> None:
        """Flush for up to `linger_ms`, then close."""
        deadline = time.monotonic() + linger_ms / 1e3
        while not self.flush() and time.monotonic() < deadline:
            if self._sock is not None:
                select.select([], [self._sock], [], max(0.0, deadline - time.monotonic()))
            else:
                time.sleep(0.005)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connect(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return False
        sock.setblocking(False)
        self._sock = sock
        return True

    def _peer_gone(self) -> None:
        self._closed_by_peer = True
        self.dropped += len(self._pending) // 2
        self._pending.clear()
        self.pending_bytes = 0


class AsyncInbox:
    """An Inbox on an asyncio loop: `await recv_pyobj()`. With `busy_poll_s` > 0 a task keeps the loop
    turning (its wait for events never sleeps) for that long after each message, so that neither the
    Inbox's messages nor the loop's other sockets (HTTP clients) wait for a wake-up."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future | None = None
        self._traffic = asyncio.Event()
        self._loop.add_reader(inbox.fileno(), self._on_readable)
        self._spinner = self._loop.create_task(self._spin()) if inbox.busy_poll_s > 0 else None

    async def recv_pyobj(self):
        while True:
            msg = self.inbox.try_recv()
            if msg is not None:
                self._traffic.set()
                return msg
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        if not self.inbox.closed:
            self._loop.remove_reader(self.inbox.fileno())
        if self._spinner is not None:
            self._spinner.cancel()
        self.inbox.close()

    def _on_readable(self) -> None:
        if self.inbox.pump() and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _spin(self) -> None:
        while True:
            await self._traffic.wait()
            self._traffic.clear()
            until = time.perf_counter() + self.inbox.busy_poll_s
            while time.perf_counter() < until:
                await asyncio.sleep(0)
                if self._traffic.is_set():
                    self._traffic.clear()
                    until = time.perf_counter() + self.inbox.busy_poll_s


class AsyncOutbox:
    """An Outbox on an asyncio loop: what the socket did not take is written when it becomes writable
    (or, before the receiver is reached, retried every `RETRY_S`)."""

    RETRY_S = 0.01

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self._loop = asyncio.get_running_loop()
        self._writer_fd = -1
        self._retry: asyncio.TimerHandle | None = None

    def send_pyobj(self, obj) -> None:
        self.outbox.send_pyobj(obj)
        if self.outbox.pending_bytes:
            self._arm()

    def close(self, linger_ms: int = 1000) -> None:
        self._disarm()
        self.outbox.close(linger_ms)

    def _arm(self) -> None:
        fd = self.outbox.fileno()
        if fd < 0:
            if self._retry is None:
                self._retry = self._loop.call_later(self.RETRY_S, self._on_writable)
        elif self._writer_fd != fd:
            self._loop.add_writer(fd, self._on_writable)
            self._writer_fd = fd

    def _disarm(self) -> None:
        if self._writer_fd >= 0:
            self._loop.remove_writer(self._writer_fd)
            self._writer_fd = -1
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def _on_writable(self) -> None:
        self._retry = None
        if self.outbox.flush():
            self._disarm()
        else:
            self._arm()
