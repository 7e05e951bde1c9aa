"""The HTTP front end's request intake, in-process: from `GenerationFastPath`'s entry to the request's hand-off
to the scheduler's channel (and on to the streamed response's start), µs per request; with `--baseline REV`,
rounds alternate between this tree's code and REV's, each in a fresh process.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 102400                       # DeepSeek-V2-Lite's
MAX_CONTEXT_TOKENS = 32768
PHASES = ("intake_us", "send_us", "start_us", "total_us")


def request_body(rid: str, prompt_ids: list[int], model: str) -> bytes:
    """The body `experiments/bench_serving.py --backend openai` sends (default sampling: ignore_eos)."""
    body = {"model": model, "max_tokens": 256, "stream": True, "rid": rid, "stream_options": {"include_usage": True},
            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "ignore_eos": True, "prompt": prompt_ids}
    return json.dumps(body, separators=(",", ":")).encode()


def http_scope(path: str, body: bytes) -> dict:
    """An ASGI scope as uvicorn's httptools protocol builds it."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "server": ("127.0.0.1", 30000), "client": ("127.0.0.1", 50000), "scheme": "http", "root_path": "",
            "headers": [(b"host", b"127.0.0.1:30000"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "state": {}, "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b""}


class Harness:
    """The HTTP process's app and TokenizerManager as `mode=serve` builds them, a scheduler Inbox that this
    drains between requests, and the hand-off's clock (the manager's outbox, timed)."""

    def __init__(self, tmp: str, trace: bool) -> None:
        from runtime.server.channel import Inbox
        from runtime.server.hop_trace import EntryMark, HopTrace
        from runtime.server.http_app import GenerationFastPath, create_app
        from runtime.server.input_processor import InputProcessor, ModelLimits
        from runtime.server.ipc import Addresses
        from runtime.server.server_metrics import ServerMetrics
        from runtime.server.tokenizer import ByteTokenizer
        from runtime.server.tokenizer_manager import TokenizerManager

        addresses = Addresses.in_dir(tmp)
        self.scheduler = Inbox(addresses.scheduler)
        self.worker_inbox = Inbox(addresses.http)
        limits = ModelLimits(MAX_CONTEXT_TOKENS, 1 << 20, VOCAB, (1,))
        metrics = ServerMetrics("bench")
        hop_trace = HopTrace(os.path.join(tmp, "hops.csv")) if trace else None
        self.manager = TokenizerManager(InputProcessor(ByteTokenizer(VOCAB), limits), addresses, metrics,
                                        lambda: True, trace=hop_trace)
        app = GenerationFastPath(create_app(self.manager, metrics, "bench", limits, {}))
        self.app = EntryMark(app) if trace else app
        self.sent_s: list[float] = []

    def start(self) -> None:
        """On the running loop: the manager's channels, its outbox timed."""
        self.manager.start(self.worker_inbox)
        push = self.manager._push
        send = push.send_pyobj

        def timed_send(obj) -> None:
            self.sent_s.append(time.perf_counter())
            send(obj)
            self.sent_s.append(time.perf_counter())

        push.send_pyobj = timed_send

    async def one(self, body: bytes) -> dict[str, float]:
        """One streamed completion up to its response's start, then its client leaves; µs per phase."""
        gone = asyncio.Event()
        started: list[float] = []
        delivered = [False]

        async def receive() -> dict:
            if not delivered[0]:
                delivered[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                started.append(time.perf_counter())
                gone.set()

        scope = http_scope("/v1/completions", body)
        self.sent_s.clear()
        t0 = time.perf_counter()
        await self.app(scope, receive, send)
        if len(self.sent_s) < 2 or not started:
            raise RuntimeError("the request was not sent or its response did not start")
        sent_begin, sent_end = self.sent_s[0], self.sent_s[1]
        list(self.scheduler.drain())                    # the request and its abort
        return {"intake_us": 1e6 * (sent_begin - t0), "send_us": 1e6 * (sent_end - sent_begin),
                "start_us": 1e6 * (started[0] - sent_end), "total_us": 1e6 * (started[0] - t0)}


async def measure(num_requests: int, num_warmup: int, prompt_len: int, trace: bool, seed: int,
                  gap_ms: float) -> dict:
    """Per-phase medians and means over `num_requests` (after `num_warmup`), µs. `gap_ms`: the loop idles that
    long between requests, as a server does between arrivals (code and data then come back cold)."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="twinserve-intake-") as tmp:
        harness = Harness(tmp, trace)
        harness.start()
        bodies = [request_body(f"r{i}", [rng.randrange(VOCAB) for _ in range(prompt_len)], "bench")
                  for i in range(num_warmup + num_requests)]
        rows = []
        for i, body in enumerate(bodies):
            row = await harness.one(body)
            if i >= num_warmup:
                rows.append(row)
            await asyncio.sleep(gap_ms / 1e3)
        await harness.manager.close()
    return {phase: {"p50": statistics.median(r[phase] for r in rows),
                    "mean": statistics.fmean(r[phase] for r in rows)} for phase in PHASES}


def run_child(args) -> None:
    import uvloop

    import runtime

    result = uvloop.run(measure(args.num_requests, args.num_warmup, args.prompt_len, args.trace, args.seed,
                                args.gap_ms))
    result["code"] = str(Path(runtime.__file__).resolve().parent.parent)
    print(json.dumps(result))


def export_tree(rev: str, directory: str) -> str:
    """REV's files (git archive) under `directory`."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout
    archive = subprocess.run(["git", "-C", root.strip(), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    return directory


def child_result(code_dir: str, args) -> dict:
    """One round in a fresh process whose `runtime` package is `code_dir`'s."""
    cmd = [sys.executable, __file__, "--child", "--num-requests", str(args.num_requests), "--num-warmup",
           str(args.num_warmup), "--prompt-len", str(args.prompt_len), "--seed", str(args.seed),
           "--gap-ms", str(args.gap_ms)]
    if args.trace:
        cmd.append("--trace")
    env = {**os.environ, "PYTHONPATH": code_dir}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def print_table(results: dict[str, list[dict]]) -> None:
    """Median over rounds of each round's p50 (and mean), per phase and code."""
    labels = list(results)
    print(f"{'phase (µs/request)':<20}" + "".join(f"{label + ' p50':>14}{label + ' mean':>14}" for label in labels))
    for phase in PHASES:
        cells = "".join(f"{statistics.median(r[phase]['p50'] for r in results[label]):>14.1f}"
                        f"{statistics.median(r[phase]['mean'] for r in results[label]):>14.1f}" for label in labels)
        print(f"{phase:<20}{cells}")
    if len(labels) == 2:                  # the machine's speed drifts: compare each round with its neighbour
        ratios = [a["intake_us"]["p50"] / b["intake_us"]["p50"] for b, a in zip(*results.values())]
        print(f"intake p50 {labels[1]}/{labels[0]}, median over paired rounds: {statistics.median(ratios):.3f}")
    for label in labels:
        print(f"{label}: intake p50 per round: "
              + " ".join(f"{r['intake_us']['p50']:.1f}" for r in results[label]) + f"  ({results[label][0]['code']})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument("--num-warmup", type=int, default=200)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="idle time between requests (0: back to back, every path hot; a served rate's gap: cold)")
    parser.add_argument("--trace", action="store_true", help="hop trace on (EntryMark + the manager's marks)")
    parser.add_argument("--baseline", default=None, help="a git revision to alternate with, e.g. HEAD")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args)
        return
    here = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory(prefix="twinserve-baseline-") as tmp:
        trees = {"after": here}
        if args.baseline:
            trees = {"before": export_tree(args.baseline, tmp), **trees}
        results: dict[str, list[dict]] = {label: [] for label in trees}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                results[label].append(child_result(tree, args))
    print_table(results)


if __name__ == "__main__":
    main()
