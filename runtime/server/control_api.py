"""Operational endpoints: GET /health, GET /health_generate, GET /get_model_info, GET /get_server_info,
GET|POST /flush_cache, POST /dump_records, GET /metrics (Prometheus text format)."""
from __future__ import annotations

import asyncio
import importlib.metadata
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from runtime.server.errors import APIError
from runtime.server.outputs import collect_outputs
from runtime.server.protocol import GenerateInput

router = APIRouter()
HEALTH_GENERATE_TIMEOUT_S = 20.0


def _version() -> str:
    try:
        return importlib.metadata.version("twinserve")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


VERSION = _version()


@router.get("/health")
async def health(http: Request):
    if http.app.state.manager.dead:
        return PlainTextResponse("scheduler process not running", status_code=503)
    return PlainTextResponse("")


@router.get("/health_generate")
async def health_generate(http: Request):
    """Health through the whole pipeline (SGLang's /health_generate): one generated token, or 503."""
    manager = http.app.state.manager
    if manager.dead:
        return PlainTextResponse("scheduler process not running", status_code=503)
    state = manager.submit(GenerateInput(input_ids=[0], sampling={"max_new_tokens": 1, "ignore_eos": True},
                                         rid=f"HEALTH_CHECK_{uuid.uuid4().hex}"), "health_generate")
    try:
        await asyncio.wait_for(collect_outputs(manager, state, http), HEALTH_GENERATE_TIMEOUT_S)
    except asyncio.TimeoutError:
        manager.abort(state.rid)
        return PlainTextResponse(f"no token within {HEALTH_GENERATE_TIMEOUT_S:.0f} s", status_code=503)
    return PlainTextResponse("")


@router.get("/get_model_info")
async def model_info(http: Request):
    s = http.app.state
    return JSONResponse({"model_path": s.server_args.get("model_path") or s.model_name,
                         "tokenizer_path": s.server_args.get("tokenizer_path"), "is_generation": True,
                         "served_model_name": s.model_name, "max_context_tokens": s.limits.max_context_tokens})


@router.get("/get_server_info")
async def server_info(http: Request):
    s = http.app.state
    reply = await s.manager.control("server_info")
    return JSONResponse({**s.server_args, "served_model_name": s.model_name, "version": VERSION,
                         "max_context_tokens": s.limits.max_context_tokens,
                         "max_total_num_tokens": s.limits.kv_capacity_tokens, "scheduler": reply.payload,
                         "num_http_requests_in_flight": len(s.manager.states)})


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(http: Request):
    reply = await http.app.state.manager.control("flush_cache")
    if not reply.ok:
        raise APIError(f"cache not flushed: {reply.payload}", status=400, code="requests_in_flight")
    return PlainTextResponse(f"Cache flushed: {reply.payload} tokens freed.\n")


@router.post("/dump_records")
async def dump_records(http: Request):
    """Write requests.parquet, steps.parquet and summary.json of everything served so far into the
    run directory (or `{"dir": ...}`; `{"rids": [...]}`: only the last request of each of these
    ids, and the steps from the first one's arrival on); returns the directory and the summary."""
    body = await http.body()
    args = {}
    if body.strip():
        try:
            import json
            args = json.loads(body)
        except ValueError as err:
            raise APIError(f"request body is not valid JSON: {err}") from None
        if not isinstance(args, dict) or not isinstance(args.get("dir") or "", str):
            raise APIError("expected {\"dir\": \"path\", \"rids\": [...]}", param="dir")
        rids = args.get("rids")
        if rids is not None and not (isinstance(rids, list) and all(isinstance(r, str) for r in rids)):
            raise APIError("rids must be a list of strings", param="rids")
    reply = await http.app.state.manager.control("dump_records", {"dir": args.get("dir"), "rids": args.get("rids")},
                                                 timeout_s=600.0)
    if not reply.ok:
        raise APIError(f"records not written: {reply.payload}", status=500)
    return JSONResponse(reply.payload)


@router.get("/metrics")
async def metrics(http: Request):
    return Response(http.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
