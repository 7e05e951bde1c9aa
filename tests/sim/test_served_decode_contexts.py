"""Per-request contexts of a real run's decode steps, rebuilt from its records (experiments/served_decode_contexts.py),
agree with the contexts the run recorded per step: exactly for most steps, never more (a step can only miss the rows
it drops); the probe's equal contexts keep the sum."""
from __future__ import annotations

from pathlib import Path

from experiments.served_decode_contexts import decode_step_contexts
from experiments.served_decode_probe import equal_contexts, pick_steps

RUN = Path(__file__).resolve().parents[2] / "experiments/results/h200/fidelity/real/random_poisson_32rps"


def test_rebuilt_contexts_match_the_recorded_sums():
    frame = decode_step_contexts(RUN)
    assert len(frame) > 1000
    exact = (frame["rebuilt_tokens"] == frame["decode_context_tokens"]) & (frame["contexts"].map(len) == frame["batch_size"])
    assert exact.mean() > 0.75
    assert (frame["rebuilt_tokens"] <= frame["decode_context_tokens"]).all()
    assert (frame["contexts"].map(len) <= frame["batch_size"]).all()
    picked = pick_steps(frame, 10, 32, 256)
    assert len(picked) == 10 and picked["batch_size"].between(32, 255).all()


def test_equal_contexts_keep_the_sum_and_differ_by_at_most_one():
    for contexts in ([5], [1, 2, 3, 10], [1000, 3, 77, 45, 45]):
        equal = equal_contexts(contexts)
        assert sum(equal) == sum(contexts) and len(equal) == len(contexts) and max(equal) - min(equal) <= 1
