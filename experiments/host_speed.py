"""How fast a real run's host launched its steps against the profile: per launch, its host time (launch minus the
polls inside it) over the profiled cost model's launch_time_s for the step's shape, and per run the median of that
ratio for extend and decode launches, the share of extend launches in the slow regime (ratio >= SLOW_RATIO), and
the slow spells (runs of such launches, within SPELL_GAP_S of each other). On the lent H200s every host part of a
launch runs ~1.7x slower for spells of seconds that the guest cannot see (experiments/results/h200/host_regimes).
Reads runs of experiments/fidelity_runs.py (launch_times.parquet, step_shapes.parquet, summary.json). Torch-free.

  python -m experiments.host_speed RUN_DIR [RUN_DIR ...] [--csv OUT.csv] [--timeline OUT_timeline.csv]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.compose import compose_config
from experiments.launch_timer import LAUNCH_TIMES_FILE
from runtime.build import build_core
from sim.predictor import build_cost_model
from sim.step_shapes import read_shapes

SLOW_RATIO = 1.35       # the two regimes' extend launches sit near 1.0 and 1.6-1.9 of the profile
SPELL_GAP_S = 1.0       # slow launches closer than this belong to one spell


def launch_ratios(run_dir: Path) -> pd.DataFrame:
    """One row per launched step: step_id, start_s, kind (extend: any new tokens; decode), launch_s (host, polls
    excluded), predicted_launch_s (the profiled cost model for the run's own overrides) and ratio."""
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = compose_config(["mode=sim", "costmodel=profiled"] + list(summary.get("overrides", [])))
    model = build_cost_model(cfg, build_core(cfg))
    steps = pd.read_parquet(run_dir / "steps.parquet").sort_values("step_id").reset_index(drop=True)
    shapes = read_shapes(run_dir)
    if len(shapes) != len(steps):
        raise ValueError(f"{run_dir}: {len(shapes)} step shapes for {len(steps)} steps")
    steps["predicted_launch_s"] = [model.launch_time_s(s) for s in shapes]
    launches = pd.read_parquet(run_dir / LAUNCH_TIMES_FILE)
    frame = steps[["step_id", "start_s", "num_prefill_tokens", "predicted_launch_s"]].merge(launches, on="step_id")
    frame["kind"] = np.where(frame["num_prefill_tokens"] > 0, "extend", "decode")
    frame["launch_s"] = frame["launch_end_s"] - frame["launch_start_s"] - frame["poll_s"]
    frame["ratio"] = frame["launch_s"] / frame["predicted_launch_s"]
    return frame[["step_id", "start_s", "kind", "launch_s", "predicted_launch_s", "ratio"]]


def slow_spells(frame: pd.DataFrame) -> list[tuple[float, float]]:
    """(first, last) start_s of each spell of slow extend launches (ratio >= SLOW_RATIO)."""
    times = frame.loc[(frame["kind"] == "extend") & (frame["ratio"] >= SLOW_RATIO), "start_s"].sort_values().to_numpy()
    spells: list[tuple[float, float]] = []
    for t in times:
        if spells and t - spells[-1][1] <= SPELL_GAP_S:
            spells[-1] = (spells[-1][0], float(t))
        else:
            spells.append((float(t), float(t)))
    return spells


def run_row(run_dir: Path, frame: pd.DataFrame) -> dict:
    """The run's summary row from its launch_ratios `frame`."""
    extend, decode = frame[frame["kind"] == "extend"], frame[frame["kind"] == "decode"]
    spells = slow_spells(frame)
    return {"run": str(run_dir), "extends": len(extend), "decodes": len(decode),
            "extend_ratio_p50": float(extend["ratio"].median()) if len(extend) else np.nan,
            "decode_ratio_p50": float(decode["ratio"].median()) if len(decode) else np.nan,
            "slow_extend_share": float((extend["ratio"] >= SLOW_RATIO).mean()) if len(extend) else np.nan,
            "slow_spells": len(spells), "longest_spell_s": max((b - a for a, b in spells), default=0.0),
            "duration_s": float(frame["start_s"].max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--timeline", type=Path, help="every launch's ratio, all runs (a run column)")
    args = parser.parse_args()
    frames = {run: launch_ratios(run) for run in args.runs}       # one cost model and pass per run
    table = pd.DataFrame([run_row(run, frame) for run, frame in frames.items()])
    with pd.option_context("display.width", 200, "display.max_colwidth", 70):
        print(table.round(3).to_string(index=False))
    if args.csv:
        table.round(4).to_csv(args.csv, index=False)
    if args.timeline:
        pd.concat([frame.assign(run=str(run)) for run, frame in frames.items()]).round(6).to_csv(args.timeline,
                                                                                                index=False)


if __name__ == "__main__":
    main()
