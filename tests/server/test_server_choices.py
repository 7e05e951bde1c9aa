"""Several choices per request through the official `openai` client: `n` (chat and completions) and batched
prompts (completions), whole and streamed. Choices are indexed prompt-major (prompt index * n + j, as OpenAI
and SGLang's adapters do), each is an independent request (greedy choices of one prompt agree, and a choice
equals the same prompt sent alone), usage counts each prompt once and every choice's tokens."""
from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")

MODEL = "tiny_mla_moe"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def alone(client, prompt, **kw) -> str:
    return client.completions.create(model=MODEL, prompt=prompt, temperature=0, **kw).choices[0].text


def test_batched_prompts_with_n_answer_every_choice_in_order(client):
    prompts = ["first prompt", "the second, longer prompt"]
    out = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    texts = [c.text for c in out.choices]
    assert texts[0] == texts[1] == alone(client, prompts[0], max_tokens=6, extra_body={"ignore_eos": True})
    assert texts[2] == texts[3] == alone(client, prompts[1], max_tokens=6, extra_body={"ignore_eos": True})
    prompt_tokens = [client.completions.create(model=MODEL, prompt=p, max_tokens=1).usage.prompt_tokens
                     for p in prompts]
    assert out.usage.prompt_tokens == sum(prompt_tokens)                 # each prompt once, not n times
    assert out.usage.completion_tokens == 4 * 6
    assert all(c.finish_reason == "length" for c in out.choices)


def test_token_id_prompts_in_a_batch(client):
    out = client.completions.create(model=MODEL, prompt=[[72, 105], [79, 107, 33]], max_tokens=3, temperature=0)
    assert [c.index for c in out.choices] == [0, 1] and out.usage.prompt_tokens == 5


def test_sampled_choices_with_a_seed_differ_and_repeat(client):
    kw = dict(model=MODEL, prompt="sampled", n=3, max_tokens=12, temperature=1.0, seed=7,
              extra_body={"ignore_eos": True})
    first = [c.text for c in client.completions.create(**kw).choices]
    again = [c.text for c in client.completions.create(**kw).choices]
    assert first == again                                                # seeded: reproducible
    assert len(set(first)) > 1                                           # seed + j per choice: not copies


def test_streamed_chat_with_n_delivers_each_choice_whole(client):
    messages = [{"role": "user", "content": "count"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, n=3, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert [c.index for c in whole.choices] == [0, 1, 2]
    stream = client.chat.completions.create(model=MODEL, messages=messages, n=3, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    texts, roles, finishes, usage = ["", "", ""], [0, 0, 0], [None] * 3, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            roles[c.index] += c.delta.role == "assistant"
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes[c.index]
    assert roles == [1, 1, 1] and finishes == ["length"] * 3
    assert texts == [c.message.content for c in whole.choices]
    assert usage.completion_tokens == 3 * 8 and usage.prompt_tokens == whole.usage.prompt_tokens


def test_streamed_completion_batch_then_the_server_is_idle(server, client):
    stream = client.completions.create(model=MODEL, prompt=["a", "bb", "ccc"], max_tokens=5, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    texts = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert sorted(texts) == [0, 1, 2]
    assert texts[1] == alone(client, "bb", max_tokens=5, extra_body={"ignore_eos": True})
    info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()["scheduler"]
    assert info["num_in_flight"] == 0


def test_a_refused_prompt_in_a_batch_withdraws_the_others(server, client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=["fine", "a" * 3000], max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", n=0, max_tokens=4)
    info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()["scheduler"]
    assert info["num_in_flight"] == 0


def test_each_choice_carries_its_own_logprobs(client):
    out = client.completions.create(model=MODEL, prompt=["one", "two"], n=2, max_tokens=4, temperature=0, logprobs=2,
                                    echo=True, extra_body={"ignore_eos": True})
    for c in out.choices:
        assert c.text.startswith(["one", "two"][c.index // 2])            # echo: each choice its own prompt
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == len(c.logprobs.top_logprobs)
        assert c.logprobs.token_logprobs[0] is None                        # the prompt's first token
    first, second = out.choices[0].logprobs, out.choices[1].logprobs   # the same prompt, greedy: the same tokens
    assert first.tokens == second.tokens and second.token_logprobs[0] is None
    # values within float noise: the two choices may run in batches of different make-up
    assert second.token_logprobs[1:] == pytest.approx(first.token_logprobs[1:], rel=1e-4, abs=1e-5)


def generate(server, body: dict):
    return httpx.post(f"{server.url}/generate", json=body, timeout=60)


def test_native_generate_batches_prompts_and_samples(server):
    greedy = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    single = [generate(server, {"text": t, "sampling_params": greedy}).json() for t in ("hi", "there")]
    assert isinstance(single[0], dict)
    batch = generate(server, {"text": ["hi", "there"], "sampling_params": greedy}).json()
    assert [b["output_ids"] for b in batch] == [s["output_ids"] for s in single]
    n2 = generate(server, {"text": "hi", "sampling_params": {**greedy, "n": 2}}).json()
    assert [b["output_ids"] for b in n2] == [single[0]["output_ids"]] * 2
    per_prompt = generate(server, {"input_ids": [[72, 105], [79, 107, 33]], "rid": ["x", "y"], "sampling_params": [
        {"max_new_tokens": 2, "ignore_eos": True}, {"max_new_tokens": 4, "ignore_eos": True}]}).json()
    assert [b["meta_info"]["completion_tokens"] for b in per_prompt] == [2, 4]
    assert [b["meta_info"]["id"] for b in per_prompt] == ["x", "y"]
    assert [b["meta_info"]["prompt_tokens"] for b in per_prompt] == [2, 3]


def test_native_generate_streams_a_batch_by_index(server):
    body = {"text": ["ab", "cd", "ef"], "stream": True, "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                                                            "ignore_eos": True}}
    last, done = {}, False
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                last[event["index"]] = event
    whole = generate(server, {**body, "stream": False}).json()
    assert done and sorted(last) == [0, 1, 2]
    assert [last[i]["output_ids"] for i in range(3)] == [w["output_ids"] for w in whole]
    assert all(last[i]["meta_info"]["finish_reason"]["type"] == "length" for i in range(3))


def test_native_batch_errors(server):
    assert generate(server, {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}]}).status_code == 400
    assert generate(server, {"text": [], "sampling_params": {"max_new_tokens": 2}}).status_code == 400
    assert generate(server, {"text": ["a", "b"], "rid": ["only-one"]}).status_code == 400
