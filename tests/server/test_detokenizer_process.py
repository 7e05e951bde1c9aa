"""The detokenizer process's logic: per-request incremental text, stop-string trimming, state freed
at the finish."""
from __future__ import annotations

from runtime.server.detokenizer_process import MAX_OUTPUTS_PER_MESSAGE, Detokenizer
from runtime.server.ipc import BatchOutput, DetokSpec, Finish, RequestOutput, by_worker
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


class CountingTokenizer(ByteTokenizer):
    """Counts decode calls: what the detokenizer has decoded so far."""

    num_decodes = 0

    def decode(self, ids, skip_special_tokens=True):
        self.num_decodes += 1
        return super().decode(ids, skip_special_tokens)


def test_first_outputs_travel_ahead_in_a_message_of_their_own():
    tok = CountingTokenizer(512)
    detok = Detokenizer(tok)
    x, y = TOK.encode("x", add_special_tokens=False), TOK.encode("y", add_special_tokens=False)
    ((worker, alone),) = detok.route(BatchOutput([RequestOutput("old", x, detok=DetokSpec([65]))], "stats"))
    assert worker == 0 and [o.text for o in alone.outputs] == ["x"] and alone.stats == "stats"
    batch = BatchOutput([RequestOutput("new", y, detok=DetokSpec([66]))] + [RequestOutput("old", y)] * 3, "stats")
    messages = detok.route(batch)
    _, first = next(messages)
    decoded = tok.num_decodes
    assert [(o.rid, o.text) for o in first.outputs] == [("new", "y")] and first.stats is None
    _, rest = next(messages)                   # the running requests are decoded only after the first went out
    assert tok.num_decodes > decoded
    assert [(o.rid, o.text) for o in rest.outputs] == [("old", "y")] * 3 and rest.stats == "stats"
    ((_, only_running),) = detok.route(BatchOutput([RequestOutput("old", x), RequestOutput("new", x)]))
    assert [o.text for o in only_running.outputs] == ["x", "x"]


def test_a_large_batch_goes_out_in_slices_decoded_one_at_a_time():
    tok = CountingTokenizer(512)
    detok = Detokenizer(tok)
    n = 2 * MAX_OUTPUTS_PER_MESSAGE + 3
    x = TOK.encode("x", add_special_tokens=False)
    messages = detok.route(BatchOutput([RequestOutput(f"r{i}", x, detok=DetokSpec([65])) for i in range(n)], "stats"))
    _, first = next(messages)
    decoded = tok.num_decodes
    rest = [m for _, m in messages]
    assert tok.num_decodes > decoded                 # the later slices were decoded after the first went out
    sizes = [len(m.outputs) for m in [first, *rest]]
    assert sizes == [MAX_OUTPUTS_PER_MESSAGE, MAX_OUTPUTS_PER_MESSAGE, 3]
    assert [m.stats for m in [first, *rest]] == [None, None, "stats"]


def test_outputs_go_to_their_worker_and_a_rid_is_per_worker():
    """Two workers may each hold a request of the same rid (the scheduler refuses the second): neither's
    text state is the other's, and each worker gets only its own outputs."""
    detok = Detokenizer(TOK)
    a, b = TOK.encode("ab", add_special_tokens=False), TOK.encode("cd", add_special_tokens=False)
    routed = list(detok.route(BatchOutput([RequestOutput("r", a[:1], detok=DetokSpec([65]), worker=1),
                                           RequestOutput("r", b[:1], detok=DetokSpec([66]), worker=2)])))
    assert [(w, [o.text for o in m.outputs]) for w, m in routed] == [(1, ["a"]), (2, ["c"])]
    routed = list(detok.route(BatchOutput([RequestOutput("r", b[1:], finish(2), worker=2),
                                           RequestOutput("r", a[1:], worker=1)])))
    assert [(w, [o.text for o in m.outputs]) for w, m in routed] == [(2, ["d"]), (1, ["b"])]
    assert len(detok) == 1


