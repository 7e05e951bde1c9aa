"""The detokenizer process's logic: per-request incremental text, stop-string trimming, state freed
at the finish."""
from __future__ import annotations

from runtime.server.detokenizer_process import Detokenizer
from runtime.server.ipc import BatchOutput, DetokSpec, Finish, RequestOutput
from runtime.server.tokenizer import ByteTokenizer

TOK = ByteTokenizer(512)


def finish(n: int, reason: str = "length") -> Finish:
    return Finish(reason, None, 3, n, 0, 1.0, 0.1)


def test_split_utf8_and_two_interleaved_requests():
    detok = Detokenizer(TOK)
    euro = list("€".encode())                                  # three bytes, one character
    a, b = TOK.encode("x", add_special_tokens=False), TOK.encode("y", add_special_tokens=False)
    first = detok.handle(BatchOutput([RequestOutput("a", euro[:2], detok=DetokSpec([65])),
                                      RequestOutput("b", b, detok=DetokSpec([66]))]))
    assert [o.text for o in first.outputs] == ["", "y"]        # half a character is held back
    second = detok.handle(BatchOutput([RequestOutput("a", euro[2:] + a), RequestOutput("b", [300], finish(2))]))
    assert [o.text for o in second.outputs] == ["€x", ""]
    assert len(detok) == 1                                     # b's state went with its finish
    detok.handle(BatchOutput([RequestOutput("a", [], finish(4))]))
    assert len(detok) == 0


def test_stop_string_is_trimmed_even_across_outputs():
    detok = Detokenizer(TOK)
    spec = DetokSpec([], stop_strs=("STOP",))
    ids = TOK.encode("go ST", add_special_tokens=False)
    out1 = detok.handle(BatchOutput([RequestOutput("r", ids, detok=spec)])).outputs[0]
    out2 = detok.handle(BatchOutput([RequestOutput("r", TOK.encode("OP now", add_special_tokens=False),
                                                   finish(8, "stop"))])).outputs[0]
    assert out1.text == "go " and out2.text == ""


def test_first_outputs_travel_ahead_in_a_message_of_their_own():
    detok = Detokenizer(TOK)
    x, y = TOK.encode("x", add_special_tokens=False), TOK.encode("y", add_special_tokens=False)
    (alone,) = detok.handle_parts(BatchOutput([RequestOutput("old", x, detok=DetokSpec([65]))], "stats"))
    assert [o.text for o in alone.outputs] == ["x"] and alone.stats == "stats"
    first, rest = detok.handle_parts(BatchOutput([RequestOutput("new", y, detok=DetokSpec([66])),
                                                  RequestOutput("old", y)], "stats"))
    assert [(o.rid, o.text) for o in first.outputs] == [("new", "y")] and first.stats is None
    assert [(o.rid, o.text) for o in rest.outputs] == [("old", "y")] and rest.stats == "stats"
    (only_running,) = detok.handle_parts(BatchOutput([RequestOutput("old", x), RequestOutput("new", x)]))
    assert [o.text for o in only_running.outputs] == ["x", "x"]
