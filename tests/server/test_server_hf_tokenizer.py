"""`mode=serve` with a local Hugging Face tokenizer (`tokenizer.path`): chat prompts go through the
tokenizer's own chat template, text comes from its decoder, stop strings apply to that text; a
tokenizer without a template gets the documented default."""
from __future__ import annotations

import signal

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("tokenizers")

from runtime.server.tokenizer import default_chat_template, load_tokenizer  # noqa: E402
from tests.server.server_process import start_server  # noqa: E402

MODEL = "tiny_mla_moe"
CORPUS = ["hello world, the quick brown fox jumps over the lazy dog", "serving systems stream tokens"] * 4
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def save_tiny_bpe(path, chat_template: str | None) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    wrapped = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>")
    if chat_template is not None:
        wrapped.chat_template = chat_template
    wrapped.save_pretrained(path)
    return str(path)


def test_tokenizer_without_template_uses_the_default(tmp_path):
    tok = load_tokenizer(save_tiny_bpe(tmp_path, None), vocab_size=512)
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == default_chat_template(messages) == "<|user|>\nhi\n<|assistant|>\n"


def test_served_chat_uses_the_tokenizers_template_and_decoder(tmp_path):
    path = save_tiny_bpe(tmp_path / "tok", TEMPLATE)
    tok = load_tokenizer(path, vocab_size=512)
    server = start_server(tmp_path, [f"tokenizer.path={path}"])
    try:
        messages = [{"role": "user", "content": "hello world"}]
        ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
        assert tok.decode(ids) == "[user]hello world\n[assistant]"
        sampling = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
        native = httpx.post(f"{server.url}/generate", json={"input_ids": ids, "sampling_params": sampling},
                            timeout=60).json()
        assert native["text"] == tok.decode(native["output_ids"])
        chat = httpx.post(f"{server.url}/v1/chat/completions", json={
            "model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0, "ignore_eos": True},
            timeout=60).json()
        assert chat["usage"]["prompt_tokens"] == len(ids)
        assert chat["choices"][0]["message"]["content"] == native["text"]
        text = native["text"]
        assert len(text) >= 6                      # seeded dummy weights: the same text every run
        stop = text[len(text) // 2:len(text) // 2 + 3]
        cut = httpx.post(f"{server.url}/generate", json={"input_ids": ids, "sampling_params": {
            **sampling, "stop": stop}}, timeout=60).json()
        assert cut["text"] == text[:text.find(stop)]
        assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    finally:
        server.stop(signal.SIGTERM)
