"""`mode=serve` with busy polling (server.busy_poll_s > 0, the default on many-core hosts): every receiving
process (detokenizer, HTTP worker, an idle scheduler) spins between messages, and the server still serves the
Engine's greedy tokens, many concurrent streams, and aborted streams leave no KV behind. The resolved value is
what /get_server_info reports (null resolves by the machine's cores)."""
from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.server.ipc import resolve_busy_poll_s  # noqa: E402
from tests.server.server_process import engine_overrides, start_server, wait_idle  # noqa: E402

MODEL = "tiny_mla_moe"
BUSY_POLL_S = 0.02


@pytest.fixture(scope="module")
def spinning_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("busy_poll"), [f"server.busy_poll_s={BUSY_POLL_S}"])
    yield srv
    srv.stop(signal.SIGTERM)


def test_server_info_reports_the_resolved_value(spinning_server, server):
    assert httpx.get(f"{spinning_server.url}/get_server_info", timeout=30).json()["busy_poll_s"] == BUSY_POLL_S
    assert httpx.get(f"{server.url}/get_server_info", timeout=30).json()["busy_poll_s"] == resolve_busy_poll_s(None)


def test_streamed_greedy_tokens_equal_the_engines(spinning_server):
    from runtime.engine.engine import Engine

    prompt = "Spinning receivers change when, not what:"
    assert httpx.post(f"{spinning_server.url}/flush_cache", timeout=30).status_code == 200
    client = openai.OpenAI(base_url=f"{spinning_server.url}/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True)
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    ref = Engine(compose_config(engine_overrides())).generate(prompt, {"max_new_tokens": 20, "temperature": 0.0})
    assert text == ref["text"]


def test_concurrent_streams_complete_and_aborted_ones_free_their_kv(spinning_server):
    async def main():
        client = openai.AsyncOpenAI(base_url=f"{spinning_server.url}/v1", api_key="none", max_retries=0, timeout=120)

        async def full(i: int) -> int:
            stream = await client.completions.create(model=MODEL, prompt=f"stream {i}", max_tokens=12,
                                                     temperature=0, stream=True,
                                                     extra_body={"ignore_eos": True})
            return len([1 async for chunk in stream if chunk.choices and chunk.choices[0].text is not None])

        async def cut(i: int) -> None:
            stream = await client.completions.create(model=MODEL, prompt=f"cut {i}", max_tokens=2000,
                                                     stream=True, extra_body={"ignore_eos": True})
            async for _ in stream:
                break
            await stream.close()

        done = await asyncio.gather(*(full(i) for i in range(24)), *(cut(i) for i in range(8)))
        await client.close()
        return done[:24]

    counts = asyncio.run(main())
    assert all(n >= 1 for n in counts)
    state = wait_idle(spinning_server)
    assert state["kv_used_tokens"] == state["radix_cache_tokens"]
