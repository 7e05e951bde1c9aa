"""Sampler: greedy paths, filters, empirical distributions and per-request seed invariance."""
from __future__ import annotations

import math

import pytest
import torch

from runtime.core.request import SamplingParams
from runtime.engine.sampler import Sampler, hashed_uniforms

# Legend: B = sequences, V = vocab.
VOCAB = 50


def _logits(num_rows: int, seed: int = 0) -> torch.Tensor:              # [B, V]
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _reference_probs(row: torch.Tensor, p: SamplingParams) -> list[float]:
    """The documented filter, one row at a time in plain Python."""
    probs = torch.softmax(row.double() / p.temperature, dim=-1).tolist()
    order = sorted(range(len(probs)), key=lambda v: -probs[v])
    kept, mass = set(), 0.0
    for rank, v in enumerate(order):
        if (p.top_k == -1 or rank < p.top_k) and (p.top_p == 1 or mass <= p.top_p):
            kept.add(v)
        mass += probs[v]
    max_prob = max(probs)
    kept = {v for v in kept if probs[v] >= p.min_p * max_prob}
    total = sum(probs[v] for v in kept)
    return [probs[v] / total if v in kept else 0.0 for v in range(len(probs))]


def _chi_square(counts: torch.Tensor, expected_probs: list[float]) -> tuple[float, int]:
    num_draws = int(counts.sum())
    stat, dof = 0.0, -1
    for count, prob in zip(counts.tolist(), expected_probs):
        if prob == 0:
            assert count == 0, "a filtered-out token was sampled"
            continue
        expected = prob * num_draws
        stat += (count - expected) ** 2 / expected
        dof += 1
    return stat, dof


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, top_p=0.5, seed=3),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=1.0, top_p=1e-6),
    SamplingParams(temperature=2.0, min_p=1.0, seed=9),
])
def test_greedy_equivalents_are_argmax(params: SamplingParams) -> None:
    logits = _logits(16)
    token_ids = Sampler(seed=1).sample(logits, [params] * 16, output_positions=[5] * 16)
    assert token_ids.dtype == torch.long and token_ids.shape == (16,)
    assert torch.equal(token_ids, logits.argmax(dim=-1))


DISTRIBUTION_CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05),
]


@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("params", DISTRIBUTION_CASES)
def test_empirical_distribution_matches_filtered_softmax(params: SamplingParams, seeded: bool) -> None:
    vocab, num_draws = 12, 20_000
    row = torch.linspace(-2.0, 2.0, vocab)                                  # [V]
    if seeded:  # one request, many steps: tests the hash's quality across positions
        params = SamplingParams(**{**params.__dict__, "seed": 1234})
    logits = row.expand(num_draws, vocab)                                   # [B, V]
    token_ids = Sampler(seed=7).sample(logits, [params] * num_draws, list(range(num_draws)))
    counts = torch.bincount(token_ids, minlength=vocab)
    stat, dof = _chi_square(counts, _reference_probs(row, params))
    # chi-square 99.99% quantile is below dof + 6 * sqrt(2 * dof) + 10 for dof <= 11
    assert stat < dof + 6 * math.sqrt(2 * max(dof, 1)) + 10, (stat, dof)


def test_seeded_tokens_do_not_depend_on_batch_composition() -> None:
    mine = SamplingParams(temperature=1.0, top_p=0.95, seed=42)
    others = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, top_k=3, seed=7),
              SamplingParams(temperature=1.5, min_p=0.2)]
    alone, crowded = [], []
    for step in range(30):
        my_logits = _logits(1, seed=100 + step)                             # [1, V]
        alone.append(int(Sampler(seed=0).sample(my_logits, [mine], [step])[0]))
        batch = torch.cat([_logits(2, seed=step), my_logits, _logits(1, seed=-step - 1)])
        params = [others[0], others[1], mine, others[2]]
        token_ids = Sampler(seed=step + 1).sample(batch, params, [9, 3, step, 0])
        crowded.append(int(token_ids[2]))
    assert alone == crowded
    assert len(set(alone)) > 3  # actually random across positions


def test_greedy_and_sampled_rows_mix_in_one_batch() -> None:
    logits = _logits(8, seed=5)
    params = [SamplingParams(temperature=0.0) if i % 2 == 0 else SamplingParams(temperature=5.0, top_k=2)
              for i in range(8)]
    sampler = Sampler(seed=3)
    top2 = logits.topk(2, dim=-1).indices                                   # [B, 2]
    seen_second = False
    for _ in range(50):
        token_ids = sampler.sample(logits, params)
        assert torch.equal(token_ids[0::2], logits[0::2].argmax(dim=-1))
        assert (token_ids[1::2, None] == top2[1::2]).any(dim=-1).all()
        seen_second |= bool((token_ids[1::2] == top2[1::2, 1]).any())
    assert seen_second


def test_masked_logits_are_never_sampled() -> None:
    logits = torch.full((4, VOCAB), float("-inf"))
    logits[:, 10:13] = torch.tensor([0.0, 1.0, 2.0])
    params = [SamplingParams(), SamplingParams(seed=1), SamplingParams(top_p=0.99), SamplingParams(min_p=0.01)]
    for step in range(20):
        token_ids = Sampler(seed=step).sample(logits, params, [step] * 4)
        assert ((token_ids >= 10) & (token_ids < 13)).all()


def test_seeded_row_requires_positions() -> None:
    with pytest.raises(ValueError, match="output_positions"):
        Sampler().sample(_logits(1), [SamplingParams(seed=1)])


def test_hashed_uniforms_are_distinct_in_range_and_pure() -> None:
    keys = torch.tensor([[0, 0], [2**32 - 1, 2**32 - 1], [12345, 678]])  # [S, 2]
    uniforms = hashed_uniforms(keys, 4096)                                  # [S, V]
    assert ((uniforms > 0) & (uniforms < 1)).all()
    assert torch.equal(uniforms, hashed_uniforms(keys, 4096))
    assert torch.equal(uniforms[2:, :100], hashed_uniforms(keys[2:], 100))
    assert abs(float(uniforms.mean()) - 0.5) < 0.02
