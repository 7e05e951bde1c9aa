"""Start this node's ranks (one process per GPU, or per CPU rank), watch them, stop them. The
launching process is their watchdog: it reads the ranks' messages and polls their exit codes, and
a rank that dies (signal, non-zero exit) or reports an error ends the whole run with RankFailed
naming it, after every other rank was terminated. Ranks also die with the launcher (worker.py), so
no path leaves an orphan. Torch-free: it only spawns.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.distributed.errors import RankFailed
from runtime.distributed.worker import RankTask, rank_main

POLL_S = 0.05            # how often exit codes are checked while no message arrives
SETTLE_S = 0.5           # after a first death, how long to wait for the others' reports
STOP_GRACE_S = 5.0       # terminate -> kill


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class _Rank:
    task: RankTask
    process: Any
    done: bool = False
    error: tuple | None = None      # (type name, message, traceback, user error?)


@dataclass
class RankProcesses:
    """The ranks of one node. `messages()` yields what they report; it raises RankFailed as soon as
    one of them dies or fails (after stopping all of them)."""

    tasks: list[RankTask]
    out_queue: Any
    context: Any = field(default_factory=lambda: mp.get_context("spawn"))
    ranks: dict[int, _Rank] = field(default_factory=dict)
    _buffer: list = field(default_factory=list)

    def start(self) -> None:
        for task in self.tasks:
            process = self.context.Process(target=rank_main, args=(task,), name=f"twinserve-rank{task.info.rank}",
                                           daemon=True)
            process.start()
            self.ranks[task.info.rank] = _Rank(task, process)

    def push_back(self, messages: list[tuple]) -> None:
        """Messages read early (while waiting for others), returned first by next_message."""
        self._buffer[:0] = messages

    @property
    def pids(self) -> dict[int, int]:
        return {rank: r.process.pid for rank, r in self.ranks.items()}

    def next_message(self, timeout_s: float | None) -> tuple | None:
        """The next ("ready" | "finished" | "done", ...) message within timeout_s (None: wait for one);
        None when the time ran out. Raises RankFailed when a rank died or reported an error."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._buffer:
                return self._buffer.pop(0)
            step = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            message = self._get(step)
            if message is not None:
                return message
            dead = [rank for rank, r in self.ranks.items() if r.process.exitcode is not None and not r.done]
            if dead:
                self._settle()            # its last messages may still be in flight
                dead = [rank for rank in dead if not self.ranks[rank].done]
                if dead:
                    self._fail(dead[0])
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _get(self, timeout_s: float) -> tuple | None:
        try:
            message = self.out_queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        kind, rank = message[0], message[1]
        if kind == "error":
            self.ranks[rank].error = message[2]
            self._settle()
            self._fail(rank)
        if kind == "done":
            self.ranks[rank].done = True
        return message

    def _settle(self) -> None:
        """Read what arrives for a moment (the other ranks' reports after a failure) into the buffer."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            try:
                message = self.out_queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if message[0] == "error":
                self.ranks[message[1]].error = message[2]
            elif message[0] == "done":
                self.ranks[message[1]].done = True
            self._buffer.append(message)

    def _fail(self, first: int) -> None:
        """Stop every rank and raise naming the culprit: a rank killed by a signal first (the others
        then fail in their collectives), else `first`. A rank's configuration/input error (ValueError,
        FileNotFoundError) is re-raised as ValueError with its own one-line message."""
        codes = {rank: r.process.exitcode for rank, r in self.ranks.items()}
        signalled = [rank for rank, code in codes.items() if code is not None and code < 0]
        culprit = signalled[0] if signalled else first
        self.stop()
        error = self.ranks[culprit].error
        if error is not None and error[3]:
            raise ValueError(error[1])
        if error is not None:           # a bug: its traceback, from the rank that raised it
            print(f"rank {culprit} traceback:\n{error[2]}", file=sys.stderr)
        raise RankFailed(self._message(culprit, codes), culprit)

    def _message(self, culprit: int, codes: dict[int, int | None]) -> str:
        r = self.ranks[culprit]
        info = r.task.info
        where = f"rank {culprit} of {info.world_size} (pid {r.process.pid}, {info.describe()})"
        if r.error is not None:
            what = f"failed: {r.error[0]}: {r.error[1].splitlines()[0] if r.error[1] else ''}"
        else:
            what = describe_exit(codes[culprit])
        others = [rank for rank in self.ranks if rank != culprit]
        return f"{where} {what}; the run stopped and ranks {others} were terminated"

    def stop(self) -> None:
        """Terminate every rank still alive (SIGTERM, then SIGKILL after a grace period) and reap all."""
        alive = [r.process for r in self.ranks.values() if r.process.is_alive()]
        for process in alive:
            process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for process in alive:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in alive:
            if process.is_alive():
                process.kill()
                process.join()
        for r in self.ranks.values():
            r.process.join(timeout=0)

    def join(self, timeout_s: float = 60.0) -> None:
        """After every rank reported "done": wait for them to exit, stop any that hangs."""
        deadline = time.monotonic() + timeout_s
        for r in self.ranks.values():
            r.process.join(max(0.0, deadline - time.monotonic()))
        self.stop()
