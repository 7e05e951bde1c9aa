"""SGLang's OpenAI-server test cases, replayed against `mode=serve` (tiny model, CPU) with the official `openai`
client and plain HTTP. Each test names the SGLang test it mirrors (files under SGLang's test/srt/ or
test/registered/); sizes are scaled to the tiny model's 2048-token context, and features this server does not
have (constrained decoding, custom logit processors) are checked to be refused with a 400 naming the parameter.
SGLang's native /generate cases: test_sglang_compat_generate.py."""
from __future__ import annotations

import itertools
import json

import httpx
import pytest

openai = pytest.importorskip("openai")

from runtime.server.tokenizer import ByteTokenizer  # noqa: E402

MODEL = "tiny_mla_moe"
PROMPT = "The capital of France is"
CHAT = [{"role": "system", "content": "You are a helpful AI assistant"},
        {"role": "user", "content": "What is the capital of France?"}]
TOKENIZER = ByteTokenizer(512)
EOS = ByteTokenizer.EOS


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-123456", max_retries=0, timeout=120)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def generate(server, **body) -> dict | list:
    r = post(server, "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(response: httpx.Response) -> list[dict]:
    """The JSON events of a server-sent stream; it must end with `data: [DONE]`."""
    lines = [line for line in response.text.splitlines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def completion_cases():
    """run_completion's grid: (echo, logprobs, n, prompt, number of prompts) over echo x logprobs x list input x
    n x token input."""
    ids = TOKENIZER.encode(PROMPT)
    for echo, logprobs, use_list, n, token_input in itertools.product((False, True), (None, 5), (True, False),
                                                                      (1, 2), (False, True)):
        one = ids if token_input else PROMPT
        yield (echo, logprobs, n, *(([one, one], 2) if use_list else (one, 1)))


def refused(response: httpx.Response, param: str) -> None:
    """A 400 with an OpenAI error object naming `param`."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"], error


# ---- test_openai_server.py :: TestOpenAIServer ------------------------------------------------------

def test_completion(client):
    """test_openai_server.py::TestOpenAIServer.test_completion (run_completion): echo x logprobs x list input
    x n x token input; choices, echoed prompt, integer logprobs with prompt entries under echo, usage."""
    ids = TOKENIZER.encode(PROMPT)
    for echo, logprobs, n, prompt, num_prompts in completion_cases():
        out = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=32,
                                        echo=echo, logprobs=logprobs, n=n)
        assert len(out.choices) == num_prompts * n
        assert sorted(c.index for c in out.choices) == list(range(num_prompts * n))
        if echo:
            assert out.choices[0].text.startswith(PROMPT)
        if logprobs:
            lp = out.choices[0].logprobs
            assert isinstance(lp.tokens[0], str)
            assert isinstance(lp.top_logprobs[1], dict) and len(lp.top_logprobs[1]) > 0
            if echo:               # the first prompt token has nothing before it
                assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
                assert len(lp.tokens) == len(ids) + out.usage.completion_tokens // (num_prompts * n)
            else:
                assert lp.token_logprobs[0]
        assert out.id and out.created
        assert out.usage.prompt_tokens == len(ids) * num_prompts      # each prompt once, not n times
        assert out.usage.completion_tokens > 0
        assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_completion_stream(client):
    """test_openai_server.py::TestOpenAIServer.test_completion_stream (run_completion_stream): every chunk
    with logprobs has tokens (top_logprobs dicts but in an echoed first chunk), the first chunk of each
    choice starts with the echoed prompt, every index appears, one final usage chunk with no choices."""
    ids = TOKENIZER.encode(PROMPT)
    for echo, logprobs, n, prompt, num_prompts in completion_cases():
        chunks = list(client.completions.create(
            model=MODEL, prompt=prompt, temperature=0, max_tokens=32, echo=echo, logprobs=logprobs,
            n=n, stream=True, stream_options={"include_usage": True}))
        usage = [c for c in chunks if c.usage is not None]
        assert len(usage) == 1 and chunks[-1] is usage[0] and usage[0].choices == []
        assert usage[0].usage.prompt_tokens == len(ids) * num_prompts
        assert usage[0].usage.completion_tokens > 0
        firsts, finishes = set(), []
        for chunk in chunks[:-1]:
            assert chunk.id and chunk.created and len(chunk.choices) == 1
            c = chunk.choices[0]
            first = c.index not in firsts
            if logprobs:
                assert c.logprobs and isinstance(c.logprobs.tokens[0], str)
                if not (first and echo):
                    assert isinstance(c.logprobs.top_logprobs[0], dict) and c.logprobs.top_logprobs[0]
            if first and echo:
                assert c.text.startswith(PROMPT)
            firsts.add(c.index)
            if c.finish_reason is not None:
                finishes.append(c.index)
        assert firsts == set(range(num_prompts * n)) and sorted(finishes) == sorted(firsts)


def test_chat_completion(client):
    """test_openai_server.py::TestOpenAIServer.test_chat_completion (run_chat_completion): top_logprobs gives
    exactly that many entries per token, n choices, the assistant role, usage (max_tokens given here: the
    absent case is test_chat_without_max_tokens_runs_to_the_context)."""
    for logprobs in (None, 5):
        for n in (1, 2):
            out = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=32,
                                                 logprobs=logprobs is not None, top_logprobs=logprobs, n=n)
            if logprobs:
                content = out.choices[0].logprobs.content
                assert isinstance(content[0].top_logprobs[0].token, str)
                assert all(len(entry.top_logprobs) == logprobs for entry in content)
            else:
                assert out.choices[0].logprobs is None
            assert len(out.choices) == n
            assert out.choices[0].message.role == "assistant" and isinstance(out.choices[0].message.content, str)
            assert out.id and out.created
            assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens > 0 and out.usage.total_tokens > 0


def test_chat_without_max_tokens_runs_to_the_context(client):
    """test_openai_server.py::TestOpenAIServer.run_chat_completion sends no max_tokens: the completion may
    then run up to the model's context (a long prompt keeps it short on CPU)."""
    messages = [{"role": "user", "content": "x" * 1990}]
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0)
    context = client.models.list().data[0].max_model_len
    assert out.usage.total_tokens <= context
    if out.choices[0].finish_reason == "length":
        assert out.usage.total_tokens == context


def test_chat_completion_stream(client):
    """test_openai_server.py::TestOpenAIServer.test_chat_completion_stream (run_chat_completion_stream): the
    first chunk of each choice carries the assistant role, every content chunk its tokens' top_logprobs
    (exactly as many as asked), each choice exactly one finish_reason, then one usage chunk."""
    for logprobs in (None, 5):
        for n in (1, 2):
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=CHAT, temperature=0, max_tokens=32, logprobs=logprobs is not None,
                top_logprobs=logprobs, n=n, stream=True, stream_options={"include_usage": True}))
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
            assert all(c.usage is None for c in chunks[:-1])
            firsts, finishes = set(), {}
            for chunk in chunks[:-1]:
                c = chunk.choices[0]
                if c.finish_reason is not None:
                    finishes[c.index] = finishes.get(c.index, 0) + 1
                if c.index not in firsts:
                    assert c.delta.role == "assistant"
                    firsts.add(c.index)
                    continue
                if logprobs and c.finish_reason is None:
                    top = c.logprobs.content[0].top_logprobs
                    assert isinstance(top[0].token, str) and len(top) == logprobs
                assert isinstance(c.delta.content, str) or c.finish_reason
                assert chunk.id and chunk.created
            assert firsts == set(range(n)) and finishes == {i: 1 for i in range(n)}


