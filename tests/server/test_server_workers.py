"""server.tokenizer_workers=2: two HTTP + tokenizer processes on one port, one scheduler. The official
openai client, many concurrent streams (spread over both workers), /abort_request and disconnects
across workers (no KV left behind), flush_cache, summed metrics, dump_records, and a shutdown that
leaves no child process; with the detokenizer process, and all of it again without one
(server.detokenizer=inline: the scheduler sends each worker its own outputs and replies) on the server of
the shutdown test, so that the second mode costs one more server start, not two."""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.server.conftest import DETOKENIZER_MODES, MODE_OVERRIDES  # noqa: E402
from tests.server.server_process import REPO, scheduler_info, start_server, wait_idle  # noqa: E402
from tests.server.test_server_shutdown import (  # noqa: E402
    LONG_CONTEXT, alive, cmdline, process_name, read_stream_until_closed,
)

MODEL = "tiny_mla_moe"
WORKERS = ["server.tokenizer_workers=2"]


@pytest.fixture(scope="module")
def server2(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("server2"), WORKERS)
    yield srv
    srv.stop(signal.SIGTERM)


def test_openai_client_streams_and_not(server2):
    client = openai.OpenAI(base_url=f"{server2.url}/v1", api_key="none", max_retries=0, timeout=60)
    args = {"model": MODEL, "max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(prompt="two workers", **args)
    chunks = list(client.completions.create(prompt="two workers", stream=True, **args))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert whole.usage.completion_tokens == 12 and chunks[-1].choices[0].finish_reason == "length"
    messages = [{"role": "user", "content": "hello workers"}]
    chat = client.chat.completions.create(messages=messages, **args)
    streamed = list(client.chat.completions.create(messages=messages, stream=True, **args))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == chat.choices[0].message.content


def test_many_concurrent_streams_all_complete(server2):
    async def one(client, i: int):
        stream = await client.completions.create(model=MODEL, prompt=f"stream {i}", max_tokens=8, stream=True,
                                                 extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        return chunks[-1].usage.completion_tokens, [c.choices[0].finish_reason for c in chunks if c.choices][-1]

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server2.url}/v1", api_key="none", max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(48)))
        finally:
            await client.close()

    assert asyncio.run(run()) == [(8, "length")] * 48
    wait_idle(server2)


def test_streams_spread_over_both_workers_and_abort_all_ends_them(server2):
    """Forty long streams on their own connections: both workers hold some; /abort_request (on whichever
    worker) ends all of them for their own clients, and no KV is left held."""
    num_streams, started, finishes = 40, [threading.Event() for _ in range(40)], {}

    def stream(i: int) -> None:
        body = {"rid": f"spread-{i}", "text": "long", "stream": True,
                "sampling_params": {"max_new_tokens": 1800, "ignore_eos": True}}
        with httpx.stream("POST", f"{server2.url}/generate", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    started[i].set()
                    finish = httpx.Response(200, content=line[6:]).json()["meta_info"]["finish_reason"]
                    if finish is not None:
                        finishes[i] = finish["type"]

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(num_streams)]
    for thread in threads:
        thread.start()
    assert all(event.wait(60) for event in started)
    in_flight: dict[int, int] = {}
    for _ in range(30):                                  # fresh connections land on either worker
        with httpx.Client(base_url=server2.url, timeout=30) as c:
            info = c.get("/get_server_info").json()
        in_flight[info["tokenizer_worker_id"]] = info["num_http_requests_in_flight"]
    assert sorted(in_flight) == [1, 2] and all(n > 0 for n in in_flight.values()), in_flight
    assert sum(in_flight.values()) == num_streams
    aborted = httpx.post(f"{server2.url}/abort_request", json={"abort_all": True}, timeout=30).json()["aborted"]
    assert sorted(aborted) == sorted(f"spread-{i}" for i in range(num_streams))
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    assert finishes == {i: "abort" for i in range(num_streams)}
    assert wait_idle(server2)["kv_tokens_held_by_requests"] == 0


def test_streams_cut_off_by_their_clients_leave_no_kv(server2):
    async def cut_off(i: int) -> int:
        body = {"model": MODEL, "prompt": f"cut {i}", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        seen = 0
        async with httpx.AsyncClient(base_url=server2.url, timeout=120) as client, \
                client.stream("POST", "/v1/completions", json=body) as r:      # a connection each
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 2:
                    break
        return seen

    async def run():
        return await asyncio.gather(*(cut_off(i) for i in range(24)))

    assert asyncio.run(run()) == [2] * 24
    state = wait_idle(server2)
    assert state["kv_tokens_held_by_requests"] == 0 and state["kv_used_tokens"] == state["radix_cache_tokens"]


def test_flush_cache_summed_metrics_health_and_dump_records(server2, tmp_path):
    def requests_total() -> float:
        text = httpx.get(f"{server2.url}/metrics", timeout=30).text
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "twinserve_requests_total")

    before = requests_total()
    for i in range(10):                                  # a connection each: both workers count some
        r = httpx.post(f"{server2.url}/v1/completions", json={"model": MODEL, "prompt": f"count {i}", "max_tokens": 2,
                                                              "rid": f"count-{i}"}, timeout=60)
        assert r.status_code == 200
    assert requests_total() == before + 10
    assert httpx.get(f"{server2.url}/health", timeout=30).status_code == 200
    assert httpx.get(f"{server2.url}/health_generate", timeout=60).status_code == 200
    wait_idle(server2)
    assert httpx.post(f"{server2.url}/flush_cache", timeout=30).status_code == 200
    assert scheduler_info(server2)["radix_cache_tokens"] == 0
    dumped = httpx.post(f"{server2.url}/dump_records", json={"dir": str(tmp_path / "dump"),
                                                             "rids": [f"count-{i}" for i in range(10)]}, timeout=60)
    assert dumped.status_code == 200 and dumped.json()["summary"]["num_finished"] == 10


@pytest.mark.parametrize("mode", DETOKENIZER_MODES)
def test_shutdown_with_two_workers_leaves_no_child_and_writes_records(tmp_path, mode):
    """inline: the tests above run on this server first."""
    from runtime.records_io import read_run

    server = start_server(tmp_path, WORKERS + ["server.graceful_shutdown_s=0"] + MODE_OVERRIDES[mode] + LONG_CONTEXT)
    try:
        if mode == "inline":
            test_openai_client_streams_and_not(server)
            test_many_concurrent_streams_all_complete(server)
            test_streams_spread_over_both_workers_and_abort_all_ends_them(server)
            test_streams_cut_off_by_their_clients_leave_no_kv(server)
            test_flush_cache_summed_metrics_health_and_dump_records(server, tmp_path)
        r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "done", "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 200
        wait_idle(server)
        dumped = httpx.post(f"{server.url}/dump_records", json={"dir": str(tmp_path / "before")}, timeout=60).json()
        before = list(read_run(tmp_path / "before")[0]["finish_reason"])
        children = server.child_pids()
        names = [process_name(pid) for pid in children]  # scheduler, detokenizer (process), two workers
        assert {"twinserve-sched", "twinserve-http1", "twinserve-http2"} <= set(names), names
        assert ("twinserve-detok" in names) == (mode != "inline"), names
        first_chunk = threading.Event()
        reader = threading.Thread(target=read_stream_until_closed, args=(server.url, first_chunk), daemon=True)
        reader.start()
        assert first_chunk.wait(60)
        assert server.stop(signal.SIGTERM, timeout_s=90) == 0, server.log()
        reader.join(30)
        assert not reader.is_alive()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [(pid, cmdline(pid)) for pid in children if alive(pid)] == []
        assert "records in" in server.log()
        requests, _, summary = read_run(server.run_dir)
        assert sorted(requests["finish_reason"]) == sorted([*before, "abort"])      # the stream cut by shutdown
        assert summary["num_finished"] == dumped["summary"]["num_finished"] >= 1
        if mode == "process":
            assert before == ["length"]
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_tokenizer_workers_below_one_are_refused():
    refused = subprocess.run([sys.executable, "run.py", "mode=serve", "model=tiny_mla_moe", "hardware=cpu",
                              "server.tokenizer_workers=0"], cwd=REPO, capture_output=True, text=True, timeout=120,
                             check=False)
    assert refused.returncode != 0
    assert "server.tokenizer_workers=0: must be >= 1" in refused.stderr + refused.stdout
