"""The FastAPI application: OpenAI, native and control routes over one TokenizerManager; every
refusal is an OpenAI-style JSON error (invalid JSON and wrong types included)."""
from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from runtime.server import control_api, native_api, openai_api
from runtime.server.errors import APIError
from runtime.server.input_processor import ModelLimits
from runtime.server.ipc import WARMUP_RID_PREFIX
from runtime.server.outputs import ClientGone
from runtime.server.server_metrics import ServerMetrics
from runtime.server.tokenizer_manager import TokenizerManager


# FastAPI's own OpenTelemetry instrumentation (FastAPI >= 0.160 turns it on by default): spans, metrics and log
# records for every request and around every streamed chunk's send, through no-op providers unless one is set up.
# The server has its own metrics (/metrics); off, a request goes from the app's entry to its submission ~10% sooner
# (1024-token prompts, from the ASGI entry to TokenizerManager.submit, measured on the CPU).
TELEMETRY_OFF = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}


def without_telemetry(app_class: type = FastAPI) -> dict:
    """The keyword that turns `app_class`'s instrumentation off, where it has one (older FastAPI: nothing)."""
    import inspect

    return {"telemetry": dict(TELEMETRY_OFF)} if "telemetry" in inspect.signature(app_class.__init__).parameters else {}


def create_app(manager: TokenizerManager, metrics: ServerMetrics, model_name: str, limits: ModelLimits,
               server_args: dict, on_startup=None, on_shutdown=None, warmup_timeout_s: float | None = None) -> FastAPI:
    """`on_startup` / `on_shutdown`: async callables run in the lifespan (the launcher starts the
    manager's receive loop and shuts the worker processes down there). `warmup_timeout_s`: after
    `on_startup`, one request through the app (`warm_up`; None: none), before the server accepts clients."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if on_startup is not None:
            await on_startup()
        if warmup_timeout_s is not None:
            await warm_up(app, model_name, warmup_timeout_s)
        yield
        if on_shutdown is not None:
            await on_shutdown()

    app = FastAPI(title="twinserve", lifespan=lifespan, docs_url=None, redoc_url=None, **without_telemetry())
    app.state.manager, app.state.metrics, app.state.model_name = manager, metrics, model_name
    app.state.limits, app.state.server_args, app.state.created = limits, server_args, int(time.time())
    app.router.routes.extend(openai_api.ROUTES + native_api.ROUTES)      # the generation endpoints
    for router in (openai_api.router, native_api.router, control_api.router):
        app.include_router(router)

    def error(err: APIError) -> JSONResponse:
        metrics.errors.labels(status=str(err.status)).inc()
        return JSONResponse(err.body(), status_code=err.status)

    app.state.error_response = error

    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError):
        return error(err)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, err: RequestValidationError):
        return error(APIError(str(err.errors()[0].get("msg", err)), code="invalid_value"))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException):
        return error(APIError(str(err.detail), status=err.status_code))

    @app.exception_handler(ClientGone)
    async def client_gone(_: Request, err: ClientGone):
        return client_gone_response()

    return app


def client_gone_response() -> JSONResponse:
    return JSONResponse({"error": {"message": "client disconnected", "type": "aborted"}}, status_code=499)


class GenerationFastPath:
    """The ASGI app a worker serves: POSTs to the generation endpoints (`openai_api.ROUTES`,
    `native_api.ROUTES`) go straight to their handlers, whose refusals it renders as the FastAPI app's
    handlers do; everything else (other paths and methods, lifespan) goes to the FastAPI app. Its
    middleware and router are a dozen ASGI layers that every request passes and two that wrap every streamed
    chunk's send (~5% of the HTTP process's CPU per token, and time on every request's way in, on the CPU of
    `experiments/bench_frontend.py`); the generation handlers need none of them."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.endpoints = {route.path: route.endpoint for route in openai_api.ROUTES + native_api.ROUTES}

    async def __call__(self, scope, receive, send) -> None:
        endpoint = self.endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app                          # handlers read app.state through their Request
        try:
            response = await endpoint(Request(scope, receive, send))
        except APIError as err:
            response = self.app.state.error_response(err)
        except ClientGone:
            response = client_gone_response()
        await response(scope, receive, send)


WARMUP_PROMPT = "The capital city of France is"


async def warm_up(app: FastAPI, model_name: str, timeout_s: float) -> None:
    """SGLang's server warm-up: one streamed /v1/completions request of 8 tokens (rid WARMUP_...) through
    the app as served (`GenerationFastPath`), in this process, before uvicorn accepts connections, so that
    what a worker does once (lazy imports, the first streamed response, the channels' first messages) is not
    paid by the first client; then the radix cache is flushed (the first client finds the cache a replay
    starts with). The request is served
    like any other; the scheduler leaves it and its steps out of the run's records. RuntimeError when it
    fails."""
    import asyncio
    import json
    import uuid

    rid = f"{WARMUP_RID_PREFIX}{uuid.uuid4().hex}"
    body = json.dumps({"model": model_name, "prompt": WARMUP_PROMPT, "max_tokens": 8, "ignore_eos": True,
                       "stream": True, "rid": rid}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    finished = asyncio.Event()
    sent = {"status": None, "body": b""}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await finished.wait()                        # the client stays until the response ends
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
        elif message["type"] == "http.response.body":
            sent["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                finished.set()

    try:
        await asyncio.wait_for(GenerationFastPath(app)(scope, receive, send), timeout_s)
    except asyncio.TimeoutError:
        raise RuntimeError(f"server warm-up: no response within {timeout_s:.0f} s") from None
    finished.set()
    if sent["status"] != 200 or not sent["body"].rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError(f"server warm-up failed: HTTP {sent['status']}: {sent['body'][-300:]!r}")
    await app.state.manager.control("flush_cache")   # refused (harmlessly) while another worker's request runs
