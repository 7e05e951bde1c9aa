"""The online RequestSource in the real driver loop, without HTTP or a model: requests, stop strings,
aborts, control requests and shutdown over the server's Unix-socket channels. Torch-free and fast."""
from __future__ import annotations

import shutil
import tempfile
import threading
import time

import pytest

from experiments.compose import compose_config
from runtime.build import build_core
from runtime.core.batch import StepResult
from runtime.core.request import FinishReason, RequestStatus, SamplingParams
from runtime.driver import RealDriver
from runtime.engine.logprob_params import LogprobSamplingParams, TokenLogprobs
from runtime.server.channel import Inbox, Outbox
from runtime.server.ipc import (
    AbortReq, Addresses, BatchOutput, ControlReply, ControlReq, DetokSpec, TokenizedRequest, WorkerPushes,
)
from runtime.server.online_source import OnlineSource
from runtime.server.scheduler_process import SchedulerControl
from runtime.server.tokenizer import ByteTokenizer


def letters(plan) -> StepResult:
    """Output token i of every request is the letter chr(65 + i % 26)."""
    return StepResult([65 + len(it.request.output_ids) % 26 for it in plan.sampling_items])


class Harness:
    def __init__(self, tmp_path, execute=letters, stream_interval: int = 1):
        core = build_core(compose_config(["model=tiny_mla_moe", "hardware=cpu", "kv.capacity_tokens=4096"]))
        self.scheduler = core.scheduler
        pull = Inbox(str(tmp_path / "scheduler"))
        self.outputs = Inbox(str(tmp_path / "out"))
        push = Outbox(str(tmp_path / "out"))      # as the server's: the driver never blocks on a send
        self.send_socket = Outbox(str(tmp_path / "scheduler"))
        control = SchedulerControl(self.scheduler, str(tmp_path), 0.0)
        control.source = self.source = OnlineSource(pull, push, self.scheduler, ByteTokenizer(512), control,
                                                          stream_interval=stream_interval)
        control.driver = self.driver = RealDriver(self.scheduler, execute, progress=False)
        self.outcome = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.outcome = self.driver.serve(self.source)

    def send(self, msg):
        self.send_socket.send_pyobj(msg)

    def request(self, rid: str, max_new_tokens: int, stops=(), top_logprobs_num: int | None = None):
        sampling = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True) if top_logprobs_num is None \
            else LogprobSamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True, top_logprobs_num=top_logprobs_num)
        self.send(TokenizedRequest(rid, [1, 2, 3, 4], sampling, 0.0, DetokSpec([4], stop_strs=tuple(stops))))

    def receive_until(self, done, timeout_ms: int = 20000) -> list:
        got = []
        while not done(got):
            assert self.outputs.poll(timeout_ms), f"no output; got {got}"
            got.append(self.outputs.recv_pyobj())
        return got

    def close(self):
        self.send(ControlReq("shutdown", 99))
        self.thread.join(20)
        assert not self.thread.is_alive()
        self.send_socket.close(0)
        self.source.push.close(0)
        self.source.pull.close()
        self.outputs.close()


def outputs_of(msgs, rid):
    return [o for m in msgs if isinstance(m, BatchOutput) for o in m.outputs if o.rid == rid]


def finished(rid):
    return lambda msgs: any(o.finish is not None for o in outputs_of(msgs, rid))


def test_tokens_stream_out_and_the_stop_string_ends_the_request(tmp_path):
    h = Harness(tmp_path)
    try:
        h.request("plain", 6)
        h.request("stopped", 50, stops=["DE"])
        msgs = h.receive_until(lambda m: finished("plain")(m) and finished("stopped")(m))
        plain, stopped = outputs_of(msgs, "plain"), outputs_of(msgs, "stopped")
        assert [t for o in plain for t in o.token_ids] == [65, 66, 67, 68, 69, 70]
        assert plain[0].detok is not None and all(o.detok is None for o in plain[1:])
        assert plain[-1].finish.reason == "length" and plain[-1].finish.completion_tokens == 6
        assert [t for o in stopped for t in o.token_ids] == [65, 66, 67, 68, 69]    # up to the E of "DE"
        end = stopped[-1].finish
        assert (end.reason, end.matched, end.completion_tokens) == ("stop", "DE", 5)
        h.send(ControlReq("server_info", 1))
        info = h.receive_until(lambda m: any(isinstance(x, ControlReply) for x in m))[-1]
        assert info.ok and info.payload["num_in_flight"] == 0 and info.payload["kv_tokens_held_by_requests"] == 0
    finally:
        h.close()
    reasons = {r.rid: r.finish_reason.value for r in h.outcome.requests}
    assert reasons == {"plain": "length", "stopped": "stop"}


