"""One HTTP + tokenizer worker: FastAPI on uvicorn over its own TokenizerManager. With one worker it runs in
the launcher's process and binds host:port itself; with several (server.tokenizer_workers, SGLang's
--tokenizer-worker-num) each is a process of its own (`run_http_worker`) serving the listening socket
the launcher bound. Imports fastapi, uvicorn and prometheus_client only inside its functions.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass
class Frontend:
    """What one worker serves with: its manager, metrics, the served model's name and limits."""

    manager: Any            # TokenizerManager
    metrics: Any            # ServerMetrics
    name: str
    limits: Any             # ModelLimits


def served_model_name(cfg, model) -> str:
    return cfg.server.served_model_name or model.name


def serving_line(cfg, model, ready, detail: str) -> str:
    """The line a launcher prints once the server listens."""
    return (f"twinserve: serving {served_model_name(cfg, model)} on http://{cfg.server.host}:{cfg.server.port} "
            f"({ready.device}, KV {ready.kv_capacity_tokens} tokens; {detail})")


def build_frontend(cfg, model, addresses, ready, worker_id: int, scheduler_alive: Callable[[], bool],
                   multiprocess_metrics: bool = False) -> Frontend:
    from runtime.server.detokenizer_process import Detokenizer
    from runtime.server.hop_trace import HopTrace
    from runtime.server.input_processor import InputProcessor, ModelLimits
    from runtime.server.server_metrics import ServerMetrics
    from runtime.server.tokenizer import load_tokenizer
    from runtime.server.tokenizer_manager import TokenizerManager

    name = served_model_name(cfg, model)
    limits = ModelLimits(ready.max_context_tokens, ready.kv_capacity_tokens, ready.vocab_size, model.eos_token_ids)
    metrics = ServerMetrics(name, multiprocess=multiprocess_metrics)
    tokenizer = load_tokenizer(cfg.tokenizer.path, model.vocab_size)
    processor = InputProcessor(tokenizer, limits)
    inline = cfg.server.detokenizer == "inline"
    detokenizer = Detokenizer(tokenizer) if inline else None                               # decodes here
    first_decoder = Detokenizer(tokenizer) if not inline and cfg.server.first_outputs_direct else None
    manager = TokenizerManager(processor, addresses, metrics, scheduler_alive=scheduler_alive,
                               trace=HopTrace.from_env(f"http{worker_id}"), worker_id=worker_id,
                               detokenizer=detokenizer, busy_poll_s=float(cfg.server.busy_poll_s or 0.0),
                               first_decoder=first_decoder)
    return Frontend(manager, metrics, name, limits)


def build_server(cfg, model, ready, frontend: Frontend, on_startup, on_shutdown, num_workers: int):
    """The uvicorn server of one worker (not started)."""
    import uvicorn
    from omegaconf import OmegaConf

    from runtime.server.http_app import GenerationFastPath, create_app

    server_args = {"model": model.name, "model_path": model.path, "device": ready.device,
                   "kv_capacity_tokens": ready.kv_capacity_tokens, "host": cfg.server.host, "port": int(cfg.server.port),
                   "tokenizer_path": cfg.tokenizer.path, "policy": OmegaConf.to_container(cfg.policy),
                   "scheduler_config": OmegaConf.to_container(cfg.scheduler), "overlap": bool(cfg.overlap),
                   "output_dir": str(cfg.output_dir), "tokenizer_workers": num_workers,
                   "tokenizer_worker_id": frontend.manager.worker_id,
                   "detokenizer": cfg.server.detokenizer, "first_outputs_direct": cfg.server.first_outputs_direct,
                   "warmup": cfg.server.warmup,
                   "busy_poll_s": cfg.server.busy_poll_s}
    app = create_app(frontend.manager, frontend.metrics, frontend.name, frontend.limits, server_args, on_startup,
                     on_shutdown, warmup_timeout_s=float(cfg.server.startup_timeout_s) if cfg.server.warmup else None)
    app = GenerationFastPath(app)
    if frontend.manager.trace is not None:          # the delivery-lag probe: when each request enters the app
        from runtime.server.hop_trace import EntryMark

        app = EntryMark(app)
    loop, http = event_loop_and_http_parser()
    return uvicorn.Server(uvicorn.Config(app, host=cfg.server.host, port=int(cfg.server.port), log_level="warning",
                                         access_log=False, loop=loop, http=http,
                                         timeout_graceful_shutdown=max(float(cfg.server.graceful_shutdown_s), 1e-3)))


def event_loop_and_http_parser() -> tuple[str, str]:
    """uvloop and httptools where installed (the `serve` extra), else asyncio's loop and h11 (which
    cost the HTTP process about 1.3x the CPU time per streamed chunk)."""
    from importlib.util import find_spec

    return ("uvloop" if find_spec("uvloop") else "asyncio"), ("httptools" if find_spec("httptools") else "h11")


def land_signals_on_noop() -> None:
    """uvicorn re-raises the signal it caught once it has shut down; land it on a no-op so that what
    follows `run()` still runs."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)


def run_http_worker(cfg_container: dict, worker_id: int, num_workers: int, addresses, ready, sock,
                    metrics_dir: str) -> None:
    """Process entry of worker `worker_id` (1..N): serve `sock` until SIGTERM (the launcher's), then
    drain for server.graceful_shutdown_s and exit. The scheduler is shut down by the launcher."""
    os.environ[METRICS_DIR_ENV] = metrics_dir            # before prometheus_client is imported here
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from runtime.server.process_utils import child_process_setup, process_alive

    child_process_setup(f"twinserve-http{worker_id}")
    cfg = OmegaConf.create(cfg_container)
    model = instantiate(cfg.model)
    frontend = build_frontend(cfg, model, addresses, ready, worker_id, lambda: process_alive(ready.pid),
                              multiprocess_metrics=True)

    async def on_startup() -> None:
        frontend.manager.start()

    async def on_shutdown() -> None:
        await frontend.manager.close()

    server = build_server(cfg, model, ready, frontend, on_startup, on_shutdown, num_workers)
    land_signals_on_noop()
    server.run(sockets=[sock])
