"""Server-sent events stay one line each for line readers that split on every Unicode line break (httpx's
iter_lines, Python's str.splitlines), whatever text the model generates, and decode to the same JSON."""
from __future__ import annotations

import json

import httpx
import pytest

from runtime.server.outputs import TEXT_SLOT, sse, sse_with_text

# every character str.splitlines ends a line at (https://docs.python.org/3/library/stdtypes.html#str.splitlines)
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def data_lines(stream: str) -> list[str]:
    """The `data:` lines an httpx client reads from a response body (its own line decoder)."""
    decoder = httpx._decoders.LineDecoder()
    return [line for line in decoder.decode(stream) + decoder.flush() if line]


@pytest.mark.parametrize("char", list(LINE_BREAKS))
def test_an_event_with_any_line_break_in_its_text_is_one_line(char):
    text = f"before{char}after"
    events = [sse({"text": text, "meta_info": {"finish_reason": None}}),
              sse_with_text({"choices": [{"index": 0, "text": TEXT_SLOT}]})(text), sse("[DONE]")]
    lines = data_lines("".join(events))
    assert len(lines) == 3 and all(line.startswith("data: ") for line in lines)
    assert json.loads(lines[0][6:])["text"] == text
    assert json.loads(lines[1][6:])["choices"][0]["text"] == text
    assert lines[2] == "data: [DONE]"


def test_other_text_is_sent_as_utf8_not_escaped():
    event = sse({"text": "héllo 世界"})
    assert "héllo 世界" in event
