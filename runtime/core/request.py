"""Request lifecycle and sampling parameters, shared by the simulator and the real runtime.

Must not import torch, simpy or time: every timestamp is passed in by a driver.
"""
from __future__ import annotations

import enum
import functools
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

SLOT_DTYPE = np.int32        # the allocator's KV slot indices
_NO_SLOTS = np.empty(0, dtype=SLOT_DTYPE)
_NO_SLOTS.flags.writeable = False


@dataclass(frozen=True)
class SamplingParams:
    """What to generate. The sampler fields are carried for the real runtime; the core reads
    only `max_new_tokens`, `ignore_eos` and `stop_token_ids` to decide when a request ends."""

    max_new_tokens: int = 128
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    frequency_penalty: float = 0.0    # SGLang's penalties (runtime/engine/penalties.py)
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0           # stop tokens are not sampled (and do not end it) before this many
    logprob_start_len: int = -1       # >= 0: prompt log-probabilities from there; the prefix match stops there
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias) added to its logit (OpenAI's logit_bias)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if any(not -100 <= bias <= 100 for _, bias in self.logit_bias):
            raise ValueError(f"logit_bias values must be in [-100, 100], got {dict(self.logit_bias)}")
        if self.logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be >= -1, got {self.logprob_start_len}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                             f"got {self.min_new_tokens}")


@dataclass(frozen=True)
class RequestSpec:
    """A request as a workload yields it: what arrives, when, and how much it should generate.

    `input_ids`: a tuple or an int32 `array.array` (4 bytes a token, sliced and compared at
    memcpy speed), never mutated: requests share it. `expected_output_ids` (optional) are the
    tokens a trace says were generated; the simulator emits them so multi-turn traces hit the
    cache the way reality would.
    """

    rid: str
    arrival_s: float
    input_ids: Sequence[int]
    output_len: int
    priority: int = 0
    expected_output_ids: tuple[int, ...] | None = None
    sampling: SamplingParams | None = None  # None: ignore_eos, max_new_tokens = output_len

    def sampling_params(self) -> SamplingParams:
        if self.sampling is not None:
            return self.sampling
        return _default_sampling(self.output_len)


@functools.lru_cache(maxsize=4096)
def _default_sampling(output_len: int) -> SamplingParams:
    """A spec's sampling without its own: ignore_eos, max_new_tokens = output_len (frozen, so shared)."""
    return SamplingParams(max_new_tokens=output_len, ignore_eos=True)


class RequestStatus(enum.Enum):
    WAITING = "waiting"      # queued, owns no KV (a retracted request comes back here)
    PREFILL = "prefill"      # admitted; some input tokens still to be computed (chunked)
    DECODING = "decoding"    # all input computed, generating one token per step
    FINISHED = "finished"
    ABORTED = "aborted"


class FinishReason(str, enum.Enum):
    LENGTH = "length"            # max_new_tokens reached
    STOP = "stop"                # a stop / eos token was sampled
    ABORT = "abort"              # aborted by the user
    TOO_LONG = "too_long"        # the input cannot fit the context or the KV pool


