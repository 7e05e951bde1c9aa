"""The detokenizer process: token ids from the scheduler in, text deltas to the HTTP process out
(SGLang's DetokenizerManager), so that decoding text never sits on the scheduler's critical path.
Imports neither torch nor the model.
"""
from __future__ import annotations

import time

from runtime.server.detokenizer import IncrementalDetokenizer
from runtime.server.hop_trace import HopTrace
from runtime.server.ipc import Addresses, BatchOutput, BatchText, ControlReply, RequestOutput, TextOutput
from runtime.server.stop_strings import StopStringMatcher
from runtime.server.token_pieces import TokenPieces
from runtime.server.tokenizer import Tokenizer


class Detokenizer:
    """Per-request incremental detokenizers; a request's state is created by its first output
    (which carries its DetokSpec) and dropped with its last."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pieces = TokenPieces(tokenizer)
        self._states: dict[str, tuple[IncrementalDetokenizer, StopStringMatcher | None]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def handle(self, batch: BatchOutput) -> BatchText:
        return BatchText([self._one(out) for out in batch.outputs], batch.stats)

    def handle_parts(self, batch: BatchOutput) -> list[BatchText]:
        """`handle` in two messages when the batch starts with requests' first outputs (the scheduler
        puts them first) and has others: the first tokens travel on before the rest is decoded."""
        outs = batch.outputs
        num_first = next((i for i, out in enumerate(outs) if out.detok is None), len(outs))
        if num_first in (0, len(outs)):
            return [self.handle(batch)]
        return [BatchText([self._one(out) for out in outs[:num_first]]),
                BatchText([self._one(out) for out in outs[num_first:]], batch.stats)]

    def _one(self, out: RequestOutput) -> TextOutput:
        state = self._states.get(out.rid)
        if state is None:
            spec = out.detok
            detok = IncrementalDetokenizer(self.tokenizer, spec.prompt_tail_ids if spec else None,
                                           spec.skip_special_tokens if spec else True)
            stop = StopStringMatcher(spec.stop_strs, spec.no_stop_trim) if spec and spec.stop_strs else None
            state = self._states[out.rid] = (detok, stop)
        detok, stop = state
        text = detok.push(out.token_ids) if out.token_ids else ""
        if out.finish is not None:
            text += detok.flush()
        if stop is not None:
            text = stop.feed(text) + (stop.flush() if out.finish is not None else "")
        if out.finish is not None:
            del self._states[out.rid]
        logprobs = self.pieces.fill(out.logprobs) if out.logprobs is not None else None
        prompt = self.pieces.fill(out.prompt_logprobs) if out.prompt_logprobs is not None else None
        return TextOutput(out.rid, text, out.token_ids, out.finish, logprobs, prompt)


def run_detokenizer(addresses: Addresses, tokenizer_path: str | None, vocab_size: int, parent_pid: int) -> None:
    """Process entry: serve until the scheduler's shutdown reply has passed through."""
    import zmq

    from runtime.server.ipc import pull_socket, push_socket
    from runtime.server.process_utils import child_process_setup, parent_alive
    from runtime.server.tokenizer import load_tokenizer

    child_process_setup("twinserve-detokenizer")
    detok = Detokenizer(load_tokenizer(tokenizer_path, vocab_size))
    trace = HopTrace.from_env("detokenizer")
    ctx = zmq.Context()
    pull, push = pull_socket(ctx, addresses.detokenizer), push_socket(ctx, addresses.http)
    try:
        while True:
            if not pull.poll(1000):
                if not parent_alive(parent_pid):
                    return
                continue
            msg = pull.recv_pyobj()
            if trace is not None and isinstance(msg, BatchOutput):
                trace.mark_outputs("detok_recv", msg.outputs, time.perf_counter())
            for out in detok.handle_parts(msg) if isinstance(msg, BatchOutput) else (msg,):
                push.send_pyobj(out)
                if trace is not None and isinstance(out, BatchText):
                    trace.mark_outputs("detok_send", out.outputs, time.perf_counter())
            if isinstance(msg, ControlReply) and msg.kind == "shutdown":
                return
    finally:
        if trace is not None:
            trace.flush()
        pull.close()
        push.close(linger=1000)
        ctx.term()
