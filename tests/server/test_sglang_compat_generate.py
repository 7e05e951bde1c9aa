"""SGLang's native-endpoint test cases (test_srt_endpoint.py: /generate, /flush_cache, /get_server_info),
replayed against `mode=serve` (tiny model, CPU) over plain HTTP; each test names the SGLang test it mirrors.
Lengths are scaled to the tiny model's 2048-token context; what this server does not have (grammars, custom
logit processors, scoring with max_new_tokens=0) is checked to be refused with a 400 naming the parameter."""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.test_sglang_compat import PROMPT, TOKENIZER, generate, post, refused, sse_events

pytest.importorskip("fastapi")


def _run_decode(server, return_logprob=False, top_logprobs_num=0, return_text=False, n=1, stream=False,
                batch=False):
    body = {"text": [PROMPT] if batch else PROMPT,
            "sampling_params": {"temperature": 0 if n == 1 else 0.5, "max_new_tokens": 16, "n": n},
            "stream": stream, "return_logprob": return_logprob, "top_logprobs_num": top_logprobs_num,
            "return_text_in_logprobs": return_text, "logprob_start_len": 0}
    r = post(server, "/generate", body)
    assert r.status_code == 200, r.text
    return sse_events(r) if stream else r.json()


def _check_meta(res: dict) -> None:
    meta = res["meta_info"]
    assert {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "e2e_latency"} <= set(meta)
    assert meta["prompt_tokens"] == len(TOKENIZER.encode(PROMPT)) and meta["completion_tokens"] == len(res["output_ids"])
    finish = meta["finish_reason"]
    assert finish["type"] in ("length", "stop") and (finish["type"] != "stop" or "matched" in finish)


