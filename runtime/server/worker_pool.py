"""Several HTTP + tokenizer workers (server.tokenizer_workers = N > 1): the launcher binds one listening
socket, starts N worker processes that all accept on it, and supervises them; on SIGINT/SIGTERM the
workers drain (server.graceful_shutdown_s), then the launcher shuts the scheduler down and takes its
records. No torch.
"""
from __future__ import annotations

import os
import signal
import socket
import threading

SUPERVISE_POLL_S = 0.5
WORKER_EXIT_MARGIN_S = 15.0
LISTEN_BACKLOG = 2048


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port and listening (shared by every worker: the kernel hands each new
    connection to one of the workers waiting to accept)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def serve_with_workers(cfg, container: dict, model, addresses, http_pull, ready, children, ipc_dir: str):
    """Serve through N worker processes until a signal; returns the scheduler's shutdown reply (None if it
    gave none). `children`: the scheduler and detokenizer processes."""
    import multiprocessing as mp

    from runtime.server.http_worker import run_http_worker, serving_line

    num_workers = int(cfg.server.tokenizer_workers)
    metrics_dir = os.path.join(ipc_dir, "metrics")
    os.makedirs(metrics_dir, exist_ok=True)
    sock = listening_socket(cfg.server.host, int(cfg.server.port))
    spawn = mp.get_context("spawn")
    workers = [spawn.Process(target=run_http_worker, name=f"twinserve-http{i}",
                             args=(container, i, num_workers, addresses, ready, sock, metrics_dir))
               for i in range(1, num_workers + 1)]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for worker in workers:
            worker.start()
        sock.close()                                       # the workers hold it now
        print(serving_line(cfg, model, ready, f"{num_workers} tokenizer workers"), flush=True)
        supervise(workers, stop)
    finally:
        stop_workers(workers, float(cfg.server.graceful_shutdown_s) + WORKER_EXIT_MARGIN_S)
    return shutdown_scheduler(addresses, http_pull, children[0])


def supervise(workers, stop: threading.Event) -> None:
    """Until `stop` (a signal) or every worker is gone; a worker that dies is reported, the rest serve on."""
    reported: set[int] = set()
    while not stop.wait(SUPERVISE_POLL_S):
        for worker in workers:
            if not worker.is_alive() and worker.pid not in reported:
                reported.add(worker.pid)
                print(f"twinserve: {worker.name} exited with code {worker.exitcode}", flush=True)
        if len(reported) == len(workers):
            return


def stop_workers(workers, timeout_s: float) -> None:
    """SIGTERM each (uvicorn drains its connections, then exits); SIGKILL what is left after `timeout_s`."""
    for worker in workers:
        if worker.is_alive():
            os.kill(worker.pid, signal.SIGTERM)
    for worker in workers:
        worker.join(timeout_s)
        if worker.is_alive():
            worker.kill()
            worker.join()


def shutdown_scheduler(addresses, http_pull, scheduler, timeout_s: float = 60.0):
    """Ask the scheduler to abort what is left and write its records; its reply, or None."""
    import time

    from runtime.server.channel import Outbox
    from runtime.server.ipc import ControlReply, ControlReq

    push = Outbox(addresses.scheduler)
    try:
        push.send_pyobj(ControlReq("shutdown", 0, {}, worker=0))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (scheduler.is_alive() or http_pull.poll(0)):
            if http_pull.poll(int(1000 * SUPERVISE_POLL_S)):
                msg = http_pull.recv_pyobj()
                if isinstance(msg, ControlReply) and msg.kind == "shutdown":
                    return msg
        print("twinserve: the scheduler gave no shutdown reply", flush=True)
        return None
    finally:
        push.close(1000)