@dataclass(eq=False)
class Request:
    """One request's mutable state. Token bookkeeping:

    - `input_ids`: the prompt (a tuple, an int32 `array.array` or a list), never mutated: the
      spec's own is shared;
    - `fill_ids` = input_ids + output_ids: every token the request knows;
    - `num_computed_tokens`: how many of them have KV written (the prefix matched in the
      radix cache counts as computed); always <= len(fill_ids);
    - `kv_slots[i]` is the KV slot index of token i, for i < num_computed_tokens: an int32 view
      of a growable buffer (`num_kv_slots` long), written through `kv_slots = ...`,
      `append_kv_slots` and slice assignment (`kv_slots[a:b] = ...` writes the buffer).
    """

    rid: str
    input_ids: Sequence[int]
    sampling: SamplingParams
    arrival_s: float
    priority: int = 0
    expected_output_ids: tuple[int, ...] | None = None

    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_kv_slots: int = 0
    _slot_buf: np.ndarray = field(default_factory=lambda: _NO_SLOTS, repr=False)   # [capacity] int32, kv_slots its head
    num_locked_prefix_tokens: int = 0   # tokens of kv_slots owned by the radix cache (locked)
    kv_version: int = 0                 # bumped whenever kv_slots is rewritten rather than appended to
    cache_node: Any = None              # the radix node locked for this request, or None
    num_cached_tokens: int = 0          # radix-cache hit tokens at the first admission
    num_retractions: int = 0
    finish_reason: FinishReason | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    admitted_s: float | None = None
    # (KV manager, its last prefix match of this prompt-only request): the next match goes on from there
    _last_match: tuple[Any, Any] | None = field(default=None, repr=False)

    @classmethod
    def from_spec(cls, spec: RequestSpec) -> "Request":
        """The request of `spec`, sharing its prompt (no copy: `input_ids` is never mutated)."""
        return cls(
            rid=spec.rid,
            input_ids=spec.input_ids,
            sampling=spec.sampling_params(),
            arrival_s=spec.arrival_s,
            priority=spec.priority,
            expected_output_ids=spec.expected_output_ids,
        )

    # -- KV slots ------------------------------------------------------------------
    @property
    def kv_slots(self) -> np.ndarray:
        return self._slot_buf[:self.num_kv_slots]

    @kv_slots.setter
    def kv_slots(self, slots: Sequence[int]) -> None:
        """Replace every slot (copied into a buffer of the request's own)."""
        slots = np.asarray(slots, dtype=SLOT_DTYPE)

        def write(out: np.ndarray) -> None:
            out[:slots.size] = slots
        self.set_kv_slots_from(slots.size, write)

    def set_kv_slots_from(self, num_slots: int, write: Callable[[np.ndarray], None]) -> None:
        """Replace every slot by `num_slots` slots that `write(out)` puts into out[:num_slots], a buffer of
        the request's own with room for its expected slots (no array in between)."""
        if num_slots == 0:
            self._slot_buf, self.num_kv_slots = _NO_SLOTS, 0
            return
        buf = np.empty(max(num_slots, self._expected_slots()), dtype=SLOT_DTYPE)
        write(buf)
        self._slot_buf, self.num_kv_slots = buf, num_slots

    def append_kv_slots(self, slots: Sequence[int]) -> None:
        """kv_slots += slots (amortised: the buffer doubles when full)."""
        n = self.num_kv_slots
        end = n + len(slots)
        if end > self._slot_buf.size:
            self._grow_slots(end)
        self._slot_buf[n:end] = slots
        self.num_kv_slots = end

    def hold_placeholder_slots(self, num_slots: int, placeholders: np.ndarray) -> None:
        """Replace every slot by the first `num_slots` of `placeholders` (a counting allocator's
        read-only `placeholder_slots`, whose values mean nothing): `kv_slots` is then a view of it, and
        `count_kv_slots` grows it without writing (no buffer of the request's own, no copies)."""
        if num_slots > placeholders.size:
            raise ValueError(f"{num_slots} slots past the {placeholders.size} placeholders")
        self._slot_buf, self.num_kv_slots = placeholders, num_slots

    def count_kv_slots(self, num_slots: int) -> None:
        """kv_slots += `num_slots` placeholder slots (after `hold_placeholder_slots`)."""
        end = self.num_kv_slots + num_slots
        if end > self._slot_buf.size:
            raise ValueError(f"{end} slots past the {self._slot_buf.size} placeholders")
        self.num_kv_slots = end

    def _expected_slots(self) -> int:
        """A first buffer size that usually holds the whole request (outputs counted up to 2048)."""
        return len(self.input_ids) + min(self.sampling.max_new_tokens, 2048) + 1

    def _grow_slots(self, min_capacity: int) -> None:
        buf = np.empty(max(min_capacity, 2 * self._slot_buf.size, self._expected_slots()), dtype=SLOT_DTYPE)
        buf[:self.num_kv_slots] = self._slot_buf[:self.num_kv_slots]
        self._slot_buf = buf

    # -- derived sizes -------------------------------------------------------------
    @property
    def num_input_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def fill_ids(self) -> list[int]:
        return [*self.input_ids, *self.output_ids]

    def tokens(self) -> Sequence[int]:
        """Every token the request knows, of the prompt's type (tuple, int32 array or list), without a copy
        while it has no output yet (callers must not mutate it; `fill_ids` is a list copy)."""
        ids, outputs = self.input_ids, self.output_ids
        if not outputs:
            return ids
        if type(ids) is tuple:
            return ids + tuple(outputs)
        if type(ids) is array:
            return ids + array(ids.typecode, outputs)
        return [*ids, *outputs]

    @property
    def num_fill_tokens(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def num_uncomputed_input_tokens(self) -> int:
        return max(0, len(self.input_ids) - self.num_computed_tokens)

    @property
    def max_new_tokens_left(self) -> int:
        return self.sampling.max_new_tokens - len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)

    def finishes_with(self, token_id: int, num_outputs: int | None = None) -> FinishReason | None:
        """The reason this request ends with `token_id` as its `num_outputs`-th output token
        (default: the last one appended), or None."""
        if num_outputs is None:
            num_outputs = len(self.output_ids)
        if num_outputs >= self.sampling.max_new_tokens:
            return FinishReason.LENGTH
        if (not self.sampling.ignore_eos and token_id in self.sampling.stop_token_ids
                and num_outputs >= self.sampling.min_new_tokens):
            return FinishReason.STOP
        return None
