"""The launch column of a profile's host table: how long `ModelRunner.launch` keeps the host (batch build,
attention plan, graph replays, eager kernels) per step, measured with the device idle, so a launch that
waits for an earlier step is not in it. Under overlap scheduling the next step is planned only after it.
Torch-free (pandas).

Decode steps (one graph replay, or eager past the graph limit): interpolated over batch size. Steps with
extends, in the two regimes the runtime launches them: up to the piecewise graphs' largest token count the
pieces with eager attention cores between them, beyond it every kernel eagerly (far more host work);
each regime interpolated over new tokens, averaged over the request counts measured at each.
"""
from __future__ import annotations

import pandas as pd

from sim.costmodel.profile_tables import Curve


class LaunchTable:
    """From host.csv rows with a `launch_s` column; `piecewise_max_tokens` (None or 0: no piecewise graphs)
    splits the extend rows into their two regimes. A regime without rows borrows the other's."""

    def __init__(self, rows: pd.DataFrame, piecewise_max_tokens: int | None) -> None:
        decode = rows["kind"] == "decode"
        self.decode = _curve(rows[decode], "num_reqs")
        extend = rows[~decode]
        limit = piecewise_max_tokens or 0
        self.limit = limit
        self.piecewise = _curve(extend[extend["new_tokens"] <= limit], "new_tokens")
        self.eager = _curve(extend[extend["new_tokens"] > limit], "new_tokens")
        if self.piecewise is None:
            self.piecewise = self.eager
        if self.eager is None:
            self.eager = self.piecewise

    def launch_s(self, num_extends: int, extend_tokens: int, num_decodes: int) -> float:
        """Seconds of host a step's launch takes: decodes only, or extends (a mixed step's decodes counted
        as one new token each, as the runtime runs them)."""
        if num_extends == 0:
            return float(self.decode(num_decodes)) if self.decode is not None and num_decodes else 0.0
        tokens = extend_tokens + num_decodes
        curve = self.piecewise if tokens <= self.limit else self.eager
        return float(curve(tokens)) if curve is not None else 0.0


def _curve(rows: pd.DataFrame, x: str) -> Curve | None:
    if rows.empty:
        return None
    mean = rows.groupby(x)["launch_s"].mean()
    return Curve(mean.index.to_numpy(dtype=float), mean.to_numpy(dtype=float))
