"""experiments/serving_lag.py: the front end's delivery lag is the client's time to each token minus the
server's, per request, on the request's own clocks (client send and HTTP arrival)."""
from __future__ import annotations

import pandas as pd
import pytest

from experiments.serving_lag import delivery_lags_ms, lag_table


def frame(rows: list[tuple[str, float, list[float]]]) -> pd.DataFrame:
    return pd.DataFrame([{"rid": rid, "arrival_s": arrival, "first_token_s": times[0], "finish_s": times[-1],
                          "output_tokens": len(times), "token_times_s": times} for rid, arrival, times in rows])


def test_lags_are_measured_from_each_side_s_own_arrival():
    # the client's clock is 100 s ahead of the server's; a: tokens seen 2, 3, 3 ms after they were made;
    # b: sent 1 s later, its one token seen 20 ms after sending, made 10 ms after its HTTP arrival
    client = frame([("a", 100.0, [100.012, 100.023, 100.033]), ("b", 101.0, [101.020])])
    server = frame([("b", 1.0005, [1.0105]), ("a", 0.0, [0.010, 0.020, 0.030])])
    first, every = delivery_lags_ms(client, server)
    assert first == pytest.approx([2.0, 10.0]) and every == pytest.approx([3.0, 10.0])


def test_a_rate_without_every_file_is_left_out(tmp_path):
    (tmp_path / "serve_rate_16.json").write_text('{"throughput": {"requests_per_s": 16.0}}')
    assert lag_table(tmp_path).empty
