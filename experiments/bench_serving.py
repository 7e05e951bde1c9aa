"""Serving benchmark: sends a twinserve workload (synthetic or a real trace) to an HTTP server on the
workload's arrival times (or re-timed Poisson/gamma, or at a fixed concurrency), streams every
response and writes requests.parquet / steps.parquet / summary.json with the shared metric
definitions (runtime/metrics.py), so a served run compares with `mode=sim` / `mode=real` of the
same workload. Works against twinserve, SGLang or any OpenAI-compatible server.

  python experiments/bench_serving.py --url http://127.0.0.1:30000 workload=random workload.request_rate=8
  python experiments/bench_serving.py --launch --out DIR workload=random workload.request_rate=8   # own server
  python experiments/bench_serving.py --url URL --backend openai-chat --max-concurrency 64 workload=sharegpt_multiturn

Positional arguments are Hydra overrides (as for run.py): they choose the workload and, with
--launch, configure the server (model, hardware, policy, ...). Each request asks for exactly its
workload output length with ignore_eos and the workload's sampling parameters (DESIGN contract 7).
Token times are client arrival times of the stream chunks (a chunk carrying k tokens stamps k).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pandas as pd
from hydra.utils import instantiate

from experiments.compose import compose_config
from experiments.http_stream_client import HTTPError, StreamClient
from experiments.workloads.arrivals import gamma_arrivals_s, rng_for
from runtime.core.records import REQUEST_COLUMNS, STEP_COLUMNS
from runtime.core.request import RequestSpec
from runtime.metrics import format_summary, summarize
from runtime.records_io import write_run

BACKENDS = ("openai", "openai-chat", "sglang")
REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Outcome:
    """What the client saw of one request; times in seconds since the benchmark started."""

    spec: RequestSpec
    sent_s: float
    token_times_s: list[float] = dataclasses.field(default_factory=list)
    finish_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None


# -- one request per backend ---------------------------------------------------------------------
def request_body(backend: str, spec: RequestSpec, model: str, tokenizer) -> tuple[str, dict]:
    sp = spec.sampling_params()
    sampling = {"temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k, "min_p": sp.min_p,
                "ignore_eos": sp.ignore_eos}
    if sp.seed is not None:
        sampling["seed"] = sp.seed
    if backend == "sglang":
        return "/generate", {"input_ids": list(spec.input_ids), "stream": True, "rid": spec.rid,
                             "sampling_params": {**sampling, "max_new_tokens": sp.max_new_tokens}}
    common = {"model": model, "max_tokens": sp.max_new_tokens, "stream": True, "rid": spec.rid,
              "stream_options": {"include_usage": True}, **sampling}
    if backend == "openai":
        return "/v1/completions", {**common, "prompt": list(spec.input_ids)}
    text = tokenizer.decode(list(spec.input_ids))
    return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}]}


def on_chunk(backend: str, data: dict, out: Outcome, now_s: float) -> None:
    """Stamp the tokens one SSE chunk delivered; take counts and finish from it."""
    if backend == "sglang":
        meta = data["meta_info"]
        new = meta["completion_tokens"] - len(out.token_times_s)
        out.token_times_s.extend([now_s] * max(new, 0))
        out.prompt_tokens, out.completion_tokens = meta["prompt_tokens"], meta["completion_tokens"]
        out.cached_tokens = meta.get("cached_tokens") or 0
        if meta.get("finish_reason"):
            out.finish_reason = meta["finish_reason"]["type"]
        return
    if data.get("usage"):
        u = data["usage"]
        out.prompt_tokens, out.completion_tokens = u["prompt_tokens"], u["completion_tokens"]
        out.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    for choice in data.get("choices") or []:
        if backend == "openai":
            piece = choice.get("text")
        else:
            delta = choice.get("delta") or {}
            piece = None if "role" in delta and not delta.get("content") else delta.get("content")
        finish = choice.get("finish_reason")
        if piece is not None and (piece or not finish):    # a bare finish chunk delivers no token
            out.token_times_s.append(now_s)
        if finish:
            out.finish_reason = finish


def settle(out: Outcome) -> None:
    """OpenAI chunks do not say how many tokens they carry: tokens beyond the chunks counted are
    stamped at the finish (usage.completion_tokens is the truth)."""
    if out.completion_tokens is not None and out.finish_s is not None:
        missing = out.completion_tokens - len(out.token_times_s)
        out.token_times_s.extend([out.finish_s] * max(missing, 0))
        del out.token_times_s[out.completion_tokens:]


async def send_one(client: StreamClient, backend: str, spec: RequestSpec, path: str, body: bytes,
                   origin: float) -> Outcome:
    out = Outcome(spec, time.perf_counter() - origin)
    response = None
    try:
        response = await client.post(path, body)
        if response.status != 200:
            out.error = f"HTTP {response.status}: {(await response.read())[:300]!r}"
            return out
        async for line in response.lines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue                                   # read the body to its end: the connection is kept
            on_chunk(backend, json.loads(payload), out, time.perf_counter() - origin)
        out.finish_s = time.perf_counter() - origin
        settle(out)
    except (HTTPError, OSError, asyncio.IncompleteReadError, ValueError, KeyError) as err:
        out.error = f"{type(err).__name__}: {err}"
    finally:
        if response is not None:
            response.release()
    return out


async def send_all(url: str, backend: str, jobs: list[tuple[RequestSpec, str, bytes]], max_concurrency: int | None,
                   origin: float | Callable[[], Awaitable[float]], progress: bool, preconnect: int = 0,
                   busy_poll: bool = False) -> list[Outcome]:
    """Send every job (spec, path, body) at its spec's arrival_s after `origin` (a perf_counter
    reading, or a coroutine function returning it once the clock starts), at most `max_concurrency` at
    once. `preconnect`: connections opened before the clock starts. `busy_poll`: the loop never sleeps in
    the kernel while requests are in flight, so that a chunk's arrival does not wait for this process to
    wake (0.1-0.3 ms on some hosts): the client's own latency is then not part of what is measured."""
    limit = asyncio.Semaphore(max_concurrency or len(jobs) or 1)
    client = StreamClient(url)
    done = 0
    if preconnect > 0:
        await client.preconnect(preconnect)
    if not isinstance(origin, float):
        origin = await origin()

    async def one(spec: RequestSpec, path: str, body: bytes) -> Outcome:
        nonlocal done
        while (delay := spec.arrival_s - (time.perf_counter() - origin)) > 0:   # the loop's timer may wake early
            await asyncio.sleep(delay)
        async with limit:
            out = await send_one(client, backend, spec, path, body, origin)
        done += 1
        if progress and (done % max(1, len(jobs) // 20) == 0 or done == len(jobs)):
            print(f"  {done}/{len(jobs)} requests done", file=sys.stderr, flush=True)
        return out

    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    spinner = asyncio.get_running_loop().create_task(spin()) if busy_poll else None
    try:
        return list(await asyncio.gather(*(one(*job) for job in jobs)))
    finally:
        if spinner is not None:
            spinner.cancel()
        await client.aclose()


def run_event_loop(coro):
    """uvloop when it is installed (as the server uses it), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _client_process(url: str, backend: str, jobs: list, max_concurrency: int | None, ready, start, results,
                    preconnect: int, busy_poll: bool) -> None:
    """One of several client processes: its share of the jobs on the shared clock origin (its connections
    opened before it reports ready)."""

    async def origin() -> float:
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, start.wait)
        return start.origin_s()

    results.put(run_event_loop(send_all(url, backend, jobs, max_concurrency, origin, False, preconnect, busy_poll)))


class _Start:
    """The moment every client process starts sending from (a perf_counter reading, the same clock in
    every process on Linux)."""

    def __init__(self, ctx) -> None:
        self._event, self._origin = ctx.Event(), ctx.Value("d", 0.0)

    def go(self, origin_s: float) -> None:
        self._origin.value = origin_s
        self._event.set()

    def wait(self) -> None:
        self._event.wait()

    def origin_s(self) -> float:
        return self._origin.value


def run_load(url: str, backend: str, specs: list[RequestSpec], max_concurrency: int | None, model: str, tokenizer,
             progress: bool, processes: int = 1, preconnect: int = 0,
             busy_poll: bool = False) -> tuple[list[Outcome], float, float]:
    """Send every spec at its arrival_s (seconds after the start); `processes` > 1 deals the requests
    round-robin to that many client processes (each with max_concurrency / processes at once); each
    process opens `preconnect` connections first and, with `busy_poll`, never sleeps while it sends.
    Returns the outcomes, the sending time and the start (a perf_counter reading: the outcomes' times
    count from it)."""
    jobs = []
    for spec in specs:                                     # bodies are encoded before the clock starts
        path, body = request_body(backend, spec, model, tokenizer)
        jobs.append((spec, path, json.dumps(body).encode()))
    if processes <= 1:
        start_s: list[float] = []

        async def origin() -> float:
            start_s.append(time.perf_counter())
            return start_s[0]

        outcomes = run_event_loop(send_all(url, backend, jobs, max_concurrency, origin, progress, preconnect,
                                           busy_poll))
        return outcomes, time.perf_counter() - start_s[0], start_s[0]
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    start, results = _Start(ctx), ctx.Queue()
    share = None if max_concurrency is None else max(1, math.ceil(max_concurrency / processes))
    workers = []
    for k in range(processes):
        ready = ctx.Event()
        worker = ctx.Process(target=_client_process, args=(url, backend, jobs[k::processes], share, ready, start,
                                                           results, preconnect, busy_poll), daemon=True)
        worker.start()
        workers.append((worker, ready))
    for worker, ready in workers:
        ready.wait()
    origin = time.perf_counter() + 0.05
    start.go(origin)
    outcomes = [o for _ in workers for o in results.get()]
    for worker, _ in workers:
        worker.join()
    return outcomes, time.perf_counter() - origin, origin


# -- records -------------------------------------------------------------------------------------
def requests_frame(outcomes: list[Outcome]) -> pd.DataFrame:
    """The client's view in the shared requests.parquet schema (arrival = when the request was sent)."""
    rows = []
    for o in sorted(outcomes, key=lambda o: (o.sent_s, o.spec.rid)):
        ok = o.error is None and o.finish_s is not None
        times = list(o.token_times_s) if ok else []
        rows.append({
            "rid": o.spec.rid, "arrival_s": o.sent_s, "admitted_s": None,
            "first_token_s": times[0] if times else None, "finish_s": o.finish_s if ok else o.sent_s,
            "input_tokens": o.prompt_tokens if o.prompt_tokens is not None else len(o.spec.input_ids),
            "output_tokens": o.completion_tokens if o.completion_tokens is not None else len(times),
            "cached_tokens": o.cached_tokens,
            "finish_reason": ("length" if o.finish_reason == "too_long" else o.finish_reason) if ok else "error",
            "num_retractions": 0, "priority": o.spec.priority, "token_times_s": times,
        })
    return pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))


