"""Malformed requests each get a 4xx with an OpenAI-style JSON error; the server keeps serving."""
from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi")

MODEL = "tiny_mla_moe"
CHAT, COMPLETIONS, GENERATE = "/v1/chat/completions", "/v1/completions", "/generate"
USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return {"model": MODEL, "messages": USER, **fields}


def completion(**fields):
    return {"model": MODEL, "prompt": "hi", **fields}


BAD = [  # (id, method, path, body: dict | raw bytes)
    ("missing messages", "POST", CHAT, {"model": MODEL}),
    ("empty messages", "POST", CHAT, chat(messages=[])),
    ("bad role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}])),
    ("message without role", "POST", CHAT, chat(messages=[{"content": "hi"}])),
    ("messages not a list", "POST", CHAT, chat(messages="hello")),
    ("image content", "POST", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}])),
    ("negative max_tokens", "POST", CHAT, chat(max_tokens=-1)),
    ("zero max_tokens", "POST", COMPLETIONS, completion(max_tokens=0)),
    ("huge max_tokens", "POST", CHAT, chat(max_tokens=10**9)),
    ("two different max token limits", "POST", CHAT, chat(max_tokens=4, max_completion_tokens=8)),
    ("prompt over the context", "POST", COMPLETIONS, completion(prompt="a" * 3000)),
    ("ids prompt over the context", "POST", COMPLETIONS, completion(prompt=[65] * 2100)),
    ("temperature < 0", "POST", CHAT, chat(temperature=-0.5)),
    ("top_p > 1", "POST", CHAT, chat(top_p=1.5)),
    ("top_p = 0", "POST", COMPLETIONS, completion(top_p=0.0)),
    ("top_k = 0", "POST", COMPLETIONS, completion(top_k=0)),
    ("min_p > 1", "POST", COMPLETIONS, completion(min_p=2.0)),
    ("max_tokens a string", "POST", CHAT, chat(max_tokens="ten")),
    ("stream a string", "POST", CHAT, chat(stream="yes")),
    ("seed a string", "POST", COMPLETIONS, completion(seed="x")),
    ("temperature a string", "POST", COMPLETIONS, completion(temperature="hot")),
    ("invalid JSON", "POST", CHAT, b'{"model": "tiny_mla_moe", "messages": [}'),
    ("body a JSON array", "POST", CHAT, b"[1, 2]"),
    ("empty body", "POST", COMPLETIONS, b""),
    ("unknown model", "POST", CHAT, {**chat(), "model": "gpt-9"}),
    ("missing model", "POST", COMPLETIONS, {"prompt": "hi"}),
    ("n = 0", "POST", CHAT, chat(n=0)),
    ("n over the choice limit", "POST", COMPLETIONS, completion(n=129)),
    ("empty prompt", "POST", COMPLETIONS, completion(prompt="")),
    ("empty ids prompt", "POST", COMPLETIONS, completion(prompt=[])),
    ("token id outside the vocab", "POST", COMPLETIONS, completion(prompt=[1, 100000])),
    ("batch x n over the choice limit", "POST", COMPLETIONS, completion(prompt=["a", "b"], n=65)),
    ("empty stop string", "POST", COMPLETIONS, completion(stop=[""])),
    ("stream_options without stream", "POST", CHAT, chat(stream_options={"include_usage": True})),
    ("top_logprobs over 20", "POST", CHAT, chat(logprobs=True, top_logprobs=21)),
    ("logprob_start_len past the prompt", "POST", GENERATE, {"text": "a", "return_logprob": True, "logprob_start_len": 9}),
    ("presence penalty over 2", "POST", CHAT, chat(presence_penalty=2.5)),
    ("repetition penalty 0", "POST", GENERATE, {"text": "a", "sampling_params": {"repetition_penalty": 0}}),
    ("generate with text and ids", "POST", GENERATE, {"text": "a", "input_ids": [1, 2]}),
    ("generate with neither", "POST", GENERATE, {"sampling_params": {"max_new_tokens": 4}}),
    ("generate unknown sampling key", "POST", GENERATE, {"text": "a", "sampling_params": {"max_tokens": 4}}),
    ("generate max_new_tokens 0", "POST", GENERATE, {"text": "a", "sampling_params": {"max_new_tokens": 0}}),
    ("abort without rid", "POST", "/abort_request", {}),
    ("unknown route", "POST", "/v1/embeddings", {"input": "x"}),
    ("wrong method", "GET", CHAT, None),
]


def send(server, method: str, path: str, body) -> httpx.Response:
    kwargs = {"content": body} if isinstance(body, bytes) else ({"json": body} if body is not None else {})
    return httpx.request(method, f"{server.url}{path}", timeout=30, headers={"content-type": "application/json"},
                         **kwargs)


def test_malformed_requests_get_openai_errors_and_the_server_keeps_serving(server):
    assert len(BAD) >= 20
    failures = []
    for name, method, path, body in BAD:
        r = send(server, method, path, body)
        try:
            err = r.json()["error"]
            ok = 400 <= r.status_code < 500 and isinstance(err["message"], str) and err["message"] \
                and isinstance(err["type"], str) and "param" in err and "code" in err
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            failures.append(f"{name}: {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)
    good = send(server, "POST", COMPLETIONS, completion(max_tokens=4, ignore_eos=True))
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 4
    info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()["scheduler"]
    assert info["num_in_flight"] == 0


def test_errors_name_the_parameter(server):
    r = send(server, "POST", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]))
    assert r.json()["error"]["param"] == "messages.0.role"
    r = send(server, "POST", CHAT, {**chat(), "model": "gpt-9"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_found"   # SGLang's status
    r = send(server, "POST", COMPLETIONS, completion(prompt="a" * 3000))
    assert r.json()["error"]["code"] == "context_length_exceeded"
