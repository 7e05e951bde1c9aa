"""experiments/bench_frontend.py: the HTTP process against a fake scheduler stepping every 10 ms serves
every request, and the front end's TTFT overhead and ITL come out per request (ITL near the step)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from experiments import bench_frontend  # noqa: E402


def test_front_end_alone_serves_every_request_at_the_fake_step(tmp_path):
    result = bench_frontend.main(["--rate", "40", "--num-requests", "16", "--output-len", "6", "--step-ms", "10",
                                  "--out", str(tmp_path)])
    assert result["num_finished"] == 16 and json.loads((tmp_path / "frontend.json").read_text()) == result
    overhead = result["ttft_overhead_ms"]
    assert 0 < overhead["p50"] <= overhead["p99"] < 5000       # the client's TTFT exceeds the fake scheduler's
    assert 0.8 < result["itl_over_step"]["p50"] < 5            # tokens arrive about one step apart
