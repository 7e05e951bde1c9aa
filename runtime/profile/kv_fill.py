"""Fill the runner's KV pool as serving would before profiling it: prefills of synthetic prompts write
every slot, so timed steps attend KV the model wrote (attention outputs, hence the hidden states and the
MoE routing of later layers, are those of real contexts, not of an all-zero pool). Decode requests that are
the fill's own sequences attend the KV their own tokens wrote, which sets how many experts a small batch
picks (experiments/decode_routing_probe.py). Imports torch (through the runner).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from tqdm import tqdm

from runtime.core.request import Request
from runtime.profile.plans import SyntheticBatch, extend_item, finish, step_plan, synthetic_request

KV_FILLS = ("model", "zeros")


@dataclass
class FilledPool:
    """What the fill wrote: `num_slots` slots, the first `len(seeds) * sequence_tokens` of them as whole
    sequences (sequence k: the synthetic request of seed seeds[k] on slots [k * L, (k + 1) * L), L =
    sequence_tokens, its KV written by its own prefill, chunk after chunk over its own prefix)."""

    num_slots: int
    sequence_tokens: int = 0
    seeds: list[int] = field(default_factory=list)

    def requests(self, tag: str, num_reqs: int, context_tokens: int, vocab_size: int) -> list[Request] | None:
        """The first `num_reqs` sequences as new requests (rids `tag-i`) whose KV up to `context_tokens` is
        their own, or None where the pool holds fewer sequences or shorter ones."""
        if num_reqs > len(self.seeds) or context_tokens > self.sequence_tokens:
            return None
        n = self.sequence_tokens
        return [synthetic_request(f"{tag}-{i}", self.seeds[i], n, i * n, vocab_size) for i in range(num_reqs)]


def sequence_layout(num_slots: int, max_context_tokens: int, sequence_tokens: int) -> tuple[int, int]:
    """(length, count) of the whole sequences fill_kv_pool writes for `sequence_tokens`."""
    length = min(sequence_tokens, max_context_tokens - 1, num_slots)
    return (length, num_slots // length) if length >= 2 else (0, 0)


def fill_kv_pool(runner, num_slots: int, max_step_tokens: int, max_context_tokens: int, vocab_size: int,
                 progress: bool = True, sequence_tokens: int = 0) -> FilledPool:
    """Prefill slots [0, num_slots): first as many whole sequences of `sequence_tokens` as fit (each
    prefilled in chunks over its own cached prefix, so a later decode of it attends the KV its own tokens
    wrote at their own positions, as a served request does), then the rest in steps of one synthetic
    request each (no prefix). A step is as long as a step may be (`max_step_tokens`) and a prompt as long as
    one may be (`max_context_tokens` less the token it would sample)."""
    chunk_tokens = max(1, min(max_step_tokens, max_context_tokens - 1))
    length, num_sequences = sequence_layout(num_slots, max_context_tokens, sequence_tokens)
    pool = FilledPool(num_slots, length)
    steps = num_sequences * -(-length // chunk_tokens) + -(-(num_slots - num_sequences * length) // chunk_tokens)
    bar = tqdm(total=steps, desc="fill KV pool", unit="step", disable=not progress)
    for k in range(num_sequences):
        seed = zlib.crc32(f"fill-sequence-{k}".encode()) % 100003
        req = synthetic_request(f"fill-sequence-{k}", seed, length, k * length, vocab_size)
        for prefix in range(0, length, chunk_tokens):
            new = min(chunk_tokens, length - prefix)
            runner.launch(step_plan([extend_item(req, prefix, new)])).wait()
            bar.update()
        finish([req])
        pool.seeds.append(seed)
    for start in range(num_sequences * length, num_slots, chunk_tokens):
        tokens = min(chunk_tokens, num_slots - start)
        synthetic = SyntheticBatch(f"fill{start}", 1, tokens, start, vocab_size)
        runner.launch(step_plan(synthetic.extend_items(tokens, 0))).wait()
        synthetic.release()
        bar.update()
    bar.close()
    return pool
