"""`mode=serve`: starts the scheduler and detokenizer processes (server.detokenizer=inline: no detokenizer
process, each tokenizer worker decodes its own outputs), waits until the model is loaded, then serves HTTP:
in this process (server.tokenizer_workers=1), or in N worker processes sharing one listening socket, this
one only supervising. SIGINT/SIGTERM shut everything down in order: HTTP drains, then the
scheduler aborts what is in flight and writes the run's records. Imports fastapi/uvicorn only inside
`run_serve` (the config test instantiates this target).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from runtime.server.http_worker import event_loop_and_http_parser   # bench_frontend imports it from here

CHILD_EXIT_TIMEOUT_S = 60.0


def check_tokenizer_workers(value: int) -> int:
    """`value` if it is a valid server.tokenizer_workers, else ValueError naming it."""
    if value < 1:
        raise ValueError(f"server.tokenizer_workers={value}: must be >= 1")
    return value


def run_serve(cfg: DictConfig) -> None:
    """Serve until a signal arrives, then print where the records went and their summary. Returns
    nothing: a server that finished no request (all aborted, or none sent) did not fail."""
    import multiprocessing as mp

    from runtime.server.channel import Inbox
    from runtime.server.detokenizer_process import run_detokenizer
    from runtime.server.ipc import Addresses, check_detokenizer, resolve_busy_poll_s
    from runtime.server.online_source import check_stream_interval
    from runtime.server.scheduler_process import run_scheduler

    check_stream_interval(int(cfg.server.stream_interval))       # before any process starts
    num_workers = check_tokenizer_workers(int(cfg.server.tokenizer_workers))
    detokenizer = check_detokenizer(cfg.server.detokenizer)
    busy_poll_s = cfg.server.busy_poll_s = resolve_busy_poll_s(cfg.server.busy_poll_s)   # every process alike
    container = OmegaConf.to_container(cfg, resolve=True)       # Hydra's run dir resolves only here
    model = instantiate(cfg.model)
    ipc_dir = tempfile.mkdtemp(prefix="twinserve-")
    addresses = Addresses.in_dir(ipc_dir)
    http_pull = Inbox(addresses.http, busy_poll_s=busy_poll_s)
    spawn = mp.get_context("spawn")
    children = [spawn.Process(target=run_scheduler, args=(container, addresses, os.getpid()),
                              name="twinserve-scheduler")]
    if detokenizer == "process":
        children.append(spawn.Process(target=run_detokenizer, name="twinserve-detokenizer",
                                      args=(addresses, cfg.tokenizer.path, model.vocab_size, os.getpid(), num_workers,
                                            busy_poll_s)))
    for child in children:
        child.start()
    try:
        ready = wait_ready(http_pull, children, float(cfg.server.startup_timeout_s))
        if num_workers == 1:
            reply = serve_http(cfg, model, addresses, http_pull, ready, children)
        else:
            from runtime.server.worker_pool import serve_with_workers
            reply = serve_with_workers(cfg, container, model, addresses, http_pull, ready, children, ipc_dir)
        report(cfg, reply)
    finally:
        stop_children(children, CHILD_EXIT_TIMEOUT_S)
        http_pull.close()
        shutil.rmtree(ipc_dir, ignore_errors=True)


def wait_ready(http_pull, children, timeout_s: float):
    """The scheduler's Ready message (after it loaded the model), or RuntimeError."""
    from runtime.server.ipc import ControlReply, Ready

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if http_pull.poll(500):
            msg = http_pull.recv_pyobj()
            if isinstance(msg, Ready):
                return msg
            if isinstance(msg, ControlReply) and not msg.ok:
                raise RuntimeError(f"the scheduler process failed to start:\n{msg.payload}")
        dead = [c for c in children if not c.is_alive()]
        if dead:
            raise RuntimeError(f"{dead[0].name} exited with code {dead[0].exitcode} during start-up")
    raise RuntimeError(f"the scheduler was not ready within {timeout_s:.0f} s (server.startup_timeout_s)")


def serve_http(cfg: DictConfig, model, addresses, http_pull, ready, children):
    """One tokenizer worker, in this process: serve until a signal, then shut the scheduler down from
    the app's lifespan. Returns the scheduler's shutdown reply (None if it gave none)."""
    from runtime.server.http_worker import build_frontend, build_server, land_signals_on_noop, serving_line

    frontend = build_frontend(cfg, model, addresses, ready, 0, scheduler_alive=children[0].is_alive)
    manager = frontend.manager
    shutdown_reply = {}

    async def on_startup() -> None:
        manager.start(http_pull)

    async def on_shutdown() -> None:
        try:
            shutdown_reply["reply"] = await manager.control("shutdown", timeout_s=CHILD_EXIT_TIMEOUT_S)
        except Exception as err:                              # the scheduler already gone: nothing to wait for
            print(f"twinserve: scheduler shutdown: {err}")
        await manager.close()

    server = build_server(cfg, model, ready, frontend, on_startup, on_shutdown, num_workers=1)
    land_signals_on_noop()                 # the children are still stopped and the records reported
    loop, http = event_loop_and_http_parser()
    print(serving_line(cfg, model, ready, f"{loop}, {http}"), flush=True)
    server.run()
    return shutdown_reply.get("reply")


def report(cfg: DictConfig, reply) -> dict | None:
    """Print where the records went and their summary; the summary, or None without a good reply."""
    from runtime.metrics import format_summary

    if reply is None or not reply.ok:
        return None
    print(f"twinserve: records in {reply.payload['dir']}")
    if cfg.print_summary:
        print(format_summary(reply.payload["summary"]))
    return reply.payload["summary"]


def stop_children(children, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.is_alive():
            child.terminate()
            child.join(5.0)
        if child.is_alive():
            child.kill()
            child.join()
