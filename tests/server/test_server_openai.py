"""The official `openai` client against `mode=serve`: chat and completions, streaming and not, and
greedy output equal to the offline Engine's for the same prompt; every test with the detokenizer process
(first outputs straight to the HTTP worker, or all through the process) and with detokenization in the HTTP
worker (server.detokenizer=process / inline)."""
from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")

from experiments.compose import compose_config  # noqa: E402
from runtime.server.tokenizer import ByteTokenizer  # noqa: E402
from tests.server.conftest import DETOKENIZER_MODES, server_of  # noqa: E402
from tests.server.server_process import engine_overrides  # noqa: E402

MODEL = "tiny_mla_moe"


@pytest.fixture(scope="module", params=DETOKENIZER_MODES)
def server(request, server):
    """The shared server of each detokenizer mode (the module's tests run against each)."""
    return server if request.param == "process" else server_of(request, request.param)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def engine():
    from runtime.engine.engine import Engine

    return Engine(compose_config(engine_overrides()))


def flush(server) -> None:
    """A cold radix cache, so the server's prefill is the Engine's (no prefix reuse)."""
    assert httpx.post(f"{server.url}/flush_cache", timeout=30).status_code == 200


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_greedy_equals_engine(server, client, engine):
    prompt = "The capital of twinserve is"
    flush(server)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    ref = engine.generate(prompt, {"max_new_tokens": 24, "temperature": 0.0})
    choice = out.choices[0]
    assert choice.text == ref["text"]
    assert choice.finish_reason == ref["meta_info"]["finish_reason"]
    assert out.usage.completion_tokens == ref["meta_info"]["completion_tokens"]
    assert out.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]
    flush(server)
    native = httpx.post(f"{server.url}/generate", json={"text": prompt, "sampling_params": {
        "max_new_tokens": 24, "temperature": 0}}, timeout=60).json()
    assert native["output_ids"] == ref["token_ids"]
    assert native["meta_info"]["finish_reason"]["type"] == ref["meta_info"]["finish_reason"]


def test_chat_greedy_equals_engine_on_the_templated_prompt(server, client, engine):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    tok = ByteTokenizer(512)
    ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    flush(server)
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                         extra_body={"ignore_eos": True})
    ref = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 20, "temperature": 0.0,
                                                          "ignore_eos": True})
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref["text"]
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 20)


def test_chat_streaming_concatenates_to_the_non_streamed_text(client):
    messages = [{"role": "user", "content": "stream me"}]
    args = dict(model=MODEL, messages=messages, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0      # the same prompt ran just before


def test_completion_streaming(client):
    stream = client.completions.create(model=MODEL, prompt="count: 1 2 3", max_tokens=12, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    whole = client.completions.create(model=MODEL, prompt="count: 1 2 3", max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert 1 <= len(chunks) <= 12


def test_stop_string_ends_the_request_and_is_not_returned(server, client):
    """Greedy output of an ids prompt, then the same request with a stop string cut from its text."""
    prompt = [5, 104, 105, 33, 10, 72, 101]
    base = httpx.post(f"{server.url}/generate", json={"input_ids": prompt, "sampling_params": {
        "max_new_tokens": 64, "temperature": 0, "ignore_eos": True}}, timeout=60).json()
    text = base["text"]
    if len(text) < 4:
        pytest.skip("the dummy model produced too little text for a stop string")
    stop = text[len(text) // 2: len(text) // 2 + 2]
    cut = text[:text.find(stop)]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == cut
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens < 64
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, temperature=0, stop=stop,
                                         stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_seeded_sampling_is_reproducible(client):
    args = dict(model=MODEL, prompt="roll the dice", max_tokens=16, temperature=1.0, top_p=0.9,
                seed=1234, extra_body={"ignore_eos": True, "min_p": 0.01, "top_k": 50})
    first = client.completions.create(**args)
    assert client.completions.create(**args).choices[0].text == first.choices[0].text


def test_penalties_reach_the_sampler(client, server):
    """frequency/presence (OpenAI) and repetition (SGLang) penalties change a greedy generation."""
    kw = dict(model=MODEL, prompt="penalties", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(**kw).choices[0].text
    assert client.completions.create(**kw, frequency_penalty=2.0, presence_penalty=1.0).choices[0].text != plain
    native = lambda sp: httpx.post(f"{server.url}/generate", timeout=60, json={   # noqa: E731
        "text": "penalties", "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True, **sp}}).json()
    assert native({"repetition_penalty": 2.0})["output_ids"] != native({})["output_ids"]
    assert native({"min_new_tokens": 8, "max_new_tokens": 8})["meta_info"]["completion_tokens"] == 8
    out = client.completions.create(model=MODEL, prompt="min", max_tokens=6, temperature=0, extra_body={"min_tokens": 6})
    assert out.usage.completion_tokens == 6
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="min", max_tokens=2, extra_body={"min_tokens": 3})


def test_logit_bias_steers_greedy_tokens(client, server):
    """OpenAI's logit_bias (and the native sampling_params.logit_bias): +100 on a token makes greedy pick it."""
    out = client.completions.create(model=MODEL, prompt="bias", max_tokens=6, temperature=0, logit_bias={"66": 100},
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == "B" * 6                          # byte tokenizer: id 66 is "B"
    native = httpx.post(f"{server.url}/generate", timeout=60, json={"text": "bias", "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "logit_bias": {"67": 100.0}}}).json()
    assert native["output_ids"] == [67] * 4
    for bad in ({"x": 1}, {"66": 101}, {"999999": 1}):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt="bias", max_tokens=2, logit_bias=bad)
