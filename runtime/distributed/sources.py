"""Request sources of a TP leader in a multi-process run (runtime.request_source.RequestSource):
`InboxSource`, a DP replica's requests as the router in the launching process sends them, and
`KeepAliveSource`, which wakes an idle leader now and then to tell the rest of its TP group it lives.

Torch-free; no clock of its own: times come from the driver.
"""
from __future__ import annotations

import queue
from typing import Callable

from runtime.core.request import Request, RequestSpec
from runtime.request_source import RequestSource

END = "end"        # the router has sent this replica its last request
GO = "go"          # every replica is ready: start the clock


class InboxSource:
    """Requests routed to `replica` arrive in `inbox` (a multiprocessing queue) as RequestSpecs, then
    END; each request that leaves the replica is reported back through `report(replica, count)`, the
    router's load signal (sglang-router sees responses end)."""

    def __init__(self, inbox, replica: int, report: Callable[[int, int], None]) -> None:
        self.inbox, self.replica, self.report = inbox, replica, report
        self._pending: list[RequestSpec] = []
        self._ended = False

    def _take(self, message: object) -> None:
        if message == END:
            self._ended = True
        elif isinstance(message, RequestSpec):
            self._pending.append(message)
        else:
            raise RuntimeError(f"replica {self.replica}: unexpected router message {message!r}")

    def poll(self, now_s: float) -> list[Request]:
        while True:
            try:
                self._take(self.inbox.get_nowait())
            except queue.Empty:
                break
        taken, self._pending = self._pending, []
        return [Request.from_spec(spec) for spec in taken]

    def aborted_rids(self) -> list[str]:
        return []

    def wait(self, now_s: float, timeout_s: float | None) -> None:
        if self._pending or self._ended:
            return
        try:
            self._take(self.inbox.get(timeout=timeout_s))
        except queue.Empty:
            pass

    def exhausted(self) -> bool:
        return self._ended and not self._pending

    def on_tokens(self, requests: list[Request], now_s: float) -> None:
        pass

    def on_finished(self, requests: list[Request], now_s: float) -> None:
        if requests:
            self.report(self.replica, len(requests))


class KeepAliveSource:
    """Wraps a source: an idle wait never blocks longer than `interval_s`, and each one ends with
    `ping()` (the leader's KEEPALIVE to its group, whose ranks block in the step broadcast)."""

    def __init__(self, source: RequestSource, ping: Callable[[], None], interval_s: float) -> None:
        self.source, self.ping, self.interval_s = source, ping, interval_s

    def poll(self, now_s: float) -> list[Request]:
        return self.source.poll(now_s)

    def aborted_rids(self) -> list[str]:
        return self.source.aborted_rids()

    def wait(self, now_s: float, timeout_s: float | None) -> None:
        self.source.wait(now_s, self.interval_s if timeout_s is None else min(timeout_s, self.interval_s))
        self.ping()

    def exhausted(self) -> bool:
        return self.source.exhausted()

    def on_tokens(self, requests: list[Request], now_s: float) -> None:
        self.source.on_tokens(requests, now_s)

    def on_finished(self, requests: list[Request], now_s: float) -> None:
        self.source.on_finished(requests, now_s)
