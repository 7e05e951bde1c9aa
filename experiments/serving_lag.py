"""Where a served run loses time against its `mode=real` replay: per rate, TTFT and TPOT as the client saw
them, as the server recorded them (from HTTP arrival to the step that made the token) and as the replay
did; the front end's delivery lag per request (client's time to a token minus the server's time to it:
intake before the server's clock starts plus delivery after the step), for the first token and for
every token; and the step records of both runs (decode step time, the gaps between steps).
Reads the files `experiments/gpu_jobs/serve_bench.sh` writes (the replay's are optional). Torch-free.

  python -m experiments.serving_lag experiments/results/h200/serving [--csv OUT.csv]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


def _ttft_tpot_ms(requests: pd.DataFrame) -> tuple[float, float]:
    ttft = (requests["first_token_s"] - requests["arrival_s"]).mean()
    decode = requests[requests["output_tokens"] > 1]
    tpot = ((decode["finish_s"] - decode["first_token_s"]) / (decode["output_tokens"] - 1)).mean()
    return 1e3 * ttft, 1e3 * tpot


def delivery_lags_ms(client: pd.DataFrame, server: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per request (joined on rid): the first token's lag and the median lag over its tokens, in ms."""
    joined = client.merge(server, on="rid", suffixes=("_client", ""))
    first, every = [], []
    for row in joined.itertuples():
        seen = np.asarray(row.token_times_s_client, dtype=float) - row.arrival_s_client
        made = np.asarray(row.token_times_s, dtype=float) - row.arrival_s
        n = min(len(seen), len(made))
        if n:
            first.append(seen[0] - made[0])
            every.append(float(np.median(seen[:n] - made[:n])))
    return 1e3 * np.asarray(first), 1e3 * np.asarray(every)


def step_stats(steps: pd.DataFrame) -> dict[str, float]:
    steps = steps.sort_values("start_s")
    ms = 1e3 * (steps["end_s"] - steps["start_s"])
    gaps = 1e3 * (steps["start_s"].to_numpy()[1:] - steps["end_s"].to_numpy()[:-1])
    decode = steps["num_prefill_tokens"] == 0
    return {"steps": len(steps), "decode_step_mean_ms": ms[decode].mean(), "prefill_step_mean_ms": ms[~decode].mean(),
            "gap_mean_ms": gaps.mean() if len(gaps) else 0.0,
            "gap_p99_ms": float(np.percentile(gaps, 99)) if len(gaps) else 0.0,
            "gap_max_ms": float(gaps.max()) if len(gaps) else 0.0,
            "gaps_over_10ms": int((gaps > 10.0).sum())}      # stalls: a step waiting on the host (a collection, say)


def lag_table(results: Path) -> pd.DataFrame:
    rows = []
    # serve_rate_<rate>[_v<k>]: the k-th client setting at that rate (serve_bench.sh's CLIENT_VARIANTS), one replay a rate
    tags = [p.stem[len("serve_rate_"):] for p in results.glob("serve_rate_*.json")]
    for rate in sorted(tags, key=lambda t: (float(t.split("_v")[0]), t)):
        base = rate.split("_v")[0]
        files = {name: results / f"{stem}.parquet" for name, stem in (   # as serve_bench.sh names them
            ("client_requests", f"serve_rate_{rate}_client_requests"), ("server_requests", f"serve_rate_{rate}_requests"),
            ("server_steps", f"serve_rate_{rate}_steps"), ("replay_requests", f"replay_rate_{base}_requests"),
            ("replay_steps", f"replay_rate_{base}_steps"))}
        if not all(files[k].exists() for k in ("client_requests", "server_requests", "server_steps")):
            continue
        sides = ("client", "server") + (("replay",) if files["replay_requests"].exists() else ())   # replay optional
        frames = {name: pd.read_parquet(files[f"{name}_requests"]) for name in sides}
        first, every = delivery_lags_ms(frames["client"], frames["server"])
        summary = json.loads((results / f"serve_rate_{rate}.json").read_text())
        row = {"rate": float(base), "client_setting": int(rate.split("_v")[1]) if "_v" in rate else 1,
               "requests_per_s": summary["throughput"]["requests_per_s"]}
        for name, frame in frames.items():
            row[f"{name}_ttft_ms"], row[f"{name}_tpot_ms"] = _ttft_tpot_ms(frame)
        row.update(first_token_lag_mean_ms=first.mean(), first_token_lag_p50_ms=float(np.median(first)),
                   token_lag_p50_ms=float(np.median(every)))
        for name in ("server", "replay"):
            if files[f"{name}_steps"].exists():
                row.update({f"{name}_{k}": v for k, v in step_stats(pd.read_parquet(files[f"{name}_steps"])).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path)
    p.add_argument("--csv", type=Path, default=None)
    args = p.parse_args(argv)
    table = lag_table(args.results)
    if table.empty:
        raise SystemExit(f"no serve_rate_* files with client, server and replay records in {args.results}")
    with pd.option_context("display.width", 200, "display.max_columns", 40, "display.float_format", "{:.2f}".format):
        print(table.set_index("rate").T.to_string())
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
