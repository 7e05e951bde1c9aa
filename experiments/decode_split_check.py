"""The profiled model's decode prices on a real run's own plans, with and without the attention's work split
over the step's own KV lengths (`costmodel.decode_kv_split`): per workload, |price / measured - 1| of its
decode-only steps (median, p90) and the signed median per padded batch. Needs runs whose step_shapes.parquet
records per-request lengths (`decode_context_lens`). Torch-free.

  python -m experiments.decode_split_check --real DIR [--only W...] [--out CSV]
  python -m experiments.decode_split_check --probe CSV --contexts PARQUET     # a served-decode probe's steps

`--probe`: steps that experiments/served_decode_probe.py timed with their own contexts (served_ms) and equal
ones (equal_ms), their contexts in the order it submitted them (PARQUET: step_id, contexts): how well equal_ms
plus the split's term predicts served_ms, at the rate the H200 profile's decode rows give.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.compose import compose_config
from experiments.fidelity_runs import ALL_WORKLOADS
from runtime.build import build_core
from runtime.core.graph_grids import capture_batch_sizes, padded_size
from sim.costmodel.mla_kv_split import equal_split, makespan_tokens
from sim.costmodel.profiled import DECODE_KV_SPLITS
from sim.predictor import build_cost_model
from sim.step_shapes import read_shapes


def decode_errors(run_dir: Path, overrides: list[str]) -> pd.DataFrame:
    """One row per decode-only step with recorded lengths: padded batch, measured and both prices (device part)."""
    shapes = read_shapes(run_dir)
    steps = pd.read_parquet(run_dir / "steps.parquet")
    measured = (steps["end_s"] - steps["start_s"]).to_numpy()
    keep = [i for i, s in enumerate(shapes) if s.is_decode_only and s.decode_context_lens]
    grid = capture_batch_sizes(1024)
    frame = pd.DataFrame({"step_id": steps["step_id"].to_numpy()[keep], "measured_s": measured[keep],
                          "padded_batch": [padded_size(shapes[i].num_decode_reqs, grid) or shapes[i].num_decode_reqs
                                           for i in keep]})
    for split in DECODE_KV_SPLITS:
        cfg = compose_config(["mode=sim", "costmodel=profiled", f"costmodel.decode_kv_split={split}"] + overrides)
        model = build_cost_model(cfg, build_core(cfg))
        frame[f"{split}_s"] = [model.step_time_s(shapes[i]) - model.host_time_s(shapes[i]) for i in keep]
    return frame


def probe_check(probe_csv: Path, contexts: Path) -> dict:
    """|predicted / served - 1| over the probe's steps, predicted = equal_ms (alone) or equal_ms plus the rate
    times the makespan difference against the probe's own equal step (its real rows equal, the padding rows
    one token each, as it timed them)."""
    cfg = compose_config(["mode=sim", "costmodel=profiled", "costmodel.decode_kv_split=flashinfer_mla"])
    split = build_cost_model(cfg, build_core(cfg)).kv_split
    probe = pd.read_csv(probe_csv).merge(pd.read_parquet(contexts), on="step_id")
    grid = capture_batch_sizes(1024)
    alone, with_term = [], []
    for row in probe.itertuples(index=False):
        lens = np.asarray(row.contexts, dtype=np.int64)
        padding = np.ones(padded_size(len(lens), grid) - len(lens), dtype=np.int64)
        spans = [makespan_tokens(np.concatenate([own, padding]), split.clusters)
                 for own in (lens, equal_split(int(lens.sum()), len(lens)))]
        extra_ms = 1e3 * split.seconds_per_token * (spans[0] - spans[1])
        alone.append(abs(row.equal_ms / row.served_ms - 1))
        with_term.append(abs((row.equal_ms + extra_ms) / row.served_ms - 1))
    return {"steps": len(probe), "rate_us_per_token": 1e6 * split.seconds_per_token,
            "equal_median": float(np.median(alone)), "equal_p90": float(np.quantile(alone, 0.9)),
            "with_term_median": float(np.median(with_term)), "with_term_p90": float(np.quantile(with_term, 0.9))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=Path, default=None)
    parser.add_argument("--probe", type=Path, default=None)
    parser.add_argument("--contexts", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the per-workload summary here (CSV)")
    args = parser.parse_args()
    if args.probe is not None:
        print({k: round(v, 4) for k, v in probe_check(args.probe, args.contexts).items()})
        return
    names = args.only or [p.name for p in sorted(args.real.iterdir()) if p.name in ALL_WORKLOADS]
    rows = []
    for name in names:
        frame = decode_errors(args.real / name, ALL_WORKLOADS[name])
        row = {"workload": name, "decode_steps": len(frame)}
        for split in DECODE_KV_SPLITS:
            ratio = frame[f"{split}_s"] / frame["measured_s"]
            err = (ratio - 1).abs()
            row.update({f"{split}_median": float(np.median(err)), f"{split}_p90": float(np.quantile(err, 0.9)),
                        f"{split}_signed_median": float(np.median(ratio - 1))})
            by_batch = ratio.groupby(frame["padded_batch"]).median().round(3).to_dict()
            print(f"{name} {split}: priced / measured by padded batch {by_batch}")
        rows.append(row)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.out is not None:
        table.round(4).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
