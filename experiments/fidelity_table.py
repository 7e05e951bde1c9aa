"""The fidelity error table from the runs of experiments/fidelity_runs.py: for every workload and cost
model, compare_runs' errors of the simulation against the real run, plus each cost model's per-step error
on the real plans themselves (the real run's step shapes priced as the simulator would, device part under
overlap, against the measured step) and, where the run recorded its launch times, each step placed behind its
real predecessor as the simulator's driver places steps (in_context_step_error_*). Writes errors.csv and the
compact steps/requests files the notebook plots. Torch-free.

  python -m experiments.fidelity_table --real DIR/real --sim DIR/sim --out experiments/results/h200/fidelity [--only W...]
      [--base tp=2]    # runs made with fidelity_runs --base tp=2 (priced as that layout)

The rows of workloads not built this time (absent from --only, or without real records) stay as --out had them.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.compare_runs import compare, per_request_latencies
from experiments.compose import compose_config
from experiments.fidelity_runs import ALL_WORKLOADS, COST_MODELS, WORKLOADS
from experiments.launch_timer import LAUNCH_TIMES_FILE
from runtime.build import build_core
from runtime.records_io import read_run
from sim.predictor import build_cost_model
from sim.step_shapes import read_shapes

ROUND = 4


def step_kind(steps: pd.DataFrame) -> pd.Series:
    prefill, decode = steps["num_prefill_tokens"] > 0, steps["num_decode_requests"] > 0
    return pd.Series(np.where(prefill & decode, "mixed", np.where(prefill, "prefill", "decode")), index=steps.index)


def predict_real_plans(name: str, cost: str, real_dir: Path, overlap: bool = True,
                       base: list[str] | None = None) -> np.ndarray:
    """Device time (overlap) or whole step the cost model gives each step the real run planned; `base`:
    the overrides every run had (e.g. its layout, tp=2)."""
    cfg = compose_config(["mode=sim", f"costmodel={cost}"] + list(base or []) + ALL_WORKLOADS[name])
    model = build_cost_model(cfg, build_core(cfg))
    shapes = read_shapes(real_dir)
    return np.array([model.step_time_s(s) - (model.host_time_s(s) if overlap else 0.0) for s in shapes])


def place_real_steps(terms: list, real_steps: pd.DataFrame, launches: pd.DataFrame,
                     idle_factor=lambda idle_s: 1.0) -> np.ndarray:
    """Each real step's duration as the simulator's driver places a step (sim.step_placement.place_step) behind
    its real predecessor: `terms` (StepResults, one per step, in step order) launched when the real launch began,
    the step ahead ending when it really ended (after_decode when it was decode-only), the ranks' launch state
    carried from the previous placement; a launch begun after the host found nothing to do (the step ahead over
    and its launch returned) stretches by idle_factor(the idle seconds). real_steps: step_id, start_s, end_s,
    num_prefill_tokens in step order; launches: launch_start_s, launch_end_s indexed by step_id."""
    from sim.step_placement import place_step

    starts = launches.loc[real_steps["step_id"], "launch_start_s"].to_numpy()
    launch_ends = launches.loc[real_steps["step_id"], "launch_end_s"].to_numpy()
    ends, decode = real_steps["end_s"].to_numpy(), (real_steps["num_prefill_tokens"] == 0).to_numpy()
    out = np.empty(len(terms))
    launched_by = 0.0
    for i, result in enumerate(terms):
        prev_end = ends[i - 1] if i else real_steps["start_s"].iloc[0]
        idle_s = starts[i] - result.host_s - max(prev_end, launch_ends[i - 1]) if i else 0.0
        factor = idle_factor(idle_s) if idle_s > 0.0 else 1.0
        placed = place_step(result, starts[i], prev_end, launched_by, bool(i) and bool(decode[i - 1]), factor)
        launched_by = placed.launched_by_s
        out[i] = placed.end_s - placed.start_s
    return out


def predict_in_context(name: str, cost: str, real_dir: Path, base: list[str] | None = None) -> np.ndarray | None:
    """place_real_steps with `cost`'s terms of the real run's step shapes (None without its launch times, from runs
    made before fidelity runs recorded them, or without overlap scheduling, whose steps the driver places alone)."""
    from sim.executor import SimExecutor

    cfg = compose_config(["mode=sim", f"costmodel={cost}"] + list(base or []) + ALL_WORKLOADS[name])
    if not (real_dir / LAUNCH_TIMES_FILE).exists() or not cfg.overlap:
        return None
    core = build_core(cfg)
    executor = SimExecutor(build_cost_model(cfg, core), core.model.vocab_size)
    _, real_steps, _ = read_run(real_dir)
    launches = pd.read_parquet(real_dir / LAUNCH_TIMES_FILE).set_index("step_id")
    terms = [executor.step_terms(shape) for shape in read_shapes(real_dir)]
    return place_real_steps(terms, real_steps, launches, executor.idle_launch_factor)


def build(real_root: Path, sim_root: Path, names: list[str],
          base: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    rows, step_frames, request_frames = [], [], []
    for name in names:
        real_dir = real_root / name
        if not (real_dir / "steps.parquet").exists():
            continue
        real_req, real_steps, _ = read_run(real_dir)
        measured = (real_steps["end_s"] - real_steps["start_s"]).to_numpy()
        steps = pd.DataFrame({"workload": name, "step_id": real_steps["step_id"], "kind": step_kind(real_steps),
                              "batch_size": real_steps["batch_size"], "measured_s": measured})
        lat = per_request_latencies(real_req).assign(rid=real_req["rid"])
        request_frames.append(lat.assign(workload=name, source="real"))
        for cost in COST_MODELS:
            predicted = predict_real_plans(name, cost, real_dir, base=base)
            steps[f"{cost}_s"] = predicted
            err = np.abs(predicted / measured - 1.0)
            row = {"workload": name, "costmodel": cost, **compare(sim_root / cost / name, real_dir),
                   "real_plan_step_error_median": float(np.median(err)),
                   "real_plan_step_error_p90": float(np.quantile(err, 0.9))}
            placed = predict_in_context(name, cost, real_dir, base=base)
            if placed is not None:                 # each step behind its real predecessor, as the driver times it
                steps[f"{cost}_in_context_s"] = placed
                err = np.abs(placed / measured - 1.0)
                row.update(in_context_step_error_median=float(np.median(err)),
                           in_context_step_error_p90=float(np.quantile(err, 0.9)))
            rows.append(row)
            sim_req, _, _ = read_run(sim_root / cost / name)
            lat = per_request_latencies(sim_req).assign(rid=sim_req["rid"])
            request_frames.append(lat.assign(workload=name, source=cost))
        step_frames.append(steps)
    return pd.DataFrame(rows), pd.concat(step_frames, ignore_index=True), pd.concat(request_frames, ignore_index=True)


def keep_other_workloads(path: Path, new: pd.DataFrame) -> pd.DataFrame:
    """`new` after the rows of the workloads it does not hold that `path` already has (a re-run of some
    workloads replaces theirs and keeps the rest)."""
    if not path.exists():
        return new
    old = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    kept = old[~old["workload"].isin(set(new["workload"]))]
    return pd.concat([kept, new], ignore_index=True) if len(kept) else new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=Path, required=True)
    parser.add_argument("--sim", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=list(WORKLOADS), choices=list(ALL_WORKLOADS))
    parser.add_argument("--base", nargs="*", default=[], help="the overrides of every run (as fidelity_runs --base)")
    args = parser.parse_args()
    errors, steps, requests = build(args.real, args.sim, args.only, args.base)
    args.out.mkdir(parents=True, exist_ok=True)
    errors, steps, requests = (keep_other_workloads(args.out / name, new) for name, new in
                               (("errors.csv", errors), ("steps.parquet", steps), ("requests.parquet", requests)))
    errors.round(ROUND).to_csv(args.out / "errors.csv", index=False)
    steps.to_parquet(args.out / "steps.parquet", index=False)
    requests.to_parquet(args.out / "requests.parquet", index=False)
    cols = ["workload", "costmodel", "throughput", "ttft_p50", "ttft_p99", "tpot_mean", "real_plan_step_error_median",
            "real_plan_step_error_p90", "plan_agreement"]
    print(errors[cols].to_string(index=False, float_format=lambda x: f"{x:+.3f}"))


if __name__ == "__main__":
    main()
