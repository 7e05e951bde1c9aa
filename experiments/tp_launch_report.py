"""Leader and follower side by side for every served step of a tp > 1 fidelity run made with
TWINSERVE_LAUNCH_PARTS=1: the leader's launch, its hand-off (send), and the other rank's wait before the step
(recv), its own launch of it (run) and how long after the leader it began. Answers whether a leader's launch waits
on its peer. Torch-free.

  python -m experiments.tp_launch_report REAL_DIR [--rank 1]     # REAL_DIR: fidelity_runs --real --out
Writes REAL_DIR/tp_launch_report.csv (one row per step) and prints medians per step kind and size.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.fidelity_runs import FOLLOWER_TIMES_FILE
from experiments.launch_timer import LAUNCH_TIMES_FILE

SIZE_BINS = [0, 16, 64, 256, 1024, 4096, 1 << 20]


def leader_launches(real_dir: Path) -> pd.DataFrame:
    """Every workload's launches (launch_times.parquet with its parts, joined to its steps), in the order they ran,
    with each launch's start on the host clock (start_perf_s)."""
    frames = []
    for launches_file in sorted(real_dir.glob(f"*/{LAUNCH_TIMES_FILE}")):
        launches = pd.read_parquet(launches_file)
        if "clock_origin_s" not in launches:
            raise ValueError(f"{launches_file} has no launch parts: run with TWINSERVE_LAUNCH_PARTS=1")
        steps = pd.read_parquet(launches_file.parent / "steps.parquet")
        frame = launches.merge(steps[["step_id", "num_prefill_tokens", "batch_size"]], on="step_id")
        frames.append(frame.assign(workload=launches_file.parent.name,
                                   start_perf_s=frame["clock_origin_s"] + frame["launch_start_s"]))
    if not frames:
        raise FileNotFoundError(f"no {LAUNCH_TIMES_FILE} under {real_dir}")
    return pd.concat(frames, ignore_index=True).sort_values("start_perf_s", ignore_index=True)


def join(real_dir: Path, rank: int = 1) -> pd.DataFrame:
    """One row per served step: the leader's launch and parts next to rank `rank`'s run of the same step (the
    follower's runs are the leader's launches in order, after its warm-up's)."""
    leader = leader_launches(real_dir)
    follower = pd.read_parquet(real_dir / FOLLOWER_TIMES_FILE.format(rank=rank))
    if len(follower) < len(leader):
        raise ValueError(f"rank {rank} ran {len(follower)} steps, fewer than the leader's {len(leader)} launches")
    follower = follower.iloc[len(follower) - len(leader):].reset_index(drop=True)
    out = pd.DataFrame({
        "workload": leader["workload"], "step_id": leader["step_id"],
        "kind": np.where(leader["num_prefill_tokens"] > 0, "extend", "decode"),
        "size": np.where(leader["num_prefill_tokens"] > 0, leader["num_prefill_tokens"], leader["batch_size"]),
        "leader_launch_ms": 1e3 * (leader["launch_end_s"] - leader["launch_start_s"] - leader["poll_s"]),
        "leader_send_ms": leader["send_ms"], "leader_core_ms": leader["core_ms"],
        "follower_recv_ms": follower["recv_ms"], "follower_run_ms": follower["run_ms"],
        "follower_core_ms": follower["core_ms"],
        "follower_lag_ms": 1e3 * (follower["run_start_perf_s"] - leader["start_perf_s"]),
    })
    if (out["follower_lag_ms"] < -1.0).any():      # a follower's step cannot begin before the leader launched it
        raise ValueError("the follower's runs do not line up with the leader's launches")
    return out


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Medians per step kind and size bin (decode: requests; extend: new tokens)."""
    binned = rows.assign(size_bin=pd.cut(rows["size"], SIZE_BINS))
    cols = ["leader_launch_ms", "leader_send_ms", "follower_recv_ms", "follower_run_ms", "follower_lag_ms"]
    table = binned.groupby(["kind", "size_bin"], observed=True)[cols].median()
    return table.assign(steps=binned.groupby(["kind", "size_bin"], observed=True).size()).round(2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("real_dir", type=Path)
    parser.add_argument("--rank", type=int, default=1)
    args = parser.parse_args(argv)
    rows = join(args.real_dir, args.rank)
    rows.to_csv(args.real_dir / "tp_launch_report.csv", index=False)
    print(summary(rows).to_string())


if __name__ == "__main__":
    main()
