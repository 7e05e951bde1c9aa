"""Turns a step plan into a predicted duration (through a cost model) and sampled tokens.

Torch-free. Tokens are the trace's real output when it has one (`expected_output_ids`), else a
deterministic pseudo-random stream per request, so multi-turn traces hit the cache as in reality.
"""
from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from runtime.core.batch import StepPlan, StepResult
from runtime.core.decode_runs import DecodeGroup, run_step_batches
from runtime.core.request import Request, RequestSpec
from runtime.core.shared_prefix import shared_prefix_tokens
from runtime.executor import FinishedStep
from sim.costmodel.base import CostModel, StepShape


_STREAM_BLOCK = 1 << 14   # tokens hashed at once by `simulated_streams`


def simulated_tokens(req: Request | RequestSpec, first_index: int, num_tokens: int, vocab_size: int,
                     int_objects: np.ndarray | None = None) -> list[int]:
    """Output tokens first_index.. of `req`: the trace's own tokens where known, else a
    splitmix64 hash of (crc32(rid), index) -- deterministic across processes and runs.
    `int_objects` (optional, [vocab_size] object array of Python ints): the ids come out as those
    shared objects (no new int per token)."""
    expected = req.expected_output_ids or ()
    known = list(expected[first_index:first_index + num_tokens])
    missing = num_tokens - len(known)
    if missing <= 0:
        return known
    start = first_index + len(known)
    x = np.arange(start, start + missing, dtype=np.uint64) + np.uint64(_rid_seed(req.rid))   # [m]
    ids = _hashed_ids(x, vocab_size)
    return known + (int_objects[ids] if int_objects is not None else ids.astype(np.int64)).tolist()


def simulated_streams(specs: Sequence[RequestSpec], vocab_size: int, int_objects: np.ndarray) -> list[list[int]]:
    """`simulated_tokens(spec, 0, max_new_tokens)` of every spec, as lists (`simulated_stream_spans`)."""
    return [buf[start:start + n] for buf, start, n in simulated_stream_spans(specs, vocab_size, int_objects)]


StreamSpan = tuple[list[int], int, int]   # (buffer, start, length): a stream is buffer[start:start + length]


def simulated_stream_spans(specs: Sequence[RequestSpec], vocab_size: int, int_objects: np.ndarray) -> list[StreamSpan]:
    """`simulated_tokens(spec, 0, max_new_tokens)` of every spec, hashed in vectorised blocks of about
    _STREAM_BLOCK tokens: each block's ids become one list of shared ints, and each spec's stream is
    a span of it (not copied out; a spec with trace tokens gets a list of its own)."""
    knowns, lengths = [], []
    for spec in specs:
        num_tokens = spec.output_len if spec.sampling is None else spec.sampling.max_new_tokens   # sampling_params()
        knowns.append(spec.expected_output_ids[:num_tokens] if spec.expected_output_ids else ())
        lengths.append(num_tokens)
    first = np.array([len(k) for k in knowns], dtype=np.int64)                         # [R]
    missing = np.array(lengths, dtype=np.int64) - first                               # [R]
    seeds = np.array([_rid_seed(spec.rid) for spec in specs], dtype=np.uint64)        # [R]
    # in blocks of specs: the temporaries stay small and are reused (one pass over the whole
    # workload's tokens faults in ~100 MB of fresh pages)
    cuts = np.searchsorted(np.cumsum(missing), np.arange(_STREAM_BLOCK, int(missing.sum()), _STREAM_BLOCK))
    bounds = np.unique(np.concatenate(([0], cuts + 1, [len(specs)]))).tolist()
    out: list[StreamSpan] = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        block = missing[lo:hi]                                                        # [r]
        ends = np.cumsum(block)                                                       # [r]
        # token j of spec i hashes seed_i + first_i + j - start_i (uint64, wrapping): one repeat per spec
        offsets = seeds[lo:hi] + (first[lo:hi] - (ends - block)).astype(np.uint64)    # [r]
        x = np.repeat(offsets, block)                                                 # [block tokens]
        x += np.arange(x.size, dtype=np.uint64)
        ids = int_objects[_hashed_ids(x, vocab_size)].tolist()                        # [block tokens]
        starts = [0, *ends.tolist()]
        for known, a, b in zip(knowns[lo:hi], starts[:-1], starts[1:]):
            if known:
                stream = list(known) + ids[a:b]
                out.append((stream, 0, len(stream)))
            else:
                out.append((ids, a, b - a))
    return out


def _rid_seed(rid: str) -> int:
    return zlib.crc32(rid.encode()) << 20


def _hashed_ids(x: np.ndarray, vocab_size: int) -> np.ndarray:
    """splitmix64 of x (uint64, hashed in place, wrapping) modulo vocab_size, as intp."""
    x += np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    x %= np.uint64(vocab_size)
    return x.astype(np.intp)


