"""Log-probabilities through the server: the official `openai` client parses chat and completion
logprobs (streaming and not), /generate returns SGLang's meta_info shapes, and the served values equal
a reference forward of the same model in this process (log_softmax of logits / temperature, greedy as
temperature 1: SGLang's Sampler.forward in python/sglang/srt/layers/sampler.py)."""
from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.engine.forward_batch import ForwardBatch  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from tests.server.server_process import engine_overrides  # noqa: E402

MODEL = "tiny_mla_moe"
TOL = 1e-4


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference():
    """The served model's weights (same dummy seed), run through the torch reference path here."""
    core = build_core(compose_config(engine_overrides()))
    return ModelRunner(dict(core.model.hf_config), 512, device="cpu", dtype="float32")


def generate(server, **body) -> dict:
    r = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def reference_log_softmax(runner: ModelRunner, prompt: list[int], outputs: list[int],
                          temperature: float) -> list[list[float]]:
    """Per output index: log_softmax(logits / temperature) of the prompt and the outputs before it."""
    seqs, offset = [], 0
    for i in range(len(outputs)):
        ids = prompt + outputs[:i]
        seqs.append((ids, 0, list(range(offset, offset + len(ids)))))
        offset += len(ids)
    logits = runner.forward(ForwardBatch.build(seqs, runner.device), path="reference").double()   # [N, V]
    return torch.log_softmax(logits / temperature, dim=-1).tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_generate_logprobs_equal_a_reference_forward(server, reference, temperature):
    prompt = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]
    out = generate(server, input_ids=prompt, return_logprob=True, top_logprobs_num=4,
                   sampling_params={"max_new_tokens": 8, "temperature": temperature, "seed": 5, "ignore_eos": True})
    meta, ids = out["meta_info"], out["output_ids"]
    ref = reference_log_softmax(reference, prompt, ids, temperature if temperature > 0 else 1.0)
    assert len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) == len(ids) == 8
    for i, ((logprob, token, text), top) in enumerate(zip(meta["output_token_logprobs"], meta["output_top_logprobs"])):
        assert token == ids[i] and text is None
        assert abs(logprob - ref[i][token]) < TOL
        assert [t for _, t, _ in top] == sorted(range(len(ref[i])), key=lambda v: -ref[i][v])[:4]
        assert all(abs(v - ref[i][t]) < TOL for v, t, _ in top)
        if temperature == 0:
            assert top[0][1] == token and top[0][0] == logprob


