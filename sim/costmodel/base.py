"""The cost-model contract: the shape of one forward step, and the Protocol that prices it.

Imports no torch and no clock; numpy only. A replay or profiled model need only implement
`CostModel`; the simulator's executor reduces each StepPlan to a StepShape first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from runtime.core.batch import ForwardMode, StepPlan
from runtime.core.shared_prefix import shared_prefix_tokens


@dataclass(frozen=True)
class StepShape:
    """What a cost model needs from a step (hashable, so models may cache on it).

    extend_new_tokens[i]    new tokens of prefill item i this step;
    extend_prefix_tokens[i] tokens of item i already in KV (cached prefix or earlier chunks);
    num_decode_reqs         decode items, one new token each;
    decode_context_tokens   sum over decode items of the KV length attended (prefix + 1);
    decode_shared_tokens    of those, tokens another decode item of the step reads too (radix-cache
                            prefixes held by several requests), counted once per extra reader: the
                            step reads decode_context_tokens - decode_shared_tokens distinct KV tokens;
    decode_context_lens     a decode-only step's KV length per decode item in batch order (summing to
                            decode_context_tokens), or () where not known: how attention splits the
                            step's work over the GPU depends on them (sim/costmodel/mla_kv_split.py).
    """

    extend_new_tokens: tuple[int, ...] = ()
    extend_prefix_tokens: tuple[int, ...] = ()
    num_decode_reqs: int = 0
    decode_context_tokens: int = 0
    decode_shared_tokens: int = 0
    decode_context_lens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.extend_new_tokens) != len(self.extend_prefix_tokens):
            raise ValueError("extend_new_tokens and extend_prefix_tokens differ in length")
        if self.num_decode_reqs < 0 or self.decode_context_tokens < self.num_decode_reqs:
            raise ValueError(f"decode context {self.decode_context_tokens} tokens is less than "
                             f"one token for each of {self.num_decode_reqs} decode requests")
        if not 0 <= self.decode_shared_tokens <= self.decode_context_tokens - self.num_decode_reqs:
            raise ValueError(f"decode shared tokens {self.decode_shared_tokens} outside [0, "
                             f"{self.decode_context_tokens - self.num_decode_reqs}] (context less one token each)")
        if self.decode_context_lens and (len(self.decode_context_lens) != self.num_decode_reqs
                                         or sum(self.decode_context_lens) != self.decode_context_tokens):
            raise ValueError(f"decode_context_lens ({len(self.decode_context_lens)} lengths summing to "
                             f"{sum(self.decode_context_lens)}) do not match {self.num_decode_reqs} decode requests "
                             f"attending {self.decode_context_tokens} tokens")

    @classmethod
    def from_plan(cls, plan: StepPlan) -> "StepShape":
        if plan.mode is ForwardMode.DECODE:           # one pass: every item decodes one token
            lens = tuple(it.num_prefix_tokens + 1 for it in plan.items)
            return cls(num_decode_reqs=len(lens), decode_context_tokens=sum(lens),
                       decode_shared_tokens=cls._shared_tokens(plan, plan.items), decode_context_lens=lens)
        extends = [it for it in plan.items if not it.is_decode]
        decodes = [it for it in plan.items if it.is_decode]
        return cls(
            extend_new_tokens=tuple(it.num_new_tokens for it in extends),
            extend_prefix_tokens=tuple(it.num_prefix_tokens for it in extends),
            num_decode_reqs=len(decodes),
            decode_context_tokens=sum(it.context_tokens for it in decodes),
            decode_shared_tokens=cls._shared_tokens(plan, decodes),
        )

    @staticmethod
    def _shared_tokens(plan: StepPlan, decodes: list) -> int:
        """The plan's decode_shared_tokens, or (a plan made elsewhere) counted from its decode items."""
        if plan.decode_shared_tokens is not None:
            return plan.decode_shared_tokens
        return shared_prefix_tokens(it.request for it in decodes)

    @property
    def num_tokens(self) -> int:
        """Tokens run through the model this step (prefill chunks plus one per decode)."""
        return sum(self.extend_new_tokens) + self.num_decode_reqs

    @property
    def num_seqs(self) -> int:
        """Sequences in the step; each gets one row of logits."""
        return len(self.extend_new_tokens) + self.num_decode_reqs

    @property
    def is_decode_only(self) -> bool:
        return not self.extend_new_tokens and self.num_decode_reqs > 0


