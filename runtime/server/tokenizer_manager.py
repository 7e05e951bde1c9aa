"""A tokenizer worker's side of the pipeline (SGLang's TokenizerManager): tokenizes and sends requests
to the scheduler, receives their detokenized outputs (or, with server.detokenizer=inline, their token ids,
which it decodes itself; with server.first_outputs_direct, requests' first outputs as token ids straight from
the scheduler) and hands them to the waiting handlers, sends aborts and control requests. One per HTTP worker
process; runs on its asyncio loop; never imports torch.
"""
from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import TYPE_CHECKING, Callable

from runtime.server.channel import AsyncInbox, AsyncOutbox, Inbox, Outbox
from runtime.server.errors import APIError
from runtime.server.hop_trace import REQUEST_ENTRY_S, HopTrace
from runtime.server.input_processor import InputProcessor
from runtime.server.ipc import (
    AbortReq, Addresses, BatchOutput, BatchText, ControlReply, ControlReq, Finish, SchedulerStats, TextOutput,
)
from runtime.server.protocol import GenerateInput
from runtime.server.server_metrics import ServerMetrics

if TYPE_CHECKING:
    from runtime.server.detokenizer_process import Detokenizer


class ReqState:
    """One request in flight: outputs not yet consumed (`take`), everything received so far, and the
    finish (or an error when the scheduler died)."""

    def __init__(self, rid: str, arrival_s: float, num_prompt_tokens: int) -> None:
        self.rid, self.arrival_s, self.num_prompt_tokens = rid, arrival_s, num_prompt_tokens
        self.pending: list[TextOutput] = []
        self.finish: Finish | None = None
        self.error: APIError | None = None
        self.last_token_s: float | None = None
        self.event = asyncio.Event()
        self.first_received = False
        self.early: list[TextOutput] = []          # later outputs that came before the first (held for it)

    @property
    def done(self) -> bool:
        return self.finish is not None or self.error is not None

    def take(self) -> list[TextOutput]:
        out, self.pending = self.pending, []
        self.event.clear()
        return out