def retimed(specs: list[RequestSpec], request_rate: float, burstiness: float, seed: int) -> list[RequestSpec]:
    """The same requests in the same order on gamma arrivals (burstiness 1 = Poisson; inf = all at 0)."""
    arrivals = gamma_arrivals_s(rng_for(seed, "bench_serving.arrivals"), len(specs), request_rate, burstiness)
    return [dataclasses.replace(s, arrival_s=float(t)) for s, t in zip(specs, arrivals)]


# -- a server of our own -------------------------------------------------------------------------
@contextlib.contextmanager
def launched_server(overrides: list[str], run_dir: Path, port: int, timeout_s: float = 1800.0):
    """`python run.py mode=serve <overrides>` until the block ends (SIGTERM: it writes its records)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "run.py", "mode=serve", *overrides, f"server.port={port}", "progress=false",
           f"hydra.run.dir={run_dir}"]
    log = open(run_dir / "server.log", "wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}; see {run_dir / 'server.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not healthy within {timeout_s:.0f} s")
            time.sleep(1.0)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def served_model(url: str) -> str:
    r = httpx.get(f"{url}/v1/models", timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def dump_server_records(url: str, out_dir: Path, rids: list[str]) -> dict | None:
    """twinserve's own records of these requests (server-side times, the workload's rids) into
    out_dir/server; None from a server without /dump_records."""
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        r = httpx.post(f"{url}/dump_records", json={"dir": str(out_dir / "server"), "rids": rids}, timeout=600)
        if r.status_code == 200:
            return r.json()["summary"]
    return None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="base URL of a running server, e.g. http://127.0.0.1:30000")
    target.add_argument("--launch", action="store_true", help="start `run.py mode=serve <overrides>` and stop it after")
    parser.add_argument("--backend", choices=BACKENDS, default="openai",
                        help="openai: /v1/completions with token-id prompts (exact input lengths); sglang: "
                             "/generate with input_ids; openai-chat: /v1/chat/completions with decoded text")
    parser.add_argument("--request-rate", type=float, default=None,
                        help="replace the workload's arrival times by gamma arrivals at this rate (req/s; inf = all at 0)")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="at most this many requests in flight")
    parser.add_argument("--num-requests", type=int, default=None, help="only the first N requests of the workload")
    parser.add_argument("--out", default=None, help="output directory (default outputs/bench_serving/<time>)")
    parser.add_argument("--flush-cache", action="store_true",
                        help="POST /flush_cache first (a cold radix cache, as a fresh mode=real run has)")
    parser.add_argument("--client-processes", type=int, default=1,
                        help="client processes sending the requests (dealt round-robin); more than one when a "
                             "single process cannot keep up with the streams")
    parser.add_argument("--preconnect", type=int, default=0,
                        help="connections each client process opens before the clock starts (a warm pool: "
                             "requests do not pay the TCP handshake); the server closes idle ones after its "
                             "keep-alive timeout")
    parser.add_argument("--busy-poll", action="store_true",
                        help="client processes spin instead of sleeping while they send (one core each), so that "
                             "their own wake-up is not in the times measured")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (workload=..., model=..., ...)")
    args = parser.parse_args(argv)

    cfg = compose_config(args.overrides)
    specs = instantiate(cfg.workload).requests()[:args.num_requests]
    if args.request_rate is not None:
        specs = retimed(specs, args.request_rate, args.burstiness, int(cfg.seed))
    t0 = min((s.arrival_s for s in specs), default=0.0)
    specs = [dataclasses.replace(s, arrival_s=s.arrival_s - t0) for s in specs]
    tokenizer = None
    if args.backend == "openai-chat":
        from runtime.server.tokenizer import load_tokenizer
        tokenizer = load_tokenizer(cfg.tokenizer.path, int(cfg.model.hf_config.vocab_size))
    out_dir = Path(args.out or f"outputs/bench_serving/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)

    with (launched_server(args.overrides, out_dir / "server_run", free_port()) if args.launch
          else contextlib.nullcontext(args.url.rstrip("/"))) as url:
        model = served_model(url)
        if args.flush_cache:
            httpx.post(f"{url}/flush_cache", timeout=60).raise_for_status()
        wall = time.perf_counter()
        outcomes, duration_s, origin_s = run_load(url, args.backend, specs, args.max_concurrency, model, tokenizer,
                                        not args.quiet, args.client_processes, args.preconnect, args.busy_poll)
        wall_s = time.perf_counter() - wall
        server_summary = dump_server_records(url, out_dir, [s.rid for s in specs])

    requests = requests_frame(outcomes)
    steps = pd.DataFrame({c: [] for c in STEP_COLUMNS})
    summary = summarize(requests, steps, mode="bench_serving", wall_time_s=wall_s)
    errors = [o.error for o in outcomes if o.error]
    rate = args.request_rate if args.request_rate is not None else cfg.workload.get("request_rate")
    summary.update(url=url if args.url else "launched", backend=args.backend, model=model,
                   client_processes=args.client_processes, preconnect=args.preconnect,
                   client_busy_poll=args.busy_poll,
                   request_rate=None if rate is None or (isinstance(rate, float) and math.isinf(rate)) else rate,
                   burstiness=args.burstiness, max_concurrency=args.max_concurrency, overrides=list(args.overrides),
                   num_errors=len(errors), first_errors=errors[:5], send_duration_s=duration_s,
                   clock_origin_s=origin_s,    # perf_counter at the client's time 0 (one clock per host)
                   server_summary=server_summary)
    write_run(out_dir, requests, steps, summary, plots=False)
    if not args.quiet:
        print(format_summary(summary))
        if errors:
            print(f"{len(errors)} requests failed, e.g. {errors[0]}")
        print(f"records in {out_dir}")
    return summary


if __name__ == "__main__":
    main()
