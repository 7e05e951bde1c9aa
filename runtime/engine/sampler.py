"""Token sampler of the real runtime: greedy, temperature, top-k, top-p, min-p, per-request seeds,
and, for the rows that ask, log-probabilities of the sampled token and the top-k tokens.

Batched on the logits' device, per-row parameters as tensors, no host sync. Stop conditions
are the core's (Request.finishes_with): this module only samples.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.core.request import SamplingParams
from runtime.engine.logprob_params import TokenLogprobs

if TYPE_CHECKING:
    from runtime.engine.prompt_logprobs import PromptValues

# Legend: B = sequences in the batch, V = vocab size, S = seeded sampled rows,
# R = rows asking for log-probabilities, K = the largest top count among them.

_MASK32 = 0xFFFF_FFFF
_MASK64 = 0xFFFF_FFFF_FFFF_FFFF
_GOLDEN32 = 0x9E37_79B9          # odd: token -> token * golden is a bijection mod 2**32
_TOP_P_OFF = 2.0                 # > 1 so cumsum rounding never trims a top_p == 1 row


def is_greedy(params: SamplingParams) -> bool:
    """Temperature 0 and top_k == 1 both mean argmax of the raw logits."""
    return params.temperature == 0 or params.top_k == 1


class Sampler:
    """Samples one token per row from logits [B, V].

    Filters follow SGLang's torch path: temperature, then softmax, then top-k and top-p on the
    sorted probabilities (top-p mass counted before top-k is renormalised), then min-p
    relative to the row's largest probability.

    Randomness. Unseeded rows draw from this sampler's own torch.Generator (`seed`), so a
    run is reproducible as a whole. A row with `SamplingParams.seed` set uses counter-based
    noise instead: a hash of (seed, output position, token id) gives the uniform of each
    token. It holds no state, so the row's tokens depend only on its own logits, seed and
    position: not on batch composition, on other requests, on retractions, or on the device
    (the hash is exact integer arithmetic). `output_positions[i]` is the index of the output
    token being sampled for row i, i.e. `len(request.output_ids)`.
    """

    def __init__(self, device: str | torch.device = "cpu", seed: int = 0) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def sample(
        self,
        logits: torch.Tensor,                      # [B, V]
        params: Sequence[SamplingParams],
        output_positions: Sequence[int] | None = None,
    ) -> torch.Tensor:                             # [B] long
        num_rows, vocab_size = logits.shape
        if len(params) != num_rows:
            raise ValueError(f"{len(params)} SamplingParams for {num_rows} rows of logits")
        greedy_rows = [is_greedy(p) for p in params]
        greedy_ids = logits.argmax(dim=-1)                                  # [B]
        if all(greedy_rows):
            return greedy_ids
        probs = self._filtered_probs(logits, params, greedy_rows)          # [B, V]
        noise = self._exponential_noise(params, greedy_rows, output_positions, vocab_size)
        # Exponential race: argmax_v p_v / E_v with E_v ~ Exp(1) iid is distributed as
        # Categorical(p / sum p): no normalisation and, unlike torch.multinomial, no host sync.
        sampled_ids = (probs / noise).argmax(dim=-1)                        # [B]
        return torch.where(self._to_device(greedy_rows, torch.bool), greedy_ids, sampled_ids)

    def logprobs(
        self,
        logits: torch.Tensor,                      # [B, V]
        params: Sequence[SamplingParams],
        token_ids: torch.Tensor,                   # [B] long, what `sample` returned
        top_nums: Sequence[int | None],            # per row: None (not asked) or its top count
    ) -> SampledLogprobs | None:
        """Log-probabilities for the rows that ask (None when none does), enqueued without a host
        sync; the other rows cost nothing. The distribution is the one SGLang reports by default
        (Sampler.forward in python/sglang/srt/layers/sampler.py, SGLANG_RETURN_ORIGINAL_LOGPROB
        unset): log_softmax(logits / temperature), temperature 0 (greedy) counting as 1, before
        top-k, top-p and min-p."""
        rows = [i for i, k in enumerate(top_nums) if k is not None]
        if not rows:
            return None
        if len(rows) < logits.shape[0]:
            index = self._to_device(rows, torch.long)
            logits, token_ids = logits.index_select(0, index), token_ids.index_select(0, index)
        scaled = logits.float()                                             # [R, V]
        temperatures = [params[i].temperature if params[i].temperature > 0 else 1.0 for i in rows]
        if any(t != 1.0 for t in temperatures):
            scaled = scaled / self._to_device(temperatures, torch.float32)[:, None]
        # finite where a logit is -inf, so that every value stays valid JSON (SGLang clamps too)
        logprobs = torch.log_softmax(scaled, dim=-1).clamp_min_(torch.finfo(torch.float32).min)  # [R, V]
        nums = [top_nums[i] for i in rows]
        top_values, top_ids = logprobs.topk(max(nums), dim=-1)              # [R, K], descending
        chosen = logprobs.gather(1, token_ids[:, None]).squeeze(1)          # [R]
        return SampledLogprobs(rows, nums, chosen, top_values, top_ids)

    # -- filters ---------------------------------------------------------------------
    def _filtered_probs(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], greedy_rows: list[bool]
    ) -> torch.Tensor:                             # [B, V], zeros outside the kept set
        temperatures = [1.0 if g else p.temperature for p, g in zip(params, greedy_rows)]
        scaled = logits.float() / self._to_device(temperatures, torch.float32)[:, None]
        probs = torch.softmax(scaled, dim=-1)                               # [B, V]
        sampled = [p for p, g in zip(params, greedy_rows) if not g]
        if any(p.top_k != -1 or p.top_p < 1 for p in sampled):
            vocab_size = logits.shape[1]
            top_ks = [vocab_size if p.top_k == -1 else p.top_k for p in params]
            top_ps = [_TOP_P_OFF if p.top_p == 1 else p.top_p for p in params]
            probs = _apply_top_k_top_p(
                probs, self._to_device(top_ks, torch.long), self._to_device(top_ps, torch.float32)
            )
        if any(p.min_p > 0 for p in sampled):
            probs = _apply_min_p(probs, self._to_device([p.min_p for p in params], torch.float32))
        return probs

    # -- noise -----------------------------------------------------------------------
    def _exponential_noise(
        self,
        params: Sequence[SamplingParams],
        greedy_rows: list[bool],
        output_positions: Sequence[int] | None,
        vocab_size: int,
    ) -> torch.Tensor:                             # [B, V] iid Exp(1), > 0
        noise = torch.empty((len(params), vocab_size), dtype=torch.float32, device=self.device)
        noise.exponential_(generator=self.generator)
        seeded = [i for i, p in enumerate(params) if p.seed is not None and not greedy_rows[i]]
        if seeded:
            if output_positions is None:
                raise ValueError("output_positions is required when a request sets a seed")
            keys = [_row_key(params[i].seed, output_positions[i]) for i in seeded]  # type: ignore[arg-type]
            keys_t = self._to_device(keys, torch.long)                      # [S, 2]
            uniforms = hashed_uniforms(keys_t, vocab_size)                  # [S, V]
            noise.index_copy_(0, self._to_device(seeded, torch.long), -torch.log(uniforms))
        # exponential_ may return exactly 0; 0/0 would be NaN, which argmax would pick.
        return noise.clamp_min_(torch.finfo(torch.float32).tiny)

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """A small host list on the sampler's device; pinned + non_blocking so CUDA does not sync."""
        tensor = torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)


