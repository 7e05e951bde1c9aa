"""Token pieces (text and bytes of one token) and the three log-probability shapes, without a server."""
from __future__ import annotations

from runtime.server.ipc import PositionLogprobs, TokenLogprob
from runtime.server.logprob_format import CompletionLogprobs, chat_logprobs, native_logprobs
from runtime.server.token_pieces import TokenPieces
from runtime.server.tokenizer import ByteTokenizer


def _positions(token_ids: list[int], tops: list[list[int]]) -> list[PositionLogprobs]:
    pieces = TokenPieces(ByteTokenizer(512))
    return pieces.fill([PositionLogprobs(TokenLogprob(-0.5 * i, t), [TokenLogprob(-0.1 * j - 0.5 * i, u)
                                                                     for j, u in enumerate(top)])
                        for i, (t, top) in enumerate(zip(token_ids, tops))])


def test_pieces_give_each_token_alone_with_its_true_bytes():
    pieces = TokenPieces(ByteTokenizer(512))
    assert pieces.piece(ord("a")) == ("a", b"a")
    assert pieces.piece(0xE2) == ("\ufffd", b"\xe2")               # half a character: its byte, not U+FFFD's
    assert pieces.piece(ByteTokenizer.EOS) == ("<|eos|>", b"<|eos|>")
    assert pieces.piece(400) == ("", b"")


def test_chat_shape():
    out = chat_logprobs(_positions([104, 0xE2], [[104, 105], [0xE2]]))
    first, second = out["content"]
    assert first == {"token": "h", "logprob": 0.0, "bytes": [104], "top_logprobs": [
        {"token": "h", "logprob": 0.0, "bytes": [104]}, {"token": "i", "logprob": -0.1, "bytes": [105]}]}
    assert second["bytes"] == [0xE2] and second["token"] == "\ufffd"


def test_completion_offsets_continue_across_blocks_and_duplicates_keep_the_likeliest():
    blocks = CompletionLogprobs()
    a = blocks.block(_positions([104, 105], [[104, 400, 401], [105]]))
    b = blocks.block(_positions([ByteTokenizer.EOS, 33], [[], []]))
    assert a["tokens"] == ["h", "i"] and a["text_offset"] == [0, 1]
    assert a["top_logprobs"][0] == {"h": 0.0, "": -0.1}               # ids 400 and 401 both decode to ""
    assert b["tokens"] == ["<|eos|>", "!"] and b["text_offset"] == [2, 9]


def test_native_shape():
    positions = _positions([104, 105], [[104, 105], [105, 104]])
    assert native_logprobs(positions, 0, with_text=False) == {"output_token_logprobs": [[0.0, 104, None],
                                                                                        [-0.5, 105, None]]}
    out = native_logprobs(positions, 2, with_text=True)
    assert out["output_top_logprobs"][1] == [[-0.5, 105, "i"], [-0.6, 104, "h"]]
