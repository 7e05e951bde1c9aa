"""Dummy (seeded random) weights: deterministic, and activations stay finite at DeepSeek-V2-Lite widths."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from runtime.models.loader import build_model
from tests.models.hf_models import hf_config
from tests.models.paged import PagedRunner, Seq

V2_LITE = yaml.safe_load((Path(__file__).parents[2] / "conf/model/deepseek_v2_lite.yaml").read_text())["hf_config"]
needs_run_slow = pytest.mark.skipif(not os.environ.get("RUN_SLOW"), reason="slow: set RUN_SLOW=1")


def _prefill_then_decode(model) -> torch.Tensor:
    """Logits of a two-sequence prefill, then of one decode step for both: [4, V]."""
    runner, a, b = PagedRunner(model, num_slots=64), Seq(), Seq()
    first = runner.step([(a, list(range(1, 12))), (b, [7, 8, 9])])
    return torch.cat([first, runner.step([(a, [5]), (b, [6])])])


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    cfg = hf_config("deepseek_v3").to_dict()
    a, b, c = (build_model(cfg, torch.float32, "cpu", seed=s) for s in (3, 3, 4))
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert not torch.equal(pa["model.layers.1.mlp.experts.w13"], pc["model.layers.1.mlp.experts.w13"])
    assert torch.equal(pa["model.norm.weight"], torch.ones(64))


def test_v2_lite_widths_two_layers_give_finite_logits() -> None:
    """Every V2-Lite width (hidden 2048, 16 heads, C=512, dense 10944, expert 1408), fewer experts
    and a smaller vocab so it runs in seconds on CPU."""
    cfg = {**V2_LITE, "num_hidden_layers": 2, "n_routed_experts": 8, "vocab_size": 4096}
    logits = _prefill_then_decode(build_model(cfg, torch.bfloat16, "cpu"))
    assert logits.isfinite().all() and logits.std() > 0.1


@pytest.mark.slow
@needs_run_slow
def test_full_v2_lite_config_two_layers_gives_finite_logits() -> None:
    cfg = {**V2_LITE, "num_hidden_layers": 2}
    logits = _prefill_then_decode(build_model(cfg, torch.bfloat16, "cpu"))
    assert logits.isfinite().all() and logits.std() > 0.1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_full_v2_lite_on_gpu_gives_finite_logits() -> None:
    logits = _prefill_then_decode(build_model(V2_LITE, torch.bfloat16, "cuda"))
    assert logits.isfinite().all() and logits.std() > 0.1