def test_inline_the_scheduler_splits_by_worker_and_each_worker_decodes_as_the_process_would(tmp_path):
    """server.detokenizer=inline: WorkerPushes sends each worker its outputs as one BatchOutput with the
    gauges (control replies and Ready by their worker); the worker's Detokenizer.route then gives the same
    messages, in the same order, as the detokenizer process gives that worker."""
    from runtime.server.channel import Inbox
    from runtime.server.ipc import Addresses, ControlReply, Ready, WorkerPushes

    addresses = Addresses.in_dir(str(tmp_path))
    pulls = {w: Inbox(addresses.worker(w)) for w in (0, 1, 2)}
    pushes = WorkerPushes(addresses, num_workers=2)
    x = TOK.encode("x", add_special_tokens=False)
    batch = BatchOutput([RequestOutput(f"n{w}", x, detok=DetokSpec([65]), worker=w) for w in (1, 2)]
                        + [RequestOutput(f"r{i}", x, detok=None, worker=1 + i % 2) for i in range(5)], "stats")
    try:
        pushes.send_pyobj(batch)
        pushes.send_pyobj(ControlReply("flush_cache", 3, True, None, worker=2))
        pushes.send_pyobj(Ready(1, 2, 3, "cpu", 4))
        received = {w: [] for w in pulls}
        for w, pull in pulls.items():
            while pull.poll(2000 if not received[w] else 200):
                received[w].append(pull.recv_pyobj())
    finally:
        pushes.close(0)
        for pull in pulls.values():
            pull.close()
    assert [type(m).__name__ for m in received[0]] == ["Ready"]
    assert [type(m).__name__ for m in received[1]] == ["BatchOutput"]
    assert [type(m).__name__ for m in received[2]] == ["BatchOutput", "ControlReply"]
    process = Detokenizer(TOK)
    expected = {1: [], 2: []}
    for worker, text in process.route(batch):
        expected[worker].append((text.outputs, text.stats))
    for w in (1, 2):
        mine = received[w][0]
        assert mine.stats == "stats" and {o.worker for o in mine.outputs} == {w}
        inline = [(text.outputs, text.stats) for _, text in Detokenizer(TOK).route(mine)]
        assert inline == expected[w]


def _by_rid(outputs) -> dict:
    out: dict = {}
    for o in outputs:
        out.setdefault(o.rid, []).append((o.text, list(o.token_ids), o.finish))
    return out


def test_first_outputs_direct_give_each_request_the_texts_the_process_alone_gives():
    """server.first_outputs_direct: a request's first output is decoded by its worker
    (`Detokenizer.first_outputs`, no state kept) and the detokenizer process decodes it too without sending
    it (`delivered`), then the rest: per request, the same texts in the same order as the process alone,
    with a first token that is half a UTF-8 character, a stop string begun in the first output, a finish on
    the first output and two workers."""
    euro = list("€".encode())
    enc = lambda s: TOK.encode(s, add_special_tokens=False)   # noqa: E731
    steps = [
        [RequestOutput("utf8", euro[:1], detok=DetokSpec([65]), worker=1),
         RequestOutput("stop", enc("go S"), detok=DetokSpec([], stop_strs=("STOP",)), worker=2),
         RequestOutput("one", enc("z"), finish(1), detok=DetokSpec([66]), worker=1)],
        [RequestOutput("late", enc("q"), detok=DetokSpec([67]), worker=2),
         RequestOutput("utf8", euro[1:] + enc("a"), worker=1),
         RequestOutput("stop", enc("TO"), worker=2)],
        [RequestOutput("utf8", enc("b"), finish(4), worker=1),
         RequestOutput("stop", enc("P!"), finish(6, "stop"), worker=2),
         RequestOutput("late", enc("r"), finish(2), worker=2)],
    ]
    alone, process, workers = Detokenizer(TOK), Detokenizer(TOK), {1: Detokenizer(TOK), 2: Detokenizer(TOK)}
    expected, got = [], []
    for outs in steps:
        for _, text in alone.route(BatchOutput(outs, "stats")):
            expected.extend(text.outputs)
        delivered = next((i for i, o in enumerate(outs) if o.detok is None), len(outs))
        for worker, mine in by_worker(outs[:delivered]).items():
            text = workers[worker].first_outputs(BatchOutput(mine, "stats"))
            assert text.stats == "stats"
            got.extend(text.outputs)
        for _, text in process.route(BatchOutput(outs, "stats", delivered)):
            assert all(o.rid not in {f.rid for f in outs[:delivered]} for o in text.outputs)
            got.extend(text.outputs)
    assert _by_rid(got) == _by_rid(expected)
    assert [t for t, _, _ in _by_rid(got)["utf8"]] == ["", "€a", "b"]
    assert "".join(t for t, _, _ in _by_rid(got)["stop"]) == "go "
    assert len(process) == 0 and all(len(w) == 0 for w in workers.values())


def test_a_batch_of_first_outputs_only_sends_nothing_from_the_process():
    process = Detokenizer(TOK)
    batch = BatchOutput([RequestOutput("a", TOK.encode("x", add_special_tokens=False), detok=DetokSpec([65]))],
                        "stats", delivered=1)
    assert list(process.route(batch)) == [] and len(process) == 1


def test_batch_output_pickles_its_delivered_count():
    import pickle

    batch = pickle.loads(pickle.dumps(BatchOutput([RequestOutput("a", [1], detok=DetokSpec([2]))], "s", 1)))
    assert batch.delivered == 1 and batch.stats == "s" and batch.outputs[0].detok == DetokSpec([2])
    assert pickle.loads(pickle.dumps(BatchOutput([], None))).delivered == 0
