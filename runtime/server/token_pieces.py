"""Each token alone as text and bytes, for log-probability entries (OpenAI's `token` and `bytes`,
SGLang's token text), cached per token id. Imports neither torch nor zmq."""
from __future__ import annotations

from runtime.server.ipc import PositionLogprobs, TokenLogprob
from runtime.server.tokenizer import Tokenizer


class TokenPieces:
    """`text`: the token decoded on its own, special tokens spelled out (a piece of a UTF-8 character
    decodes to U+FFFD, as SGLang reports it); `utf8`: the bytes the token stands for."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}

    def piece(self, token_id: int) -> tuple[str, bytes]:
        out = self._cache.get(token_id)
        if out is None:
            out = self._cache[token_id] = (self.tokenizer.decode([token_id], skip_special_tokens=False),
                                           self.tokenizer.token_bytes(token_id))
        return out

    def named(self, entry: TokenLogprob) -> TokenLogprob:
        text, utf8 = self.piece(entry.token_id)
        return entry._replace(text=text, utf8=utf8)

    def fill(self, positions: list[PositionLogprobs]) -> list[PositionLogprobs]:
        return [PositionLogprobs(self.named(p.sampled), [self.named(t) for t in p.top]) for p in positions]
