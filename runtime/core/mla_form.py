"""Which form an MLA step attends in -- SGLang's rule for its FlashInfer / FA3 MLA backends, shared by
the runtime (which runs it) and the simulator's roofline (which prices it). Imports neither torch nor a clock.

MHA form ("MLA prefill as MHA"): kv_b_proj expands each attended token's latent into per-head k_nope and
v, then causal ragged attention with q/k of qk_nope + rope dims and v of v_head_dim. Absorbed form: W_UK /
W_UV fold into q and the output, and attention reads the kv_lora_rank latent (~3x the FLOPs per pair).
"""
from __future__ import annotations

from collections.abc import Sequence

# SGLang: SGL_CHUNKED_PREFIX_CACHE_THRESHOLD (default 8192) -- summed cached-prefix tokens from which an
# extend batch attends its prefix in MHA form too (the "chunked prefix cache" path, on by default for
# the FlashInfer and FA3 MLA backends)
MHA_PREFIX_THRESHOLD_TOKENS = 8192
# SGLang: ForwardBatch.get_max_chunk_capacity() -- up to this many summed KV tokens the prefix is expanded
# in one shot (MHA_ONE_SHOT); beyond it SGLang expands the prefix chunk by chunk (MHA_CHUNKED_KV), which
# twinserve does not implement: such steps attend in absorbed form
MHA_ONE_SHOT_MAX_KV_TOKENS = 128 * 1024


def mla_attends_as_mha(prefix_tokens: Sequence[int], seq_tokens: Sequence[int]) -> bool:
    """True when an extend step (any step that is not decode-only) runs its MLA attention in MHA form.

    prefix_tokens[i] / seq_tokens[i]: item i's cached tokens before the step and its KV length after it
    (SGLang counts every item of the batch, decodes of a mixed batch included). No prefix anywhere: MHA.
    Summed prefix >= MHA_PREFIX_THRESHOLD_TOKENS: MHA over the expanded prefix, when the step's KV fits
    one shot. Otherwise absorbed."""
    sum_prefix = sum(prefix_tokens)
    if sum_prefix == 0:
        return True
    return sum_prefix >= MHA_PREFIX_THRESHOLD_TOKENS and sum(seq_tokens) <= MHA_ONE_SHOT_MAX_KV_TOKENS
