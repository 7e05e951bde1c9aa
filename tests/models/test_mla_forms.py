"""MLA in MHA form ("prefill as MHA": k/v expanded from the latents by kv_b_proj) is the same function as the
absorbed form, on the tiny DeepSeek models in float32 with the torch reference backend: logits within 1e-4
relative, and the latents it stores serve later absorbed decode steps."""
from __future__ import annotations

import pytest
import torch

from runtime.models.attention_backend import TorchAttentionBackend
from tests.models.conftest import Pair
from tests.models.hf_models import rel_err
from tests.models.paged import PagedRunner, Seq
from tests.models.test_prefill import prompt

TOL = 1e-4


class Recording(TorchAttentionBackend):
    """The reference backend, recording which form each MLA layer ran; force_mha also sends steps with any
    prefix to MHA form (the rule does so only from a summed prefix of 8192 tokens, too long for CPU tests)."""

    def __init__(self, mla_prefill_as_mha: bool, force_mha: bool = False) -> None:
        super().__init__(mla_prefill_as_mha)
        self.force_mha, self.forms = force_mha, []

    def mla_as_mha(self, fb) -> bool:
        return (self.force_mha and not fb.all_decode) or super().mla_as_mha(fb)

    def mla(self, layer, *args, **kwargs):
        self.forms.append("absorbed")
        return super().mla(layer, *args, **kwargs)

    def mla_mha(self, layer, *args, **kwargs):
        self.forms.append("mha")
        return super().mla_mha(layer, *args, **kwargs)


def _mla(pair: Pair) -> None:
    if not pair.ours.config.use_mla:
        pytest.skip("MLA models only")


def _all_logits(runner: PagedRunner, work, backend: Recording) -> torch.Tensor:   # [T, V]
    fb = runner.batch(work)
    fb.attn_backend = backend
    return runner.model.compute_logits(runner.model.hidden_states(fb, runner.pool))


def test_prefill_in_mha_form_equals_absorbed_form(pair: Pair) -> None:
    _mla(pair)
    prompts = [prompt(n, seed=20 + n) for n in (7, 1, 12)]
    layers = pair.ours.config.num_hidden_layers
    results = {}
    for as_mha in (True, False):
        runner, backend = PagedRunner(pair.ours, seed=3), Recording(as_mha)
        results[as_mha] = _all_logits(runner, [(Seq(), p) for p in prompts], backend), runner.pool
        assert backend.forms == ["mha" if as_mha else "absorbed"] * layers
    (mha, mha_pool), (absorbed, absorbed_pool) = results[True], results[False]
    assert mha.shape[0] == sum(map(len, prompts))
    assert rel_err(mha, absorbed) <= TOL
    for layer in range(layers):                       # same slots, same latents stored by both forms
        torch.testing.assert_close(mha_pool.get_kv(layer), absorbed_pool.get_kv(layer))


def test_latents_stored_by_mha_form_serve_decode(pair: Pair) -> None:
    _mla(pair)
    prompts = [prompt(n, seed=40 + n) for n in (6, 10)]
    last = {}
    for as_mha in (True, False):
        runner, seqs = PagedRunner(pair.ours, seed=4), [Seq(), Seq()]
        _all_logits(runner, list(zip(seqs, prompts)), Recording(as_mha))
        decode = Recording(as_mha)
        last[as_mha] = _all_logits(runner, [(s, [5]) for s in seqs], decode)   # [B, V]
        assert set(decode.forms) == {"absorbed"}                               # decode never runs as MHA
    assert rel_err(last[True], last[False]) <= TOL


def test_mha_form_over_a_cached_prefix_equals_absorbed_form(pair: Pair) -> None:
    """A radix-cache hit and a later prefill chunk: the prefix latents are read back from the pool,
    expanded, and attended with bottom-right causal alignment."""
    _mla(pair)
    out = {}
    for force in (True, False):
        runner, first = PagedRunner(pair.ours, seed=5), Seq()
        _all_logits(runner, [(first, prompt(14, seed=60))], Recording(False))    # prefix, absorbed
        hit = runner.share_prefix(first, 9)
        backend = Recording(False, force_mha=force)
        out[force] = _all_logits(runner, [(first, prompt(5, seed=61)), (hit, prompt(8, seed=62)),
                                          (Seq(), prompt(3, seed=63))], backend)
        assert set(backend.forms) == {"mha" if force else "absorbed"}
    assert rel_err(out[True], out[False]) <= TOL
