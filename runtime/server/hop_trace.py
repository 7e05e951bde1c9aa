"""Per-output hop timestamps for the delivery-lag probe (experiments/serving_hops.py): off unless the
environment names a directory in TWINSERVE_HOP_TRACE; then every server process writes its own CSV of
(hop, rid, token_index, num_tokens, t_s) rows, t_s on time.perf_counter(). Standard library only.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from contextvars import ContextVar

ENV_VAR = "TWINSERVE_HOP_TRACE"
FLUSH_ROWS = 8192
HEADER = "hop,rid,token_index,num_tokens,t_s\n"
REQUEST_ENTRY_S: ContextVar[float | None] = ContextVar("twinserve_request_entry_s", default=None)


class EntryMark:
    """An ASGI app in front of `app` that notes when each HTTP request entered the application (uvicorn has
    parsed its headers; routing, body and validation come after) in REQUEST_ENTRY_S, which the handler's
    task inherits: the tokenizer manager marks it as hop `http_entry` once the request has its rid."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            REQUEST_ENTRY_S.set(time.perf_counter())
        await self.app(scope, receive, send)


class HopTrace:
    """Rows of one process. An output's `token_index` is the index of its first token in its request,
    counted here per hop (every process sees each request's outputs in order); an intake mark has -1."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._rows: list[str] = []
        self._num_tokens: dict[tuple[str, str], int] = {}     # (hop, rid) -> tokens marked so far
        with open(path, "w") as f:
            f.write(HEADER)

    @classmethod
    def from_env(cls, process: str) -> HopTrace | None:
        """A trace for this process when TWINSERVE_HOP_TRACE is set, else None (tracing off)."""
        directory = os.environ.get(ENV_VAR)
        if not directory:
            return None
        os.makedirs(directory, exist_ok=True)
        return cls(os.path.join(directory, f"{process}-{os.getpid()}.csv"))

    def mark(self, hop: str, rid: str, t_s: float) -> None:
        """An intake hop of one request (no token)."""
        self._add(f"{hop},{rid},-1,0,{t_s:.9f}\n")

    def mark_outputs(self, hop: str, outputs: Iterable, t_s: float) -> None:
        """Outputs (anything with `rid`, `token_ids`, `finish`) passing `hop` at `t_s`."""
        for out in outputs:
            index = self._count(hop, out)
            self._add(f"{hop},{out.rid},{index},{len(out.token_ids)},{t_s:.9f}\n")

    def count_outputs(self, hop: str, outputs: Iterable) -> None:
        """Outputs that pass `hop` elsewhere (first outputs their worker had straight from the scheduler):
        counted, so that later outputs' token indices stay right, without a row."""
        for out in outputs:
            self._count(hop, out)

    def _count(self, hop: str, out) -> int:
        """The index of `out`'s first token in its request at `hop`; counts its tokens (forgets the request
        at its finish)."""
        key = (hop, out.rid)
        index = self._num_tokens.get(key, 0)
        if out.finish is not None:
            self._num_tokens.pop(key, None)
        else:
            self._num_tokens[key] = index + len(out.token_ids)
        return index

    def _add(self, row: str) -> None:
        self._rows.append(row)
        if len(self._rows) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            with open(self.path, "a") as f:
                f.writelines(self._rows)
            self._rows = []
