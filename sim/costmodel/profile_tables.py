"""Where measured profiles live and how the profiled cost model reads them: the tables written by
`python run.py mode=profile` under sim/profiles/<hardware>/<model>/, as piecewise-linear interpolants
(monotone between grid points: never above or below the two measurements around a query). Torch-free.

Each lookup returns (seconds, inside): `inside` is False where the query lies past the measured grid
(the caller then falls back to the roofline).
"""
from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from runtime.core.graph_grids import capture_batch_sizes  # noqa: F401 (profiled.py reads it from here)

PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
_EDGE = 1.0 + 1e-9


def profile_dir(hardware_name: str, model_name: str) -> Path:
    """sim/profiles/<hardware>/<model>/ (it may not exist)."""
    return PROFILES_DIR / hardware_name / model_name


def prefill_piecewise_limit(directory: Path) -> int | None:
    """The piecewise graphs' token limit the profile's prefill table was measured under (meta.json: the
    latest run that measured prefill), or None where the profile does not record it. 0: no piecewise graphs."""
    meta = Path(directory) / "meta.json"
    if not meta.exists():
        return None
    runs = json.loads(meta.read_text()).get("runs") or []
    for run in reversed(runs):
        if "prefill" in (run.get("sections") or ["prefill"]):
            limit = run.get("piecewise_max_tokens")
            return None if limit is None else int(limit)
    return None


def has_profile(directory: Path) -> bool:
    return (Path(directory) / "decode.csv").exists() and (Path(directory) / "prefill.csv").exists()


class Curve:
    """y(x) through measured points: linear between them, flat below the first, linear (last segment's
    slope, never decreasing below the last value) above the last, where `inside` turns False."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        order = np.argsort(np.asarray(xs, dtype=np.float64))
        self.xs = np.asarray(xs, dtype=np.float64)[order]
        self.ys = np.asarray(ys, dtype=np.float64)[order]
        if len(self.xs) == 0:
            raise ValueError("a curve needs at least one point")
        self.slope = (self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2]) if len(self.xs) > 1 else 0.0
        # a scalar query in plain floats (numpy's per-call overhead dominates one point); the same
        # arithmetic as np.interp, so the same floats. Repeated xs keep numpy's tie rules: no lists.
        distinct = len(self.xs) < 2 or bool((np.diff(self.xs) > 0).all())
        self._xs: list[float] | None = self.xs.tolist() if distinct else None
        self._ys: list[float] = self.ys.tolist()

    @property
    def max_x(self) -> float:
        return float(self.xs[-1])

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        if type(x) in (float, int, np.float64) and self._xs is not None:
            return np.float64(self._at(float(x)))
        x = np.asarray(x, dtype=np.float64)
        y = np.interp(x, self.xs, self.ys)
        above = x > self.xs[-1]
        if above.any():
            y = np.where(above, self.ys[-1] + max(self.slope, 0.0) * (x - self.xs[-1]), y)
        return y


    def at(self, x: float) -> float:
        """float(self(x)) for one number, without numpy's per-call overhead where the points allow."""
        if self._xs is not None:
            return self._at(float(x))
        return float(self(x))

    def _at(self, x: float) -> float:
        """__call__ at one point, as np.interp computes it (slope of the segment, from its left end)."""
        xs, ys = self._xs, self._ys
        if x != x:
            return x
        if x > xs[-1]:
            return ys[-1] + max(self.slope, 0.0) * (x - xs[-1])
        if x >= xs[-1]:
            return ys[-1]
        if x < xs[0]:
            return ys[0]
        j = bisect.bisect_right(xs, x) - 1                  # xs[j] <= x < xs[j + 1]
        if xs[j] == x:
            return ys[j]
        slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
        y = slope * (x - xs[j]) + ys[j]
        if y != y:                                          # numpy's retry from the right end
            y = slope * (x - xs[j + 1]) + ys[j + 1]
            if y != y and ys[j] == ys[j + 1]:
                y = ys[j]
        return y