class CostModel(Protocol):
    """Predicts how long one forward step takes on one DP replica, in seconds."""

    def step_time_s(self, shape: StepShape) -> float:
        """Duration of the step: GPU work, launch overhead and per-step CPU overhead."""
        ...

    def host_time_s(self, shape: StepShape) -> float:
        """The part of step_time_s(shape) spent on the host (scheduling, batch building, result
        processing): with overlap scheduling it runs while the GPU executes the previous step."""
        ...

    def launch_time_s(self, shape: StepShape) -> float:
        """Host time of launching the step (batch build, attention plan, graph replays and eager kernel
        launches). It lies inside the device part of step_time_s (a step whose launch is longer than its
        kernels lasts as long as its launch), and under overlap scheduling the host plans the next step
        only once this launch has returned."""
        ...

    def launch_bound_s(self, shape: StepShape) -> float:
        """Of the device part of step_time_s, the time the device waits for the step's own launch rather
        than computes (a host-bound step launched back to back lasts as long as its launch). Under overlap
        the launch begins while the step ahead still runs, and that head start hides up to this much."""
        ...

    def after_decode_saving_s(self, shape: StepShape) -> float:
        """Seconds a step takes less when it runs right behind a decode-only step (no idle device between)
        than its price, which holds the step timed back to back after one like it: a device-bound extend's
        back-to-back time over its kernels alone (0 where the model knows none). On an H200 a graph-replayed
        prefill of 2-8k new tokens served right after a decode ran at 0.96 of its back-to-back time and at
        1.00 after another extend (experiments/results/h200/fidelity*): the GPU runs faster after a light
        step than after a heavy one."""
        ...

    def idle_launch_factor(self, idle_s: float) -> float:
        """How many times its launch_time_s the launch of a step takes when the host has idled `idle_s` seconds
        before it (1 for no idle; >= 1). On an H200 a 256-token graph-replayed prefill launched after 8 s of idle
        took 1.1-1.6x its time right after a step, and a step after gaps of up to 2 s at most 1 ms more
        (experiments/results/h200/piecewise_idle_probe)."""
        ...

    def launch_ends_step(self, shape: StepShape) -> bool:
        """True for steps that ranks launching in lockstep (tensor parallelism) launch without waiting on the
        device, but whose kernels cannot outrun their launch (extends replayed as piecewise CUDA graphs, eager
        attention cores between the pieces). The driver then lets every rank take the step once the leader
        launched it and each rank has launched the step ahead; the step ends no earlier than its launch time
        after that, its launch_bound_s is its whole back-to-back excess over its kernels alone (hidden only by
        what the step ahead still runs once every rank could take it), and its ranks are done launching it
        only as it ends. False: launch_bound_s is the part a head start from the launch's begin can hide."""
        ...

    def device_waits_for_launch(self, shape: StepShape) -> bool:
        """True when the step's kernels reach the device only as its launch returns (a decode step that
        replays one CUDA graph once the host has built its batch): the device part then begins no earlier
        than launch_time_s after the launch began, which binds when the device is idle by then (after a
        host-bound step). False where kernels are enqueued all along the launch (eager and piecewise steps,
        whose launch-bound share launch_bound_s already prices)."""
        ...

    def decode_times_s(self, num_reqs: int, context_tokens: np.ndarray, shared_tokens: int = 0,
                       first_context_lens: np.ndarray | None = None) -> np.ndarray:
        """Durations of consecutive decode-only steps of one batch of `num_reqs` requests,
        where context_tokens[j] is the step-j sum of KV lengths, `shared_tokens` of them read by
        several requests (the batch's shared prefixes; constant while the batch is), and, where given,
        first_context_lens [num_reqs] the step-0 KV length of each request (step j: j more each). Element j
        must equal step_time_s(StepShape(num_decode_reqs=num_reqs, decode_context_tokens=context_tokens[j],
        decode_shared_tokens=shared_tokens, decode_context_lens=first_context_lens + j (or ())))."""
        ...

    def decode_segment_times_s(self, num_reqs: Sequence[int], segment_steps: Sequence[int],
                               context_tokens: np.ndarray, shared_tokens: Sequence[int],
                               first_context_lens: Sequence[np.ndarray | None]) -> np.ndarray:
        """decode_times_s of consecutive segments of one decode run, concatenated: segment i is
        segment_steps[i] steps of a batch of num_reqs[i] requests, whose context sums are the next
        segment_steps[i] entries of context_tokens, with shared_tokens[i] and first_context_lens[i]
        (its step-0 lengths, or None). `decode_segments_one_by_one` is the plain implementation."""
        ...

    def breakdown_s(self, shape: StepShape) -> dict[str, float]:
        """Per-operator durations of the step; the values sum to step_time_s(shape)."""
        ...


def decode_segments_one_by_one(model: CostModel, num_reqs: Sequence[int], segment_steps: Sequence[int],
                               context_tokens: np.ndarray, shared_tokens: Sequence[int],
                               first_context_lens: Sequence[np.ndarray | None]) -> np.ndarray:
    """CostModel.decode_segment_times_s as one decode_times_s call per segment."""
    bounds = np.cumsum([0, *segment_steps]).tolist()
    parts = [model.decode_times_s(n, context_tokens[a:b], shared, lens)
             for n, a, b, shared, lens in zip(num_reqs, bounds[:-1], bounds[1:], shared_tokens, first_context_lens)]
    return np.concatenate(parts) if len(parts) != 1 else parts[0]