class Held:
    """`letters`, but a step of requests that already have a token waits until the test lets it go (at most
    20 s): an abort or shutdown the test sends meanwhile reaches the driver before the request can finish."""

    def __init__(self):
        self.go = threading.Event()

    def __call__(self, plan) -> StepResult:
        if any(it.request.output_ids for it in plan.sampling_items):
            self.go.wait(20)
        return letters(plan)


def test_abort_and_shutdown_free_everything(tmp_path):
    held = Held()
    h = Harness(tmp_path, execute=held)
    h.request("long", 3000)
    h.receive_until(lambda m: len(outputs_of(m, "long")) >= 1)
    h.send(AbortReq("long"))
    held.go.set()
    msgs = h.receive_until(finished("long"))
    assert outputs_of(msgs, "long")[-1].finish.reason == "abort"
    h.send(ControlReq("flush_cache", 2))
    reply = h.receive_until(lambda m: any(isinstance(x, ControlReply) for x in m))[-1]
    assert reply.ok and h.scheduler.kv.used_tokens() == 0
    held.go.clear()
    h.request("cut by shutdown", 3000)
    h.receive_until(lambda m: len(outputs_of(m, "cut by shutdown")) >= 1)
    h.send(ControlReq("shutdown", 98))
    held.go.set()
    h.close()
    assert {r.rid: r.finish_reason.value for r in h.outcome.requests} == {"long": "abort", "cut by shutdown": "abort"}
    assert not h.scheduler.has_work() and h.scheduler.kv.used_tokens() == h.scheduler.kv.cache.total_size()


def letters_with_logprobs(plan) -> StepResult:
    """`letters`, and for requests that ask, logprob -(i + 1) for output token i (top: that token, then 0)."""
    result = letters(plan)
    result.logprobs = [None if not isinstance(it.request.sampling, LogprobSamplingParams) else
                       TokenLogprobs(-(len(it.request.output_ids) + 1.0),
                                     [(token, -(len(it.request.output_ids) + 1.0)), (0, -99.0)])
                       for it, token in zip(plan.sampling_items, result.next_token_ids)]
    return result


def test_logprobs_travel_with_their_tokens_and_stop_at_the_stop_string(tmp_path):
    h = Harness(tmp_path, execute=letters_with_logprobs)
    try:
        h.request("asks", 6, top_logprobs_num=2)
        h.request("stopped", 50, stops=["DE"], top_logprobs_num=1)
        h.request("plain", 3)
        msgs = h.receive_until(lambda m: all(finished(r)(m) for r in ("asks", "stopped", "plain")))
    finally:
        h.close()
    assert all(o.logprobs is None for o in outputs_of(msgs, "plain"))
    for rid, num_tokens in (("asks", 6), ("stopped", 5)):
        outs = outputs_of(msgs, rid)
        assert all(len(o.logprobs) == len(o.token_ids) for o in outs)
        positions = [p for o in outs for p in o.logprobs]
        assert [p.sampled.token_id for p in positions] == [t for o in outs for t in o.token_ids]
        assert [p.sampled.logprob for p in positions] == [-(i + 1.0) for i in range(num_tokens)]
        assert all(p.top[0].token_id == p.sampled.token_id for p in positions)
    assert h.source.tracked == {}


