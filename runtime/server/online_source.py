"""The scheduler process's RequestSource for an online front end: requests, aborts and control
messages arrive over Unix sockets (`channel.py`) from the HTTP process; new tokens and finishes leave for
the detokenizer as soon as a step's are known (one message, two when the step finishes requests; requests'
first outputs also straight to their HTTP workers with server.first_outputs_direct). Stop
strings are checked here, on decoded text, so that a request ends as soon as one appears. Torch-free.
"""
from __future__ import annotations

import os
import time
from array import array
from dataclasses import dataclass, field
from typing import Callable

from runtime.core.batch import ScheduledItem
from runtime.core.request import FinishReason, Request
from runtime.core.scheduler import Scheduler
from runtime.engine.logprob_params import prompt_logprob_start, top_logprobs_num
from runtime.server.detokenizer import IncrementalDetokenizer
from runtime.server.hop_trace import HopTrace
from runtime.server.ipc import (
    AbortReq, BatchOutput, ControlReply, ControlReq, DetokSpec, Finish, PositionLogprobs, RequestOutput,
    SchedulerStats, TokenizedRequest, TokenLogprob,
)
from runtime.server.stop_strings import StopStringMatcher
from runtime.server.tokenizer import Tokenizer

PARENT_CHECK_S = 1.0
PENDING_FLUSH_S = 0.005            # while a receiver has not taken all our outputs, an idle wait retries this often


def check_stream_interval(value: int) -> int:
    """`value` if it is a valid server.stream_interval, else ValueError naming it."""
    if value < 1:
        raise ValueError(f"server.stream_interval={value}: must be >= 1")
    return value


@dataclass
class _Tracked:
    """A request between its arrival and its finish, as the front end sees it."""

    request: Request
    detok: DetokSpec
    worker: int = 0                                # the tokenizer worker its outputs go to
    num_sent: int = 0
    detok_sent: bool = False
    text: IncrementalDetokenizer | None = None     # only with stop strings
    stop: StopStringMatcher | None = None
    logprobs: dict[int, PositionLogprobs] | None = None   # by output index, until sent; None: not asked
    held: list[int] = field(default_factory=list)   # tokens taken but not sent yet (stream_interval > 1)
    prompt_logprobs: list[PositionLogprobs] | None = None  # its prompt tokens', for the first output

    @property
    def stopped(self) -> bool:
        return self.stop is not None and self.stop.matched is not None


