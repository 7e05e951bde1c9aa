"""ForwardBatch layout: CSR offsets, positions, write slots and logits rows, from lists and from a StepPlan."""
from __future__ import annotations

import pytest
import torch

from runtime.core.batch import ForwardMode, ScheduledItem, StepPlan
from runtime.core.request import Request, SamplingParams
from runtime.engine.forward_batch import ForwardBatch


def test_build_mixed_batch_fields() -> None:
    # an extend after a 2-token prefix, then a decode after a 3-token prefix
    fb = ForwardBatch.build([([11, 12, 13], 2, [9, 4, 7, 1, 8]), ([21], 3, [5, 0, 6, 2])], "cpu")
    assert fb.input_ids.tolist() == [11, 12, 13, 21]
    assert fb.positions.tolist() == [2, 3, 4, 3]
    assert fb.out_cache_loc.tolist() == [7, 1, 8, 2]
    assert fb.seq_lens.tolist() == [5, 4] and fb.prefix_lens.tolist() == [2, 3]
    assert fb.extend_lens.tolist() == [3, 1]
    assert fb.qo_indptr.tolist() == [0, 3, 4] and fb.kv_indptr.tolist() == [0, 5, 9]
    assert fb.kv_indices.tolist() == [9, 4, 7, 1, 8, 5, 0, 6, 2]
    assert fb.logits_indices.tolist() == [2, 3]
    assert fb.is_decode.tolist() == [False, True] and not fb.all_decode
    assert fb.batch_size == 2 and fb.num_tokens == 4


def test_build_rejects_slot_count_mismatch() -> None:
    with pytest.raises(ValueError):
        ForwardBatch.build([([1, 2], 1, [0, 1])], "cpu")


def test_from_plan_reads_request_tokens_and_slots() -> None:
    req = Request(rid="a", input_ids=[5, 6, 7, 8], sampling=SamplingParams(max_new_tokens=4), arrival_s=0.0)
    req.output_ids = [9]
    req.num_computed_tokens, req.kv_slots = 4, [30, 10, 20, 40]
    decode = ScheduledItem(req, num_prefix_tokens=4, num_new_tokens=1, new_slots=[3], is_decode=True, samples=True)
    other = Request(rid="b", input_ids=[1, 2, 3], sampling=SamplingParams(), arrival_s=0.0)
    other.kv_slots = [7]
    chunk = ScheduledItem(other, num_prefix_tokens=1, num_new_tokens=2, new_slots=[8, 9], is_decode=False,
                          samples=True)
    fb = ForwardBatch.from_plan(StepPlan(step_id=0, mode=ForwardMode.MIXED, items=[decode, chunk]), "cpu")
    assert fb.input_ids.tolist() == [9, 2, 3]
    assert fb.positions.tolist() == [4, 1, 2]
    assert fb.kv_indices.tolist() == [30, 10, 20, 40, 3, 7, 8, 9]
    assert fb.out_cache_loc.tolist() == [3, 8, 9]
    assert fb.is_decode.tolist() == [True, False]
    assert fb.input_ids.dtype == torch.long
