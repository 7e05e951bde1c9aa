"""SGLang's native endpoints: POST /generate (text or input_ids, or a batch of either; sampling_params, with
`n`; stream, rid) and POST /abort_request. Responses carry `text`, `output_ids` and `meta_info`; streamed chunks are
cumulative, as SGLang sends them."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from runtime.server.ipc import Finish, PositionLogprobs, TextOutput
from runtime.server.logprob_format import native_logprobs
from runtime.server.openai_api import parse
from runtime.server.outputs import (
    collect_outputs, gather, gather_logprobs, merge_streams, native_finish, prompt_logprobs, sse, stream_outputs,
)
from runtime.server.protocol import AbortRequest, GenerateRequest
from runtime.server.tokenizer_manager import ReqState, TokenizerManager

router = APIRouter()


class _Accumulated:
    """Cumulative text, ids (and log-probabilities, when asked) of one request, and its meta_info."""

    def __init__(self, state: ReqState, req: GenerateRequest) -> None:
        self.state, self.req = state, req
        self.text, self.ids = "", []
        self.logprobs: list[PositionLogprobs] = []
        self.prompt_logprobs: list[PositionLogprobs] | None = None

    def add(self, outs: list[TextOutput]) -> None:
        text, ids = gather(outs)
        self.text += text
        self.ids += ids
        self.logprobs += gather_logprobs(outs)
        if self.prompt_logprobs is None:
            self.prompt_logprobs = prompt_logprobs(outs)

    def body(self) -> dict:
        finish: Finish | None = self.state.finish
        meta = {"id": self.state.rid, "prompt_tokens": self.state.num_prompt_tokens,
                "completion_tokens": len(self.ids),
                "cached_tokens": finish.cached_tokens if finish else None,
                "finish_reason": native_finish(finish) if finish else None,
                "e2e_latency": time.perf_counter() - self.state.arrival_s}
        if finish is not None:
            meta["completion_tokens"] = finish.completion_tokens
        if self.req.return_logprob:
            meta.update(native_logprobs(self.logprobs, self.req.top_logprobs_num or 0,
                                        self.req.return_text_in_logprobs, self.prompt_logprobs))
        return {"text": self.text, "output_ids": list(self.ids), "meta_info": meta}


async def generate(http: Request):
    req = await parse(http, GenerateRequest)
    manager: TokenizerManager = http.app.state.manager
    states = manager.submit_all(req.generate_inputs(), "generate")
    accs = [_Accumulated(state, req) for state in states]
    if not req.is_batch:
        if req.stream:
            return StreamingResponse(_stream(manager, states[0], accs[0]), media_type="text/event-stream")
        accs[0].add(await collect_outputs(manager, states[0], http))
        return JSONResponse(accs[0].body())
    if req.stream:
        streams = [_choice_events(manager, state, acc, index) for index, (state, acc) in enumerate(zip(states, accs))]
        return StreamingResponse(_batch_stream(streams), media_type="text/event-stream")
    outs = await asyncio.gather(*(collect_outputs(manager, state, http) for state in states))
    for acc, out in zip(accs, outs):
        acc.add(out)
    return JSONResponse([acc.body() for acc in accs])


async def _stream(manager: TokenizerManager, state: ReqState, acc: _Accumulated) -> AsyncIterator[str]:
    async for batch in stream_outputs(manager, state):
        acc.add(batch)
        yield sse(acc.body())
    yield sse("[DONE]")


async def _choice_events(manager: TokenizerManager, state: ReqState, acc: _Accumulated,
                         index: int) -> AsyncIterator[str]:
    async for batch in stream_outputs(manager, state):
        acc.add(batch)
        yield sse({**acc.body(), "index": index})


async def _batch_stream(streams: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    async with aclosing(merge_streams(streams)) as events:   # a client gone closes them all (and aborts)
        async for event in events:
            yield event
    yield sse("[DONE]")


ROUTES = [Route("/generate", generate, methods=["POST"])]     # a plain Starlette route, as openai_api.ROUTES


@router.post("/abort_request")
async def abort_request(http: Request):
    req = await parse(http, AbortRequest)
    manager: TokenizerManager = http.app.state.manager
    return JSONResponse({"aborted": await manager.abort_for_clients(req.rids())})
