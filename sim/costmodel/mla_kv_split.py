"""How FlashInfer's MLA attention splits a decode step's KV work over the GPU (its host-side plan), as a
makespan in KV tokens: the longest any one SM works. Equal contexts of the same sum can split worse or
better than a step's real ones, and the split follows the batch in steps (DeepSeek-V2-Lite on an H200 at
16k contexts: batch 48 has every SM work 10,240 tokens, 64 8,192, 72 16,384; measured 17.9, 17.1 and
23.3 ms): with `costmodel.decode_kv_split=flashinfer_mla` the profiled model prices a decode step's
attention by the makespan of its own contexts.
Torch-free (numpy, pandas, heapq).

The plan (FlashInfer's MLAPlan, one query token per request, few heads: one CTA per SM): a chunk limit
of ceil(total / SMs) KV tokens rounded up (to 32, 64, 128, 192, or a multiple of 256); each request's KV,
in batch order, cut into chunks of at most that limit, each chunk to the SM with the least work so far.
"""
from __future__ import annotations

import heapq

import numpy as np
import pandas as pd


def chunk_limit(total_tokens: int, num_sms: int) -> int:
    """The plan's largest chunk (KV tokens) for a step attending `total_tokens` over `num_sms` SMs."""
    per_sm = max(-(-total_tokens // num_sms), 1)
    for bound, limit in ((8, 32), (16, 64), (32, 128), (64, 192)):
        if per_sm <= bound:
            return limit
    return -(-per_sm // 256) * 256


def makespan_tokens(kv_lens: np.ndarray, num_sms: int) -> int:
    """KV tokens the busiest SM attends in the plan of a decode step whose requests attend `kv_lens`
    (int64 [B], each >= 1, in batch order). While the chunks are no more than the SMs each SM takes at
    most one and the makespan is the largest chunk; else the first `num_sms` chunks seed the SMs and
    each later one goes to the least-loaded (the lower index on a tie)."""
    limit = chunk_limit(int(kv_lens.sum()), num_sms)
    chunks = -(-kv_lens // limit)                                       # [B]
    num_chunks = int(chunks.sum())
    if num_chunks <= num_sms:
        return int(min(limit, int(kv_lens.max())))
    last = kv_lens - (chunks - 1) * limit                               # [B] each request's last chunk
    sizes = np.full(num_chunks, limit, dtype=np.int64)
    sizes[np.cumsum(chunks) - 1] = last                                 # [chunks] in plan order
    seeds = sizes[:num_sms]
    heap = list(zip(seeds.tolist(), range(num_sms)))
    heapq.heapify(heap)
    busiest = int(seeds.max())
    for size in sizes[num_sms:].tolist():
        load, sm = heap[0]
        load += size
        heapq.heapreplace(heap, (load, sm))
        if load > busiest:
            busiest = load
    return busiest


def equal_split(total_tokens: int, num_rows: int) -> np.ndarray:
    """`num_rows` KV lengths as equal as integers allow with the given sum (a profiled point's contexts)."""
    base, extra = divmod(total_tokens, num_rows)
    out = np.full(num_rows, base, dtype=np.int64)
    out[:extra] += 1
    return out


def num_clusters(num_sms: int, heads_per_rank: int) -> int:
    """The plan's units of work: one CTA per SM, or two per cluster where a request's query rows (one
    token times the rank's heads) exceed a CTA's 64-row tile."""
    return num_sms // (2 if heads_per_rank > 64 else 1)


class KVSplitExcess:
    """Decode attention's time beyond that of equal contexts: `seconds_per_token` times the makespan of a
    step's own KV lengths less that of equal lengths of the same sum over the same (padded) rows. The rate
    is fitted to the profile's decode steps (equal contexts): within each batch size, the step time against
    its makespan, least squares over the batch sizes with points at several makespans (DeepSeek-V2-Lite on
    an H200: 0.87 us a token; the steps' time then departs from the fit by 3% rms). Every step replays the
    plan (the makespan is a step function of the lengths: a few tokens more can move a chunk boundary)."""

    def __init__(self, clusters: int, seconds_per_token: float) -> None:
        self.clusters, self.seconds_per_token = clusters, seconds_per_token

    @classmethod
    def fit(cls, rows: pd.DataFrame, clusters: int) -> "KVSplitExcess | None":
        """From decode.csv rows (batch_size, context_tokens, device_s); None without a positive rate."""
        if rows.empty:
            return None
        spans = np.array([makespan_tokens(np.full(int(b), int(c), dtype=np.int64), clusters)
                          for b, c in zip(rows["batch_size"], rows["context_tokens"])], dtype=np.float64)
        frame = pd.DataFrame({"batch": rows["batch_size"].to_numpy(), "span": spans,
                              "time": rows["device_s"].to_numpy(dtype=np.float64)})
        x = frame["span"] - frame.groupby("batch")["span"].transform("mean")
        y = frame["time"] - frame.groupby("batch")["time"].transform("mean")
        denominator = float((x * x).sum())
        rate = float((x * y).sum()) / denominator if denominator > 0 else 0.0
        return cls(clusters, rate) if rate > 0 else None

    def excess_s(self, first_lens: np.ndarray, rows: int, num_steps: int) -> np.ndarray:
        """Seconds [num_steps] of consecutive decode steps of requests attending first_lens [B] at step 0
        (one more token each step), run over `rows` >= B rows (the padded batch: padding rows attend one
        token each), beyond the price of equal contexts of the same sum over those rows."""
        lens = np.ones(rows, dtype=np.int64)
        lens[:first_lens.size] = first_lens
        real = np.zeros(rows, dtype=np.int64)
        real[:first_lens.size] = 1
        return np.array([self._excess(lens + j * real, rows) for j in range(num_steps)])

    def _excess(self, lens: np.ndarray, rows: int) -> float:
        spread = makespan_tokens(lens, self.clusters)
        equal = makespan_tokens(equal_split(int(lens.sum()), rows), self.clusters)
        return self.seconds_per_token * (spread - equal)