def test_penalty(client):
    """test_openai_server.py::TestOpenAIServer.test_penalty: frequency_penalty on a chat request."""
    out = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=32,
                                         frequency_penalty=1.0)
    assert isinstance(out.choices[0].message.content, str)


def test_response_prefill(server, client):
    """test_openai_server.py::TestOpenAIServer.test_response_prefill: continue_final_message continues the
    last assistant message (rendered open, no generation prompt) instead of starting a new one."""
    messages = [{"role": "user", "content": "Extract the name as JSON"}, {"role": "assistant", "content": "{\n"}]
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8,
                                         extra_body={"continue_final_message": True, "ignore_eos": True})
    rendered = TOKENIZER.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)
    assert rendered.endswith("<|assistant|>\n{\n")
    assert out.usage.prompt_tokens == len(TOKENIZER.encode(rendered, add_special_tokens=False))
    native = generate(server, input_ids=TOKENIZER.encode(rendered, add_special_tokens=False),
                      sampling_params={"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert out.choices[0].message.content == native["text"]
    refused(post(server, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "continue_final_message": True}),
            "continue_final_message")


def test_model_list(client):
    """test_openai_server.py::TestOpenAIServer.test_model_list: one model, with an integer max_model_len."""
    models = list(client.models.list())
    assert len(models) == 1 and isinstance(getattr(models[0], "max_model_len", None), int)


def test_retrieve_model(client):
    """test_openai_server.py::TestOpenAIServer.test_retrieve_model: id and root; an unknown model is a 404."""
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.root == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("non-existent-model")


# ---- constrained decoding and other SGLang extensions: refused -------------------------------------

@pytest.mark.parametrize("field, value", [
    ("regex", r"\{\n   \"name\": \"[\w]+\"\n\}"),   # test_openai_server.py::TestOpenAIServer.test_regex
    ("ebnf", 'root ::= "Hello" | "Hi"'),         # test_openai_server_ebnf.py::TestOpenAIServerEBNF
    ("json_schema", '{"type": "object"}'),        # test_json_constrained.py
    ("stop_regex", r"and|or"),                    # test_matched_stop.py::TestMatchedStop.test_finish_stop_regex_str
    ("custom_logit_processor", "{}"),             # test_srt_endpoint.py::TestSRTEndpoint.test_custom_logit_processor
])
def test_unsupported_extensions_are_refused(server, client, field, value):
    """Constrained decoding and custom logit processors are not part of this server: a 400 naming the
    parameter (OpenAI's BadRequestError), on both OpenAI endpoints, never a silently unconstrained answer."""
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, extra_body={field: value})
    assert field in str(err.value)
    refused(post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, field: value}), field)