class SimExecutor:
    """An Executor (runtime/executor.py): `execute(plan)` -> StepResult with the cost model's
    duration, `launch(plan)` the same as an already finished step (no clock of its own: the driver
    places it on its clock). Beyond the Protocol, for exact decode fast-forward, `decode_groups_durations_s`
    and `decode_tokens` give k consecutive decode steps of an unchanged batch at once.
    Each request's token stream is generated once, vectorised: on first use, or for a whole
    workload at once (`prepare_streams`)."""

    def __init__(self, cost_model: CostModel, vocab_size: int) -> None:
        self.cost_model = cost_model
        self.vocab_size = vocab_size
        self._streams: dict[str, StreamSpan] = {}
        self._int_objects = np.arange(vocab_size).astype(object)   # [V] one Python int per id, shared
        self._decode_hosts: dict[int, float] = {}                  # decode_host_s per batch size
        self._decode_launches: dict[int, tuple[float, float]] = {}  # decode_launch_s per batch size

    def prepare_streams(self, specs: Sequence[RequestSpec]) -> None:
        """Generate the token streams of requests still to come in one pass (the same tokens)."""
        todo = [spec for spec in specs if spec.rid not in self._streams]
        for spec, span in zip(todo, simulated_stream_spans(todo, self.vocab_size, self._int_objects)):
            self._streams[spec.rid] = span

    def _stream(self, req: Request) -> StreamSpan:
        """The request's token stream (a span: buffer, start, length), made now if not prepared."""
        span = self._streams.get(req.rid)
        if span is None or span[2] < req.sampling.max_new_tokens:
            stream = simulated_tokens(req, 0, req.sampling.max_new_tokens, self.vocab_size, self._int_objects)
            span = self._streams[req.rid] = (stream, 0, len(stream))
        return span

    def step_terms(self, shape: StepShape, next_token_ids: list[int] | None = None) -> StepResult:
        """The cost model's terms of a step of `shape` (duration, host share, launch and its lead, launch-bound
        share, lockstep, saving behind a decode), as execute() returns them with the step's tokens."""
        launch_s, lead_s = self._launch_and_lead(shape)
        return StepResult(next_token_ids=next_token_ids or [], duration_s=self.cost_model.step_time_s(shape),
                          host_s=self.cost_model.host_time_s(shape), launch_s=launch_s, launch_lead_s=lead_s,
                          launch_bound_s=self.cost_model.launch_bound_s(shape),
                          launch_ends_step=self.cost_model.launch_ends_step(shape),
                          after_decode_saving_s=self.cost_model.after_decode_saving_s(shape))

    def execute(self, plan: StepPlan) -> StepResult:
        shape = StepShape.from_plan(plan)
        streams, tokens = self._streams, []
        for it in plan.items:
            if it.samples:
                req = it.request
                buf, start, length = streams.get(req.rid) or self._stream(req)
                index = len(req.output_ids)
                # past max_new_tokens: the step after the last one under overlap (its token is dropped)
                tokens.append(buf[start + index] if index < length else 0)
        return self.step_terms(shape, tokens)

    def _launch_and_lead(self, shape: StepShape) -> tuple[float, float]:
        """The step's launch host time and, of it, the part before the device can begin: all of it where
        the kernels reach the device only as the launch returns (a decode graph replay), else none."""
        launch_s = self.cost_model.launch_time_s(shape)
        return launch_s, launch_s if self.cost_model.device_waits_for_launch(shape) else 0.0

    def clock_origin(self) -> None:
        """None: a simulated step has no device times; the driver's clock places it."""
        return None

    def launch(self, plan: StepPlan) -> FinishedStep:
        return FinishedStep(self.execute(plan))

    def idle_launch_factor(self, idle_s: float) -> float:
        """The cost model's factor on a step's launch after `idle_s` seconds of host idle (CostModel.idle_launch_factor)."""
        return self.cost_model.idle_launch_factor(idle_s)

    def decode_host_s(self, num_reqs: int) -> float:
        """Host share of each step of a decode run of a batch of `num_reqs` (independent of context)."""
        n = num_reqs
        host = self._decode_hosts.get(n)
        if host is None:
            host = self._decode_hosts[n] = self.cost_model.host_time_s(StepShape(num_decode_reqs=n, decode_context_tokens=n))
        return host

    def decode_launch_s(self, num_reqs: int) -> tuple[float, float]:
        """(launch, launch lead) of each step of a decode run of a batch of `num_reqs`: the host time of its
        launch and the part of it before the device can begin (StepResult.launch_s, .launch_lead_s)."""
        n = num_reqs
        launch = self._decode_launches.get(n)
        if launch is None:
            launch = self._decode_launches[n] = self._launch_and_lead(StepShape(num_decode_reqs=n, decode_context_tokens=n))
        return launch

    def decode_groups_durations_s(self, groups: Sequence[DecodeGroup], ends: Sequence[int]) -> np.ndarray:
        """Durations of consecutive batches of one decode run, concatenated: group g's steps
        groups[g].first_step .. ends[g]-1 (its batch's contexts at the run's first step, one token more
        per request each step), priced by the cost model in one call."""
        num_reqs, steps, shared, lens = [], [], [], []
        for group, end in zip(groups, ends):
            num_reqs.append(group.num_reqs)
            steps.append(end - group.first_step)
            tokens = group.shared_tokens             # the batch's: constant while it runs
            shared.append(shared_prefix_tokens(it.request for it in group.plan.items) if tokens is None else tokens)
            lens.append(group.context_lens + group.first_step)
        _, context = run_step_batches(groups, ends)                                           # [k]
        return self.cost_model.decode_segment_times_s(num_reqs, steps, context, shared, lens)

    def decode_tokens(self, plan: StepPlan, num_steps: int) -> list[list[int]]:
        out = []
        streams = self._streams
        for it in plan.items:
            req = it.request
            first = len(req.output_ids)
            span = streams.get(req.rid)              # `_stream`, inlined where the span is prepared and whole
            if span is None or span[2] < req.sampling.max_new_tokens:
                span = self._stream(req)
            buf, start, length = span
            out.append(buf[start + first:start + min(first + num_steps, length)])
        return out
