"""One output's way through the server's process chain without the server: scheduler -> detokenizer ->
HTTP worker (an asyncio loop), a message every `gap_ms` (one per step), per transport and receive mode.
Prints per-hop and end-to-end one-way latency (p50 / p90 / mean, us). Torch-free.

  python -m experiments.ipc_latency_bench [--gap-ms 10] [--messages 400] [--csv OUT.csv]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import tempfile
import time

TRANSPORTS = ("zmq", "mpconn")
MODES = ("block", "spin")


def _zmq_pull(address):
    import zmq
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PULL)
    sock.bind(address)
    return sock


def _zmq_push(address):
    import zmq
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.connect(address)
    return sock


def _middle(transport: str, mode: str, in_addr: str, out_addr: str, n: int, ready, results) -> None:
    """The detokenizer's role: receive, stamp, forward."""
    stamps = []
    if transport == "zmq":
        import zmq
        pull = _zmq_pull(in_addr)
        ready.set()
        push = _zmq_push(out_addr)
        while len(stamps) < n:
            if mode == "block":
                pull.poll(1000)
            try:
                msg = pull.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                continue
            now = time.perf_counter()
            stamps.append(now - msg[0])
            push.send_pyobj((msg[0], now))
    else:
        from multiprocessing.connection import Client, Listener
        listener = Listener(in_addr, family="AF_UNIX")
        ready.set()
        conn = listener.accept()
        out = Client(out_addr, family="AF_UNIX")
        while len(stamps) < n:
            if mode == "spin":
                if not conn.poll(0):
                    continue
            msg = conn.recv()
            now = time.perf_counter()
            stamps.append(now - msg[0])
            out.send((msg[0], now))
    results.put(("middle", stamps))


def _last(transport: str, mode: str, in_addr: str, n: int, ready, results) -> None:
    """The HTTP worker's role: an asyncio loop (uvloop when installed) woken by the message; with mode
    spin a task keeps the loop turning (its poll for events never sleeps)."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    hop, total = [], []

    async def spin(stop):
        while not stop.done():
            await asyncio.sleep(0)

    async def with_mode(coro):
        stop = asyncio.get_running_loop().create_future()
        spinner = asyncio.create_task(spin(stop)) if mode == "spin" else None
        await coro
        stop.set_result(None)
        if spinner is not None:
            await spinner

    async def main_zmq():
        import zmq.asyncio
        ctx = zmq.asyncio.Context()
        pull = ctx.socket(zmq.PULL)
        pull.bind(in_addr)
        ready.set()
        while len(hop) < n:
            msg = await pull.recv_pyobj()
            now = time.perf_counter()
            hop.append(now - msg[1])
            total.append(now - msg[0])

    async def main_conn():
        from multiprocessing.connection import Listener
        listener = Listener(in_addr, family="AF_UNIX")
        ready.set()
        loop = asyncio.get_running_loop()
        conn = await loop.run_in_executor(None, listener.accept)
        done = loop.create_future()

        def on_readable():
            while conn.poll(0):
                msg = conn.recv()
                now = time.perf_counter()
                hop.append(now - msg[1])
                total.append(now - msg[0])
            if len(hop) >= n and not done.done():
                loop.remove_reader(conn.fileno())
                done.set_result(None)
        loop.add_reader(conn.fileno(), on_readable)
        await done

    asyncio.run(with_mode(main_zmq() if transport == "zmq" else main_conn()))
    results.put(("last", hop))
    results.put(("total", total))


def run_chain(transport: str, mode: str, last_mode: str, gap_ms: float, n: int) -> dict[str, list[float]]:
    tmp = tempfile.mkdtemp(prefix="ipcbench")
    if transport == "zmq":
        a, b = f"ipc://{tmp}/mid", f"ipc://{tmp}/last"
    else:
        a, b = f"{tmp}/mid", f"{tmp}/last"
    ctx = mp.get_context("spawn")
    results, r1, r2 = ctx.Queue(), ctx.Event(), ctx.Event()
    last = ctx.Process(target=_last, args=(transport, last_mode, b, n, r2, results))
    last.start()
    r2.wait()
    mid = ctx.Process(target=_middle, args=(transport, mode, a, b, n, r1, results))
    mid.start()
    r1.wait()
    if transport == "zmq":
        push = _zmq_push(a)
        send = push.send_pyobj
    else:
        from multiprocessing.connection import Client
        conn = Client(a, family="AF_UNIX")
        send = conn.send
    time.sleep(0.5)
    for _ in range(n):
        time.sleep(gap_ms / 1e3)
        send((time.perf_counter(), 0.0))
    out = dict(results.get(timeout=60) for _ in range(3))
    mid.join()
    last.join()
    return out


def summarize(values: list[float]) -> dict[str, float]:
    us = sorted(v * 1e6 for v in values)
    return {"p50_us": us[len(us) // 2], "p90_us": us[int(len(us) * 0.9)], "mean_us": statistics.fmean(us)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gap-ms", type=float, default=10.0)
    ap.add_argument("--messages", type=int, default=400)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    rows = []
    for transport in TRANSPORTS:
        for mode in MODES:
            for last_mode in MODES:
                out = run_chain(transport, mode, last_mode, args.gap_ms, args.messages)
                for hop in ("middle", "last", "total"):
                    rows.append({"transport": transport, "middle_mode": mode, "last_mode": last_mode, "hop": hop,
                                 "gap_ms": args.gap_ms, **summarize(out[hop])})
    print(f"{'transport':9s} {'middle':6s} {'last':6s} {'hop':7s} {'p50 us':>8s} {'p90 us':>8s} {'mean us':>8s}"
          f"  (cores {os.cpu_count()})")
    for r in rows:
        print(f"{r['transport']:9s} {r['middle_mode']:6s} {r['last_mode']:6s} {r['hop']:7s} {r['p50_us']:8.0f} "
              f"{r['p90_us']:8.0f} {r['mean_us']:8.0f}")
    if args.csv:
        import pandas as pd
        pd.DataFrame(rows).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