def test_json_mode_is_refused(client):
    """test_json_mode.py::JSONModeMixin.test_json_mode_response: response_format json_object needs
    constrained decoding; refused with a 400 naming response_format (streamed or not)."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, stream=stream,
                                           response_format={"type": "json_object"})
        assert "response_format" in str(err.value)


# ---- validation/ ------------------------------------------------------------------------------------

def test_strict_model_validation(client):
    """test_strict_model_validation.py::TestStrictModelValidation: a generation request naming another
    model is a 400 saying which model is served."""
    for create in (lambda: client.chat.completions.create(model="wrong_model_name", messages=CHAT, max_tokens=4),
                   lambda: client.completions.create(model="wrong_model_name", prompt="hi", max_tokens=4)):
        with pytest.raises(openai.BadRequestError) as err:
            create()
        assert "The model `wrong_model_name` does not exist" in str(err.value)
        assert f"The served model name is `{MODEL}`" in str(err.value)


def test_request_length_validation(client):
    """test_request_length_validation.py::TestRequestLengthValidation: a prompt over the context (streamed or
    not) and a max_tokens over it are 400s saying so."""
    long_text = "hello " * 400                                 # > 2048 byte tokens
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_text}],
                                           temperature=0, stream=stream)
        assert "is longer than the model's context length" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello "}], temperature=0,
                                       max_tokens=3000)
    assert "max_completion_tokens is too large" in str(err.value)


def _greedy_stop_string(client) -> tuple[str, str]:
    text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    printable = [i for i in range(2, len(text) - 2) if text[i:i + 2].isprintable() and "\ufffd" not in text[i:i + 2]]
    if not printable:
        pytest.skip("the dummy model produced no printable text for a stop string")
    stop = text[printable[len(printable) // 2]:][:2]
    return stop, text[:text.find(stop)]


def test_matched_stop(server, client):
    """test_matched_stop.py::TestMatchedStop: finish_reason and matched_stop of completions and chat choices:
    the stop string, the EOS token id, None for length."""
    stop, cut = _greedy_stop_string(client)
    out = post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "temperature": 0, "top_p": 1,
                                            "max_tokens": 48, "stop": stop, "ignore_eos": True}).json()
    assert (out["choices"][0]["finish_reason"], out["choices"][0]["matched_stop"]) == ("stop", stop)
    assert out["choices"][0]["text"] == cut
    eos_bias = {"logit_bias": {str(EOS): 100}}
    for path, body in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": CHAT})):
        base = {"model": MODEL, "temperature": 0, "top_p": 1, **body}
        out = post(server, path, {**base, "max_tokens": 100, **eos_bias}).json()
        assert (out["choices"][0]["finish_reason"], out["choices"][0]["matched_stop"]) == ("stop", EOS)
        out = post(server, path, {**base, "max_tokens": 5, "ignore_eos": True}).json()
        assert (out["choices"][0]["finish_reason"], out["choices"][0]["matched_stop"]) == ("length", None)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=0, stop=[stop],
                                            stream=True, extra_body={"ignore_eos": True}))
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].matched_stop == stop


def test_ignore_eos(client):
    """test_openai_server_ignore_eos.py::TestOpenAIServerIgnoreEOS.test_ignore_eos: with ignore_eos the
    completion runs to max_tokens (finish_reason length) where it would otherwise stop at EOS."""
    kw = dict(model=MODEL, messages=CHAT, temperature=0, max_tokens=20, logit_bias={str(EOS): 5})
    default = client.chat.completions.create(**kw, extra_body={"ignore_eos": False})
    ignored = client.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    assert ignored.choices[0].finish_reason == "length" and ignored.usage.completion_tokens == 20
    assert ignored.usage.completion_tokens >= default.usage.completion_tokens


# ---- features/ --------------------------------------------------------------------------------------

def test_continuous_usage_stats(client):
    """test_continuous_usage_stats.py::TestContinuousUsageStats: with continuous_usage_stats every chunk
    carries the usage so far; without it only the final usage chunk (no choices) does."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "What is machine learning?"}], stream=True,
              max_tokens=30, temperature=0)
    chunks = list(client.chat.completions.create(**kw, stream_options={"include_usage": True,
                                                                       "continuous_usage_stats": True}))
    with_content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    with_usage = [c for c in chunks if c.usage]
    assert with_content and len(with_usage) >= len(with_content)
    completions = [c.usage.completion_tokens for c in with_usage]
    assert completions == sorted(completions)
    last = with_usage[-1].usage
    assert last.prompt_tokens > 0 and last.completion_tokens == 30
    assert last.total_tokens == last.prompt_tokens + last.completion_tokens
    chunks = list(client.chat.completions.create(**kw, stream_options={"include_usage": True,
                                                                       "continuous_usage_stats": False}))
    usage = [c for c in chunks if c.usage]
    assert len(usage) == 1 and usage[0].choices == []


def test_cache_report(client):
    """test_cache_report.py: usage.prompt_tokens_details.cached_tokens counts the prompt's reused prefix."""
    messages = [{"role": "user", "content": "cache report " * 20}]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