def pinned(t: torch.Tensor) -> torch.Tensor:
    """A copy of a device tensor in pinned host memory, enqueued without waiting."""
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


@dataclass
class SampledLogprobs:
    """One step's log-probabilities of the R rows that asked, on the sampler's device until `to_host`."""

    rows: list[int]                 # each asking row's index among the sampled rows
    top_nums: list[int]             # each asking row's top count (<= K)
    token_logprobs: torch.Tensor    # [R] float32, of the sampled tokens
    top_logprobs: torch.Tensor      # [R, K] float32, descending
    top_ids: torch.Tensor           # [R, K] long
    prompt: dict[int, PromptValues] | None = None   # by sampled row: prompts that finished this step

    def to_host(self) -> SampledLogprobs:
        """Copies in pinned host memory, enqueued without waiting (the caller syncs before `entries`);
        itself when already on the host."""
        if self.token_logprobs.device.type != "cuda":
            return self
        prompt = {row: values.to_host() for row, values in self.prompt.items()} if self.prompt else None
        return dataclasses.replace(self, token_logprobs=pinned(self.token_logprobs),
                                   top_logprobs=pinned(self.top_logprobs), top_ids=pinned(self.top_ids),
                                   prompt=prompt)

    def entries(self, num_rows: int) -> list[TokenLogprobs | None]:
        """Per sampled row: None (not asked) or (logprob of its token, its top (id, logprob) pairs)."""
        chosen, values, ids = self.token_logprobs.tolist(), self.top_logprobs.tolist(), self.top_ids.tolist()
        out: list[TokenLogprobs | None] = [None] * num_rows
        prompt = self.prompt or {}
        for j, (row, k) in enumerate(zip(self.rows, self.top_nums)):
            entry = prompt[row].entry() if row in prompt else None
            out[row] = TokenLogprobs(chosen[j], list(zip(ids[j][:k], values[j][:k])), entry)
        return out


