"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions (streaming as
server-sent events ending with `data: [DONE]`). Imports neither torch nor zmq directly."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from runtime.server.errors import APIError, from_validation_error
from runtime.server.outputs import (
    OPENAI_FINISH, TEXT_SLOT, collect_outputs, gather, sse, sse_with_text, stream_outputs, usage,
)
from runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from runtime.server.tokenizer_manager import ReqState, TokenizerManager

router = APIRouter()


async def parse(http: Request, model: type[BaseModel]) -> BaseModel:
    try:
        return model.model_validate_json(await http.body())
    except ValidationError as err:
        raise from_validation_error(err) from None


def check_model(http: Request, name: str) -> None:
    served = http.app.state.model_name
    if name != served:
        raise APIError(f"the model {name!r} does not exist; this server serves {served!r}", status=404,
                       param="model", code="model_not_found")


@router.get("/v1/models")
async def models(http: Request) -> dict:
    s = http.app.state
    return {"object": "list", "data": [{"id": s.model_name, "object": "model", "created": s.created,
                                        "owned_by": "twinserve", "root": s.model_name,
                                        "max_model_len": s.limits.max_context_tokens}]}


@router.post("/v1/chat/completions")
async def chat_completions(http: Request):
    req = await parse(http, ChatCompletionRequest)
    check_model(http, req.model)
    gi = req.generate_input()
    manager: TokenizerManager = http.app.state.manager
    state = manager.submit(gi, "chat")
    head = {"id": f"chatcmpl-{state.rid}", "created": int(time.time()), "model": req.model}
    if gi.stream:
        return StreamingResponse(_chat_stream(manager, state, head, req.include_usage()),
                                 media_type="text/event-stream")
    text, _ = gather(await collect_outputs(manager, state, http))
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": OPENAI_FINISH[state.finish.reason]}
    return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage(state.finish)})


async def _chat_stream(manager: TokenizerManager, state: ReqState, head: dict,
                       include_usage: bool) -> AsyncIterator[str]:
    head = {**head, "object": "chat.completion.chunk"}
    chunk = lambda delta, finish=None: sse({**head, "choices": [   # noqa: E731
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})
    content = sse_with_text({**head, "choices": [{"index": 0, "delta": {"content": TEXT_SLOT}, "logprobs": None,
                                                  "finish_reason": None}]})
    yield chunk({"role": "assistant", "content": ""})
    async for batch in stream_outputs(manager, state):
        text, ids = gather(batch)
        if text or ids:                  # a chunk per delivery, even when its tokens decode to ""
            yield content(text)
    yield chunk({}, OPENAI_FINISH[state.finish.reason])
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage(state.finish)})
    yield sse("[DONE]")


@router.post("/v1/completions")
async def completions(http: Request):
    req = await parse(http, CompletionRequest)
    check_model(http, req.model)
    gi = req.generate_input()
    manager: TokenizerManager = http.app.state.manager
    state = manager.submit(gi, "completions")
    head = {"id": f"cmpl-{state.rid}", "created": int(time.time()), "model": req.model}
    if gi.stream:
        return StreamingResponse(_completion_stream(manager, state, head, req.include_usage()),
                                 media_type="text/event-stream")
    text, _ = gather(await collect_outputs(manager, state, http))
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": OPENAI_FINISH[state.finish.reason]}
    return JSONResponse({**head, "object": "text_completion", "choices": [choice], "usage": usage(state.finish)})


async def _completion_stream(manager: TokenizerManager, state: ReqState, head: dict,
                             include_usage: bool) -> AsyncIterator[str]:
    head = {**head, "object": "text_completion"}
    piece = sse_with_text({**head, "choices": [{"index": 0, "text": TEXT_SLOT, "logprobs": None,
                                                "finish_reason": None}]})
    async for batch in stream_outputs(manager, state):
        text, ids = gather(batch)
        if batch[-1].finish is not None:
            yield sse({**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                            "finish_reason": OPENAI_FINISH[state.finish.reason]}]})
        elif text or ids:
            yield piece(text)
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage(state.finish)})
    yield sse("[DONE]")
