"""Stop strings over a stream of text deltas: emit text up to (not including) the first stop string,
holding back any tail that could still become one. Pure Python; used on both sides of the
server (the scheduler ends the request, the detokenizer trims the text) with identical results.
"""
from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """`feed(delta)` returns the text that is safe to emit; once a stop string appeared, `matched`
    is that string and nothing more is emitted (`keep_stop`: the stop string itself is emitted too,
    SGLang's no_stop_trim). `flush()` releases the held-back tail at the end."""

    def __init__(self, stops: Sequence[str], keep_stop: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        self.stops = tuple(stops)
        self.keep_stop = keep_stop
        self.matched: str | None = None
        self._held = ""

    def feed(self, delta: str) -> str:
        if self.matched is not None or not delta:
            return ""
        text = self._held + delta
        hits = [(text.find(s), i) for i, s in enumerate(self.stops) if s in text]
        if hits:
            pos, i = min(hits)
            self.matched, self._held = self.stops[i], ""
            return text[:pos + len(self.matched)] if self.keep_stop else text[:pos]
        keep = max((self._prefix_tail(text, s) for s in self.stops), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

    @staticmethod
    def _prefix_tail(text: str, stop: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                return k
        return 0
