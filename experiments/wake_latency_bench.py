"""One message's way from one process into another, as the server's hops take it: the scheduler's Outbox
into an HTTP worker's asyncio loop (AsyncInbox) or a plain loop (Inbox.poll), and a TCP chunk into the
benchmark client's loop; each receiver spinning or sleeping between messages. Torch-free; stdlib + uvloop.

  python -m experiments.wake_latency_bench [--gap-ms 20] [--messages 300] [--csv OUT.csv]

Prints one-way latency per variant (p50 / p90 / mean, us) and, for spinning asyncio loops, how long one
turn of the loop takes while it spins (the floor of any hop into it).
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import multiprocessing as mp
import os
import socket
import statistics
import tempfile
import time

VARIANTS = ("plain_spin", "plain_sleep", "asyncio_spin", "asyncio_sleep", "tcp_client_spin", "tcp_client_sleep")
PAYLOAD = {"rid": "x" * 32, "token_ids": [123], "text": "token", "stats": tuple(range(7))}   # a first output's size


def _event_loop():
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def _sender(path_or_port, tcp: bool, gap_s: float, n: int, ready, go) -> None:
    """Every gap_s: the send time (perf_counter) and a payload, over the server's channel or a TCP socket."""
    import pickle
    if tcp:
        listener = socket.create_server(("127.0.0.1", path_or_port))
        ready.set()
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        from runtime.server.channel import Outbox
        ready.set()
        go.wait()
        out = Outbox(path_or_port)
    time.sleep(0.2)
    body = pickle.dumps(PAYLOAD)
    for _ in range(n):
        deadline = time.perf_counter() + gap_s
        while time.perf_counter() < deadline - 0.002:
            time.sleep(0.001)
        while time.perf_counter() < deadline:
            pass
        t0 = time.perf_counter()
        if tcp:
            conn.sendall(b"data: %.9f %s\n" % (t0, body.hex().encode()[:64]))
        else:
            out.send_pyobj((t0, PAYLOAD))
    time.sleep(0.1)


def _receiver(variant: str, address, n: int, ready, go, results) -> None:
    spin = variant.endswith("_spin")
    lat: list[float] = []
    turns = {"count": 0, "seconds": 0.0}
    if variant.startswith("plain"):
        from runtime.server.channel import Inbox
        inbox = Inbox(address, busy_poll_s=10.0 if spin else 0.0)
        ready.set()
        go.set()
        while len(lat) < n:
            t0, _ = inbox.recv_pyobj()
            lat.append(time.perf_counter() - t0)
        results.put((variant, lat, None))
        return

    async def spinner(stop: asyncio.Event) -> None:
        start = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0)
            turns["count"] += 1
        turns["seconds"] = time.perf_counter() - start

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(spinner(stop)) if spin else None
        if variant.startswith("asyncio"):
            from runtime.server.channel import AsyncInbox, Inbox
            inbox = AsyncInbox(Inbox(address, busy_poll_s=0.0))   # the spinner above keeps the loop turning
            ready.set()
            go.set()
            while len(lat) < n:
                t0, _ = await inbox.recv_pyobj()
                lat.append(time.perf_counter() - t0)
            inbox.close()
        else:
            ready.wait()
            reader, writer = await asyncio.open_connection("127.0.0.1", address)
            while len(lat) < n:
                line = await reader.readline()
                lat.append(time.perf_counter() - float(line.split()[1]))
            writer.close()
        stop.set()
        if task is not None:
            await task

    loop = _event_loop()
    loop.run_until_complete(main())
    loop.close()
    per_turn_us = 1e6 * turns["seconds"] / turns["count"] if turns["count"] else None
    results.put((variant, lat, per_turn_us))


def run_variant(variant: str, gap_s: float, n: int) -> tuple[list[float], float | None]:
    ctx = mp.get_context("spawn")
    ready, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
    tcp = variant.startswith("tcp")
    with tempfile.TemporaryDirectory(prefix="wake") as tmp:
        if tcp:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                address = s.getsockname()[1]
        else:
            address = os.path.join(tmp, "inbox")
        sender_ready = ready if tcp else ctx.Event()         # held here until the sender has started
        sender = ctx.Process(target=_sender, args=(address, tcp, gap_s, n, sender_ready, go))
        receiver = ctx.Process(target=_receiver, args=(variant, address, n, ready, go, results))
        if tcp:
            sender.start()
            receiver.start()
        else:
            receiver.start()
            ready.wait()
            sender.start()
        _, lat, per_turn_us = results.get(timeout=60 + 2 * n * gap_s)
        sender.join()
        receiver.join()
    return lat, per_turn_us


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gap-ms", type=float, default=20.0, help="time between messages (a step)")
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    rows = []
    print(f"{'variant':18s} {'p50 us':>8s} {'p90 us':>8s} {'mean us':>8s} {'loop turn us':>13s}")
    for variant in args.variants.split(","):
        lat, per_turn_us = run_variant(variant, args.gap_ms / 1e3, args.messages)
        us = sorted(1e6 * x for x in lat[10:])                 # the first messages warm the path up
        row = {"variant": variant, "p50_us": statistics.median(us), "p90_us": us[int(0.9 * (len(us) - 1))],
               "mean_us": statistics.fmean(us), "loop_turn_us": per_turn_us, "messages": len(us),
               "gap_ms": args.gap_ms}
        rows.append(row)
        turn = f"{per_turn_us:13.2f}" if per_turn_us is not None else f"{'-':>13s}"
        print(f"{variant:18s} {row['p50_us']:8.1f} {row['p90_us']:8.1f} {row['mean_us']:8.1f} {turn}", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
