"""SGLang's operational endpoints besides the APIs: /health_generate (a token through the whole pipeline),
/get_model_info, /flush_cache by GET or POST, /abort_request (by rid or abort_all), and the OpenAI model
retrieval (`client.models.retrieve`)."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.server.server_process import wait_idle  # noqa: E402

MODEL = "tiny_mla_moe"


def test_health_generate_runs_a_token_and_leaves_nothing_in_flight(any_server):
    server = any_server
    r = httpx.get(f"{server.url}/health_generate", timeout=60)
    assert r.status_code == 200
    info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()
    assert info["scheduler"]["num_in_flight"] == 0 and info["num_http_requests_in_flight"] == 0


def test_model_info_names_the_model(server):
    info = httpx.get(f"{server.url}/get_model_info", timeout=30).json()
    assert info["is_generation"] is True and info["model_path"] == MODEL and info["served_model_name"] == MODEL


def test_flush_cache_by_get_and_post(any_server):
    server = any_server
    assert httpx.get(f"{server.url}/flush_cache", timeout=30).status_code == 200
    assert httpx.post(f"{server.url}/flush_cache", timeout=30).status_code == 200


def test_openai_client_retrieves_the_model_and_not_another(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=30)
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def _stream_until_finish(server, rid: str, started, finishes: dict) -> None:
    body = {"rid": rid, "text": "abort me", "stream": True, "sampling_params": {"max_new_tokens": 1800,
                                                                                "ignore_eos": True}}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                started.set()
                finish = json.loads(line[6:])["meta_info"]["finish_reason"]
                if finish is not None:
                    finishes[rid] = finish["type"]


def test_abort_request_ends_the_stream_of_its_client(any_server):
    """/abort_request by rid or abort_all: the requests' own clients get their finish (abort), nothing hangs
    (either server.detokenizer mode)."""
    server = any_server
    for how in ("rid", "all"):
        rids, finishes, threads = [f"victim-{how}-{i}" for i in range(2)], {}, []
        for rid in rids:
            started = threading.Event()
            thread = threading.Thread(target=_stream_until_finish, args=(server, rid, started, finishes), daemon=True)
            thread.start()
            assert started.wait(60)
            threads.append(thread)
        body = {"abort_all": True} if how == "all" else {"rid": rids[0]}
        aborted = httpx.post(f"{server.url}/abort_request", json=body, timeout=30).json()["aborted"]
        assert sorted(aborted) == (sorted(rids) if how == "all" else [rids[0]])
        if how == "rid":
            httpx.post(f"{server.url}/abort_request", json={"rid": rids[1]}, timeout=30)
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
        assert finishes == {rid: "abort" for rid in rids}
    info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()
    assert info["scheduler"]["num_in_flight"] == 0 and info["num_http_requests_in_flight"] == 0
    assert wait_idle(server)["kv_tokens_held_by_requests"] == 0


def test_native_sampling_keys_of_sglang(server):
    """no_stop_trim keeps the matched stop string; SGLang's keys this server lacks pass when null."""
    greedy = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    generate = lambda sp: httpx.post(f"{server.url}/generate", timeout=60,   # noqa: E731
                                     json={"text": "stop strings", "sampling_params": sp}).json()
    text = generate(greedy)["text"]
    stop = next((c for c in text if c.isprintable() and c != " "), None)
    assert stop is not None, f"greedy text without a printable character: {text!r}"
    cut = text.index(stop)
    assert generate({**greedy, "stop": stop})["text"] == text[:cut]
    assert generate({**greedy, "stop": stop, "no_stop_trim": True})["text"] == text[:cut + 1]
    nulls = {"json_schema": None, "regex": None, "ebnf": None, "logit_bias": None, "custom_params": None,
             "spaces_between_special_tokens": False}
    assert generate({**greedy, **nulls})["text"] == text
    r = httpx.post(f"{server.url}/generate", json={"text": "x", "sampling_params": {"regex": "a+"}}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.regex"
