"""The delivery-lag probe's hop marks: off without the environment variable, token indices counted per
request and hop, and the probe's table of the time between hops."""
from __future__ import annotations

from runtime.server.hop_trace import ENV_VAR, HopTrace
from runtime.server.ipc import Finish, TextOutput


def test_tracing_is_off_unless_the_environment_names_a_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert HopTrace.from_env("http") is None
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "hops"))
    trace = HopTrace.from_env("http")
    assert trace is not None and trace.path.startswith(str(tmp_path / "hops"))


def test_marks_count_token_indices_and_the_probe_joins_them(tmp_path):
    from experiments.serving_hops import hop_table, read_marks

    end = Finish("length", None, 3, 3, 0, 1.0, 0.1)
    a = HopTrace(str(tmp_path / "a.csv"))
    b = HopTrace(str(tmp_path / "b.csv"))
    a.mark("http_arrival", "WARMUP_x", 0.0)                    # the server's warm-up: not in the table
    a.mark("sched_recv", "WARMUP_x", 0.5)
    a.mark("http_arrival", "r", 0.0)
    a.mark("sched_recv", "r", 0.001)
    for hop, trace, offset_s in (("sched_send", a, 0.0), ("http_recv", b, 0.002)):
        trace.mark_outputs(hop, [TextOutput("r", "x", [1])], 1.0 + offset_s)
        trace.mark_outputs(hop, [TextOutput("r", "yz", [2, 3], end)], 2.0 + offset_s)
    a.flush()
    b.flush()
    marks = read_marks(tmp_path)
    assert sorted(marks[marks["hop"] == "http_recv"]["token_index"]) == [0, 1]
    table = hop_table(marks)
    assert abs(table["first_token"]["sched_send->http_recv"]["p50"] - 2.0) < 1e-6
    assert abs(table["later_tokens"]["sched_send->http_recv"]["p50"] - 2.0) < 1e-6
    assert abs(table["intake"]["http_arrival->sched_recv"]["p50"] - 1.0) < 1e-6


def test_hops_marked_only_on_first_outputs_leave_the_later_tokens_chain_whole(tmp_path):
    """The direct first outputs' sched_written / worker_parsed marks split the first token's scheduler -> worker
    hop; later tokens, which never pass them, still get sched_send -> detok_recv."""
    from experiments.serving_hops import hop_table, read_marks

    trace = HopTrace(str(tmp_path / "s.csv"))
    trace.mark_outputs("sched_send", [TextOutput("r", "x", [1])], 1.000)
    trace.mark_outputs("sched_written", [TextOutput("r", "x", [1])], 1.001)
    trace.mark_outputs("worker_parsed", [TextOutput("r", "x", [1])], 1.003)
    trace.mark_outputs("detok_recv", [TextOutput("r", "x", [1])], 1.004)
    trace.mark_outputs("sched_send", [TextOutput("r", "y", [2])], 2.000)
    trace.mark_outputs("detok_recv", [TextOutput("r", "y", [2])], 2.005)
    trace.flush()
    table = hop_table(read_marks(tmp_path))
    first, later = table["first_token"], table["later_tokens"]
    assert abs(first["sched_written->worker_parsed"]["p50"] - 2.0) < 1e-6
    assert abs(first["worker_parsed->detok_recv"]["p50"] - 1.0) < 1e-6
    assert abs(first["sched_send->detok_recv"]["p50"] - 4.0) < 1e-6          # the whole span, end to end
    assert abs(later["sched_send->detok_recv"]["p50"] - 5.0) < 1e-6
    assert not any("sched_written" in hop for hop in later)


def test_outputs_counted_elsewhere_keep_the_later_token_indices(tmp_path):
    """A first output that went straight to its worker passes the detokenizer's hops uncounted there unless
    `count_outputs` counts it: its second output must still be token 1, not 0."""
    import pandas as pd

    trace = HopTrace(str(tmp_path / "d.csv"))
    trace.count_outputs("detok_recv", [TextOutput("r", "x", [1])])
    trace.mark_outputs("detok_recv", [TextOutput("r", "yz", [2, 3])], 1.0)
    trace.count_outputs("detok_recv", [TextOutput("s", "", [4], Finish("length", None, 3, 1, 0, 1.0, 0.1))])
    trace.mark_outputs("detok_recv", [TextOutput("s", "", [5])], 2.0)           # a new request of that rid
    trace.flush()
    rows = pd.read_csv(tmp_path / "d.csv")
    assert list(zip(rows["rid"], rows["token_index"], rows["num_tokens"])) == [("r", 1, 2), ("s", 0, 1)]


def test_entry_mark_hands_the_request_entry_time_to_the_handlers_context():
    import asyncio
    import time

    from runtime.server.hop_trace import REQUEST_ENTRY_S, EntryMark

    seen = []

    async def app(scope, receive, send):
        await asyncio.sleep(0)
        seen.append(REQUEST_ENTRY_S.get())

    async def main():
        before = time.perf_counter()
        await asyncio.create_task(EntryMark(app)({"type": "http"}, None, None))   # each in its task, as uvicorn
        await asyncio.create_task(EntryMark(app)({"type": "lifespan"}, None, None))   # not a request: none
        return before

    before = asyncio.run(main())
    assert seen[0] is not None and before <= seen[0] <= time.perf_counter()
    assert seen[1] is None
