"""The detokenizer process: token ids from the scheduler in, text deltas out to the tokenizer worker that
owns each request (SGLang's DetokenizerManager), so that decoding text never sits on the scheduler's
critical path (server.detokenizer=process; with server.first_outputs_direct each worker decodes requests' first
outputs itself, `Detokenizer.first_outputs`). With server.detokenizer=inline the same `Detokenizer` runs in
each tokenizer worker instead, on the outputs the scheduler sends it (`TokenizerManager`). Imports neither
torch nor the model.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

from runtime.server.detokenizer import IncrementalDetokenizer
from runtime.server.hop_trace import HopTrace
from runtime.server.ipc import Addresses, BatchOutput, BatchText, ControlReply, RequestOutput, TextOutput, by_worker
from runtime.server.stop_strings import StopStringMatcher
from runtime.server.token_pieces import TokenPieces
from runtime.server.tokenizer import Tokenizer

PENDING_FLUSH_MS = 5             # while a worker has not taken all its outputs, the wait retries this often
MAX_OUTPUTS_PER_MESSAGE = 32    # a worker starts writing these streams' chunks while the next ones are decoded


class Detokenizer:
    """Per-request incremental detokenizers, by (worker, rid): a request's state is created by its first
    output (which carries its DetokSpec) and dropped with its last."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pieces = TokenPieces(tokenizer)
        self._states: dict[tuple[int, str], tuple[IncrementalDetokenizer, StopStringMatcher | None]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def handle(self, batch: BatchOutput) -> BatchText:
        """The whole batch in one message, whatever the workers (one worker's view)."""
        return BatchText([self._one(out) for out in batch.outputs], batch.stats)

    def route(self, batch: BatchOutput) -> Iterator[tuple[int, BatchText]]:
        """(worker, message) pairs, each to be sent as it comes, decoded only when asked for: when the batch
        starts with requests' first outputs (the scheduler puts them first) and has others, the first
        outputs go before the rest is decoded (time to first token waits on them); then each worker's
        outputs, at most MAX_OUTPUTS_PER_MESSAGE a message, so that a worker writes the first streams'
        chunks while the later ones are decoded. The scheduler's gauges ride with each worker's last. The
        `batch.delivered` leading outputs, which their workers have had from the scheduler, are decoded (the
        text state goes on from them) and not sent."""
        outs = batch.outputs
        if batch.delivered:
            for out in outs[:batch.delivered]:
                self._one(out)
            outs = outs[batch.delivered:]
            if not outs:
                return
        num_first = next((i for i, out in enumerate(outs) if out.detok is None), len(outs))
        parts = [outs] if num_first in (0, len(outs)) else [outs[:num_first], outs[num_first:]]
        for k, part in enumerate(parts):
            for worker, mine in by_worker(part).items():
                for start in range(0, len(mine), MAX_OUTPUTS_PER_MESSAGE):
                    end = start + MAX_OUTPUTS_PER_MESSAGE
                    stats = batch.stats if k == len(parts) - 1 and end >= len(mine) else None
                    yield worker, BatchText([self._one(out) for out in mine[start:end]], stats)

    def first_outputs(self, batch: BatchOutput) -> BatchText:
        """Requests' first outputs (server.first_outputs_direct, in their worker): decoded as `route` decodes
        them, keeping no state (the detokenizer process decodes the requests' later outputs)."""
        texts = []
        for out in batch.outputs:
            texts.append(self._one(out))
            self._states.pop((out.worker, out.rid), None)
        return BatchText(texts, batch.stats)

    def _one(self, out: RequestOutput) -> TextOutput:
        key = (out.worker, out.rid)
        state = self._states.get(key)
        if state is None:
            spec = out.detok
            detok = IncrementalDetokenizer(self.tokenizer, spec.prompt_tail_ids if spec else None,
                                           spec.skip_special_tokens if spec else True)
            stop = StopStringMatcher(spec.stop_strs, spec.no_stop_trim) if spec and spec.stop_strs else None
            state = self._states[key] = (detok, stop)
        detok, stop = state
        text = detok.push(out.token_ids) if out.token_ids else ""
        if out.finish is not None:
            text += detok.flush()
        if stop is not None:
            text = stop.feed(text) + (stop.flush() if out.finish is not None else "")
        if out.finish is not None:
            del self._states[key]
        logprobs = self.pieces.fill(out.logprobs) if out.logprobs is not None else None
        prompt = self.pieces.fill(out.prompt_logprobs) if out.prompt_logprobs is not None else None
        return TextOutput(out.rid, text, out.token_ids, out.finish, logprobs, prompt)


def run_detokenizer(addresses: Addresses, tokenizer_path: str | None, vocab_size: int, parent_pid: int,
                    num_workers: int = 1, busy_poll_s: float = 0.0) -> None:
    """Process entry: serve until the scheduler's shutdown reply has passed through. Outputs and control
    replies go to their worker; Ready to the launcher (worker 0). `busy_poll_s`: server.busy_poll_s."""
    from runtime.server.channel import Inbox
    from runtime.server.ipc import WorkerPushes
    from runtime.server.process_utils import child_process_setup, parent_alive
    from runtime.server.tokenizer import load_tokenizer

    child_process_setup("twinserve-detokenizer")
    detok = Detokenizer(load_tokenizer(tokenizer_path, vocab_size))
    trace = HopTrace.from_env("detokenizer")
    pull = Inbox(addresses.detokenizer, busy_poll_s=busy_poll_s)
    pushes = WorkerPushes(addresses, num_workers)
    try:
        while True:
            if not pull.poll(1000 if pushes.flush() else PENDING_FLUSH_MS):
                if not parent_alive(parent_pid):
                    return
                continue
            msg = pull.recv_pyobj()
            if trace is not None and isinstance(msg, BatchOutput):      # what it sends on
                now = time.perf_counter()
                for hop in ("detok_recv", "detok_send"):
                    trace.count_outputs(hop, msg.outputs[:msg.delivered])
                trace.mark_outputs("detok_recv", msg.outputs[msg.delivered:], now)
            if not isinstance(msg, BatchOutput):           # a control reply, Ready: to its worker
                pushes.send_pyobj(msg)
            else:
                for worker, out in detok.route(msg):       # each part sent before the next is decoded
                    if trace is not None:
                        trace.mark_outputs("detok_send", out.outputs, time.perf_counter())
                    pushes.send_to(worker, out)
            if isinstance(msg, ControlReply) and msg.kind == "shutdown":
                return
    finally:
        if trace is not None:
            trace.flush()
        pull.close()
        pushes.close(1000)