def _apply_top_k_top_p(
    probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor  # [B, V], [B], [B]
) -> torch.Tensor:                                                    # [B, V]
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)         # [B, V]
    ranks = torch.arange(probs.shape[1], device=probs.device)[None, :]     # [1, V]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs              # [B, V]; 0 at rank 0
    drop_sorted = (ranks >= top_ks[:, None]) | (mass_before > top_ps[:, None])
    drop = torch.empty_like(drop_sorted).scatter_(1, sorted_ids, drop_sorted)
    return probs.masked_fill(drop, 0.0)


def _apply_min_p(probs: torch.Tensor, min_ps: torch.Tensor) -> torch.Tensor:  # [B, V], [B]
    max_probs = probs.amax(dim=-1, keepdim=True)                           # [B, 1]
    return probs.masked_fill(probs < min_ps[:, None] * max_probs, 0.0)    # keeps the max


# -- counter-based noise for seeded rows -----------------------------------------------
def _splitmix64(x: int) -> int:
    x = (x + 0x9E37_79B9_7F4A_7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK64
    return x ^ (x >> 31)


def _row_key(seed: int, position: int) -> list[int]:
    """Two 32-bit keys for (seed, position), mixed on the host (Python ints are exact)."""
    key = _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))
    return [key & _MASK32, key >> 32]


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32) without overflowing int64."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser: a bijection with full avalanche."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EB_CA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2_AE35)
    return h ^ (h >> 16)


def hashed_uniforms(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1), [S, V], a pure function of keys [S, 2] (int64 in [0, 2**32)) and
    the token id. Values are kept in [0, 2**32) inside int64, so the result is bit-exact on
    every device. For a fixed key, distinct tokens get distinct 32-bit hashes."""
    tokens = torch.arange(vocab_size, dtype=torch.long, device=keys.device)[None, :]  # [1, V]
    h = (_mul32(tokens, _GOLDEN32) + keys[:, :1]) & _MASK32                # [S, V]
    h = _fmix32(_fmix32(h) ^ keys[:, 1:])                                  # [S, V]
    return ((h >> 8).float() + 0.5) * 2.0**-24                             # 24 bits, exact in fp32
