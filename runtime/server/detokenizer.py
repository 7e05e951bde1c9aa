"""Incremental detokenization: a stream of sampled token ids in, text deltas out.

Decodes a short window of recent tokens (prefix offset / read offset) and holds text back
while it ends in U+FFFD (a UTF-8 character split across tokens). Works with any Tokenizer.
"""
from __future__ import annotations

from collections.abc import Sequence

from runtime.server.tokenizer import Tokenizer

NUM_PROMPT_CONTEXT_TOKENS = 5   # prompt tail decoded as left context of the first output tokens
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Text of one request's output tokens, produced as they arrive.

    The window `_ids` holds the prefix-offset..end tokens of the classic technique:
    `_ids[:_read_offset]` were emitted last time and are kept as left context (SentencePiece
    and the like decode a piece differently at the start of a string); `_ids[_read_offset:]`
    are pending. Each push decodes context alone and context + pending, and emits the
    difference once it no longer ends in U+FFFD; older tokens are dropped (memory stays small).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_ids or [])[-NUM_PROMPT_CONTEXT_TOKENS:]
        self._read_offset = len(self._ids)
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far (held-back bytes appear after `flush`)."""
        return "".join(self._chunks)

    def push(self, token_ids: Sequence[int]) -> str:
        """Append output tokens; return only the newly completed text (maybe "")."""
        self._ids.extend(token_ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """Emit whatever is held back, U+FFFD included: call it when the request finishes."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        context_text = self._decode(self._ids[: self._read_offset])
        full_text = self._decode(self._ids)
        if len(full_text) <= len(context_text):
            return ""
        if full_text.endswith(REPLACEMENT_CHAR) and not final:
            return ""
        delta = full_text[len(context_text):]
        # The tokens just emitted become the next context; older ones are dropped.
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        self._chunks.append(delta)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
