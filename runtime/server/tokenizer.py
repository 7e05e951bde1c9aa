"""Tokenizers of the server: a built-in byte-level tokenizer and a local Hugging Face one.

Imports transformers only when a Hugging Face tokenizer is loaded; never downloads.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

Message = dict[str, str]   # {"role": ..., "content": ...}


class Tokenizer(Protocol):
    """What the server needs from a tokenizer.

    Chat prompts: encode `apply_chat_template(...)` with add_special_tokens=False, since
    Hugging Face templates already spell out the BOS token.
    """

    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_token_id(self) -> int | None: ...
    @property
    def eos_token_id(self) -> int | None: ...
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (log-probability entries report them)."""
        ...
    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        """`continue_final_message`: the last message left open (no end marker) for the model to
        continue, instead of a generation prompt."""
        ...


def default_chat_template(messages: Sequence[Message], add_generation_prompt: bool = True,
                          continue_final_message: bool = False) -> str:
    """The documented default chat template (the byte tokenizer's, and that of a Hugging Face
    tokenizer without one): each message as "<|role|>\\ncontent\\n", then "<|assistant|>\\n" when
    add_generation_prompt. E.g. [{"role": "user", "content": "hi"}] -> "<|user|>\\nhi\\n<|assistant|>\\n".
    With continue_final_message the last message has no closing newline and nothing follows it."""
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    if continue_final_message and messages:
        return text[:-1]
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


class ByteTokenizer:
    """Ids 0..255 are the UTF-8 bytes; 256, 257, 258 are bos, eos, pad.

    `vocab_size` (>= 259) is the model's, so every id a model can sample is valid; ids from
    259 up are never produced by `encode` and decode to "" (models with dummy weights sample
    them often, so their text is shorter than their token count).
    """

    NUM_BYTES = 256
    BOS, EOS, PAD = 256, 257, 258
    SPECIAL_TEXT = {BOS: "<|bos|>", EOS: "<|eos|>", PAD: "<|pad|>"}

    def __init__(self, vocab_size: int = 259) -> None:
        if vocab_size < 259:
            raise ValueError(f"ByteTokenizer needs vocab_size >= 259 (256 bytes + 3 special), got {vocab_size}")
        self._vocab_size = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_token_id(self) -> int:
        return self.BOS

    @property
    def eos_token_id(self) -> int:
        return self.EOS

    @property
    def pad_token_id(self) -> int:
        return self.PAD

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """UTF-8 bytes of `text`, after BOS when add_special_tokens. Special-token text typed
        in `text` (e.g. "<|eos|>") stays plain bytes."""
        return ([self.BOS] if add_special_tokens else []) + list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Bytes decode as UTF-8 (errors="replace": an incomplete or invalid sequence becomes
        U+FFFD); special tokens are dropped or spelled as SPECIAL_TEXT; other ids give ""."""
        pieces: list[str] = []
        run = bytearray()
        for token_id in ids:
            if not 0 <= token_id < self._vocab_size:
                raise ValueError(f"token id {token_id} outside the vocab [0, {self._vocab_size})")
            if token_id < self.NUM_BYTES:
                run.append(token_id)
            elif token_id in self.SPECIAL_TEXT and not skip_special_tokens:
                pieces.append(run.decode("utf-8", errors="replace"))
                run.clear()
                pieces.append(self.SPECIAL_TEXT[token_id])
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)

    def token_bytes(self, token_id: int) -> bytes:
        """The byte itself (even half of a UTF-8 character); a special token's text; b"" otherwise."""
        if token_id < self.NUM_BYTES:
            return bytes([token_id])
        return self.SPECIAL_TEXT.get(token_id, "").encode("utf-8")

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        return default_chat_template(messages, add_generation_prompt, continue_final_message)


class HFTokenizer:
    """A Hugging Face tokenizer loaded from a local directory (local_files_only)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.path = path
        self.hf_tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)

    @property
    def vocab_size(self) -> int:
        """All ids the tokenizer can produce: the base vocab plus added tokens."""
        return len(self.hf_tokenizer)

    @property
    def bos_token_id(self) -> int | None:
        return self.hf_tokenizer.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self.hf_tokenizer.eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf_tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """UTF-8 of the token decoded alone (as SGLang reports it: a piece of a character is U+FFFD)."""
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        """The tokenizer's own template; the documented default when it has none."""
        if not getattr(self.hf_tokenizer, "chat_template", None):
            return default_chat_template(messages, add_generation_prompt, continue_final_message)
        extra = {"continue_final_message": True} if continue_final_message else {}
        return self.hf_tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )


def load_tokenizer(path: str | None, vocab_size: int) -> Tokenizer:
    """The byte tokenizer sized to the model's `vocab_size` when `path` is None, else the
    Hugging Face tokenizer in the local directory `path` (which must fit `vocab_size`)."""
    if path is None:
        return ByteTokenizer(vocab_size)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"tokenizer.path={path!r} is not a directory. Give a local Hugging Face tokenizer "
            "folder (twinserve never downloads), or leave tokenizer.path unset for the "
            "built-in byte tokenizer."
        )
    tokenizer = HFTokenizer(path)
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(
            f"tokenizer at {path!r} has {tokenizer.vocab_size} tokens, more than the model's "
            f"vocab_size={vocab_size}"
        )
    return tokenizer
