"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions (streaming as
server-sent events ending with `data: [DONE]`). Imports neither torch nor zmq directly."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from runtime.server.errors import APIError, from_validation_error
from runtime.server.ipc import PositionLogprobs
from runtime.server.logprob_format import CompletionLogprobs, chat_logprobs
from runtime.server.outputs import (
    OPENAI_FINISH, TEXT_SLOT, collect_outputs, gather, gather_logprobs, prompt_logprobs, sse, sse_with_text,
    stream_outputs, usage,
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


def choice(payload: dict, logprobs: dict | None, finish_reason: str | None) -> dict:
    """One choice of a response or stream chunk, either API."""
    return {"index": 0, **payload, "logprobs": logprobs, "finish_reason": finish_reason}


class _ChatFormat:
    """What a chat completion has of its own: names, the choice's payload, the log-probabilities'
    shape and the stream's chunks (a role chunk first, the finish in a chunk of its own)."""

    endpoint, id_prefix, object, chunk_object = "chat", "chatcmpl", "chat.completion", "chat.completion.chunk"

    def __init__(self, req: ChatCompletionRequest) -> None:
        self.wants_logprobs = req.logprobs

    def payload(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}}

    def logprobs(self, positions: list[PositionLogprobs], prompt: list[PositionLogprobs] | None = None) -> dict | None:
        return chat_logprobs(positions) if self.wants_logprobs else None

    async def stream(self, manager: TokenizerManager, state: ReqState, head: dict) -> AsyncIterator[str]:
        chunk = lambda delta, logprobs=None, finish=None: sse(   # noqa: E731
            {**head, "choices": [choice({"delta": delta}, logprobs, finish)]})
        content = sse_with_text({**head, "choices": [choice({"delta": {"content": TEXT_SLOT}}, None, None)]})
        yield chunk({"role": "assistant", "content": ""})
        async for batch in stream_outputs(manager, state):
            text, ids = gather(batch)
            if self.wants_logprobs and ids:
                yield chunk({"content": text}, self.logprobs(gather_logprobs(batch)))
            elif text or ids:              # a chunk per delivery, even when its tokens decode to ""
                yield content(text)
        yield chunk({}, finish=OPENAI_FINISH[state.finish.reason])


class _CompletionFormat:
    """A text completion's: its stream carries the finish in the last text chunk. With `echo` the
    prompt's text comes first (in a stream: in the first chunk) and, with logprobs, its tokens' entries
    (the first one's None), as OpenAI's legacy API returns them."""

    endpoint, id_prefix, object, chunk_object = "completions", "cmpl", "text_completion", "text_completion"

    def __init__(self, req: CompletionRequest) -> None:
        self.blocks = CompletionLogprobs() if req.logprobs is not None else None   # text offsets span chunks
        self.echo = req.echo
        self.prompt_text = ""                  # set with echo, once the prompt is tokenized

    def payload(self, text: str) -> dict:
        return {"text": self.prompt_text + text}

    def logprobs(self, positions: list[PositionLogprobs], prompt: list[PositionLogprobs] | None = None) -> dict | None:
        if self.blocks is None:
            return None
        return self.blocks.block((prompt or []) + positions if self.echo else positions)

    async def stream(self, manager: TokenizerManager, state: ReqState, head: dict) -> AsyncIterator[str]:
        piece = sse_with_text({**head, "choices": [choice({"text": TEXT_SLOT}, None, None)]})
        echo = self.echo                       # the prompt still to send, ahead of the first output
        async for batch in stream_outputs(manager, state):
            text, ids = gather(batch)
            finish = OPENAI_FINISH[state.finish.reason] if batch[-1].finish is not None else None
            prompt = prompt_logprobs(batch) if echo else None
            if echo:
                text, echo = self.prompt_text + text, False
            if finish is not None or (self.blocks is not None and (ids or prompt)):
                yield sse({**head, "choices": [choice({"text": text}, self.logprobs(gather_logprobs(batch), prompt),
                                                      finish)]})
            elif text or ids:
                yield piece(text)


@router.post("/v1/chat/completions")
async def chat_completions(http: Request):
    req = await parse(http, ChatCompletionRequest)
    return await _respond(http, req, _ChatFormat(req))


@router.post("/v1/completions")
async def completions(http: Request):
    req = await parse(http, CompletionRequest)
    return await _respond(http, req, _CompletionFormat(req))


async def _respond(http: Request, req: Union[ChatCompletionRequest, CompletionRequest],
                   fmt: Union[_ChatFormat, _CompletionFormat]):
    """Validate, submit, then answer whole or as a stream of chunks (+ usage) ending with [DONE]."""
    check_model(http, req.model)
    gi = req.generate_input()
    manager: TokenizerManager = http.app.state.manager
    state = manager.submit(gi, fmt.endpoint)
    if getattr(fmt, "echo", False):
        fmt.prompt_text = gi.text if gi.text is not None else manager.processor.tokenizer.decode(gi.input_ids)
    head = {"id": f"{fmt.id_prefix}-{state.rid}", "created": int(time.time()), "model": req.model}
    if gi.stream:
        return StreamingResponse(_sse(fmt, manager, state, {**head, "object": fmt.chunk_object},
                                      req.include_usage()), media_type="text/event-stream")
    outs = await collect_outputs(manager, state, http)
    text, _ = gather(outs)
    only = choice(fmt.payload(text), fmt.logprobs(gather_logprobs(outs), prompt_logprobs(outs)),
                  OPENAI_FINISH[state.finish.reason])
    return JSONResponse({**head, "object": fmt.object, "choices": [only], "usage": usage(state.finish)})


async def _sse(fmt: Union[_ChatFormat, _CompletionFormat], manager: TokenizerManager, state: ReqState, head: dict,
               include_usage: bool) -> AsyncIterator[str]:
    async with aclosing(fmt.stream(manager, state, head)) as events:   # a client gone closes it (and aborts)
        async for event in events:
            yield event
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage(state.finish)})
    yield sse("[DONE]")