class Bare:
    """An OnlineSource alone, driven by hand: admit requests, give them tokens, read what it sends."""

    def __init__(self, stops=(), direct: bool = False):
        """`direct`: first outputs also go to a worker's inbox (`worker_sink`), as server.first_outputs_direct
        has them."""
        self.dir = tempfile.mkdtemp(prefix="twinserve-test-")
        self.pull, self.sink = Inbox(f"{self.dir}/in"), Inbox(f"{self.dir}/out")
        push, self.sender = Outbox(f"{self.dir}/out"), Outbox(f"{self.dir}/in")
        addresses = Addresses.in_dir(self.dir)
        self.worker_sink = Inbox(addresses.worker(0)) if direct else None
        pushes = WorkerPushes(addresses, 1) if direct else None
        core = build_core(compose_config(["model=tiny_mla_moe", "hardware=cpu", "kv.capacity_tokens=4096"]))
        self.source = OnlineSource(self.pull, push, core.scheduler, ByteTokenizer(512), control=None, direct=pushes)
        self.stops = tuple(stops)

    def admit(self, rid, max_new_tokens=8):
        sampling = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        self.sender.send_pyobj(TokenizedRequest(rid, [1, 2, 3], sampling, 0.0, DetokSpec([3], stop_strs=self.stops)))
        assert self.pull.poll(5000)
        (req,) = self.source.poll(0.0)
        return req

    @staticmethod
    def emit(req, token):
        req.output_ids.append(token)
        req.token_times_s.append(0.0)

    def sent(self):
        """The messages sent so far, without waiting."""
        out = []
        while self.sink.poll(0):
            out.append(self.sink.recv_pyobj())
        return out

    def close(self):
        for box in (self.sender, self.source.push, self.source.direct):
            if box is not None:
                box.close(0)
        for box in (self.pull, self.sink, self.worker_sink):
            if box is not None:
                box.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def bare():
    b = Bare()
    yield b
    b.close()


def test_first_outputs_lead_their_batch_and_the_batch_pickles_as_rows(bare):
    """A request's first output goes ahead of the running requests' outputs in the one message of a
    step (time to first token waits on it), and the message survives pickling."""
    import pickle

    old = bare.admit("old")
    bare.emit(old, 65)
    bare.source.on_tokens([old], 0.0)
    assert [o.rid for o in bare.sink.recv_pyobj().outputs] == ["old"]
    new = bare.admit("new")
    bare.emit(old, 66)
    bare.emit(new, 67)
    bare.source.on_tokens([old, new], 0.0)                      # the batch's own order: old, then new
    batch = pickle.loads(pickle.dumps(bare.sink.recv_pyobj()))
    assert [(o.rid, o.token_ids, o.detok is not None) for o in batch.outputs] == [("new", [67], True),
                                                                                ("old", [66], False)]
    assert batch.outputs[0].detok.prompt_tail_ids == [3] and batch.stats.prompt_tokens_total == 6


def test_first_outputs_also_go_straight_to_their_worker():
    """server.first_outputs_direct: a step's first outputs go to their worker in a message of their own,
    sent before the step's whole message, which tells the detokenizer how many of its outputs those are."""
    b = Bare(direct=True)
    try:
        old = b.admit("old")
        b.emit(old, 65)
        b.source.on_tokens([old], 0.0)
        assert b.worker_sink.poll(5000)
        (direct,) = [b.worker_sink.recv_pyobj()]
        (whole,) = b.sent()
        assert [(o.rid, o.token_ids) for o in direct.outputs] == [("old", [65])] and direct.delivered == 0
        assert [o.rid for o in whole.outputs] == ["old"] and whole.delivered == 1 and direct.stats == whole.stats
        new = b.admit("new")
        b.emit(old, 66)
        b.emit(new, 67)
        b.source.on_tokens([old, new], 0.0)
        assert b.worker_sink.poll(5000)
        direct = b.worker_sink.recv_pyobj()
        (whole,) = b.sent()
        assert [(o.rid, o.detok is not None) for o in direct.outputs] == [("new", True)]
        assert [o.rid for o in whole.outputs] == ["new", "old"] and whole.delivered == 1
        b.emit(old, 68)
        b.emit(new, 69)
        b.source.on_tokens([old, new], 0.0)
        (whole,) = b.sent()
        assert whole.delivered == 0 and not b.worker_sink.poll(50)   # no first output: nothing straight
    finally:
        b.close()


