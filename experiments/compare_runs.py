"""Joins a simulated and a real run of the same workload and seed -- request by request (rid) and step by
step (step_id) -- with the metric definitions of runtime/metrics.py: relative errors of throughput,
TTFT / ITL / TPOT / E2E (mean, p50, p90, p99), per-step time (median and p90 of |pred/meas - 1|), and
plan-sequence agreement. Torch-free.

  python -m experiments.compare_runs SIM_DIR REAL_DIR
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from runtime.metrics import PERCENTILES, distribution, inter_token_latencies_s, per_request_latencies
from runtime.records_io import read_run

LATENCIES = ("ttft_s", "itl_s", "tpot_s", "e2e_s")
STATS = ("mean",) + tuple(f"p{p}" for p in PERCENTILES)
PLAN_COLUMNS = ("batch_size", "num_prefill_tokens", "num_decode_requests")


def relative_error(predicted: float | None, measured: float | None) -> float:
    """predicted / measured - 1 (NaN when either is missing or measured is 0)."""
    if predicted is None or measured is None or measured == 0:
        return float("nan")
    return float(predicted) / float(measured) - 1.0


def _finished(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[requests["finish_reason"].isin(["length", "stop"])]


def latency_distributions(requests: pd.DataFrame) -> dict[str, dict]:
    done = _finished(requests)
    lat = per_request_latencies(done)
    return {"ttft_s": distribution(lat["ttft_s"].dropna()), "itl_s": distribution(inter_token_latencies_s(done)),
            "tpot_s": distribution(lat["tpot_s"].dropna()), "e2e_s": distribution(lat["e2e_s"].dropna())}


def throughput_req_per_s(requests: pd.DataFrame) -> float:
    done = _finished(requests)
    duration = float(requests["finish_s"].max() - requests["arrival_s"].min()) if len(requests) else 0.0
    return len(done) / duration if duration > 0 else 0.0


def step_errors(sim_steps: pd.DataFrame, real_steps: pd.DataFrame) -> dict:
    """Per step (joined on step_id): |sim duration / real duration - 1|, median and p90, and the share of
    steps whose plan (batch size, prefill tokens, decode requests) is the same in both runs."""
    joined = sim_steps.merge(real_steps, on="step_id", suffixes=("_sim", "_real"))
    if joined.empty:
        return {"steps_joined": 0, "step_error_median": float("nan"), "step_error_p90": float("nan"),
                "plan_agreement": 0.0}
    measured = (joined["end_s_real"] - joined["start_s_real"]).to_numpy()
    predicted = (joined["end_s_sim"] - joined["start_s_sim"]).to_numpy()
    ok = measured > 0
    err = np.abs(predicted[ok] / measured[ok] - 1.0)
    same = np.ones(len(joined), dtype=bool)
    for col in PLAN_COLUMNS:
        same &= joined[f"{col}_sim"].to_numpy() == joined[f"{col}_real"].to_numpy()
    return {"steps_joined": int(len(joined)), "step_error_median": float(np.median(err)),
            "step_error_p90": float(np.quantile(err, 0.9)),
            "plan_agreement": float(same.sum() / max(len(sim_steps), len(real_steps)))}


def request_join(sim_requests: pd.DataFrame, real_requests: pd.DataFrame) -> pd.DataFrame:
    """One row per rid finished in both runs: ttft/tpot/e2e of each and their relative errors."""
    sim = per_request_latencies(_finished(sim_requests)).assign(rid=_finished(sim_requests)["rid"])
    real = per_request_latencies(_finished(real_requests)).assign(rid=_finished(real_requests)["rid"])
    joined = sim.merge(real, on="rid", suffixes=("_sim", "_real"))
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        joined[f"{key}_error"] = joined[f"{key}_sim"] / joined[f"{key}_real"] - 1.0
    return joined


def compare(sim_dir: str | Path, real_dir: str | Path) -> dict:
    """Relative errors (sim / real - 1) of the run-level metrics, per-step errors, plan agreement, and the
    median |error| of each request's own TTFT and E2E (joined on rid)."""
    sim_req, sim_steps, _ = read_run(sim_dir)
    real_req, real_steps, _ = read_run(real_dir)
    out = {"throughput": relative_error(throughput_req_per_s(sim_req), throughput_req_per_s(real_req)),
           "duration": relative_error(sim_req["finish_s"].max() - sim_req["arrival_s"].min(),
                                      real_req["finish_s"].max() - real_req["arrival_s"].min())}
    sim_lat, real_lat = latency_distributions(sim_req), latency_distributions(real_req)
    for key in LATENCIES:
        for stat in STATS:
            out[f"{key[:-2]}_{stat}"] = relative_error(sim_lat[key][stat], real_lat[key][stat])
    out.update(step_errors(sim_steps, real_steps))
    per_request = request_join(sim_req, real_req)
    out["requests_joined"] = int(len(per_request))
    for key in ("ttft_s", "e2e_s"):
        out[f"request_{key[:-2]}_abs_error_median"] = float(per_request[f"{key}_error"].abs().median()) \
            if len(per_request) else float("nan")
    return out


def error_table(pairs: dict[str, tuple[Path, Path]]) -> pd.DataFrame:
    """compare() of every named (sim_dir, real_dir) pair, one row each."""
    return pd.DataFrame([{"run": name, **compare(sim, real)} for name, (sim, real) in pairs.items()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sim_dir")
    parser.add_argument("real_dir")
    args = parser.parse_args()
    for key, value in compare(args.sim_dir, args.real_dir).items():
        print(f"{key:<36} {value:+.4f}" if isinstance(value, float) else f"{key:<36} {value}")


if __name__ == "__main__":
    main()
