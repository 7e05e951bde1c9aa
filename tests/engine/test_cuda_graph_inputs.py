"""CUDA-graph bucketing and padding, on CPU: which captured size a decode batch replays with, and what the
static buffers hold after a padded fill (padding rows only ever touch the dummy slot)."""
from __future__ import annotations

import pytest

from runtime.core.graph_grids import padded_size
from runtime.engine.cuda_graph_runner import (
    DecodeGraphInputs, capture_batch_sizes, padded_kv_indptr,
)
from runtime.engine.forward_batch import ForwardBatch

DUMMY = 99


def test_capture_sizes_grid() -> None:
    sizes = capture_batch_sizes(256)
    assert sizes[:7] == [1, 2, 4, 8, 12, 16, 24]
    assert sizes[-1] == 256 and all(b - a == 8 for a, b in zip(sizes[6:], sizes[7:]))
    assert capture_batch_sizes(20) == [1, 2, 4, 8, 12, 16, 20]   # the max is always captured
    assert capture_batch_sizes(1) == [1]
    with pytest.raises(ValueError):
        capture_batch_sizes(0)


@pytest.mark.parametrize("batch, bucket", [(1, 1), (3, 4), (5, 8), (9, 12), (13, 16), (17, 24), (24, 24),
                                           (250, 256), (256, 256), (257, None)])
def test_padded_batch_size(batch: int, bucket: int | None) -> None:
    assert padded_size(batch, capture_batch_sizes(256)) == bucket


def test_padded_kv_indptr() -> None:
    assert padded_kv_indptr([5, 2, 7], 5) == [0, 5, 7, 14, 15, 16]
    assert padded_kv_indptr([], 2) == [0, 1, 2]
    with pytest.raises(ValueError):
        padded_kv_indptr([1, 1, 1], 2)


def decode_batch() -> ForwardBatch:
    """3 decode sequences: KV lengths 4, 2, 3 at scattered slots; new tokens at slots 10, 20, 30."""
    seqs = [([11], 3, [0, 1, 2, 10]), ([12], 1, [5, 20]), ([13], 2, [7, 8, 30])]
    return ForwardBatch.build(seqs, "cpu")


def test_fill_pads_with_the_dummy_slot() -> None:
    inputs = DecodeGraphInputs(max_bs=8, max_kv_tokens=64, dummy_slot=DUMMY, device="cpu")
    inputs.input_ids.fill_(-1)                        # stale content from an earlier, bigger step
    inputs.kv_indices.fill_(-1)
    fb = decode_batch()
    kv_indptr = inputs.fill(fb, 4)
    assert kv_indptr == [0, 4, 6, 9, 10]
    assert inputs.input_ids[:4].tolist() == [11, 12, 13, 0]
    assert inputs.positions[:4].tolist() == [3, 1, 2, 0]
    assert inputs.out_cache_loc[:4].tolist() == [10, 20, 30, DUMMY]
    assert inputs.seq_lens[:4].tolist() == [4, 2, 3, 1]
    assert inputs.kv_indptr[:5].tolist() == kv_indptr
    assert inputs.kv_indices[:10].tolist() == [0, 1, 2, 10, 5, 20, 7, 8, 30, DUMMY]
    view = inputs.forward_batch(4)
    assert view.batch_size == 4 and view.all_decode
    assert view.input_ids.data_ptr() == inputs.input_ids.data_ptr()      # views, not copies
    assert view.logits_indices.tolist() == [0, 1, 2, 3]


def test_padding_rows_write_and_read_only_the_dummy_slot() -> None:
    inputs = DecodeGraphInputs(max_bs=16, max_kv_tokens=64, dummy_slot=DUMMY, device="cpu")
    fb = decode_batch()
    real_slots = set(fb.kv_indices.tolist())
    kv_indptr = inputs.fill(fb, 12)
    pad_writes = inputs.out_cache_loc[3:12].tolist()
    pad_reads = inputs.kv_indices[kv_indptr[3]:kv_indptr[12]].tolist()
    assert set(pad_writes) == set(pad_reads) == {DUMMY} and DUMMY not in real_slots


def test_fits_counts_padding_tokens() -> None:
    inputs = DecodeGraphInputs(max_bs=8, max_kv_tokens=10, dummy_slot=DUMMY, device="cpu")
    fb = decode_batch()                               # 9 KV tokens
    assert inputs.fits(fb, 4) and not inputs.fits(fb, 8)


def test_fill_dummy() -> None:
    inputs = DecodeGraphInputs(max_bs=8, max_kv_tokens=16, dummy_slot=DUMMY, device="cpu")
    assert inputs.fill_dummy(4) == [0, 1, 2, 3, 4]
    assert inputs.out_cache_loc[:4].tolist() == [DUMMY] * 4 and inputs.kv_indices[:4].tolist() == [DUMMY] * 4


def test_capture_grid_past_256_steps_by_16():
    sizes = capture_batch_sizes(1024)
    assert 256 in sizes and 272 in sizes and 264 not in sizes and sizes[-1] == 1024
    assert all(b - a == 16 for a, b in zip(sizes[sizes.index(256):], sizes[sizes.index(256) + 1:]))