def test_simple_decode(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_simple_decode and test_simple_decode_batch."""
    res = _run_decode(server)
    _check_meta(res)
    assert isinstance(res["text"], str)
    batch = _run_decode(server, batch=True)
    assert isinstance(batch, list) and len(batch) == 1 and batch[0]["output_ids"] == res["output_ids"]


def test_parallel_sample(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_parallel_sample and test_parallel_sample_stream: n=3 gives a
    list of 3; streamed, every event is one choice's cumulative body with its index."""
    out = _run_decode(server, n=3)
    assert len(out) == 3
    for res in out:
        _check_meta(res)
    events = _run_decode(server, n=3, stream=True)
    assert {e["index"] for e in events} == {0, 1, 2}
    for index in range(3):
        mine = [e for e in events if e["index"] == index]
        assert all(b["text"].startswith(a["text"]) and b["output_ids"][:len(a["output_ids"])] == a["output_ids"]
                   for a, b in zip(mine, mine[1:]))                    # cumulative
        assert mine[-1]["meta_info"]["finish_reason"] is not None


def test_stream_is_cumulative(server):
    """test_srt_endpoint.py::TestSRTEndpoint.run_decode(stream=True): `data: {...}` events whose text and
    output_ids grow, ending with `data: [DONE]`; only the last has a finish_reason."""
    events = _run_decode(server, stream=True)
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"] is not None
    whole = _run_decode(server)
    assert events[-1]["text"] == whole["text"] and events[-1]["output_ids"] == whole["output_ids"]
    assert [len(e["output_ids"]) for e in events] == sorted(len(e["output_ids"]) for e in events)


def test_logprob(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_logprob: return_logprob, top 5 with text, from position 0."""
    res = _run_decode(server, return_logprob=True, top_logprobs_num=5, return_text=True)
    meta = res["meta_info"]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] and meta["input_token_logprobs"][0][0] is None
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert all(len(top) == 5 for top in meta["output_top_logprobs"])
    assert all(isinstance(entry[2], str) for entry in meta["output_token_logprobs"])
    assert [entry[1] for entry in meta["output_token_logprobs"]] == res["output_ids"]


def test_logprob_start_len(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_logprob_start_len: a batch; input_token_logprobs from the
    given position to the prompt's end, their texts end the prompt, output texts make the text."""
    start, new_tokens = 4, 4
    prompts = ["I have a very good idea on", "Today is a sunndy day and"]
    out = generate(server, text=prompts, sampling_params={"temperature": 0, "max_new_tokens": new_tokens},
                   return_logprob=True, top_logprobs_num=5, return_text_in_logprobs=True, logprob_start_len=start)
    for prompt, res in zip(prompts, out):
        meta = res["meta_info"]
        assert meta["prompt_tokens"] == start + len(meta["input_token_logprobs"])
        assert prompt.endswith("".join(entry[-1] for entry in meta["input_token_logprobs"]))
        assert meta["completion_tokens"] == new_tokens == len(meta["output_token_logprobs"])
        if "\ufffd" not in res["text"]:          # a byte of a character decodes alone as U+FFFD
            assert res["text"] == "".join(entry[-1] for entry in meta["output_token_logprobs"])


def test_logprob_with_chunked_prefill(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_logprob_with_chunked_prefill (a long prompt, scaled to the
    context): greedy, so each output token is its position's top-1 entry, and 5 top entries each."""
    new_tokens = 4
    res = generate(server, text="I have a very good idea on this. " * 50,
                   sampling_params={"temperature": 0, "max_new_tokens": new_tokens},
                   return_logprob=True, logprob_start_len=-1, top_logprobs_num=5)
    meta = res["meta_info"]
    assert meta["completion_tokens"] == new_tokens
    assert len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) == new_tokens
    for sampled, top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert sampled == top[0] and len(top) == 5


def test_logprob_match(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_logprob_match: the output tokens' log-probabilities equal
    those of the same tokens scored as a prompt. SGLang scores with max_new_tokens=0, which this server
    refuses (a 400 naming it); one new token does the same scoring."""
    def run(prompt, max_new_tokens):
        key = "text" if isinstance(prompt, str) else "input_ids"
        return post(server, "/generate", {key: prompt, "return_logprob": True, "return_text_in_logprobs": True,
                                          "logprob_start_len": 0, "sampling_params": {
                                              "temperature": 1.0, "max_new_tokens": max_new_tokens,
                                              "ignore_eos": True, "seed": 3}})
    gen = run("I have a very good idea on how to", 32).json()["meta_info"]
    inputs = [entry[1] for entry in gen["input_token_logprobs"]]
    outputs = [entry[1] for entry in gen["output_token_logprobs"]]
    score = run(inputs + outputs, 1).json()["meta_info"]["input_token_logprobs"][gen["prompt_tokens"]:]
    assert [entry[1] for entry in score] == outputs
    for (served, _, _), (scored, _, _) in zip(gen["output_token_logprobs"], score):
        assert math.isclose(served, scored, abs_tol=1e-3)
    refused(run(inputs, 0), "sampling_params.max_new_tokens")


def test_cache_tokens(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_cache_tokens (lengths scaled to the context): after a flush,
    cached_tokens is the longest cached prefix, never the whole prompt (its last token is always computed)."""
    for _ in range(2):
        assert httpx.post(f"{server.url}/flush_cache", timeout=30).status_code == 200

    def cached(length: int) -> int:
        ids = [1 + i % 250 for i in range(length)]
        return generate(server, input_ids=ids, sampling_params={"max_new_tokens": 1})["meta_info"]["cached_tokens"]

    assert cached(50) == 0
    assert cached(1000) == 50
    assert cached(1000) == 999
    assert cached(500) == 499
    assert cached(1500) == 1000


def test_get_server_info(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_get_server_info and test_get_server_info_concurrent."""
    info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()
    assert isinstance(info["max_total_num_tokens"], int) and isinstance(info["version"], str)
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: httpx.get(f"{server.url}/get_server_info", timeout=30), range(4)))
    assert all(r.status_code == 200 and "max_total_num_tokens" in r.json() for r in replies)


def test_get_model_info(server):
    """SGLang's GET /get_model_info (http_server.py): model_path, tokenizer_path, is_generation."""
    info = httpx.get(f"{server.url}/get_model_info", timeout=30).json()
    assert {"model_path", "tokenizer_path", "is_generation"} <= set(info) and info["is_generation"] is True


def test_logit_bias(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_logit_bias, test_forbidden_token, test_logit_bias_isolation."""
    def sampled(**sp):
        res = generate(server, text=PROMPT, return_logprob=True,
                       sampling_params={"temperature": 1.0, "max_new_tokens": 8, "seed": 11, **sp})
        return [entry[1] for entry in res["meta_info"]["output_token_logprobs"]]

    target = 80
    assert sampled(logit_bias={str(target): 100.0}) == [target] * 8
    assert any(token != target for token in sampled())             # the bias stays with its request
    greedy = generate(server, text=PROMPT, sampling_params={"temperature": 0, "max_new_tokens": 8})["output_ids"]
    assert greedy[0] not in sampled(temperature=0, logit_bias={str(greedy[0]): -100.0})


def test_generate_grammar_and_custom_processor_are_refused(server):
    """test_srt_endpoint.py::TestSRTEndpoint.test_logprob_grammar (sampling_params.regex) and
    run_custom_logit_processor (custom_logit_processor + sampling_params.custom_params)."""
    refused(post(server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 1, "regex": "( Yes| No)"},
                                       "return_logprob": True}), "sampling_params.regex")
    refused(post(server, "/generate", {"text": PROMPT, "sampling_params": {"temperature": 0.0},
                                       "custom_logit_processor": "{}"}), "custom_logit_processor")
    refused(post(server, "/generate", {"text": PROMPT, "sampling_params": {"custom_params": {"token_id": 5}}}),
            "sampling_params.custom_params")
