"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions (streaming as
server-sent events ending with `data: [DONE]`). Imports neither torch nor zmq directly."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from runtime.server.errors import APIError, from_validation_error
from runtime.server.ipc import Finish, PositionLogprobs
from runtime.server.logprob_format import CompletionLogprobs, chat_logprobs
from runtime.server.outputs import (
    OPENAI_FINISH, TEXT_SLOT, collect_outputs, gather, gather_logprobs, merge_streams, prompt_logprobs, running_usage,
    sse, sse_with_text, stream_outputs, total_usage,
)
from runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from runtime.server.tokenizer_manager import ReqState, TokenizerManager

router = APIRouter()


async def parse(http: Request, model: type[BaseModel]) -> BaseModel:
    try:
        return model.model_validate_json(await read_body(http))
    except ValidationError as err:
        raise from_validation_error(err) from None


async def read_body(http: Request) -> bytes:
    """The request's body, read as Starlette's `Request.body` reads it (a client gone meanwhile raises
    `ClientDisconnect`) but without its async generator: a body that came in one message (uvicorn hands
    over what it has read) is that message's bytes, uncopied (~5 µs less per request on the CPU)."""
    chunks: list[bytes] = []
    while True:
        message = await http.receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    http._body = body                      # where Starlette keeps it: `http.body()` and `http.stream()` give it
    return body


def check_model(http: Request, name: str, status: int = 404) -> None:
    """404 where the model is the resource (GET /v1/models/{model}); a generation request naming
    another model is a 400, as SGLang answers it."""
    served = http.app.state.model_name
    if name != served:
        raise APIError(f"The model `{name}` does not exist. The served model name is `{served}`.", status=status,
                       param="model", code="model_not_found")


def model_card(http: Request) -> dict:
    s = http.app.state
    return {"id": s.model_name, "object": "model", "created": s.created, "owned_by": "twinserve",
            "root": s.model_name, "max_model_len": s.limits.max_context_tokens}


@router.get("/v1/models")
async def models(http: Request) -> dict:
    return {"object": "list", "data": [model_card(http)]}


@router.get("/v1/models/{model:path}")
async def retrieve_model(http: Request, model: str) -> dict:
    check_model(http, model)
    return model_card(http)


def choice(payload: dict, logprobs: dict | None, finish: Finish | None, index: int = 0) -> dict:
    """One choice of a response or stream chunk, either API; once finished, SGLang's `matched_stop`
    too (the stop string or token id that ended it, None for any other finish)."""
    if finish is None:
        return {"index": index, **payload, "logprobs": logprobs, "finish_reason": None}
    matched = finish.matched if finish.reason == "stop" else None
    return {"index": index, **payload, "logprobs": logprobs, "finish_reason": OPENAI_FINISH[finish.reason],
            "matched_stop": matched}


class _Chunks:
    """Stream chunks of one choice: with `continuous_usage_stats` each carries the usage so far."""

    def __init__(self, req: Union[ChatCompletionRequest, CompletionRequest], index: int) -> None:
        self.index = index                     # of the choice (prompt index * n + j)
        self.continuous_usage = req.continuous_usage()
        self.num_completion_tokens = 0

    def event(self, state: ReqState, body: dict) -> str:
        if self.continuous_usage:
            body = {**body, "usage": running_usage(state.num_prompt_tokens, self.num_completion_tokens)}
        return sse(body)

    def text_event(self, state: ReqState, make: Callable[[str], dict]) -> Callable[[str], str]:
        """An event maker for the chunk `make(text)`; without usage the JSON around the text is
        serialized once per request, not once per token."""
        if not self.continuous_usage:
            return sse_with_text(make(TEXT_SLOT))
        return lambda text: self.event(state, make(text))


class _ChatFormat(_Chunks):
    """What a chat completion has of its own: names, the choice's payload, the log-probabilities'
    shape and the stream's chunks (a role chunk first, the finish in a chunk of its own)."""

    endpoint, id_prefix, object, chunk_object = "chat", "chatcmpl", "chat.completion", "chat.completion.chunk"

    def __init__(self, req: ChatCompletionRequest, index: int = 0) -> None:
        super().__init__(req, index)
        self.wants_logprobs = req.logprobs

    def payload(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}}

    def logprobs(self, positions: list[PositionLogprobs], prompt: list[PositionLogprobs] | None = None) -> dict | None:
        return chat_logprobs(positions) if self.wants_logprobs else None

    async def stream(self, manager: TokenizerManager, state: ReqState, head: dict) -> AsyncIterator[str]:
        chunk = lambda delta, logprobs=None, finish=None: self.event(state, {   # noqa: E731
            **head, "choices": [choice({"delta": delta}, logprobs, finish, self.index)]})
        content = self.text_event(state, lambda text: {
            **head, "choices": [choice({"delta": {"content": text}}, None, None, self.index)]})
        yield chunk({"role": "assistant", "content": ""})
        async for batch in stream_outputs(manager, state):
            text, ids = gather(batch)
            self.num_completion_tokens += len(ids)
            if self.wants_logprobs and ids:
                yield chunk({"content": text}, self.logprobs(gather_logprobs(batch)))
            elif text or ids:              # a chunk per delivery, even when its tokens decode to ""
                yield content(text)
        yield chunk({}, finish=state.finish)


