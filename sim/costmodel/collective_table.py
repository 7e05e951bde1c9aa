"""Measured collective latencies (a CSV written by experiments/bench_collectives.py) as a
CollectiveCost, falling back to the alpha-beta model where the table has no row; and the
builder that picks them for a hardware.

Torch-free, no clock. Columns: collective, num_ranks, size_bytes, graph (0/1), time_s.
"""
from __future__ import annotations

import bisect
import csv
import re
from collections.abc import Sequence
from pathlib import Path

from runtime.core.hardware import HardwareSpec
from sim.costmodel.collectives import COLLECTIVES, AlphaBetaCollectives, CollectiveCost

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ("collective", "num_ranks", "size_bytes", "graph", "time_s")


def find_collective_tables(hardware_name: str, root: Path = ROOT) -> list[Path]:
    """Every measured table of this hardware, in precedence order: sim/profiles/<hw>/collectives.csv,
    experiments/results/<hw>/collectives.csv, then experiments/results/<hw>x<N>/collectives.csv (a run
    on N GPUs of one host), N ascending. Tables are keyed by group size, so each adds the sizes it has."""
    paths = [root / "sim" / "profiles" / hardware_name / "collectives.csv",
             root / "experiments" / "results" / hardware_name / "collectives.csv"]
    results = root / "experiments" / "results"
    pattern = re.compile(re.escape(hardware_name) + r"x(\d+)")
    hosts = [(int(m.group(1)), d) for d in (results.iterdir() if results.is_dir() else ())
             if (m := pattern.fullmatch(d.name))]
    paths += [d / "collectives.csv" for _, d in sorted(hosts)]
    return [p for p in paths if p.exists()]


def find_collective_table(hardware_name: str, root: Path = ROOT) -> Path | None:
    """The first of find_collective_tables, else None."""
    tables = find_collective_tables(hardware_name, root)
    return tables[0] if tables else None


def read_rows(path: str | Path) -> list[tuple[str, int, float, bool, float]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}; expected {COLUMNS}")
        return [(r["collective"], int(r["num_ranks"]), float(r["size_bytes"]),
                 r["graph"].strip().lower() in ("1", "true"), float(r["time_s"])) for r in reader]


class MeasuredCollectives:
    """Per (collective, num_ranks, graph): piecewise-linear in size between measured sizes (exact
    for an affine latency + bytes/bandwidth curve); below the smallest size its time (the latency
    floor), above the largest the last segment's slope (the bandwidth, never negative) carries
    on; a single measured size grows as the fallback does. Any other
    (collective, num_ranks, graph) goes to `fallback`."""

    def __init__(self, rows: list[tuple[str, int, float, bool, float]], fallback: CollectiveCost,
                 source: str = "") -> None:
        self.fallback = fallback
        self.source = source
        points: dict[tuple[str, int, bool], dict[float, float]] = {}
        for op, n, size, graph, t in rows:
            if op not in COLLECTIVES:
                raise ValueError(f"{source}: unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
            if size < 0 or t <= 0 or n < 1:
                raise ValueError(f"{source}: bad row {(op, n, size, graph, t)}")
            points.setdefault((op, int(n), bool(graph)), {})[float(size)] = float(t)
        self._curves = {key: (sorted(p), [p[s] for s in sorted(p)]) for key, p in points.items()}

    @classmethod
    def from_csv(cls, path: str | Path, fallback: CollectiveCost) -> "MeasuredCollectives":
        return cls(read_rows(path), fallback, source=str(path))

    @classmethod
    def from_csvs(cls, paths: list[Path], fallback: CollectiveCost) -> "MeasuredCollectives":
        """Several tables as one: each (collective, num_ranks, graph) curve comes whole from the
        first table that has it."""
        rows, taken = [], set()
        for path in paths:
            own = read_rows(path)
            rows += [r for r in own if (r[0], r[1], r[3]) not in taken]
            taken |= {(r[0], r[1], r[3]) for r in own}
        return cls(rows, fallback, source=", ".join(map(str, paths)))

    def covers(self, op: str, num_ranks: int, graph: bool) -> bool:
        return (op, num_ranks, graph) in self._curves

    def time_s(self, op: str, size_bytes: float, num_ranks: int, graph: bool) -> float:
        if num_ranks <= 1:
            return 0.0
        curve = self._curves.get((op, num_ranks, graph))
        if curve is None:
            return self.fallback.time_s(op, size_bytes, num_ranks, graph)
        sizes, times = curve
        if size_bytes <= sizes[0]:
            return times[0]
        if len(sizes) == 1:           # one point: the fallback's growth from there
            grow = self.fallback.time_s(op, size_bytes, num_ranks, graph)
            return times[0] + grow - self.fallback.time_s(op, sizes[0], num_ranks, graph)
        if size_bytes >= sizes[-1]:
            slope = max(0.0, (times[-1] - times[-2]) / (sizes[-1] - sizes[-2]))
            return times[-1] + slope * (size_bytes - sizes[-1])
        i = bisect.bisect_left(sizes, size_bytes)
        s0, s1, t0, t1 = sizes[i - 1], sizes[i], times[i - 1], times[i]
        return t0 + (t1 - t0) * (size_bytes - s0) / (s1 - s0)


def build_collectives(hardware: HardwareSpec, comm_efficiency: float,
                      inter_node_bandwidth_bytes_per_s: float, graph_latency_s: float,
                      eager_latency_s: float, per_rank_latency_s: float,
                      inter_node_latency_s: float, table: str | Sequence[str] | None = "auto",
                      root: Path = ROOT) -> CollectiveCost:
    """The alpha-beta model for `hardware` (intra-node bus bandwidth = NVLink * comm_efficiency),
    under the measured tables when there are any: `table` = "auto" (find_collective_tables, merged),
    a CSV path, a list of those (merged in that order: a curve comes from the first that has it),
    or None (alpha-beta only)."""
    if not 0 < comm_efficiency <= 1:
        raise ValueError(f"comm_efficiency must be in (0, 1], got {comm_efficiency}")
    alpha_beta = AlphaBetaCollectives(
        intra_node_bandwidth_bytes_per_s=hardware.nvlink_bandwidth_bytes_per_s * comm_efficiency,
        inter_node_bandwidth_bytes_per_s=inter_node_bandwidth_bytes_per_s,
        gpus_per_node=hardware.num_gpus_per_node, graph_latency_s=graph_latency_s,
        eager_latency_s=eager_latency_s, per_rank_latency_s=per_rank_latency_s,
        inter_node_latency_s=inter_node_latency_s)
    if table is None:
        return alpha_beta
    paths: list[Path] = []
    for entry in ([table] if isinstance(table, str) else table):
        paths += find_collective_tables(hardware.name, root) if entry == "auto" else [Path(entry)]
    return MeasuredCollectives.from_csvs(paths, alpha_beta) if paths else alpha_beta
