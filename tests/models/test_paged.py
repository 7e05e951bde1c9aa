"""Decode, radix-style prefix reuse and mixed batches through the paged pool equal HF full forwards."""
from __future__ import annotations

from tests.models.conftest import Pair
from tests.models.hf_models import hf_logits, rel_err
from tests.models.paged import PagedRunner, Seq
from tests.models.test_prefill import TOL, prompt


def test_decode_token_by_token_over_shuffled_slots(pair: Pair) -> None:
    runner, seq = PagedRunner(pair.ours, seed=1), Seq()
    runner.step([(seq, prompt(10, seed=2))])
    for token in prompt(8, seed=3):
        logits = runner.step([(seq, [token])])[0]
        assert rel_err(logits, hf_logits(pair.hf, seq.ids)[-1]) <= TOL, len(seq.ids)
    assert seq.slots != sorted(seq.slots)


def test_prefix_hit_extends_only_the_new_tokens(pair: Pair) -> None:
    runner, first = PagedRunner(pair.ours, seed=2), Seq()
    runner.step([(first, prompt(12, seed=4))])
    second = runner.share_prefix(first, 8)
    new_ids = prompt(5, seed=5)
    logits = runner.step_all([(second, new_ids)])                      # [5, V]
    assert second.slots[:8] == first.slots[:8]
    assert rel_err(logits, hf_logits(pair.hf, second.ids)[8:]) <= TOL


def test_chunked_prefill_continues_its_own_prefix(pair: Pair) -> None:
    runner, seq = PagedRunner(pair.ours, seed=3), Seq()
    ids = prompt(15, seed=6)
    runner.step([(seq, ids[:6])])
    logits = runner.step_all([(seq, ids[6:])])
    assert rel_err(logits, hf_logits(pair.hf, ids)[6:]) <= TOL


def test_mixed_batch_of_one_extend_and_two_decodes(pair: Pair) -> None:
    runner = PagedRunner(pair.ours, seed=4)
    short, long = Seq(), Seq()
    runner.step([(short, prompt(7, seed=7)), (long, prompt(13, seed=8))])
    extend = runner.share_prefix(long, 9)
    logits = runner.step([(extend, prompt(4, seed=9)), (short, [3]), (long, [250])])   # [3, V]
    for row, seq in enumerate((extend, short, long)):
        assert rel_err(logits[row], hf_logits(pair.hf, seq.ids)[-1]) <= TOL, row
