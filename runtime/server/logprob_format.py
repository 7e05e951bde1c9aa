"""Token log-probabilities in each API's shape: OpenAI chat (`logprobs.content`), OpenAI legacy
completions (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`; with `echo`, the prompt's tokens
first) and SGLang's native meta_info (`[logprob, token_id, text or None]` lists, input and output).
A prompt's first token has no log-probability: None, and None for its top entries. Imports neither
torch nor zmq."""
from __future__ import annotations

from runtime.server.ipc import PositionLogprobs, TokenLogprob


def _chat_token(t: TokenLogprob) -> dict:
    return {"token": t.text, "logprob": t.logprob, "bytes": list(t.utf8)}


def chat_logprobs(positions: list[PositionLogprobs]) -> dict:
    """A chat choice's (or chunk's) `logprobs`: one `content` entry per token."""
    return {"content": [{**_chat_token(p.sampled), "top_logprobs": [_chat_token(t) for t in p.top]}
                        for p in positions]}


class CompletionLogprobs:
    """A completion choice's `logprobs`, one block per response or stream chunk; `text_offset` counts
    characters of the completion text from its start, across the chunks of a stream."""

    def __init__(self) -> None:
        self.text_offset = 0

    def block(self, positions: list[PositionLogprobs]) -> dict:
        offsets = []
        for p in positions:
            offsets.append(self.text_offset)
            self.text_offset += len(p.sampled.text)
        return {"tokens": [p.sampled.text for p in positions],
                "token_logprobs": [p.sampled.logprob for p in positions],
                "top_logprobs": [None if p.sampled.logprob is None else _top_by_text(p.top) for p in positions],
                "text_offset": offsets}


def _top_by_text(top: list[TokenLogprob]) -> dict[str, float]:
    """Text -> logprob; tokens with the same text keep the most likely one's value."""
    out: dict[str, float] = {}
    for t in top:
        out.setdefault(t.text, t.logprob)
    return out


def native_logprobs(positions: list[PositionLogprobs], top_logprobs_num: int, with_text: bool,
                    prompt: list[PositionLogprobs] | None = None) -> dict:
    """meta_info keys of /generate: input_token_logprobs (once known) and output_token_logprobs, and
    input_/output_top_logprobs when top_logprobs_num > 0."""
    def entry(t: TokenLogprob) -> list:
        return [t.logprob, t.token_id, t.text if with_text else None]

    def tops(p: PositionLogprobs) -> list | None:
        return None if p.sampled.logprob is None else [entry(t) for t in p.top]

    out: dict = {}
    if prompt is not None:
        out["input_token_logprobs"] = [entry(p.sampled) for p in prompt]
    out["output_token_logprobs"] = [entry(p.sampled) for p in positions]
    if top_logprobs_num > 0:
        if prompt is not None:
            out["input_top_logprobs"] = [tops(p) for p in prompt]
        out["output_top_logprobs"] = [tops(p) for p in positions]
    return out
