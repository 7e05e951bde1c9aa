"""Simulated output tokens: the same stream whether ids come out as shared int objects or not."""
from __future__ import annotations

import numpy as np

from runtime.core.request import Request, RequestSpec, SamplingParams
from sim.executor import simulated_streams, simulated_tokens


def test_shared_int_objects_give_the_same_tokens_and_reuse_them() -> None:
    vocab = 1000
    ints = np.arange(vocab).astype(object)
    req = Request("mooncake-000042", (1, 2, 3), SamplingParams(max_new_tokens=300), 0.0)
    plain = simulated_tokens(req, 5, 300, vocab)
    shared = simulated_tokens(req, 5, 300, vocab, ints)
    assert shared == plain and all(0 <= t < vocab for t in plain)
    assert all(t is ints[t] for t in shared)                      # no new int per token
    assert simulated_tokens(req, 0, 305, vocab)[5:] == plain      # a stream is prefix-stable
    assert len(set(plain)) > 250                                  # not constant: a hash of the index


def test_streams_of_a_whole_workload_at_once_equal_one_request_at_a_time() -> None:
    vocab = 1000
    ints = np.arange(vocab).astype(object)
    specs = [RequestSpec(f"r{i}", 0.0, (1,), output_len=(i * 37) % 50 + 1,
                         expected_output_ids=tuple(range(i % 7)) if i % 3 == 0 else None) for i in range(60)]
    streams = simulated_streams(specs, vocab, ints)
    assert streams == [simulated_tokens(s, 0, s.output_len, vocab) for s in specs]
    assert streams[3][:3] == [0, 1, 2] and len(streams[3]) == specs[3].output_len   # trace tokens first
    assert simulated_streams([], vocab, ints) == []