def test_a_steps_tokens_leave_at_once_not_at_the_next_poll(bare):
    """With overlap scheduling the driver polls again only after the next step's bookkeeping: a step's
    tokens must not wait for it. A request the step finished sends its last token with its finish."""
    going, ending = bare.admit("going"), bare.admit("ending", max_new_tokens=1)
    bare.emit(going, 65)
    bare.emit(ending, 66)
    ending.status, ending.finish_reason = RequestStatus.FINISHED, FinishReason.LENGTH   # as resolve leaves it
    bare.source.on_tokens([going, ending], 0.0)
    (msg,) = bare.sent()
    assert [(o.rid, o.token_ids, o.finish) for o in msg.outputs] == [("going", [65], None)]
    bare.source.on_finished([ending], 0.0)
    (msg,) = bare.sent()
    assert [(o.rid, o.token_ids, o.finish.reason) for o in msg.outputs] == [("ending", [66], "length")]


def test_a_stop_string_finish_waits_for_the_poll_before_its_abort():
    """The client that sees a stop-string finish may ask about the request at once; the driver aborts
    it right after its next poll, so the finish (and its step's other outputs) go out in that poll."""
    b = Bare(stops=["B"])
    try:
        stopped, other = b.admit("stopped"), b.admit("other")
        b.emit(stopped, 65)
        b.emit(other, 67)
        b.source.on_tokens([stopped, other], 0.0)
        b.sent()                                               # the first tokens
        b.emit(stopped, 66)                                    # "B": the stop string
        b.emit(other, 68)
        b.source.on_tokens([stopped, other], 0.0)
        assert b.sent() == []
        assert b.source.poll(0.0) == [] and b.source.aborted_rids() == ["stopped"]
        (msg,) = b.sent()
        assert [(o.rid, o.finish.reason if o.finish else None) for o in msg.outputs] == [("stopped", "stop"),
                                                                                       ("other", None)]
    finally:
        b.close()


def test_a_rid_in_flight_from_another_worker_is_refused_and_aborts_need_the_owner(bare):
    """Two tokenizer workers can each accept a request of the same rid: the scheduler keeps the first and
    refuses the second (abort, to its own worker); an abort counts only from the worker owning the rid."""
    sampling = SamplingParams(max_new_tokens=8, ignore_eos=True)
    first = bare.admit("same")
    bare.sender.send_pyobj(TokenizedRequest("same", [1, 2], sampling, 0.0, DetokSpec([2]), worker=2))
    bare.sender.send_pyobj(AbortReq("same", worker=2))
    assert bare.pull.poll(5000)
    time.sleep(0.05)                                             # both messages arrived
    assert bare.source.poll(0.0) == [] and bare.source.aborted_rids() == []
    (msg,) = bare.sent()
    (refusal,) = msg.outputs
    assert (refusal.rid, refusal.worker, refusal.finish.reason) == ("same", 2, "abort")
    assert bare.source.tracked["same"].request is first
    bare.sender.send_pyobj(AbortReq("same", worker=0))
    assert bare.pull.poll(5000)
    bare.source.poll(0.0)
    assert bare.source.aborted_rids() == ["same"]


def test_stream_interval_sends_the_first_token_then_every_n_then_the_rest_with_the_finish(tmp_path):
    """SGLang's --stream-interval: fewer, larger outputs; the same tokens, log-probabilities and finishes."""
    h = Harness(tmp_path, execute=letters_with_logprobs, stream_interval=3)
    try:
        h.request("eight", 8, top_logprobs_num=1)
        h.request("stopped", 50, stops=["FG"])
        msgs = h.receive_until(lambda m: finished("eight")(m) and finished("stopped")(m))
    finally:
        h.close()
    eight, stopped = outputs_of(msgs, "eight"), outputs_of(msgs, "stopped")
    assert [len(o.token_ids) for o in eight] == [1, 3, 3, 1] and eight[-1].finish.reason == "length"
    assert [t for o in eight for t in o.token_ids] == list(range(65, 73))
    assert [p.sampled.logprob for o in eight for p in o.logprobs] == [-(i + 1.0) for i in range(8)]
    assert [t for o in stopped for t in o.token_ids] == list(range(65, 72))        # up to the G of "FG"
    assert [len(o.token_ids) for o in stopped] == [1, 3, 3] and stopped[-1].finish.reason == "stop"


def test_a_stream_interval_below_one_is_refused():
    with pytest.raises(ValueError, match="stream_interval=0"):
        OnlineSource(None, None, None, ByteTokenizer(512), None, stream_interval=0)
