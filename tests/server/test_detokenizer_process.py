"""The detokenizer process's logic: per-request incremental text, stop-string trimming, state freed
at the finish."""
from __future__ import annotations

from runtime.server.detokenizer_process import MAX_OUTPUTS_PER_MESSAGE, Detokenizer
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
