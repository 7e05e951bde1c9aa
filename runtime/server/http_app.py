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
               server_args: dict, on_startup=None, on_shutdown=None) -> FastAPI:
    """`on_startup` / `on_shutdown`: async callables run in the lifespan (the launcher starts the
    manager's receive loop and shuts the worker processes down there)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if on_startup is not None:
            await on_startup()
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
