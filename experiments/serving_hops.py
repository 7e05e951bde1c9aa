"""Where a served token's delivery lag goes, hop by hop: starts `run.py mode=serve <overrides>` with
TWINSERVE_HOP_TRACE set (every server process records when each output passes it), sends the workload
with experiments/bench_serving.py, and joins the marks with the client's token times (one perf_counter
clock on one host). Hops: step_end (the recorded token time, what the server's TTFT and ITL use) ->
sched_out (the scheduler has the output) -> sched_send -> detok_recv -> detok_send -> http_recv (the
HTTP process has it) -> handler (the stream's handler woke) -> written (the SSE chunk was written) -> client;
first outputs sent straight to their HTTP worker also pass sched_written (the scheduler's write done) and
worker_parsed (the worker's channel took the latest message off its sockets) before that worker's detok_recv.
Intake: client_sent -> http_entry (the request enters the ASGI app: uvicorn has parsed its headers) -> http_arrival
(routed, read and validated; the server's clock starts) -> http_sent -> sched_recv.
The *_send / *_sent marks are taken as a message is handed to its channel (pickling and the transfer count in
the next hop): on a busy host a mark taken after the send can come after the receiver's.

  python -m experiments.serving_hops --out DIR --client-processes 4 model=deepseek_v2_lite workload=random \
      workload.input_len=1024 workload.output_len=256 workload.num_requests=300 workload.request_rate=16
  python -m experiments.serving_hops --analyze DIR          # the table again, from the files

Writes DIR/hops.json (per hop: p50 / mean / p90 ms, first tokens and later ones apart) and prints it.
"""
from __future__ import annotations

import argparse
import json
import os
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd

OUTPUT_HOPS = ("step_end", "sched_out", "sched_send", "sched_written", "worker_parsed", "detok_recv", "detok_send",
               "http_recv", "handler", "written", "client")
INTAKE_HOPS = ("client_sent", "http_entry", "http_arrival", "http_sent", "sched_recv")
WINDOW_S = 5.0


def read_marks(trace_dir: Path) -> pd.DataFrame:
    """Every process's marks in one frame (hop, rid, token_index, num_tokens, t_s), without the server's
    warm-up request (it runs before any client and pays each channel's first message)."""
    from runtime.server.ipc import WARMUP_RID_PREFIX

    frames = [pd.read_csv(path, dtype={"rid": str}) for path in sorted(trace_dir.glob("*.csv"))]
    if not frames:
        raise SystemExit(f"no hop marks in {trace_dir}: was the server started with TWINSERVE_HOP_TRACE?")
    marks = pd.concat(frames, ignore_index=True)
    return marks[~marks["rid"].str.startswith(WARMUP_RID_PREFIX)].reset_index(drop=True)


def client_marks(bench_dir: Path) -> pd.DataFrame:
    """The client's marks on the server's clock: each request's sending and each token's arrival."""
    origin_s = json.loads((bench_dir / "summary.json").read_text())["clock_origin_s"]
    requests = pd.read_parquet(bench_dir / "requests.parquet")
    rows = []
    for r in requests.itertuples():
        rows.append(("client_sent", r.rid, -1, 0, origin_s + r.arrival_s))
        rows += [("client", r.rid, i, 1, origin_s + t) for i, t in enumerate(r.token_times_s)]
    return pd.DataFrame(rows, columns=["hop", "rid", "token_index", "num_tokens", "t_s"])