def test_generate_shapes_text_and_streaming(any_server):
    server = any_server                                  # the tokens' text: from either detokenizer mode
    body = dict(text="shapes", return_logprob=True, return_text_in_logprobs=True,
                sampling_params={"max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
    whole = generate(server, **body)
    meta = whole["meta_info"]
    assert "output_top_logprobs" not in meta                               # top_logprobs_num 0, as SGLang
    assert [t for _, t, _ in meta["output_token_logprobs"]] == whole["output_ids"]
    assert all(isinstance(text, str) for _, _, text in meta["output_token_logprobs"])
    assert "logprob" not in str(generate(server, text="plain", sampling_params={"max_new_tokens": 2})["meta_info"])
    with httpx.stream("POST", f"{server.url}/generate", json={**body, "stream": True}, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in last] == whole["output_ids"]
    assert all(abs(a[0] - b[0]) < TOL for a, b in zip(last, meta["output_token_logprobs"]))


def _chat_args(**extra) -> dict:
    return dict(model=MODEL, messages=[{"role": "user", "content": "logprobs please"}], max_tokens=10,
                temperature=0, extra_body={"ignore_eos": True}, **extra)


def test_chat_logprobs_with_the_openai_client(any_server):
    client = openai.OpenAI(base_url=f"{any_server.url}/v1", api_key="none", max_retries=0, timeout=60)
    out = client.chat.completions.create(**_chat_args(logprobs=True, top_logprobs=3))
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 10
    for entry in content:
        tops = entry.top_logprobs
        assert len(tops) == 3 and [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert (tops[0].token, tops[0].logprob, tops[0].bytes) == (entry.token, entry.logprob, entry.bytes)
        assert isinstance(entry.bytes, list) and entry.logprob <= 0
    plain = client.chat.completions.create(**_chat_args(logprobs=True))
    assert [e.top_logprobs for e in plain.choices[0].logprobs.content] == [[]] * 10
    assert client.chat.completions.create(**_chat_args()).choices[0].logprobs is None

    chunks = list(client.chat.completions.create(**_chat_args(logprobs=True, top_logprobs=3), stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(abs(a.logprob - b.logprob) < TOL for a, b in zip(streamed, content))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == out.choices[0].message.content


def test_completion_logprobs_with_the_openai_client(client):
    args = dict(model=MODEL, prompt="count: 1 2 3", max_tokens=12, temperature=0, logprobs=2,
                extra_body={"ignore_eos": True})
    out = client.completions.create(**args)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 12
    assert lp.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 2
        assert top[token] == value                                        # greedy: the top token is the one sampled
    chunks = list(client.completions.create(**args, stream=True))
    blocks = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert [t for b in blocks for t in b.tokens] == lp.tokens
    assert [o for b in blocks for o in b.text_offset] == lp.text_offset
    assert all(abs(a - b) < TOL for a, b in zip([v for b in blocks for v in b.token_logprobs], lp.token_logprobs))
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text
    assert client.completions.create(**{**args, "logprobs": None}).choices[0].logprobs is None


@pytest.mark.parametrize("name, path, body, param", [
    ("top_logprobs 21", "/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("top_logprobs negative", "/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("logprobs an int", "/v1/chat/completions", {"logprobs": 1}, "logprobs"),
    ("top_logprobs a string", "/v1/chat/completions", {"logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
    ("completion logprobs 6", "/v1/completions", {"logprobs": 6}, "logprobs"),
    ("completion logprobs negative", "/v1/completions", {"logprobs": -1}, "logprobs"),
    ("completion logprobs a bool", "/v1/completions", {"logprobs": True}, "logprobs"),
    ("logprob_start_len past the prompt", "/generate", {"return_logprob": True, "logprob_start_len": 9},
     "logprob_start_len"),
    ("logprob_start_len -2", "/generate", {"return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    ("top_logprobs_num 21", "/generate", {"return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
    ("token_ids_logprob", "/generate", {"return_logprob": True, "token_ids_logprob": [1, 2]}, "token_ids_logprob"),
    ("n = 0 with logprobs", "/v1/chat/completions", {"logprobs": True, "n": 0}, "n"),
])
def test_invalid_logprob_requests_are_openai_errors(server, name, path, body, param):
    base = {"/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            "/v1/completions": {"model": MODEL, "prompt": "hi"}, "/generate": {"text": "hi"}}[path]
    r = httpx.post(f"{server.url}{path}", json={**base, **body}, timeout=30)
    assert r.status_code == 400, (name, r.text)
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    if name == "logprob_start_len past the prompt":
        assert "the prompt has 3 tokens" in err["message"]


# -- prompt tokens (SGLang's input_token_logprobs; completions echo) -------------------------------
def reference_prompt_log_softmax(runner: ModelRunner, prompt: list[int]) -> list[list[float]]:
    """log_softmax of a plain forward's logits at every prompt position (no temperature: SGLang
    reports prompt tokens unscaled)."""
    fb = ForwardBatch.build([(prompt, 0, list(range(len(prompt))))], runner.device)
    logits = runner.model.compute_logits(runner.model.hidden_states(fb, runner.pool)).double()    # [L, V]
    return torch.log_softmax(logits, dim=-1).tolist()


PROMPT = [(11 * j) % 90 + 32 for j in range(24)]                 # printable ASCII: one character each


@pytest.mark.parametrize("stream", [False, True])
def test_generate_input_token_logprobs_equal_a_full_forward(server, reference, stream):
    body = dict(input_ids=PROMPT, return_logprob=True, logprob_start_len=3, top_logprobs_num=2, stream=stream,
                sampling_params={"max_new_tokens": 4, "temperature": 0.7, "seed": 3, "ignore_eos": True})
    if stream:
        with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert all("input_token_logprobs" in e["meta_info"] for e in events)   # from the first chunk on
        meta = events[-1]["meta_info"]
    else:
        meta = generate(server, **body)["meta_info"]
    ref = reference_prompt_log_softmax(reference, PROMPT)
    entries, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert [t for _, t, _ in entries] == PROMPT[3:] and entries[0][0] is None and tops[0] is None
    for k in range(1, len(entries)):                          # token PROMPT[3 + k] given the ones before it
        row = ref[3 + k - 1]
        assert abs(entries[k][0] - row[PROMPT[3 + k]]) < TOL
        assert [t for _, t, _ in tops[k]] == sorted(range(len(row)), key=lambda v: -row[v])[:2]
    assert len(meta["output_token_logprobs"]) == 4


def test_generate_default_start_reports_the_last_prompt_token_only(server):
    meta = generate(server, input_ids=PROMPT, return_logprob=True,
                    sampling_params={"max_new_tokens": 2, "ignore_eos": True})["meta_info"]
    assert meta["input_token_logprobs"] == [[None, PROMPT[-1], None]]          # SGLang's logprob_start_len=-1


def test_completion_echo_with_logprobs_through_the_openai_client(client, reference):
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, echo=True,
                extra_body={"ignore_eos": True})
    out = client.completions.create(**args)
    plain = client.completions.create(**{**args, "echo": False})
    prompt_text = "".join(map(chr, PROMPT))                                    # the byte tokenizer's text
    assert out.choices[0].text == prompt_text + plain.choices[0].text
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(PROMPT) + 5 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = reference_prompt_log_softmax(reference, PROMPT)
    assert all(abs(lp.token_logprobs[k] - ref[k - 1][PROMPT[k]]) < TOL for k in range(1, len(PROMPT)))
    assert all(abs(a - b) < TOL for a, b in zip(lp.token_logprobs[len(PROMPT):], plain.choices[0].logprobs.token_logprobs))
    chunks = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text
    blocks = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert [t for b in blocks for t in b.tokens] == lp.tokens
    assert [o for b in blocks for o in b.text_offset] == lp.text_offset
    assert client.completions.create(**{**args, "logprobs": None}).choices[0].text == out.choices[0].text
