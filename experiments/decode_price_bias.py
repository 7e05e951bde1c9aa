"""How a decode profile prices the decode steps of real runs: every decode-only step of each run's
steps.parquet priced by `costmodel=profiled` from the given profile directories (device time only, no
shared-prefix reads: use it on workloads without shared prefixes), as the median price / measured per
batch-size bucket. Torch-free.

  python -m experiments.decode_price_bias --profiles OLD_DIR NEW_DIR --runs RUN_DIR... [--model deepseek_v2_lite]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from hydra.utils import instantiate

from experiments.compose import compose_config
from runtime.core.layout import ParallelLayout
from sim.costmodel.base import StepShape
from sim.costmodel.profiled import ProfiledCostModel
from sim.costmodel.roofline import RooflineCostModel

BUCKETS = [0, 1, 3, 7, 15, 31, 63, 127, 255, 1 << 20]


def price_over_measured(model, hardware, profile: Path, run: Path) -> pd.DataFrame:
    """Per batch bucket: decode steps and their median profiled device price / measured interval."""
    cm = ProfiledCostModel(model, hardware, ParallelLayout(), fallback=RooflineCostModel,
                           profile=str(profile))
    steps = pd.read_parquet(run / "steps.parquet")
    decode = steps[steps["mode"] == "decode"]
    priced = [cm.device_time_s(StepShape(num_decode_reqs=int(b), decode_context_tokens=int(c)))
              for b, c in zip(decode["batch_size"], decode["decode_context_tokens"])]
    ratio = pd.Series(priced, index=decode.index) / (decode["end_s"] - decode["start_s"])
    buckets = pd.cut(decode["batch_size"], BUCKETS)
    out = ratio.groupby(buckets, observed=True).agg(["size", "median"])
    out.index = [f"{int(i.left) + 1}-{int(i.right)}" for i in out.index]
    return out.rename(columns={"size": "steps", "median": "price_over_measured"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profiles", nargs="+", type=Path, required=True)
    p.add_argument("--runs", nargs="+", type=Path, required=True)
    p.add_argument("--model", default="deepseek_v2_lite")
    p.add_argument("--hardware", default="h200")
    p.add_argument("--out", type=Path, default=None, help="CSV of every (profile, run, bucket) row")
    args = p.parse_args(argv)
    cfg = compose_config(["mode=sim", f"model={args.model}", f"hardware={args.hardware}"])
    model, hardware = instantiate(cfg.model), instantiate(cfg.hardware)
    rows = []
    for profile in args.profiles:
        for run in args.runs:
            table = price_over_measured(model, hardware, profile, run)
            print(f"{profile} on {run}: " + "  ".join(f"b{b} {r.price_over_measured:.3f} ({int(r.steps)})"
                                                      for b, r in table.iterrows()))
            rows += [{"profile": str(profile), "run": str(run), "batch": b, **r} for b, r in table.to_dict("index").items()]
    if args.out is not None:
        pd.DataFrame(rows).to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
