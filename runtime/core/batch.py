"""The plan of one forward step (what the scheduler asks for) and its result (what came back).

Must not import torch, simpy or time. Both executors (cost model, GPU) consume `StepPlan`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from runtime.core.request import Request


class ForwardMode(str, enum.Enum):
    EXTEND = "extend"   # prefill chunks only (new tokens after a cached prefix)
    DECODE = "decode"   # one token for every running request
    MIXED = "mixed"     # prefill chunks and decodes in one batch (mixed-chunk mode)


@dataclass(eq=False, slots=True)
class ScheduledItem:
    """One request's share of a step: `num_new_tokens` tokens at positions
    [num_prefix_tokens, num_prefix_tokens + num_new_tokens), written to `new_slots`.
    The tokens themselves are `request.fill_ids[num_prefix_tokens:][:num_new_tokens]`;
    the KV of the prefix is at `request.kv_slots[:num_prefix_tokens]`.
    `samples` is False for a prefill chunk that does not reach the end of the input."""

    request: Request
    num_prefix_tokens: int
    num_new_tokens: int
    new_slots: list[int]
    is_decode: bool
    samples: bool
    dropped: bool = False    # its request ended or was retracted before the step was applied

    @property
    def context_tokens(self) -> int:
        """KV length attended by the last new token (prefix + new)."""
        return self.num_prefix_tokens + self.num_new_tokens


@dataclass(eq=False)
class StepPlan:
    step_id: int
    mode: ForwardMode
    items: list[ScheduledItem]
    num_cache_hit_tokens: int = 0          # radix-cache hits of requests admitted this step
    retracted_rids: list[str] = field(default_factory=list)
    # of the decode items' cached prefixes, the tokens read again (shared_prefix_tokens of their requests),
    # as the scheduler counted them when it made the plan; None: count them from the items
    decode_shared_tokens: int | None = None

    @property
    def batch_size(self) -> int:
        return len(self.items)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(it.num_new_tokens for it in self.items if not it.is_decode)

    @property
    def num_decode_requests(self) -> int:
        return sum(1 for it in self.items if it.is_decode)

    @property
    def sampling_items(self) -> list[ScheduledItem]:
        return [it for it in self.items if it.samples]

    def signature(self) -> tuple[tuple[str, int, int], ...]:
        """What was decided, independent of timing: (rid, prefix tokens, new tokens) per item."""
        return tuple((it.request.rid, it.num_prefix_tokens, it.num_new_tokens) for it in self.items)


@dataclass
class StepResult:
    """What an executor returns for a plan: one sampled token per sampling item (in the order
    of `plan.sampling_items`) and, from a cost model, the predicted duration."""

    next_token_ids: list[int]
    duration_s: float | None = None
    host_s: float = 0.0        # of duration_s, the host's share (what overlap scheduling can hide)
    launch_s: float = 0.0      # host time of the step's launch, inside the device share: under overlap the
                               # host plans the next step once it has returned
    launch_lead_s: float = 0.0    # of launch_s, the part before the device can begin the step (all of it for
                                  # a CUDA-graph replay, enqueued as the launch returns; 0 for eager kernels)
    launch_bound_s: float = 0.0   # of the device share, time the device waits for the launch rather than
                                  # computes: a launch begun while the step ahead runs hides up to this much
    launch_ends_step: bool = False   # ranks launch it in lockstep and it ends no earlier than its launch on every
                                     # rank (sim.costmodel.base.CostModel.launch_ends_step); launch_bound_s is
                                     # then its whole back-to-back excess over its kernels alone
    after_decode_saving_s: float = 0.0   # of the device share, what the step takes less right behind a decode-only
                                         # step (sim.costmodel.base.CostModel.after_decode_saving_s)
    # per sampling item, for requests that asked: (logprob of its token, [(token id, logprob), ...] most
    # likely first), else None; None when no item asked
    logprobs: list[tuple[float, list[tuple[int, float]]] | None] | None = None
