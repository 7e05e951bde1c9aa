"""Fill the runner's KV pool as serving would before profiling it: prefills of synthetic prompts write
every slot, so timed steps attend KV the model wrote (attention outputs, hence the hidden states and the
MoE routing of later layers, are those of real contexts, not of an all-zero pool). Imports torch
(through the runner).
"""
from __future__ import annotations

from tqdm import tqdm

from runtime.profile.plans import SyntheticBatch, step_plan

KV_FILLS = ("model", "zeros")


def fill_kv_pool(runner, num_slots: int, max_step_tokens: int, max_context_tokens: int, vocab_size: int,
                 progress: bool = True) -> int:
    """Prefill slots [0, num_slots) in steps of one synthetic request each (no prefix), as long as a step
    may be (`max_step_tokens`) and a prompt may be (`max_context_tokens` less the token it would sample);
    returns the slots written."""
    chunk_tokens = max(1, min(max_step_tokens, max_context_tokens - 1))
    starts = range(0, num_slots, chunk_tokens)
    for start in tqdm(starts, desc="fill KV pool", unit="step", disable=not progress):
        tokens = min(chunk_tokens, num_slots - start)
        if tokens < 1:
            break
        synthetic = SyntheticBatch(f"fill{start}", 1, tokens, start, vocab_size)
        runner.launch(step_plan(synthetic.extend_items(tokens, 0))).wait()
        synthetic.release()
    return num_slots
