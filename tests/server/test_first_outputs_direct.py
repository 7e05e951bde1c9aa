"""A tokenizer worker with server.first_outputs_direct: requests' first outputs come straight from the
scheduler as token ids and are decoded here; later outputs come as text from the detokenizer process, and
one that overtakes its request's first waits for it."""
from __future__ import annotations

import asyncio

import pytest

from runtime.server.detokenizer_process import Detokenizer
from runtime.server.ipc import (
    Addresses, BatchOutput, BatchText, DetokSpec, Finish, RequestOutput, SchedulerStats, TextOutput,
)
from runtime.server.tokenizer import ByteTokenizer
from runtime.server.tokenizer_manager import ReqState, TokenizerManager

pytest.importorskip("prometheus_client")
TOK = ByteTokenizer(512)
STATS = SchedulerStats(2, 0, 10, 100, 0, 6, 0)


def manager(tmp_path) -> TokenizerManager:
    from runtime.server.server_metrics import ServerMetrics

    return TokenizerManager(None, Addresses.in_dir(str(tmp_path)), ServerMetrics("m"), lambda: True,
                            first_decoder=Detokenizer(TOK))


def track(m: TokenizerManager, rid: str) -> ReqState:
    state = m.states[rid] = ReqState(rid, 0.0, 3)
    return state


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_later_outputs_that_overtake_the_first_wait_for_it(tmp_path):
    m = manager(tmp_path)
    a, b = track(m, "a"), track(m, "b")
    m._dispatch(BatchText([TextOutput("a", "y", ids("y")), TextOutput("a", "z", ids("z"))]), 1.0)
    assert a.pending == [] and not a.event.is_set() and len(a.early) == 2
    m._first_outputs(BatchOutput([RequestOutput("a", ids("x"), detok=DetokSpec([65])),
                                  RequestOutput("b", ids("q"), detok=DetokSpec([66]))], STATS))
    assert [(o.text, o.token_ids) for o in a.pending] == [("x", ids("x")), ("y", ids("y")), ("z", ids("z"))]
    assert a.event.is_set() and a.early == [] and m.last_stats == STATS
    assert [o.text for o in b.pending] == ["q"]
    m._dispatch(BatchText([TextOutput("b", "r", ids("r"))]), 2.0)     # after its first: at once
    assert [o.text for o in b.pending] == ["q", "r"]


def test_a_first_output_that_finishes_ends_the_request(tmp_path):
    m = manager(tmp_path)
    state = track(m, "one")
    m._first_outputs(BatchOutput([RequestOutput("one", ids("x"), Finish("length", None, 3, 1, 0, 1.0, 0.1),
                                                detok=DetokSpec([65]))]))
    assert state.finish.reason == "length" and "one" not in m.states
    assert [o.text for o in state.pending] == ["x"] and len(m.first_decoder) == 0


def test_the_handler_streams_first_and_later_outputs_in_order(tmp_path):
    """Through `stream_outputs`, as a handler reads them: a later output sent first still comes second."""
    from runtime.server.outputs import stream_outputs

    async def run() -> list[str]:
        m = manager(tmp_path)
        state = track(m, "r")
        m._dispatch(BatchText([TextOutput("r", "b", ids("b"))]), 1.0)
        m._first_outputs(BatchOutput([RequestOutput("r", ids("a"), detok=DetokSpec([65]))]))
        m._dispatch(BatchText([TextOutput("r", "c", ids("c"), Finish("length", None, 3, 3, 0, 1.0, 0.1))]), 2.0)
        return [o.text async for batch in stream_outputs(m, state) for o in batch]

    assert asyncio.run(run()) == ["a", "b", "c"]
