"""Greedy generation through ForwardBatch and the paged pool equals HF generate(do_sample=False)."""
from __future__ import annotations

import torch

from tests.models.conftest import Pair
from tests.models.paged import PagedRunner, Seq
from tests.models.test_prefill import prompt

NEW_TOKENS = 32


def greedy(runner: PagedRunner, ids: list[int], num_new: int) -> list[int]:
    seq = Seq()
    logits = runner.step([(seq, ids)])
    out: list[int] = []
    while True:
        out.append(int(logits[0].argmax()))
        if len(out) == num_new:
            return out
        logits = runner.step([(seq, out[-1:])])


def test_greedy_generation_matches_hf_generate(pair: Pair) -> None:
    ids = prompt(8, seed=10)
    with torch.no_grad():
        hf_out = pair.hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                  pad_token_id=0)
    expected = hf_out[0, len(ids):].tolist()
    assert greedy(PagedRunner(pair.ours, seed=5), ids, NEW_TOKENS) == expected
