"""Where a real-time driver's requests come from and where their tokens go: a workload replay
or an online front end (HTTP). The driver loop is the same for both; only the source differs.

Torch-free; no clock: every time is handed in by the driver.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

from runtime.core.request import Request, RequestSpec


class RequestSource(Protocol):
    """The driver calls, once per loop iteration: `poll` (new requests), `aborted_rids`, then after
    each step's results `on_tokens` / `on_finished`; when it has nothing to run, `wait`; it stops
    once `exhausted()` is true and the scheduler has no work left."""

    def poll(self, now_s: float) -> list[Request]:
        """Requests that have arrived by `now_s` and were not handed out yet (never blocks)."""
        ...

    def aborted_rids(self) -> list[str]:
        """Request ids whose clients gave up since the last call (never blocks)."""
        ...

    def wait(self, now_s: float, timeout_s: float | None) -> None:
        """The driver is idle: block until a request may have arrived, at most `timeout_s`
        (None: as long as needed)."""
        ...

    def exhausted(self) -> bool:
        """No request will ever arrive again (replay: all handed out; online: shutting down)."""
        ...

    def on_tokens(self, requests: list[Request], now_s: float) -> None:
        """These requests received new output tokens (streaming); called after every step."""
        ...

    def on_finished(self, requests: list[Request], now_s: float) -> None:
        """These requests ended (finished, aborted or rejected); called once per request."""
        ...


def at_time_zero(specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    """The same requests, all arriving at t=0 (offline throughput runs)."""
    return [dataclasses.replace(s, arrival_s=0.0) for s in specs]


class ReplaySource:
    """Replays workload specs on their arrival times (or all at t=0 when `all_at_once`)."""

    def __init__(self, specs: Sequence[RequestSpec], all_at_once: bool = False,
                 sleep=None) -> None:
        specs = sorted(specs, key=lambda s: (s.arrival_s, s.rid))
        if all_at_once:
            specs = at_time_zero(specs)
        self.specs = specs
        self.next_idx = 0
        self._sleep = sleep

    def poll(self, now_s: float) -> list[Request]:
        start = self.next_idx
        while self.next_idx < len(self.specs) and self.specs[self.next_idx].arrival_s <= now_s:
            self.next_idx += 1
        return [Request.from_spec(s) for s in self.specs[start:self.next_idx]]

    def aborted_rids(self) -> list[str]:
        return []

    def wait(self, now_s: float, timeout_s: float | None) -> None:
        if self.next_idx >= len(self.specs):
            return
        delay = self.specs[self.next_idx].arrival_s - now_s
        if timeout_s is not None:
            delay = min(delay, timeout_s)
        if delay > 0 and self._sleep is not None:
            self._sleep(delay)

    def exhausted(self) -> bool:
        return self.next_idx >= len(self.specs)

    def on_tokens(self, requests: list[Request], now_s: float) -> None:
        pass

    def on_finished(self, requests: list[Request], now_s: float) -> None:
        pass