def hop_table(marks: pd.DataFrame) -> dict:
    """Per consecutive pair of hops: the time between them (ms), over the outputs (first tokens and the
    rest apart) or requests (intake) that have both marks."""
    outputs = marks[(marks["token_index"] >= 0) & ((marks["num_tokens"] > 0) | (marks["hop"] == "client"))]
    wide = outputs.pivot_table(index=["rid", "token_index"], columns="hop", values="t_s", aggfunc="first")
    intake = marks[marks["token_index"] < 0].pivot_table(index="rid", columns="hop", values="t_s", aggfunc="first")
    first = wide.xs(0, level="token_index", drop_level=False) if len(wide) else wide
    later = wide[wide.index.get_level_values("token_index") > 0]
    return {"first_token": _chain(first, OUTPUT_HOPS), "later_tokens": _chain(later, OUTPUT_HOPS),
            "intake": _chain(intake, INTAKE_HOPS), "num_requests": int(intake.shape[0]),
            "num_outputs": int(wide.shape[0]), "step_end_to_sched_out_floor_ms": floor_over_time(wide)}


def floor_over_time(wide: pd.DataFrame, window_s: float = WINDOW_S) -> list[list[float]]:
    """[seconds since the first output, ms] per window: the least time from a step's recorded end to
    the scheduler holding its outputs. On CUDA the recorded end is a device event placed on the host
    clock once per run; a floor that grows over the run is the device clock drifting from the host's."""
    if not {"step_end", "sched_out"} <= set(wide.columns):
        return []
    pair = wide[["step_end", "sched_out"]].dropna()
    t = pair["sched_out"] - pair["sched_out"].min()
    lag_ms = 1e3 * (pair["sched_out"] - pair["step_end"])
    floors = lag_ms.groupby((t // window_s).astype(int)).min()
    return [[k * window_s, float(v)] for k, v in floors.items()]


def _chain(wide: pd.DataFrame, hops: tuple[str, ...]) -> dict:
    present = [h for h in hops if h in wide.columns and wide[h].notna().any()]
    pairs = list(pairwise(present)) + ([(present[0], present[-1])] if len(present) > 2 else [])
    out = {}
    for a, b in pairs:
        ms = 1e3 * (wide[b] - wide[a]).dropna().to_numpy()
        if len(ms):
            out[f"{a}->{b}"] = {"p50": float(np.median(ms)), "mean": float(ms.mean()),
                                "p90": float(np.percentile(ms, 90)), "n": len(ms)}
    return out


def print_table(table: dict) -> None:
    print(f"{table['num_requests']} requests, {table['num_outputs']} outputs; ms: p50 / mean / p90")
    for part in ("intake", "first_token", "later_tokens"):
        print(f"  {part}")
        for hop, v in table[part].items():
            print(f"    {hop:<26} {v['p50']:8.3f} {v['mean']:8.3f} {v['p90']:8.3f}   (n={v['n']})")
    floors = ", ".join(f"{t:.0f}s {ms:.3f}" for t, ms in table["step_end_to_sched_out_floor_ms"])
    print(f"  least step_end->sched_out per {WINDOW_S:.0f} s (ms): {floors}")


def analyze(out_dir: Path) -> dict:
    marks = pd.concat([read_marks(out_dir / "hops"), client_marks(out_dir / "bench")], ignore_index=True)
    table = hop_table(marks)
    (out_dir / "hops.json").write_text(json.dumps(table, indent=2))
    print_table(table)
    return table


def main(argv: list[str] | None = None) -> int:
    from experiments import bench_serving
    from runtime.server.hop_trace import ENV_VAR

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--analyze", action="store_true", help="only the table, from the files already in --out")
    p.add_argument("--client-processes", type=int, default=1)
    p.add_argument("--preconnect", type=int, default=0, help="bench_serving's warm connection pool per client process")
    p.add_argument("overrides", nargs="*", help="Hydra overrides: the server's and the workload's")
    args = p.parse_args(argv)
    if not args.analyze:
        args.out.mkdir(parents=True, exist_ok=True)
        os.environ[ENV_VAR] = str((args.out / "hops").resolve())    # the launched server inherits it
        bench_serving.main(["--launch", "--quiet", "--flush-cache", "--out", str(args.out / "bench"),
                            "--client-processes", str(args.client_processes), "--preconnect", str(args.preconnect),
                            *args.overrides])
    analyze(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
