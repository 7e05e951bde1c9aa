"""Serving metrics, defined once for every mode and for the notebooks: TTFT, ITL, TPOT, E2E,
throughput, cache hit rate, from the per-request and per-step tables.

Torch-free (pandas + numpy).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)


def distribution(values: np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90, p99 (None when there are no values)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    return {"mean": float(values.mean()), **{f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}}


def inter_token_latencies_s(requests: pd.DataFrame) -> np.ndarray:
    """Gaps between consecutive output tokens of each request, all requests concatenated."""
    gaps = [np.diff(np.asarray(t, dtype=np.float64)) for t in requests["token_times_s"] if len(t) > 1]
    return np.concatenate(gaps) if gaps else np.empty(0)


def per_request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """ttft_s, e2e_s and tpot_s ((finish - first token) / (output tokens - 1)) per request."""
    out = pd.DataFrame(index=requests.index)
    out["ttft_s"] = requests["first_token_s"] - requests["arrival_s"]
    out["e2e_s"] = requests["finish_s"] - requests["arrival_s"]
    decode_tokens = (requests["output_tokens"] - 1).where(requests["output_tokens"] > 1)
    out["tpot_s"] = (requests["finish_s"] - requests["first_token_s"]) / decode_tokens
    return out


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, mode: str, wall_time_s: float) -> dict:
    """The run summary (summary.json). Latencies and throughput count finished requests only;
    duration is from the first arrival to the last finish."""
    finished = requests[requests["finish_reason"].isin(["length", "stop"])]
    num_aborted = int(len(requests) - len(finished))
    if len(requests):
        duration_s = float(requests["finish_s"].max() - requests["arrival_s"].min())
    else:
        duration_s = 0.0
    lat = per_request_latencies(finished)
    per_s = (lambda x: float(x) / duration_s) if duration_s > 0 else (lambda x: 0.0)
    admitted = requests[requests["admitted_s"].notna()]
    input_admitted = float(admitted["input_tokens"].sum())
    return {
        "mode": mode,
        "num_requests": int(len(requests)),
        "num_finished": int(len(finished)),
        "num_aborted": num_aborted,
        "duration_s": duration_s,
        "wall_time_s": float(wall_time_s),
        "throughput": {
            "requests_per_s": per_s(len(finished)),
            "input_tokens_per_s": per_s(finished["input_tokens"].sum()),
            "output_tokens_per_s": per_s(finished["output_tokens"].sum()),
        },
        "ttft_s": distribution(lat["ttft_s"].dropna().to_numpy()),
        "itl_s": distribution(inter_token_latencies_s(finished)),
        "tpot_s": distribution(lat["tpot_s"].dropna().to_numpy()),
        "e2e_s": distribution(lat["e2e_s"].dropna().to_numpy()),
        "cache_hit_rate": float(admitted["cached_tokens"].sum() / input_admitted) if input_admitted else 0.0,
        "num_steps": int(len(steps)),
        "num_retractions": int(steps["num_retractions"].sum()) if len(steps) else 0,
    }


def format_summary(summary: dict) -> str:
    """A short fixed-width table for the terminal."""
    ms = lambda v: f"{'-':>12}" if v is None else f" {v * 1e3:11.2f}"   # noqa: E731
    lines = [
        f"mode={summary['mode']}  requests={summary['num_requests']} finished={summary['num_finished']} "
        f"aborted={summary['num_aborted']}  steps={summary['num_steps']} retractions={summary['num_retractions']}",
        f"duration {summary['duration_s']:.2f} s (wall {summary['wall_time_s']:.2f} s)   "
        f"throughput {summary['throughput']['requests_per_s']:.2f} req/s, "
        f"{summary['throughput']['input_tokens_per_s']:.0f} in tok/s, "
        f"{summary['throughput']['output_tokens_per_s']:.0f} out tok/s   "
        f"cache hit rate {summary['cache_hit_rate']:.3f}",
        f"{'latency (ms)':<12}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}",
    ]
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        d = summary[key]
        lines.append(f"{key[:-2]:<12}" + "".join(ms(d[k]) for k in ("mean", "p50", "p90", "p99")))
    return "\n".join(lines)


def step_prediction_error(steps: pd.DataFrame) -> dict:
    """|predicted / measured - 1| over the steps that carry a prediction: median, p90, and count."""
    if "predicted_s" not in steps:
        return {"median": None, "p90": None, "num_steps": 0}
    measured = (steps["end_s"] - steps["start_s"]).to_numpy()
    predicted = steps["predicted_s"].to_numpy(dtype=float)
    ok = np.isfinite(predicted) & (measured > 0)
    if not ok.any():
        return {"median": None, "p90": None, "num_steps": 0}
    err = np.abs(predicted[ok] / measured[ok] - 1.0)
    return {"median": float(np.median(err)), "p90": float(np.quantile(err, 0.9)), "num_steps": int(ok.sum())}
