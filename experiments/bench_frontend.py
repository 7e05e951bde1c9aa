"""The serving front end alone: the real HTTP process (FastAPI on uvicorn, TokenizerManager) fed by a
fake scheduler + detokenizer process that, every `--step-ms`, emits one token for each request in flight
(first tokens after one step, first outputs in a message of their own as the detokenizer sends them),
driven by experiments/bench_serving.py's client. No model: what it measures is HTTP, tokenization, IPC
and the client.

  python experiments/bench_frontend.py --rate 64 --num-requests 640 --output-len 64 --step-ms 20

Reports the front end's TTFT overhead per request (the client's TTFT minus the fake scheduler's own time
from receiving the request to emitting its first token), ITL against the step, and the HTTP process's CPU
time per streamed token; writes them to OUT/frontend.json next to bench_serving's records. With
TWINSERVE_HOP_TRACE=DIR (a new, empty directory) the HTTP process marks each request's way in, and
frontend.json gains `intake_ms`: from the ASGI app's entry to the request's submission and hand-off (p50 /
mean / p90 ms; `experiments/serving_hops.py` names the hops).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

VOCAB = 512


def fake_scheduler(addresses, step_s: float, results, stop) -> None:
    """Every step_s: one token for each request in flight (its first one step after it arrived). Once
    `stop` is set, puts {rid: seconds from receiving the request to emitting its first token} on `results`."""
    from runtime.server.channel import Inbox, Outbox
    from runtime.server.detokenizer_process import MAX_OUTPUTS_PER_MESSAGE
    from runtime.server.ipc import (
        AbortReq, BatchText, ControlReply, ControlReq, Finish, Ready, SchedulerStats, TextOutput, TokenizedRequest,
    )

    pull, push = Inbox(addresses.scheduler), Outbox(addresses.http)
    push.send_pyobj(Ready(1 << 20, 1 << 16, VOCAB, "fake", os.getpid()))
    live: dict[str, list] = {}            # rid -> [tokens sent, arrival, prompt tokens, tokens wanted]
    ttfts: dict[str, float] = {}
    next_step = time.perf_counter() + step_s
    while not stop.is_set():
        push.flush()
        if pull.poll(max(0.0, (next_step - time.perf_counter()) * 1000)):
            for msg in pull.drain():
                if isinstance(msg, TokenizedRequest):
                    live[msg.rid] = [0, time.perf_counter(), len(msg.input_ids), msg.sampling.max_new_tokens]
                elif isinstance(msg, AbortReq):
                    live.pop(msg.rid, None)
                elif isinstance(msg, ControlReq):
                    push.send_pyobj(ControlReply(msg.kind, msg.req_id, msg.kind == "flush_cache",
                                                 0 if msg.kind == "flush_cache" else "a fake scheduler keeps no records"))
            continue
        now = time.perf_counter()
        next_step = now + step_s
        first, rest = [], []
        for rid, state in list(live.items()):
            if now - state[1] < step_s:
                continue
            state[0] += 1
            finish = None
            if state[0] >= state[3]:
                finish = Finish("length", None, state[2], state[0], 0, now - state[1], None)
                del live[rid]
            (first if state[0] == 1 else rest).append(TextOutput(rid, "x", [120], finish))
            if state[0] == 1:
                ttfts[rid] = now - state[1]
        stats = SchedulerStats(len(live), 0, 0, 1, 0, 0, 0)
        if first and rest:
            push.send_pyobj(BatchText(first))
            first = []
        outs = first + rest                              # in slices, as the detokenizer process sends them
        for start in range(0, len(outs), MAX_OUTPUTS_PER_MESSAGE):
            end = start + MAX_OUTPUTS_PER_MESSAGE
            push.send_pyobj(BatchText(outs[start:end], stats if end >= len(outs) else None))
    results.put(ttfts)
    push.close(0)
    pull.close()


def http_process(addresses, port: int, fast_path: bool = True) -> None:
    """The HTTP process as `mode=serve` builds it (uvloop and httptools where installed); `fast_path`
    False: the FastAPI app alone, without `GenerationFastPath` in front (for a side-by-side)."""
    import uvicorn

    from runtime.server.channel import Inbox
    from runtime.server.hop_trace import EntryMark, HopTrace
    from runtime.server.http_app import GenerationFastPath, create_app
    from runtime.server.input_processor import InputProcessor, ModelLimits
    from runtime.server.launch import event_loop_and_http_parser
    from runtime.server.server_metrics import ServerMetrics
    from runtime.server.tokenizer import ByteTokenizer
    from runtime.server.tokenizer_manager import TokenizerManager

    pull = Inbox(addresses.http)
    ready = pull.recv_pyobj()
    limits = ModelLimits(ready.max_context_tokens, ready.kv_capacity_tokens, VOCAB, ())
    metrics = ServerMetrics("fake")
    trace = HopTrace.from_env("http")          # TWINSERVE_HOP_TRACE=DIR: the delivery-lag probe's marks
    manager = TokenizerManager(InputProcessor(ByteTokenizer(VOCAB), limits), addresses, metrics, lambda: True,
                               trace=trace)

    async def on_startup() -> None:
        manager.start(pull)

    async def on_shutdown() -> None:
        await manager.close()                 # writes the trace's last rows

    app = create_app(manager, metrics, "fake", limits, {}, on_startup, on_shutdown)
    if fast_path:
        app = GenerationFastPath(app)
    if trace is not None:
        app = EntryMark(app)
    loop, http = event_loop_and_http_parser()
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                                  loop=loop, http=http)).run()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> dict:
    from experiments import bench_serving
    from runtime.records_io import read_run
    from runtime.server.hop_trace import ENV_VAR as HOP_TRACE_ENV
    from runtime.server.ipc import Addresses

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=64.0, help="Poisson request rate (req/s)")
    parser.add_argument("--num-requests", type=int, default=640)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=20.0, help="the fake scheduler's step")
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument("--out", default=None, help="output directory (default outputs/bench_frontend/<time>)")
    parser.add_argument("--without-fast-path", action="store_true",
                        help="serve the FastAPI app alone, as before GenerationFastPath (a side-by-side)")
    args = parser.parse_args(argv)

    out = Path(args.out or f"outputs/bench_frontend/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    ipc_dir = tempfile.mkdtemp(prefix="twinserve-frontend-")
    addresses, port = Addresses.in_dir(ipc_dir), bench_serving.free_port()
    ctx = mp.get_context("spawn")
    results, stop = ctx.Queue(), ctx.Event()
    http = ctx.Process(target=http_process, args=(addresses, port, not args.without_fast_path), daemon=True)
    http.start()
    time.sleep(0.2)                                  # the HTTP process binds its socket before Ready is sent
    backend = ctx.Process(target=fake_scheduler, args=(addresses, args.step_ms / 1000, results, stop), daemon=True)
    backend.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or not http.is_alive():
                raise RuntimeError("the HTTP process did not come up")
            time.sleep(0.1)
        for stream in (False, True):                 # first-request costs (imports, validators) off the clock
            httpx.post(f"{url}/v1/completions", json={"model": "fake", "prompt": [65, 66], "max_tokens": 2,
                                                      "stream": stream}, timeout=30).raise_for_status()
        cpu_before = cpu_seconds(http.pid)
        summary = bench_serving.main([
            "--url", url, "--quiet", "--out", str(out), "--client-processes", str(args.client_processes),
            "model=tiny_mla_moe", "workload=random", f"workload.input_len={args.input_len}",
            f"workload.output_len={args.output_len}", "workload.range_ratio=0.0",
            f"workload.num_requests={args.num_requests}", f"workload.request_rate={args.rate}"])
        cpu_after = cpu_seconds(http.pid)
        stop.set()
        server_ttft = results.get(timeout=30)
    finally:
        stop.set()
        backend.join(5)
        http.terminate()
        http.join(5)
        shutil.rmtree(ipc_dir, ignore_errors=True)
    requests, _, _ = read_run(out)
    ok = requests.dropna(subset=["first_token_s"])
    overhead_ms = np.array([1000 * (first - sent - server_ttft[rid]) for rid, first, sent in
                            zip(ok["rid"], ok["first_token_s"], ok["arrival_s"]) if rid in server_ttft])
    tokens = int(requests["output_tokens"].sum())
    overhead = None
    if len(overhead_ms):
        overhead = {"mean": float(overhead_ms.mean()),
                    **{f"p{p}": float(np.percentile(overhead_ms, p)) for p in (50, 90, 99)}}
    result = {
        "rate": args.rate, "num_requests": args.num_requests, "output_len": args.output_len, "step_ms": args.step_ms,
        "client_processes": args.client_processes, "num_finished": summary["num_finished"],
        "ttft_overhead_ms": overhead,
        "itl_over_step": {q: summary["itl_s"][q] * 1000 / args.step_ms for q in ("mean", "p50", "p99")},
        "http_cpu_us_per_token": (1e6 * (cpu_after - cpu_before) / tokens
                                  if cpu_before is not None and cpu_after is not None and tokens else None),
    }
    trace_dir = os.environ.get(HOP_TRACE_ENV)
    if trace_dir:                                    # the request's way in, hop by hop (the probe's marks)
        from experiments.serving_hops import INTAKE_HOPS, hop_table, read_marks

        marks = read_marks(Path(trace_dir))
        result["intake_ms"] = hop_table(marks[marks["hop"].isin(INTAKE_HOPS)])["intake"]
    (out / "frontend.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
