"""Per-output hop timestamps for the delivery-lag probe (experiments/serving_hops.py): off unless the
environment names a directory in TWINSERVE_HOP_TRACE; then every server process writes its own CSV of
(hop, rid, token_index, num_tokens, t_s) rows, t_s on time.perf_counter(). Standard library only.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

ENV_VAR = "TWINSERVE_HOP_TRACE"
FLUSH_ROWS = 8192
HEADER = "hop,rid,token_index,num_tokens,t_s\n"


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
            key = (hop, out.rid)
            index = self._num_tokens.get(key, 0)
            n = len(out.token_ids)
            if out.finish is not None:
                self._num_tokens.pop(key, None)
            else:
                self._num_tokens[key] = index + n
            self._add(f"{hop},{out.rid},{index},{n},{t_s:.9f}\n")

    def _add(self, row: str) -> None:
        self._rows.append(row)
        if len(self._rows) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            with open(self.path, "a") as f:
                f.writelines(self._rows)
            self._rows = []