class TokenizerManager:
    def __init__(self, processor: InputProcessor, addresses: Addresses, metrics: ServerMetrics,
                 scheduler_alive: Callable[[], bool], trace: HopTrace | None = None, worker_id: int = 0,
                 detokenizer: Detokenizer | None = None, busy_poll_s: float = 0.0,
                 first_decoder: Detokenizer | None = None) -> None:
        """`trace`: the delivery-lag probe's hop marks (None: off). `worker_id`: this worker's (0: the one
        HTTP process), carried with every message so that outputs and replies come back here. `detokenizer`:
        server.detokenizer=inline, this worker decodes the token ids the scheduler sends it (None: the
        detokenizer process sends text). `first_decoder`: server.first_outputs_direct, the scheduler sends
        requests' first outputs here as token ids and this decodes them; the detokenizer process sends the
        rest (a request's later outputs wait for its first). `busy_poll_s`: server.busy_poll_s, for the Inbox
        this worker binds."""
        self.processor = processor
        self.detokenizer = detokenizer
        self.first_decoder = first_decoder
        self.trace = trace
        self.worker_id = worker_id
        self.metrics = metrics
        self.scheduler_alive = scheduler_alive
        self.addresses = addresses
        self.states: dict[str, ReqState] = {}
        self.last_stats: SchedulerStats | None = None
        self.dead = False
        self._controls: dict[int, asyncio.Future] = {}
        self._control_ids = itertools.count()
        self._request_counters: dict[str, object] = {}    # endpoint -> its child of metrics.requests
        self.busy_poll_s = busy_poll_s
        self._outbox = Outbox(addresses.scheduler)
        self._push: AsyncOutbox | None = None
        self._pull: AsyncInbox | None = None
        self._tasks: list[asyncio.Task] = []

    def start(self, inbox: Inbox | None = None) -> None:
        """Start sending and receiving on the running event loop. `inbox`: the launcher's, bound at launch
        (it already received Ready); without it, this worker's is bound."""
        self._push = AsyncOutbox(self._outbox)
        self._pull = AsyncInbox(inbox if inbox is not None
                                else Inbox(self.addresses.worker(self.worker_id), busy_poll_s=self.busy_poll_s))
        self._tasks = [asyncio.create_task(self._recv_loop()), asyncio.create_task(self._watch_scheduler())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._pull is not None:
            self._pull.close()
        if self._push is not None:
            self._push.close(1000)
        if self.trace is not None:
            self.trace.flush()

    # -- requests --------------------------------------------------------------------------------
    def submit(self, gi: GenerateInput, endpoint: str) -> ReqState:
        """Tokenize, validate and send; APIError when the request is refused."""
        arrival = time.perf_counter()
        self._request_counter(endpoint).inc()
        if self.dead:
            raise APIError("the scheduler process is not running", status=503)
        rid = gi.rid or uuid.uuid4().hex
        if rid in self.states:
            raise APIError(f"rid {rid!r} is already in flight", param="rid")
        tokenized = self.processor.process(gi, rid, arrival)
        tokenized.worker = self.worker_id
        state = self.states[rid] = ReqState(rid, arrival, len(tokenized.input_ids))
        if self.trace is not None:                         # marked as handed over (a mark after it can lag)
            entry_s = REQUEST_ENTRY_S.get()
            if entry_s is not None:
                self.trace.mark("http_entry", rid, entry_s)
            self.trace.mark("http_arrival", rid, arrival)
            self.trace.mark("http_sent", rid, time.perf_counter())
        self._push.send_pyobj(tokenized)
        return state

    def _request_counter(self, endpoint: str):
        """The `requests` counter's child for `endpoint`, looked up once (prometheus_client's `labels` costs
        ~2 µs a call)."""
        counter = self._request_counters.get(endpoint)
        if counter is None:
            counter = self._request_counters[endpoint] = self.metrics.requests.labels(endpoint=endpoint)
        return counter

    def submit_all(self, inputs: list[GenerateInput], endpoint: str) -> list[ReqState]:
        """`submit` each (a request's choices or batch); one refused withdraws those already sent."""
        states: list[ReqState] = []
        try:
            for gi in inputs:
                states.append(self.submit(gi, endpoint))
        except APIError:
            for state in states:
                self.abort(state.rid)
            raise
        return states

    def abort(self, rid: str) -> None:
        """Client gone: the scheduler frees its KV; later outputs are dropped."""
        state = self.states.pop(rid, None)
        if state is not None and not state.done:
            self.metrics.finished.labels(reason="abort").inc()
        self._push.send_pyobj(AbortReq(rid, self.worker_id))

    async def abort_for_clients(self, rids: list[str] | None) -> list[str]:
        """/abort_request (None: every request in flight): the scheduler ends them, whichever worker they
        came through; their clients get their outputs so far and the finish (reason abort). Returns the
        rids it found in flight."""
        return (await self.control("abort", {"rids": rids})).payload

    async def control(self, kind: str, args: dict | None = None, timeout_s: float = 60.0) -> ControlReply:
        if self.dead:
            raise APIError("the scheduler process is not running", status=503)
        req_id = next(self._control_ids)
        future = self._controls[req_id] = asyncio.get_running_loop().create_future()
        self._push.send_pyobj(ControlReq(kind, req_id, args or {}, self.worker_id))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError as err:
            raise APIError(f"the scheduler did not answer {kind} within {timeout_s:.0f} s", status=503) from err
        finally:
            self._controls.pop(req_id, None)

    # -- receiving -------------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        while True:
            msg = await self._pull.recv_pyobj()
            if isinstance(msg, BatchText):
                self._dispatch(msg, time.perf_counter())
            elif isinstance(msg, BatchOutput):
                if self.detokenizer is not None:
                    await self._detokenize(msg)
                else:
                    self._first_outputs(msg)
            elif isinstance(msg, ControlReply):
                future = self._controls.get(msg.req_id)
                if future is not None and not future.done():
                    future.set_result(msg)
                continue
            # Let the handlers just woken write their chunks, and the loop take what its sockets have (a new
            # request, say), before the next message's outputs: otherwise a step's whole burst of outputs runs
            # in one turn of the loop and a request arriving meanwhile waits for all of it.
            await asyncio.sleep(0)

    async def _detokenize(self, batch: BatchOutput) -> None:
        """server.detokenizer=inline: decode the scheduler's outputs here, part by part as the detokenizer
        process would send them (requests' first outputs, then slices of the rest), dispatching each part and
        letting the handlers it woke write their chunks before the next part is decoded."""
        if self.trace is not None:
            self.trace.mark_outputs("detok_recv", batch.outputs, time.perf_counter())
        for k, (_, part) in enumerate(self.detokenizer.route(batch)):
            if k:
                await asyncio.sleep(0)
            now = time.perf_counter()
            if self.trace is not None:
                self.trace.mark_outputs("detok_send", part.outputs, now)
            self._dispatch(part, now)

    def _first_outputs(self, batch: BatchOutput) -> None:
        """server.first_outputs_direct: requests' first outputs, straight from the scheduler: decoded here."""
        if self.trace is not None:     # when the channel last took a message off its sockets (this one, unless
            # another came right behind it), then when this handler ran
            self.trace.mark_outputs("worker_parsed", batch.outputs, self._pull.inbox.last_message_s)
            self.trace.mark_outputs("detok_recv", batch.outputs, time.perf_counter())
        text = self.first_decoder.first_outputs(batch)
        now = time.perf_counter()
        if self.trace is not None:
            self.trace.mark_outputs("detok_send", text.outputs, now)
        self._dispatch(text, now, firsts=True)

    def _dispatch(self, batch: BatchText, now_s: float, firsts: bool = False) -> None:
        """Hand each output to its request's handler; handlers wake in the batch's order. With first outputs
        coming straight from the scheduler (`firsts`: such a batch), a later output that overtook its
        request's first waits for it."""
        if self.trace is not None:
            self.trace.mark_outputs("http_recv", batch.outputs, now_s)
        hold = self.first_decoder is not None and not firsts
        num_tokens = 0
        for out in batch.outputs:
            state = self.states.get(out.rid)
            if state is None:
                continue                                   # aborted by its client
            if hold and not state.first_received:
                state.early.append(out)
                continue
            state.first_received = True
            num_tokens += self._deliver(state, out, now_s)
            if state.early:
                for early in state.early:
                    if out.rid in self.states:
                        num_tokens += self._deliver(state, early, now_s)
                state.early = []
        self.metrics.on_batch(num_tokens)
        if batch.stats is not None:
            self.last_stats = batch.stats
            self.metrics.on_stats(batch.stats)

    def _deliver(self, state: ReqState, out: TextOutput, now_s: float) -> int:
        """One output to its handler; the number of tokens it carries."""
        if out.token_ids:
            self.metrics.on_tokens(state.arrival_s, state.last_token_s, now_s, len(out.token_ids))
            state.last_token_s = now_s
        state.pending.append(out)
        if out.finish is not None:
            state.finish = out.finish
            self.metrics.on_finish(out.finish, state.arrival_s, now_s)
            del self.states[out.rid]
        state.event.set()
        return len(out.token_ids)

    async def _watch_scheduler(self) -> None:
        while not self.dead:
            await asyncio.sleep(1.0)
            if not self.scheduler_alive():
                self.dead = True
                for state in self.states.values():
                    state.error = APIError("the scheduler process exited", status=503)
                    state.event.set()
                self.states.clear()
