"""The offline Engine: greedy generation through the scheduler + paged runtime equals Hugging Face
transformers' greedy `generate` on tiny checkpoints the test writes itself."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.engine.engine import Engine, to_sampling_params  # noqa: E402
from tests.models.hf_models import FAMILIES, make_hf_model, save_hf_model  # noqa: E402


def engine_for(path, capacity=4096) -> Engine:
    return Engine(compose_config(["mode=real", "model=tiny_mla_moe", f"model.path={path}", "hardware=cpu",
                                  "real.device=cpu", "real.dtype=float32", f"kv.capacity_tokens={capacity}"]))


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_greedy_equals_hf_generate(family, tmp_path):
    hf = make_hf_model(family)
    save_hf_model(hf, tmp_path)
    engine = engine_for(tmp_path)
    prompts = [[5, 17, 99, 3, 42, 8, 150, 77], [9, 1, 2, 3]]
    greedy = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    outs = engine.generate(input_ids=prompts, sampling_params=greedy)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, min_new_tokens=32)
        assert out["token_ids"] == ref[0, len(prompt):].tolist()
        assert out["meta_info"]["completion_tokens"] == 32 and out["meta_info"]["finish_reason"] == "length"
    again = engine.generate(input_ids=prompts[0], sampling_params=greedy)   # warm radix cache
    assert again["token_ids"] == outs[0]["token_ids"]
    assert again["meta_info"]["cached_tokens"] == len(prompts[0]) - 1


def test_engine_text_prompts_and_stop_tokens(tmp_path):
    engine = Engine(compose_config(["mode=real", "model=tiny_mla_moe", "hardware=cpu", "real.device=cpu",
                                    "real.dtype=float32", "kv.capacity_tokens=2048"]))
    out = engine.generate("hello, twinserve", {"max_new_tokens": 8, "temperature": 0.0})
    assert out["meta_info"]["prompt_tokens"] == len(engine.tokenizer.encode("hello, twinserve"))
    assert isinstance(out["text"], str) and 1 <= out["meta_info"]["completion_tokens"] <= 8
    first = out["token_ids"][0]
    stopped = engine.generate("hello, twinserve", {"max_new_tokens": 8, "temperature": 0.0, "stop_token_ids": [first]})
    assert stopped["token_ids"] == [first] and stopped["meta_info"]["finish_reason"] == "stop"


def test_bad_sampling_params_name_the_valid_ones():
    with pytest.raises(ValueError, match="max_new_tokens"):
        to_sampling_params({"max_tokens": 3})
    with pytest.raises(ValueError, match="top_p"):
        to_sampling_params({"top_p": 0.0})


def test_stop_tokens_are_the_same_on_every_call():
    """The tokenizer's eos is a stop token from the first call on, not only once a first result
    was decoded (which loads the tokenizer): two identical calls stop on the same set."""
    engine = Engine(compose_config(["mode=real", "model=tiny_mla_moe", "hardware=cpu", "real.device=cpu",
                                    "real.dtype=float32", "kv.capacity_tokens=2048"]))
    before = engine._stop_ids()
    assert engine.tokenizer.eos_token_id in before
    greedy = {"max_new_tokens": 4, "temperature": 0.0}
    first = engine.generate(input_ids=[5, 17, 99, 3], sampling_params=greedy)
    second = engine.generate(input_ids=[5, 17, 99, 3], sampling_params=greedy)
    assert engine._stop_ids() == before
    assert first["token_ids"] == second["token_ids"]
