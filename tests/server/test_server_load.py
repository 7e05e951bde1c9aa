"""Many streams at once, streams cut off by their clients (no KV left behind), /flush_cache and
/metrics, against one served tiny model."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

pytest.importorskip("fastapi")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.server.server_process import scheduler_info, wait_idle  # noqa: E402

MODEL = "tiny_mla_moe"


async def stream_completion(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[int, str, dict]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks, finish, usage = 0, None, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data["choices"]:
                chunks += 1
                finish = data["choices"][0]["finish_reason"] or finish
            else:
                usage = data["usage"]
    return chunks, finish, usage


def test_64_concurrent_streams_all_complete(any_server):
    server = any_server
    async def run():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(stream_completion(client, f"stream {i}: ", 8) for i in range(64)))

    results = asyncio.run(run())
    assert len(results) == 64
    for chunks, finish, usage in results:
        assert finish == "length" and usage["completion_tokens"] == 8 and chunks >= 1
    wait_idle(server)


def test_100_streams_cut_off_mid_way_leave_no_kv_allocated(any_server):
    server = any_server
    async def cut_off(client: httpx.AsyncClient, i: int) -> int:
        body = {"model": MODEL, "prompt": f"a long story number {i}", "max_tokens": 1500, "ignore_eos": True,
                "stream": True}
        seen = 0
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen == 2:
                        break                         # leaving the block closes the connection
        return seen

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=128)) as c:
            return await asyncio.gather(*(cut_off(c, i) for i in range(100)))

    assert asyncio.run(run()) == [2] * 100
    state = wait_idle(server)
    assert state["kv_tokens_held_by_requests"] == 0
    assert state["kv_used_tokens"] == state["radix_cache_tokens"]
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    aborted = [s.value for f in text_string_to_metric_families(metrics) for s in f.samples
               if s.name == "twinserve_requests_finished_total" and s.labels.get("reason") == "abort"]
    assert aborted and aborted[0] >= 100


def test_flush_cache_empties_the_radix_cache(server):
    r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "cache me " * 20,
                                                         "max_tokens": 4}, timeout=60)
    assert r.status_code == 200
    before = wait_idle(server)
    assert before["radix_cache_tokens"] > 0
    r = httpx.post(f"{server.url}/flush_cache", timeout=30)
    assert r.status_code == 200
    after = scheduler_info(server)
    assert after["radix_cache_tokens"] == 0 and after["kv_used_tokens"] == 0


def test_flush_cache_refuses_while_requests_run(server):
    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            body = {"model": MODEL, "prompt": "busy", "max_tokens": 1500, "ignore_eos": True, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        break
                return await client.post("/flush_cache")

    refused = asyncio.run(run())
    assert refused.status_code == 400 and "in flight" in refused.json()["error"]["message"]
    wait_idle(server)


def test_metrics_parse_with_prometheus_parser(server):
    httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "metrics", "max_tokens": 3,
                                                     "ignore_eos": True}, timeout=60)
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("twinserve_requests", "twinserve_time_to_first_token_seconds", "twinserve_inter_token_latency_seconds",
                 "twinserve_e2e_request_latency_seconds", "twinserve_num_running_reqs", "twinserve_num_waiting_reqs",
                 "twinserve_kv_usage", "twinserve_cache_hit_rate", "twinserve_generation_tokens"):
        assert name in families, sorted(families)
    count = lambda fam, suffix: sum(s.value for s in families[fam].samples if s.name == fam + suffix)  # noqa: E731
    assert count("twinserve_time_to_first_token_seconds", "_count") >= 1
    assert count("twinserve_e2e_request_latency_seconds", "_count") >= 1
    assert count("twinserve_inter_token_latency_seconds", "_count") >= 2
