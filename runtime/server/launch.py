"""`mode=serve`: starts the scheduler and detokenizer processes, waits until the model is loaded,
then serves HTTP (FastAPI on uvicorn) in this process, which also tokenizes. SIGINT/SIGTERM shut
everything down in order: the scheduler aborts what is in flight and writes the run's records.
Imports fastapi/uvicorn/zmq only inside `run_serve` (the config test instantiates this target).
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

CHILD_EXIT_TIMEOUT_S = 60.0


def run_serve(cfg: DictConfig) -> None:
    """Serve until a signal arrives, then print where the records went and their summary. Returns
    nothing: a server that finished no request (all aborted, or none sent) did not fail."""
    import multiprocessing as mp

    import zmq

    from runtime.server.detokenizer_process import run_detokenizer
    from runtime.server.ipc import Addresses, pull_socket
    from runtime.server.online_source import check_stream_interval
    from runtime.server.scheduler_process import run_scheduler

    check_stream_interval(int(cfg.server.stream_interval))       # before any process starts
    container = OmegaConf.to_container(cfg, resolve=True)       # Hydra's run dir resolves only here
    model = instantiate(cfg.model)
    ipc_dir = tempfile.mkdtemp(prefix="twinserve-")
    addresses = Addresses.in_dir(ipc_dir)
    zctx = zmq.Context()
    http_pull = pull_socket(zctx, addresses.http)
    spawn = mp.get_context("spawn")
    children = [
        spawn.Process(target=run_scheduler, args=(container, addresses, os.getpid()), name="twinserve-scheduler"),
        spawn.Process(target=run_detokenizer, args=(addresses, cfg.tokenizer.path, model.vocab_size, os.getpid()),
                      name="twinserve-detokenizer"),
    ]
    for child in children:
        child.start()
    try:
        ready = wait_ready(http_pull, children, float(cfg.server.startup_timeout_s))
        serve_http(cfg, model, addresses, http_pull, ready, children)
    finally:
        stop_children(children, CHILD_EXIT_TIMEOUT_S)
        http_pull.close()
        zctx.term()
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


def serve_http(cfg: DictConfig, model, addresses, http_pull, ready, children) -> dict | None:
    import uvicorn

    from runtime.metrics import format_summary
    from runtime.server.hop_trace import HopTrace
    from runtime.server.http_app import create_app
    from runtime.server.input_processor import InputProcessor, ModelLimits
    from runtime.server.server_metrics import ServerMetrics
    from runtime.server.tokenizer import load_tokenizer
    from runtime.server.tokenizer_manager import TokenizerManager

    name = cfg.server.served_model_name or model.name
    limits = ModelLimits(ready.max_context_tokens, ready.kv_capacity_tokens, ready.vocab_size, model.eos_token_ids)
    metrics = ServerMetrics(name)
    processor = InputProcessor(load_tokenizer(cfg.tokenizer.path, model.vocab_size), limits)
    manager = TokenizerManager(processor, addresses, metrics, scheduler_alive=children[0].is_alive,
                               trace=HopTrace.from_env("http"))
    shutdown_reply = {}

    async def on_startup() -> None:
        manager.start(http_pull)

    async def on_shutdown() -> None:
        try:
            shutdown_reply["reply"] = await manager.control("shutdown", timeout_s=CHILD_EXIT_TIMEOUT_S)
        except Exception as err:                              # the scheduler already gone: nothing to wait for
            print(f"twinserve: scheduler shutdown: {err}")
        await manager.close()

    server_args = {"model": model.name, "model_path": model.path, "device": ready.device, "kv_capacity_tokens": ready.kv_capacity_tokens,
                   "host": cfg.server.host, "port": int(cfg.server.port), "tokenizer_path": cfg.tokenizer.path,
                   "policy": OmegaConf.to_container(cfg.policy), "scheduler_config": OmegaConf.to_container(cfg.scheduler),
                   "overlap": bool(cfg.overlap), "output_dir": str(cfg.output_dir)}
    app = create_app(manager, metrics, name, limits, server_args, on_startup, on_shutdown)
    loop, http = event_loop_and_http_parser()
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.server.host, port=int(cfg.server.port), log_level="warning",
                                           access_log=False, loop=loop, http=http,
                                           timeout_graceful_shutdown=max(float(cfg.server.graceful_shutdown_s), 1e-3)))
    # uvicorn re-raises the signal it caught once it has shut down; land it on a no-op so the
    # children are still stopped and the records reported below.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    print(f"twinserve: serving {name} on http://{cfg.server.host}:{cfg.server.port} ({ready.device}, "
          f"KV {ready.kv_capacity_tokens} tokens; {loop}, {http})", flush=True)
    server.run()
    reply = shutdown_reply.get("reply")
    if reply is None or not reply.ok:
        return None
    print(f"twinserve: records in {reply.payload['dir']}")
    if cfg.print_summary:
        print(format_summary(reply.payload["summary"]))
    return reply.payload["summary"]


def event_loop_and_http_parser() -> tuple[str, str]:
    """uvloop and httptools where installed (the `serve` extra), else asyncio's loop and h11 (which
    cost the HTTP process about 1.3x the CPU time per streamed chunk)."""
    from importlib.util import find_spec

    return ("uvloop" if find_spec("uvloop") else "asyncio"), ("httptools" if find_spec("httptools") else "h11")


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