def lerp_rows(keys: Sequence[float], key: float, value: Callable[[int], np.ndarray]) -> np.ndarray | None:
    """Linear interpolation in `key` between the two rows around it (keys sorted ascending);
    value(i) is row i's answer. None when `key` lies outside [keys[0], keys[-1]]."""
    if key < keys[0] / _EDGE or key > keys[-1] * _EDGE:
        return None
    hi = min(bisect.bisect_left(keys, key), len(keys) - 1)
    if keys[hi] == key or hi == 0:
        return value(hi)
    lo = hi - 1
    w = (key - keys[lo]) / (keys[hi] - keys[lo])
    return (1 - w) * value(lo) + w * value(hi)


class DecodeTable:
    """Decode steps of one path (graph or eager): per measured batch size, time over context per request."""

    def __init__(self, rows: pd.DataFrame) -> None:
        self.batches = sorted(int(b) for b in rows["batch_size"].unique())
        self.curves = [Curve(g["context_tokens"], g["device_s"])
                       for _, g in sorted(rows.groupby("batch_size"), key=lambda kv: kv[0])]

    def __bool__(self) -> bool:
        return bool(self.batches)

    def lookup(self, batch: int, total_context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Times [n] of decode steps of `batch` requests attending total_context[n] KV tokens, and
        which lie inside the grid (the smaller neighbouring batch measured that context)."""
        ctx = np.asarray(total_context, dtype=np.float64) / max(batch, 1)
        out = lerp_rows(self.batches, batch, lambda i: self.curves[i](ctx))
        if out is None:
            return np.full(ctx.shape, np.nan), np.zeros(ctx.shape, dtype=bool)
        lo = max(0, bisect.bisect_right(self.batches, batch) - 1)
        return out, ctx <= self.curves[lo].max_x * _EDGE

    def min_context_per_request(self) -> float:
        """The shortest context per request the table measured (its smallest batch's first point)."""
        return float(self.curves[0].xs[0])

    def edge(self, batch: int, total_context: float) -> tuple[int, float]:
        """The nearest (batch, total context) inside the grid."""
        b = min(max(batch, self.batches[0]), self.batches[-1])
        lo = max(0, bisect.bisect_right(self.batches, b) - 1)
        return b, min(total_context / max(batch, 1), self.curves[lo].max_x) * b


class PrefillColumns:
    """Prefill steps of one sequence: per measured cached prefix, time over new tokens. With `form`,
    only columns of that MLA form (MHA or absorbed) serve a query.

    Two launch regimes, as the runtime has them: steps of up to the piecewise graphs' largest token count
    replay graphs, larger ones launch every kernel eagerly (far more host work: a launch-bound step
    whose time hardly moves with its tokens). `split_tokens` (the limit the profile was measured under)
    puts each measured point in its regime, and `query_limit` (the runtime's limit) says which regime a
    query belongs to. Past the limit a step is priced from the eager points: between the limit and the
    first eager point, on the line from the graph-replayed step at the limit (where the profile measured
    one; its device time alone plus the first eager point's launch-bound share, `eager_edge_rows`) to that
    point -- a step just past the limit does the same device work as one at it and pays the eager launch,
    while the first eager point may lie a thousand tokens or more above; without a point at the limit the
    eager curve stays flat below its first point. Below the limit, graph-replayed points only. A query of a regime the
    profile did not measure at its token count is outside the grid. `split_tokens` None or 0: one regime
    (profiles without the limit recorded, or measured without piecewise graphs: every point is what such
    a profile prices); `query_limit=None`: the runtime's limit is the profile's."""

    def __init__(self, rows: pd.DataFrame, split_tokens: int | None = None, query_limit: int | None = None) -> None:
        self.prefixes = sorted(int(p) for p in rows["prefix_tokens"].unique())
        self.max_tokens = float(rows["new_tokens"].max())
        self.split = split_tokens or None
        self.query_limit = self.split if query_limit is None else query_limit
        self.min_tokens = float(rows["new_tokens"].min())
        every = _column_curves(rows)
        self.curves = self.eager_curves = every
        if self.split is not None:      # a column without points in a regime keeps its curve through every point
            self.curves = {**every, **_column_curves(rows[rows["new_tokens"] <= self.split])}
            eager = rows[rows["new_tokens"] > self.split]
            at_limit = rows[(rows["new_tokens"] == self.split) & rows["prefix_tokens"].isin(eager["prefix_tokens"])]
            self.eager_curves = {**every, **_column_curves(pd.concat([eager_edge_rows(at_limit, eager), eager]))}

    def lookup(self, tokens: float, prefix: float, prefixes: list[int]) -> tuple[float, bool]:
        """Time at (tokens, equivalent prefix) among `prefixes` columns of the query's regime; below the
        first column, the first two columns' slope carries it down (a step with fewer attention pairs than
        any measured), to at most half the first column's time."""
        inside = tokens <= self.max_tokens * _EDGE and prefix <= prefixes[-1] * _EDGE
        curves = self.curves
        if self.split is not None:
            eager = self.runs_eagerly(tokens)
            curves = self.eager_curves if eager else self.curves
            # the profile measured this token count in the other regime
            inside = inside and (tokens > self.split if eager else tokens <= self.split * _EDGE)
        at = lambda i: curves[prefixes[i]].at(tokens)   # noqa: E731
        if prefix >= prefixes[0] or len(prefixes) == 1:
            value = lerp_rows(prefixes, min(max(prefix, prefixes[0]), prefixes[-1]), at)
            return float(value), inside
        slope = (at(1) - at(0)) / (prefixes[1] - prefixes[0])
        return max(at(0) - max(slope, 0.0) * (prefixes[0] - prefix), 0.5 * at(0)), inside

    def runs_eagerly(self, tokens: float) -> bool:
        """Whether the runtime launches a step of `tokens` new tokens eagerly (past its piecewise limit)."""
        return self.query_limit is not None and tokens > self.query_limit

    def edge_tokens(self, tokens: float) -> float:
        """The nearest token count that the query's regime measured (the grid's edge for a fallback)."""
        if self.split is None:
            return min(tokens, self.max_tokens)
        if self.runs_eagerly(tokens):
            return min(max(tokens, self.split + 1), self.max_tokens)
        return max(min(tokens, self.split, self.max_tokens), self.min_tokens)


def eager_edge_rows(at_limit: pd.DataFrame, eager: pd.DataFrame) -> pd.DataFrame:
    """The graph-replayed points at the piecewise limit re-stated as the start of the eager curve above them: each
    one's device time alone plus the launch-bound share (back to back minus alone) of the first eager point of its
    column. A step just past the limit does the device work of one at it but pays the eager launch, a cost that
    hardly moves with the tokens (1-2 ms at 3,072 tokens on one H200, where the kernels outlast the launch; 44 ms
    at tp=2, where the eager launch waits on the device). Points without `device_alone_s` stay as measured."""
    if "device_alone_s" not in at_limit or at_limit.empty:
        return at_limit
    at_limit = at_limit.copy()
    for index, row in at_limit.iterrows():
        column = eager[eager["prefix_tokens"] == row["prefix_tokens"]].sort_values("new_tokens")
        if column.empty or pd.isna(row["device_alone_s"]) or pd.isna(column["device_alone_s"].iloc[0]):
            continue
        share = max(float(column["device_s"].iloc[0] - column["device_alone_s"].iloc[0]), 0.0)
        at_limit.loc[index, "device_s"] = float(row["device_alone_s"]) + share
    return at_limit


def _column_curves(rows: pd.DataFrame) -> dict[int, Curve]:
    """Per prefix column of `rows`, its time over new tokens."""
    return {int(p): Curve(g["new_tokens"], g["device_s"]) for p, g in rows.groupby("prefix_tokens")}
