"""experiments/bench_serving.py against the served tiny model: every backend completes the workload
with the requested output lengths and writes the shared records (client side and server side)."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from experiments import bench_serving  # noqa: E402
from runtime.records_io import read_run  # noqa: E402
from tests.server.server_process import MODEL_OVERRIDES  # noqa: E402

WORKLOAD = ["model=tiny_mla_moe", "workload=random", "workload.input_len=48", "workload.output_len=12",
            "workload.range_ratio=0.5", "workload.num_requests=24", "workload.request_rate=60"]


@pytest.mark.parametrize("backend", bench_serving.BACKENDS)
def test_bench_against_a_running_server(server, tmp_path, backend):
    summary = bench_serving.main(["--url", server.url, "--backend", backend, "--out", str(tmp_path), "--quiet",
                                  "--flush-cache", *WORKLOAD])
    requests, steps, saved = read_run(tmp_path)
    assert saved["num_errors"] == 0 and summary["num_finished"] == 24 == len(requests)
    assert (requests["finish_reason"] == "length").all()
    expected = {s.rid: s.output_len for s in bench_serving.instantiate(
        bench_serving.compose_config(WORKLOAD).workload).requests()}
    assert dict(zip(requests["rid"], requests["output_tokens"])) == expected
    assert all(len(t) == n for t, n in zip(requests["token_times_s"], requests["output_tokens"]))
    assert summary["ttft_s"]["p50"] > 0 and summary["itl_s"]["mean"] is not None
    assert summary["cache_hit_rate"] < 0.5           # flushed: the earlier backends' runs do not count
    server_requests, _, server_summary = read_run(tmp_path / "server")          # the same requests, server side
    assert sorted(server_requests["rid"]) == sorted(expected) and server_summary["num_finished"] == 24
    if backend == "openai":                                                      # ids prompts: exact lengths
        assert dict(zip(server_requests["rid"], server_requests["input_tokens"])) == \
            dict(zip(requests["rid"], requests["input_tokens"]))


def test_bench_launches_and_stops_its_own_server(tmp_path):
    summary = bench_serving.main(["--launch", "--max-concurrency", "4", "--out", str(tmp_path), "--quiet",
                                  *MODEL_OVERRIDES, *WORKLOAD[1:], "workload.num_requests=8"])
    assert summary["num_finished"] == 8 and summary["server_summary"]["num_finished"] == 8
    _, _, served = read_run(tmp_path / "server_run")                             # written at its shutdown
    assert served["mode"] == "serve" and served["num_finished"] == 8


@pytest.mark.parametrize("client_args", [[], ["--preconnect", "3", "--busy-poll"]], ids=["plain", "warm_spinning"])
def test_bench_with_several_client_processes(server, tmp_path, client_args):
    summary = bench_serving.main(["--url", server.url, "--client-processes", "2", "--out", str(tmp_path), "--quiet",
                                  "--flush-cache", *client_args, *WORKLOAD, "workload.num_requests=10"])
    requests, _, _ = read_run(tmp_path)
    assert summary["num_errors"] == 0 and summary["num_finished"] == 10 and summary["client_processes"] == 2
    assert summary["client_busy_poll"] == bool(client_args) and summary["preconnect"] == (3 if client_args else 0)
    assert sorted(requests["rid"]) == sorted(s.rid for s in bench_serving.instantiate(
        bench_serving.compose_config(WORKLOAD + ["workload.num_requests=10"]).workload).requests())
    assert all(len(t) == n for t, n in zip(requests["token_times_s"], requests["output_tokens"]))
    assert requests["arrival_s"].min() >= 0 and requests["arrival_s"].max() < summary["duration_s"]
