"""How far a simulated run's metrics move when every arrival shifts by under a millisecond: the band that plan flips
(a prompt arriving just before or just after the loop plans its next step, which a step ending 1% earlier or later
decides) put around each simulated metric. A real run's error that lies inside its workload's band is no pricing
error the cost model could remove. Torch-free (mode=sim only).

  python -m experiments.plan_sensitivity --out DIR [--only W ...] [--base tp=2 hardware=h200] [--runs 20]
      [--jitter-ms 1.0] [--costmodel profiled] [--real experiments/results/h200/fidelity/real]

DIR/runs.csv: one row per workload and run (run 0 unjittered), the metrics below; DIR/bands.csv: per workload and
metric, the unjittered value, min / median / max over the jittered runs and, with --real, the real run's value and
the unjittered and band-edge errors against it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import pandas as pd
from hydra.utils import instantiate
from tqdm import tqdm

from experiments.compose import compose_config
from experiments.fidelity_runs import ALL_WORKLOADS, QUIET, WORKLOADS
from experiments.sweep import summary_metrics
from runtime.build import build_core
from runtime.core.request import RequestSpec
from runtime.metrics import summarize
from runtime.records_io import requests_frame, steps_frame
from sim.app import sim_run
from sim.costmodel.base import CostModel
from sim.predictor import build_cost_model

METRICS = ("requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s")


def jittered(specs: list[RequestSpec], jitter_s: float, seed: int) -> list[RequestSpec]:
    """Each distinct arrival time moved by a uniform shift in [-jitter_s, +jitter_s] (never before 0), keeping the
    arrivals' order: requests that arrive together still do, and none overtakes another (the shifted times are
    sorted and handed out in the original order), so only the gaps move against the steps' ends. jitter_s = 0
    returns the specs unchanged."""
    if jitter_s <= 0:
        return list(specs)
    rng = random.Random(seed)
    times = sorted({s.arrival_s for s in specs})
    moved = dict(zip(times, sorted(max(0.0, t + rng.uniform(-jitter_s, jitter_s)) for t in times)))
    return [dataclasses.replace(s, arrival_s=moved[s.arrival_s]) for s in specs]


def metrics(summary: dict) -> dict[str, float]:
    """The METRICS of a summary.json (either mode), as the sweep tables name them."""
    flat = summary_metrics(summary)
    return {metric: flat[metric] for metric in METRICS}


def simulate(cfg, specs: list[RequestSpec], cost_model: CostModel | None = None) -> dict[str, float]:
    """One mode=sim run of `specs` under `cfg` with a fresh scheduler; `cost_model`: one built for cfg before
    (its prices depend on the step alone), else built here."""
    core = build_core(cfg)
    run = sim_run(cfg, core, cost_model if cost_model is not None else build_cost_model(cfg, core))
    started = time.perf_counter()
    with run.context():
        outcome = run.driver.run(specs)
    return metrics(summarize(requests_frame(outcome.requests), steps_frame(outcome.steps), mode="sim",
                             wall_time_s=time.perf_counter() - started))


def workload_runs(name: str, overrides: list[str], runs: int, jitter_s: float, seed: int) -> list[dict]:
    """Run 0 with the workload's own arrivals, runs 1..runs with jittered ones (seeds seed+1 ...)."""
    cfg = compose_config(["mode=sim"] + overrides + QUIET)
    specs = instantiate(cfg.workload).requests()
    cost_model = build_cost_model(cfg, build_core(cfg))       # the profile read once for every run
    rows = []
    for run in range(runs + 1):
        values = simulate(cfg, jittered(specs, jitter_s if run else 0.0, seed + run), cost_model)
        rows.append({"workload": name, "run": run, "jitter_s": jitter_s if run else 0.0, **values})
    return rows


def bands(runs: pd.DataFrame, real_root: Path | None) -> pd.DataFrame:
    """Per workload and metric: the unjittered value, the jittered runs' min / median / max and, where the real run
    exists under real_root/<workload>/, its value, the unjittered error and the band's edges as errors (sim / real - 1)
    and whether the real value lies within the band (unjittered run included)."""
    rows = []
    for name, group in runs.groupby("workload", sort=False):
        base, moved = group[group["run"] == 0].iloc[0], group[group["run"] > 0]
        summary = real_root / name / "summary.json" if real_root is not None else None
        real = metrics(json.loads(summary.read_text())) if summary is not None and summary.exists() else None
        for metric in METRICS:
            values = pd.concat([moved[metric], pd.Series([base[metric]])])
            row = {"workload": name, "metric": metric, "unjittered": base[metric], "min": moved[metric].min(),
                   "median": moved[metric].median(), "max": moved[metric].max(), "runs": len(moved)}
            if real is not None and real[metric]:
                truth = real[metric]
                row.update(real=truth, error=base[metric] / truth - 1, error_low=values.min() / truth - 1,
                           error_high=values.max() / truth - 1,
                           real_in_band=bool(values.min() <= truth <= values.max()))
            rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=list(WORKLOADS), choices=list(ALL_WORKLOADS))
    parser.add_argument("--base", nargs="*", default=[], help="overrides for every run (e.g. tp=2 hardware=h200)")
    parser.add_argument("--runs", type=int, default=20, help="jittered runs per workload")
    parser.add_argument("--jitter-ms", type=float, default=1.0, help="largest shift of an arrival, either way")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--costmodel", default="profiled")
    parser.add_argument("--real", type=Path, default=None, help="the real runs' directory (<workload>/summary.json)")
    args = parser.parse_args()
    if args.runs < 1 or args.jitter_ms <= 0:
        parser.error("--runs must be >= 1 and --jitter-ms > 0")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in tqdm(args.only, desc="workloads"):
        overrides = [f"costmodel={args.costmodel}"] + args.base + ALL_WORKLOADS[name]
        rows += workload_runs(name, overrides, args.runs, args.jitter_ms / 1e3, args.seed)
    runs = pd.DataFrame(rows)
    runs.to_csv(args.out / "runs.csv", index=False)
    table = bands(runs, args.real)
    table.to_csv(args.out / "bands.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