class OnlineSource:
    """`control(req)` answers flush_cache / server_info / dump_records between steps (the driver
    calls `poll` only between steps); `shutdown` aborts everything in flight, then `exhausted()`."""

    def __init__(self, pull, push, scheduler: Scheduler, tokenizer: Tokenizer,
                 control: Callable[[ControlReq], ControlReply], parent_pid: int | None = None,
                 clock: Callable[[], float] = time.perf_counter, stream_interval: int = 1,
                 trace: HopTrace | None = None, direct=None) -> None:
        """`pull`: the scheduler's Inbox; `push`: an Outbox or WorkerPushes (`send_pyobj`, `flush`).
        `direct`: WorkerPushes that requests' first outputs also go to, ahead of `push` (the detokenizer
        process, told how many of a message's outputs their workers have had); None: everything to `push`.
        stream_interval (SGLang's --stream-interval): a request's first token goes out at once, then its
        tokens whenever `stream_interval` of them are waiting, and the rest with its finish. `trace`: the
        delivery-lag probe's hop marks (None: off)."""
        self.stream_interval = check_stream_interval(stream_interval)
        self.pull, self.push, self.scheduler, self.tokenizer = pull, push, scheduler, tokenizer
        self.direct = direct
        self.control = control
        self.parent_pid = parent_pid
        self.clock = clock
        self.trace = trace
        self.tracked: dict[str, _Tracked] = {}
        self.finished: list[Request] = []                 # every ended request (the records)
        self.shutdown: ControlReq | None = None
        self.prompt_tokens_total = self.cached_tokens_total = 0
        self._aborts: list[str] = []
        self._first_outputs: list[RequestOutput] = []    # requests' first outputs: sent ahead of the rest
        self._outputs: list[RequestOutput] = []
        self._stop_pending = False                        # a stop-string finish waits for the next poll
        self._clock_offset_s: float | None = None         # clock() - driver time

    # -- RequestSource --------------------------------------------------------------------------
    def poll(self, now_s: float) -> list[Request]:
        """New requests (aborts and control requests are taken too); then the outputs not sent yet go out.
        After the intake, so that a client that saw a request end (say, by a stop string, whose abort the
        driver applies right after this poll) cannot ask about it before then."""
        if self._clock_offset_s is None:
            self._clock_offset_s = self.clock() - now_s
        new: list[Request] = []
        for msg in self.pull.drain():
            if isinstance(msg, TokenizedRequest):
                req = self._admit(msg)
                if req is not None:
                    new.append(req)
            elif isinstance(msg, AbortReq):
                t = self.tracked.get(msg.rid)
                if t is not None and t.worker == msg.worker:
                    self._aborts.append(msg.rid)
            elif isinstance(msg, ControlReq):
                self._on_control(msg)
        self.flush()
        self._flush_sockets()                             # what a busy receiver left (usually nothing)
        return new

    def aborted_rids(self) -> list[str]:
        out, self._aborts = self._aborts, []
        return out

    def wait(self, now_s: float, timeout_s: float | None) -> None:
        self.flush()
        deadline = None if timeout_s is None else self.clock() + timeout_s
        while True:
            check_s = PARENT_CHECK_S if self._flush_sockets() else PENDING_FLUSH_S
            slice_s = check_s if deadline is None else min(check_s, deadline - self.clock())
            if slice_s <= 0 or self.pull.poll(int(slice_s * 1000)):
                return
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                self._begin_shutdown(ControlReq("shutdown", -1))   # the HTTP process is gone
                return

    def exhausted(self) -> bool:
        self.flush()
        return self.shutdown is not None

    def on_tokens(self, requests: list[Request], now_s: float) -> None:
        """A step's new tokens go out now, not at the next poll (which in overlap scheduling comes after
        the next step's bookkeeping). A request the step finished is left to `on_finished`, which the driver
        calls right after: its last tokens travel with its finish."""
        for req in requests:
            t = self.tracked.get(req.rid)
            if t is None or t.stopped or req.is_finished:
                continue
            t.held += self._take_new_tokens(t)
            if t.stopped:                                  # a stop string appeared: end it now
                self._aborts.append(req.rid)
                self._stop_pending = True
                self._output(t, self._release(t), self._finish(req, "stop", t.stop.matched, t.num_sent, now_s))
            elif t.held and (not t.detok_sent or len(t.held) >= self.stream_interval):
                self._output(t, self._release(t))
        self._send_now()

    def on_logprobs(self, items: list[ScheduledItem], logprobs: list) -> None:
        """A step's log-probabilities (StepResult.logprobs, one per sampling item), kept by output index
        until their tokens are sent: an item counts where the scheduler's `resolve` placed its token."""
        for item, entry in zip(items, logprobs):
            if entry is None or item.dropped:
                continue
            req = item.request
            t = self.tracked.get(req.rid)
            index = item.num_prefix_tokens + item.num_new_tokens - len(req.input_ids)
            if t is None or t.logprobs is None or index >= len(req.output_ids):
                continue
            t.logprobs[index] = PositionLogprobs(TokenLogprob(entry.logprob, req.output_ids[index]),
                                                 [TokenLogprob(value, token) for token, value in entry.top])
            if entry.prompt is not None and t.prompt_logprobs is None:   # again after a retraction: kept
                t.prompt_logprobs = self._prompt_positions(req, *entry.prompt)

    def on_finished(self, requests: list[Request], now_s: float) -> None:
        for req in requests:
            self.finished.append(req)
            t = self.tracked.pop(req.rid, None)
            if t is None:
                continue
            if t.stopped:                                  # ended by its stop string, reported already
                req.finish_reason = FinishReason.STOP
                continue
            t.held += self._take_new_tokens(t)
            new = self._release(t)
            reason = req.finish_reason.value if req.finish_reason else "abort"
            if t.stopped:
                reason, matched = "stop", t.stop.matched
                req.finish_reason = FinishReason.STOP
            else:
                matched = req.output_ids[-1] if reason == "stop" and req.output_ids else None
            self._output(t, new, self._finish(req, reason, matched, t.num_sent, now_s))
        self._send_now()

    # -- outputs --------------------------------------------------------------------------------
    def _send_now(self) -> None:
        """Flush, unless a request ended by its stop string since the last poll: then everything waits for
        that poll, right after which the driver applies the request's abort, so that a client that saw the
        finish never finds the request still in flight."""
        if not self._stop_pending:
            self.flush()

    def flush(self) -> None:
        """Send the outputs gathered since the last flush in one message, with the scheduler's gauges;
        requests' first outputs lead (time to first token is what waits on them)."""
        self._stop_pending = False
        if self._first_outputs or self._outputs:
            firsts = self._first_outputs
            outs = firsts + self._outputs
            self._first_outputs, self._outputs = [], []
            if self.trace is not None:                     # marked as handed over (a mark after it can lag)
                self.trace.mark_outputs("sched_send", outs, self.clock())
            stats = self.stats()
            delivered = 0
            if self.direct is not None and firsts:
                delivered = len(firsts)
                self.direct.send_pyobj(BatchOutput(firsts, stats))
                if self.trace is not None:                 # pickled and written (or buffered)
                    self.trace.mark_outputs("sched_written", firsts, self.clock())
            self.push.send_pyobj(BatchOutput(outs, stats, delivered))

    def _flush_sockets(self) -> bool:
        """Write what the sockets take now; True when nothing is left."""
        done = self.push.flush()
        return (self.direct.flush() if self.direct is not None else True) and done

    def stats(self) -> SchedulerStats:
        s = self.scheduler
        return SchedulerStats(len(s.running) + (s.chunked is not None), len(s.waiting), s.kv.used_tokens(),
                              s.kv.capacity_tokens, s.kv.cache.total_size(), self.prompt_tokens_total,
                              self.cached_tokens_total)

    def _output(self, t: _Tracked, token_ids: list[int], finish: Finish | None = None) -> None:
        detok = None
        if not t.detok_sent:
            detok, t.detok_sent = t.detok, True
            self.prompt_tokens_total += len(t.request.input_ids)
            self.cached_tokens_total += t.request.num_cached_tokens
        logprobs = prompt = None
        if t.logprobs is not None:            # the entries of the tokens just taken (num_sent counts them)
            logprobs = [t.logprobs.pop(i) for i in range(t.num_sent - len(token_ids), t.num_sent)]
            if detok is not None:
                prompt = t.prompt_logprobs
        out = RequestOutput(t.request.rid, token_ids, finish, detok, logprobs, prompt, t.worker)
        (self._outputs if detok is None else self._first_outputs).append(out)
        if self.trace is not None:
            self._trace_output(t, out)

    def _trace_output(self, t: _Tracked, out: RequestOutput) -> None:
        """The probe's first two hops: the recorded time of the output's last token (what the records'
        TTFT and token times use), and now, when the output is made."""
        now = self.clock()
        made = t.request.token_times_s[t.num_sent - 1] + self._clock_offset_s if out.token_ids else now
        self.trace.mark_outputs("step_end", (out,), made)
        self.trace.mark_outputs("sched_out", (out,), now)

    @staticmethod
    def _release(t: _Tracked) -> list[int]:
        """The held tokens, to send now (the tail of the tokens taken: num_sent counts them)."""
        out, t.held = t.held, []
        return out

    def _take_new_tokens(self, t: _Tracked) -> list[int]:
        """Output tokens not sent yet; with stop strings, only those up to the one completing a stop.
        Only tokens whose step has resolved (they have a time): with overlap scheduling the tail of
        `output_ids` can be a placeholder of the step still on the device."""
        req = t.request
        new = req.output_ids[t.num_sent:len(req.token_times_s)]
        if t.stop is not None:
            for k, token in enumerate(new):
                t.stop.feed(t.text.push([token]))
                if t.stop.matched is not None:
                    new = new[:k + 1]
                    break
        t.num_sent += len(new)
        return new

    @staticmethod
    def _prompt_positions(req: Request, start: int, values: list[float], tops: list) -> list[PositionLogprobs]:
        """Prompt tokens start.. : the first without a value (SGLang's None), then one per value."""
        ids = req.input_ids
        out = [PositionLogprobs(TokenLogprob(None, ids[start]), [])]
        for j, (value, top) in enumerate(zip(values, tops)):
            out.append(PositionLogprobs(TokenLogprob(value, ids[start + 1 + j]),
                                        [TokenLogprob(v, token) for token, v in top]))
        return out

    @staticmethod
    def _finish(req: Request, reason: str, matched, num_tokens: int, now_s: float) -> Finish:
        e2e = now_s - req.arrival_s
        ttft = req.first_token_s - req.arrival_s if req.first_token_s is not None else None
        return Finish(reason, matched, len(req.input_ids), num_tokens, req.num_cached_tokens, e2e, ttft)

    # -- intake and control ---------------------------------------------------------------------
    def _admit(self, msg: TokenizedRequest) -> Request | None:
        arrival = max(0.0, msg.arrival_clock_s - self._clock_offset_s)
        # an int32 array, as trace workloads' prompts are: no object the garbage collector walks (a list's every
        # element is visited by each full collection, and the radix cache's keys are slices of it)
        req = Request(rid=msg.rid, input_ids=array("i", msg.input_ids), sampling=msg.sampling, arrival_s=arrival)
        if self.trace is not None:
            self.trace.mark("sched_recv", msg.rid, self.clock())
        asks = top_logprobs_num(msg.sampling) is not None
        t = _Tracked(req, msg.detok, msg.worker, logprobs={} if asks else None)
        if t.logprobs is not None:            # from the last prompt token alone: no forward row, no value
            start = prompt_logprob_start(msg.sampling, len(req.input_ids))
            if start is None or start == len(req.input_ids) - 1:
                t.prompt_logprobs = self._prompt_positions(req, len(req.input_ids) - 1, [], [])
        if msg.detok.stop_strs:
            t.text = IncrementalDetokenizer(self.tokenizer, msg.detok.prompt_tail_ids, msg.detok.skip_special_tokens)
            t.stop = StopStringMatcher(msg.detok.stop_strs)
        if self.shutdown is not None or msg.rid in self.tracked:   # shutting down, or the rid taken: refuse
            matched = None if self.shutdown is not None else "rid already in flight"
            self._output(t, [], Finish("abort", matched, len(req.input_ids), 0, 0, None, None))
            return None
        self.tracked[msg.rid] = t
        return req

    def _on_control(self, msg: ControlReq) -> None:
        if msg.kind == "shutdown":
            self._begin_shutdown(msg)
            return
        self.flush()                                       # replies follow the outputs before them
        try:
            reply = self.control(msg)
        except Exception as err:                           # a failed control must not stop serving
            reply = ControlReply(msg.kind, msg.req_id, False, f"{type(err).__name__}: {err}", msg.worker)
        self.push.send_pyobj(reply)

    def abort_for_clients(self, rids: list[str] | None) -> list[str]:
        """/abort_request: these requests (None: every one in flight) end at the next step, their own
        clients getting the finish (reason abort), whichever worker they came through. Returns those found."""
        found = list(self.tracked) if rids is None else [rid for rid in rids if rid in self.tracked]
        self._aborts.extend(rid for rid in found if rid not in self._aborts)
        return found

    def _begin_shutdown(self, msg: ControlReq) -> None:
        self.shutdown = msg
        self._aborts.extend(rid for rid in self.tracked if rid not in self._aborts)
