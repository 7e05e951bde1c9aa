"""Synthetic step plans for profiling the runner: decode batches over long contexts, prefill chunks
over a cached prefix, mixed steps -- on explicitly chosen KV slots, without an allocator or a
scheduler (the KV contents do not change a step's time). Torch-free.
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence

from runtime.core.batch import ForwardMode, ScheduledItem, StepPlan
from runtime.core.request import Request, RequestStatus, SamplingParams

# the workloads' default: ignore_eos, temperature 1 (sampled, not greedy)
PROFILE_SAMPLING = SamplingParams(max_new_tokens=1 << 30, ignore_eos=True)


class SyntheticTokens(Sequence):
    """Token ids of one synthetic request, computed on demand (a 64k-token prompt costs no list).
    Tokens differ across requests and positions, so MoE routing spreads as it does on real text."""

    def __init__(self, seed: int, length: int, vocab_size: int) -> None:
        self.seed, self.length, self.vocab_size = seed, length, vocab_size

    def __len__(self) -> int:
        return self.length

    def _token(self, i: int) -> int:
        return (self.seed * 7919 + i * 104729 + (i * i) % 977 + 13) % self.vocab_size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._token(i) for i in range(*index.indices(self.length))]
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self._token(index)


def synthetic_request(rid: str, seed: int, num_tokens: int, first_slot: int, vocab_size: int) -> Request:
    """A request whose first `num_tokens` tokens own KV slots first_slot..first_slot + num_tokens - 1."""
    req = Request(rid, SyntheticTokens(seed, num_tokens, vocab_size), PROFILE_SAMPLING, 0.0)   # type: ignore[arg-type]
    req.kv_slots = range(first_slot, first_slot + num_tokens)                                  # type: ignore[assignment]
    req.status = RequestStatus.DECODING
    return req


class SyntheticBatch:
    """`num_reqs` requests of up to `max_tokens` tokens each, on disjoint slot ranges from `first_slot`.
    The same requests serve every context length of a batch size: the runner's slot table only gains
    the new columns. `release()` marks them finished (the runner frees their table rows)."""

    def __init__(self, tag: str, num_reqs: int, max_tokens: int, first_slot: int, vocab_size: int) -> None:
        self.requests = [synthetic_request(f"{tag}-{b}", zlib.crc32(f"{tag}-{b}".encode()) % 100003, max_tokens,
                                           first_slot + b * max_tokens, vocab_size) for b in range(num_reqs)]
        self.max_tokens = max_tokens

    def decode_items(self, context_tokens: int) -> list[ScheduledItem]:
        """One decode token per request at position context_tokens - 1 (attending context_tokens)."""
        if not 2 <= context_tokens <= self.max_tokens:
            raise ValueError(f"context {context_tokens} outside [2, {self.max_tokens}]")
        return decode_items(self.requests, context_tokens)

    def extend_items(self, new_tokens: int, prefix_tokens: int) -> list[ScheduledItem]:
        """A prefill of new_tokens per request after prefix_tokens of cached KV."""
        end = prefix_tokens + new_tokens
        if end > self.max_tokens or new_tokens < 1:
            raise ValueError(f"prefix {prefix_tokens} + {new_tokens} new tokens outside [1, {self.max_tokens}]")
        return [extend_item(r, prefix_tokens, new_tokens) for r in self.requests]

    def release(self) -> None:
        finish(self.requests)


def decode_items(requests: list[Request], context_tokens: int) -> list[ScheduledItem]:
    """One decode token per request at position context_tokens - 1 (attending its first context_tokens slots)."""
    return [decode_item(r, context_tokens - 1) for r in requests]


def extend_item(req: Request, prefix_tokens: int, new_tokens: int) -> ScheduledItem:
    """A prefill chunk of `req` whose new tokens write its slots [prefix_tokens, + new_tokens), handed over as
    the scheduler's KVManager.allocate hands them (an int32 array): a tensor-parallel leader broadcasts them to
    its peers every step, and a list of numpy scalars made that hand-off cost 3 us a token on the H200s
    (experiments/results/h200x2/tp_launch_probe)."""
    end = prefix_tokens + new_tokens
    return ScheduledItem(req, prefix_tokens, new_tokens, req.kv_slots[prefix_tokens:end].copy(), is_decode=False,
                         samples=True)


def decode_item(req: Request, pos: int) -> ScheduledItem:
    """One decode token of `req` at position `pos`, its slot a Python int (KVManager.allocate_decode's)."""
    return ScheduledItem(req, pos, 1, [int(req.kv_slots[pos])], is_decode=True, samples=True)


def finish(requests) -> None:
    """Mark synthetic requests finished: the runner frees their slot-table rows."""
    for r in requests:
        r.status = RequestStatus.FINISHED


class SharedPrefixBatch:
    """`num_reqs` decoding requests in groups of `group_size` that read one shared prefix each (the
    group's first `shared_tokens` KV slots, as radix-cache hits give them) and then `private_tokens`
    slots of their own. `interleaved` orders the batch round-robin over groups instead of group after
    group. Slots: the groups' prefixes from `first_slot` on, then every request's private range."""

    def __init__(self, tag: str, num_reqs: int, group_size: int, shared_tokens: int, private_tokens: int,
                 first_slot: int, vocab_size: int, interleaved: bool = False) -> None:
        if group_size < 1 or num_reqs % group_size or private_tokens < 1:
            raise ValueError(f"{num_reqs} requests do not split into groups of {group_size} "
                             f"(or no private token: {private_tokens})")
        num_groups = num_reqs // group_size
        private_base = first_slot + num_groups * shared_tokens
        order = ([(b % num_groups) * group_size + b // num_groups for b in range(num_reqs)] if interleaved
                 else list(range(num_reqs)))
        self.requests = []
        for b in order:
            group = b // group_size
            req = synthetic_request(f"{tag}-{b}", zlib.crc32(f"{tag}-{b}".encode()) % 100003,
                                    shared_tokens + private_tokens, 0, vocab_size)
            shared = range(first_slot + group * shared_tokens, first_slot + (group + 1) * shared_tokens)
            private = range(private_base + b * private_tokens, private_base + (b + 1) * private_tokens)
            req.kv_slots = list(shared) + list(private)
            self.requests.append(req)
        self.context_tokens = shared_tokens + private_tokens
        self.unique_tokens = num_groups * shared_tokens + num_reqs * private_tokens

    def decode_items(self) -> list[ScheduledItem]:
        """One decode token per request at its last position (attending all its shared + private tokens)."""
        return [decode_item(r, self.context_tokens - 1) for r in self.requests]

    def release(self) -> None:
        finish(self.requests)


def step_plan(items: list[ScheduledItem]) -> StepPlan:
    decodes = sum(it.is_decode for it in items)
    mode = ForwardMode.DECODE if decodes == len(items) else ForwardMode.MIXED if decodes else ForwardMode.EXTEND
    return StepPlan(0, mode, items)
