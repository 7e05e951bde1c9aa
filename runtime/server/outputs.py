"""Waiting for a request's outputs in a handler, and the pieces every response format shares:
usage and finish reasons in the OpenAI and SGLang-native shapes.
Client disconnects abort the request (its KV is freed by the scheduler)."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request as HTTPRequest

from runtime.server.ipc import Finish, PositionLogprobs, TextOutput
from runtime.server.tokenizer_manager import ReqState, TokenizerManager

DISCONNECT_POLL_S = 1.0
TEXT_SLOT = "\x00text\x00"
OPENAI_FINISH = {"stop": "stop", "length": "length", "too_long": "length", "abort": "abort"}


class ClientGone(Exception):
    """The client closed its connection before the request finished."""


async def stream_outputs(manager: TokenizerManager, state: ReqState) -> AsyncIterator[list[TextOutput]]:
    """Batches of outputs as they arrive, until the finish; aborts the request if the consumer stops
    early (a streaming client disconnected: Starlette cancels the response task)."""
    trace = manager.trace
    try:
        while True:
            await state.event.wait()
            batch = state.take()
            if state.error is not None:
                raise state.error
            if batch:
                if trace is not None:
                    trace.mark_outputs("handler", batch, time.perf_counter())
                yield batch
                if trace is not None:                      # resumed once the chunk was written
                    trace.mark_outputs("written", batch, time.perf_counter())
            if state.finish is not None and not state.pending:
                return
    finally:
        if not state.done:
            manager.abort(state.rid)


async def collect_outputs(manager: TokenizerManager, state: ReqState, http: HTTPRequest) -> list[TextOutput]:
    """Every output of a non-streaming request; ClientGone (and an abort) if the client leaves."""
    outs: list[TextOutput] = []
    while True:
        try:
            await asyncio.wait_for(state.event.wait(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await http.is_disconnected():
                manager.abort(state.rid)
                raise ClientGone(state.rid) from None
            continue
        outs.extend(state.take())
        if state.error is not None:
            raise state.error
        if state.finish is not None:
            return outs


# Characters that Python's str.splitlines (and line readers built on it, e.g. httpx's iter_lines) take for line
# ends besides CR and LF, which JSON leaves raw when it does not escape non-ASCII (control characters below U+0020
# are always escaped). Escaped, an event stays one line for such readers; the decoded JSON is the same.
_LINE_BREAK_ESCAPES = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event_json(value) -> str:
    """JSON of an SSE event's value: UTF-8 text as is, except the Unicode line separators above, escaped."""
    return json.dumps(value, ensure_ascii=False).translate(_LINE_BREAK_ESCAPES)


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else event_json(payload)}\n\n"


def sse_with_text(payload: dict) -> Callable[[str], str]:
    """An SSE event maker for `payload` whose one value TEXT_SLOT becomes the given text: the JSON
    around it is serialized once per request, not once per token."""
    prefix, suffix = sse(payload).split(json.dumps(TEXT_SLOT))
    return lambda text: prefix + event_json(text) + suffix


def total_usage(finishes: list[Finish], n: int) -> dict:
    """Usage of a request of several choices (prompt-major, n per prompt): each prompt's tokens once,
    every choice's completion tokens."""
    prompts = finishes[::n]
    prompt_tokens = sum(f.prompt_tokens for f in prompts)
    completion_tokens = sum(f.completion_tokens for f in finishes)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(f.cached_tokens for f in prompts)}}


def running_usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """One choice's usage so far (a streamed chunk's, with continuous usage stats)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def merge_streams(streams: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    """The items of several async iterators as each comes; closing this closes them all (a choice's
    stream closing early aborts its request)."""
    pending = {asyncio.ensure_future(anext(stream)): stream for stream in streams}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                stream = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(stream))] = stream
                yield item
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def native_finish(finish: Finish) -> dict:
    out: dict = {"type": "length" if finish.reason == "too_long" else finish.reason}
    if finish.reason == "stop" and finish.matched is not None:
        out["matched"] = finish.matched
    if finish.reason in ("length", "too_long"):
        out["length"] = finish.completion_tokens
    return out


def gather(outs: list[TextOutput]) -> tuple[str, list[int]]:
    """Text and token ids of a list of outputs, concatenated."""
    return "".join(o.text for o in outs), [t for o in outs for t in o.token_ids]


def gather_logprobs(outs: list[TextOutput]) -> list[PositionLogprobs]:
    """The log-probabilities of a list of outputs' tokens, concatenated (empty when not asked)."""
    return [p for o in outs for p in (o.logprobs or ())]


def prompt_logprobs(outs: list[TextOutput]) -> list[PositionLogprobs] | None:
    """The prompt tokens' log-probabilities, which the first output carries (None: not among these)."""
    return next((o.prompt_logprobs for o in outs if o.prompt_logprobs is not None), None)