class _CompletionFormat(_Chunks):
    """A text completion's: its stream carries the finish in the last text chunk. With `echo` the
    prompt's text comes first (in a stream: in the first chunk) and, with logprobs, its tokens' entries
    (the first one's None), as OpenAI's legacy API returns them."""

    endpoint, id_prefix, object, chunk_object = "completions", "cmpl", "text_completion", "text_completion"

    def __init__(self, req: CompletionRequest, index: int = 0) -> None:
        super().__init__(req, index)
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
        piece = self.text_event(state, lambda text: {**head, "choices": [choice({"text": text}, None, None,
                                                                                self.index)]})
        echo = self.echo                       # the prompt still to send, ahead of the first output
        async for batch in stream_outputs(manager, state):
            text, ids = gather(batch)
            self.num_completion_tokens += len(ids)
            finish = state.finish if batch[-1].finish is not None else None
            prompt = prompt_logprobs(batch) if echo else None
            if echo:
                text, echo = self.prompt_text + text, False
            if finish is not None or (self.blocks is not None and (ids or prompt)):
                yield self.event(state, {**head, "choices": [choice(
                    {"text": text}, self.logprobs(gather_logprobs(batch), prompt), finish, self.index)]})
            elif text or ids:
                yield piece(text)


async def chat_completions(http: Request):
    req = await parse(http, ChatCompletionRequest)
    return await _respond(http, req, _ChatFormat)


async def completions(http: Request):
    req = await parse(http, CompletionRequest)
    return await _respond(http, req, _CompletionFormat)


# The generation endpoints parse their own bodies and return responses, so they are plain Starlette routes:
# FastAPI's route layers (dependency solving, its router's nesting) cost ~0.2 ms of each request's way in on the
# CPU (the delivery-lag probe's http_entry hop, experiments/bench_frontend.py) and give them nothing.
ROUTES = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
          Route("/v1/completions", completions, methods=["POST"])]


Format = Union[_ChatFormat, _CompletionFormat]


async def _respond(http: Request, req: Union[ChatCompletionRequest, CompletionRequest], make_format: type):
    """Validate, submit one request per choice (prompts x n), then answer whole or as a stream of chunks
    (+ usage) ending with [DONE]. A choice refused at submission withdraws the ones already sent."""
    check_model(http, req.model, status=400)
    inputs = req.generate_inputs()
    manager: TokenizerManager = http.app.state.manager
    formats: list[Format] = [make_format(req, index) for index in range(len(inputs))]
    states = manager.submit_all(inputs, formats[0].endpoint)
    for fmt, gi in zip(formats, inputs):
        if getattr(fmt, "echo", False):
            fmt.prompt_text = gi.text if gi.text is not None else manager.processor.tokenizer.decode(gi.input_ids)
    head = {"id": f"{formats[0].id_prefix}-{req.rid or states[0].rid}", "created": int(time.time()),
            "model": req.model}
    if inputs[0].stream:
        return StreamingResponse(_sse(formats, manager, states, {**head, "object": formats[0].chunk_object},
                                      req.include_usage(), req.n), media_type="text/event-stream")
    outs_per_choice = await asyncio.gather(*(collect_outputs(manager, state, http) for state in states))
    choices = []
    for fmt, state, outs in zip(formats, states, outs_per_choice):
        text, _ = gather(outs)
        choices.append(choice(fmt.payload(text), fmt.logprobs(gather_logprobs(outs), prompt_logprobs(outs)),
                              state.finish, fmt.index))
    return JSONResponse({**head, "object": formats[0].object, "choices": choices,
                         "usage": total_usage([s.finish for s in states], req.n)})


async def _sse(formats: list[Format], manager: TokenizerManager, states: list[ReqState], head: dict,
               include_usage: bool, n: int) -> AsyncIterator[str]:
    streams = [fmt.stream(manager, state, head) for fmt, state in zip(formats, states)]
    # a client gone closes the stream(s), which abort their requests
    async with aclosing(streams[0] if len(streams) == 1 else merge_streams(streams)) as events:
        async for event in events:
            yield event
    if include_usage:
        yield sse({**head, "choices": [], "usage": total_usage([s.finish for s in states], n)})
    yield sse("[DONE]")
