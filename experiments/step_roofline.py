"""Per-step efficiency of a run: each recorded step's duration over its ideal roofline time (the
simulator's roofline with every efficiency at 1 and no floors, launch or host costs: FLOPs over
peak FLOP/s or bytes over HBM bandwidth, per operator), bucketed by step kind and size; and the
device's idle share between steps. Torch-free: works on the records of either mode.

  python -m experiments.step_roofline RUN_DIR [--model deepseek_v2_lite --hardware h200]
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from runtime.core.layout import ParallelLayout
from sim.costmodel.base import StepShape
from sim.costmodel.roofline import RooflineCostModel
from sim.costmodel.roofline_ops import GPU_OPS

DECODE_BATCH_BUCKETS = (1, 2, 8, 64, 256, 1025, 10**9)
DECODE_CONTEXT_BUCKETS = (0, 1024, 4096, 16384, 10**9)   # mean KV tokens per decode request
PREFILL_BUCKETS = (1, 256, 2048, 10**9)


def ideal_model(model, hardware, layout: ParallelLayout | None = None) -> RooflineCostModel:
    return RooflineCostModel(model, hardware, layout or ParallelLayout(), mfu=1.0, mbu=1.0, attention_mfu=1.0,
                             attention_mbu=1.0, moe_efficiency=1.0, comm_efficiency=1.0,
                             kernel_floor_s=0.0, eager_kernel_gap_s=0.0, cpu_overhead_s=0.0,
                             cpu_overhead_per_seq_s=0.0, sampler_base_s=0.0, sampler_per_seq_s=0.0)


def ideal_step_s(steps: pd.DataFrame, cost: RooflineCostModel) -> np.ndarray:
    """GPU roofline time of every step from its recorded shape (the step's extends taken as equal
    shares of its new and cached-prefix tokens; decodes with their summed context)."""
    out = np.empty(len(steps))
    for i, row in enumerate(steps.itertuples(index=False)):
        k = int(row.batch_size - row.num_decode_requests)        # extend sequences, taken as equal
        extend = (int(row.num_prefill_tokens) // k,) * k if row.num_prefill_tokens else ()
        prefix = (int(row.extend_prefix_tokens) // k,) * k if extend else ()
        shape = StepShape(extend, prefix, int(row.num_decode_requests),
                          max(int(row.decode_context_tokens), int(row.num_decode_requests)))
        parts = cost.breakdown_s(shape)
        out[i] = sum(parts[op] for op in GPU_OPS)
    return out


def step_kind_table(steps: pd.DataFrame, ideal_s: np.ndarray) -> pd.DataFrame:
    """Median and p90 of measured / ideal per bucket (decode: batch x context; prefill: new tokens)."""
    df = steps.assign(measured_s=steps["end_s"] - steps["start_s"], ideal_s=ideal_s)
    df["ratio"] = df["measured_s"] / df["ideal_s"]
    decode = df[(df["num_prefill_tokens"] == 0) & (df["num_decode_requests"] > 0)].copy()
    decode["batch"] = pd.cut(decode["num_decode_requests"], DECODE_BATCH_BUCKETS, right=False)
    decode["context"] = pd.cut(decode["decode_context_tokens"] / decode["num_decode_requests"],
                               DECODE_CONTEXT_BUCKETS, right=False)
    prefill = df[df["num_prefill_tokens"] > 0].copy()
    prefill["tokens"] = pd.cut(prefill["num_prefill_tokens"], PREFILL_BUCKETS, right=False)
    rows = []
    for (batch, ctx), g in decode.groupby(["batch", "context"], observed=True):
        rows.append(_row("decode", f"batch {batch}", f"ctx/req {ctx}", g))
    for tokens, g in prefill.groupby("tokens", observed=True):
        rows.append(_row("prefill" if (g["num_decode_requests"] == 0).all() else "prefill+decode",
                         f"new tokens {tokens}", "", g))
    return pd.DataFrame(rows)


def _row(kind: str, size: str, context: str, g: pd.DataFrame) -> dict:
    return {"kind": kind, "size": size, "context": context, "steps": len(g),
            "measured_ms_p50": 1e3 * g["measured_s"].median(), "ideal_ms_p50": 1e3 * g["ideal_s"].median(),
            "ratio_p50": g["ratio"].median(), "ratio_p90": g["ratio"].quantile(0.9)}


def device_idle_share(steps: pd.DataFrame) -> float:
    """Share of the span from the first step's start to the last step's end in which no step ran
    (gaps between consecutive steps; steps are recorded in launch order)."""
    if len(steps) < 2:
        return 0.0
    start, end = steps["start_s"].to_numpy(), steps["end_s"].to_numpy()
    gaps = np.clip(start[1:] - end[:-1], 0.0, None)
    return float(gaps.sum() / (end[-1] - start[0]))


def main() -> None:
    from experiments.compose import compose_config
    from hydra.utils import instantiate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--model", default="deepseek_v2_lite")
    parser.add_argument("--hardware", default="h200")
    args = parser.parse_args()
    cfg = compose_config([f"model={args.model}", f"hardware={args.hardware}"])
    steps = pd.read_parquet(f"{args.run_dir}/steps.parquet")
    cost = ideal_model(instantiate(cfg.model), instantiate(cfg.hardware))
    table = step_kind_table(steps, ideal_step_s(steps, cost))
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"device idle between steps: {100 * device_idle_share(steps):.2f}% of the span")


if __name__ == "__main__":
    main()
