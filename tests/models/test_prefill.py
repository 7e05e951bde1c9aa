"""Prefill through the paged pool equals Hugging Face's full forward, for every family and checkpoint form."""
from __future__ import annotations

import torch

from runtime.models.loader import build_model, checkpoint_files
from tests.models.conftest import Pair
from tests.models.hf_models import VOCAB, hf_logits, rel_err
from tests.models.paged import PagedRunner, Seq

TOL = 1e-4


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefill_logits_match_hf_at_every_position(pair: Pair) -> None:
    ids = prompt(16, seed=1)
    ref = hf_logits(pair.hf, ids)                                     # [L, V]
    runner = PagedRunner(pair.ours)
    assert rel_err(runner.step_all([(Seq(), ids)]), ref) <= TOL
    last = PagedRunner(pair.ours).step([(Seq(), ids)])                 # [1, V]
    assert rel_err(last[0], ref[-1]) <= TOL


def test_sharded_checkpoint_loads_the_same_weights(pair: Pair, tmp_path) -> None:
    pair.hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(checkpoint_files(tmp_path)) > 1
    sharded = build_model(None, torch.float32, "cpu", load_format="safetensors", path=tmp_path)
    ours = dict(pair.ours.named_parameters())
    for name, param in sharded.named_parameters():
        assert torch.equal(param, ours[name]), name

