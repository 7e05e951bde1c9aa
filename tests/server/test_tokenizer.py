"""Byte and Hugging Face tokenizers, and incremental detokenization of split UTF-8 characters."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime.server.detokenizer import IncrementalDetokenizer
from runtime.server.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

TEXTS = [
    "hello, world",
    "héllo wörld — ça va?",
    "日本語のテキストと中文",
    "emoji: 👩‍💻🎉🇫🇷 done",
    "mixed 😀a文b",
]
CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog",
    "héllo wörld — ça va? très bien, merci",
    "日本語のテキストと中文 and english together",
    "emoji: 👩‍💻🎉🇫🇷 done; mixed 😀a文b",
] * 3


def _stream(tokenizer: Tokenizer, ids: list[int], prompt_ids: list[int] | None = None) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=prompt_ids)
    chunks = [detokenizer.push([token_id]) for token_id in ids] + [detokenizer.flush()]
    assert detokenizer.text == "".join(chunks)
    return chunks


# -- byte tokenizer --------------------------------------------------------------------
@pytest.mark.parametrize("text", TEXTS)
def test_byte_round_trip(text: str) -> None:
    tokenizer = ByteTokenizer(vocab_size=1000)
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.bos_token_id and max(ids[1:]) < 256
    assert tokenizer.encode(text, add_special_tokens=False) == ids[1:]
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=False) == (
        f"<|bos|>{text}<|eos|>"
    )


def test_byte_ids_beyond_specials_and_range() -> None:
    tokenizer = ByteTokenizer(vocab_size=1000)
    assert tokenizer.vocab_size == 1000
    assert tokenizer.decode([104, 300, 105, 999]) == "hi"
    assert tokenizer.decode([0xE6, 0x97]) == "\ufffd"  # incomplete character
    with pytest.raises(ValueError):
        tokenizer.decode([1000])
    with pytest.raises(ValueError, match="259"):
        ByteTokenizer(vocab_size=258)


def test_byte_chat_template() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    tokenizer = ByteTokenizer()
    assert tokenizer.apply_chat_template(messages) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False).endswith("hi\n")


@pytest.mark.parametrize("text", TEXTS)
def test_byte_incremental_detokenization_one_byte_at_a_time(text: str) -> None:
    tokenizer = ByteTokenizer()
    chunks = _stream(tokenizer, tokenizer.encode(text, add_special_tokens=False),
                     prompt_ids=tokenizer.encode("prompt ✓"))
    assert "".join(chunks) == text
    assert not any("\ufffd" in chunk for chunk in chunks)


def test_detokenizer_holds_back_then_flushes_an_invalid_tail() -> None:
    detokenizer = IncrementalDetokenizer(ByteTokenizer())
    assert detokenizer.push([ord("a"), 0xF0, 0x9F]) == ""  # "a" + half an emoji: held
    assert detokenizer.push([0x98, 0x80]) == "a😀"
    assert detokenizer.push([0xE6]) == ""
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.text == "a😀\ufffd"


def test_detokenizer_skips_special_tokens() -> None:
    tokenizer = ByteTokenizer()
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.push([ord("o"), ord("k")]) == "ok"
    assert detokenizer.push([tokenizer.eos_token_id]) == ""
    assert detokenizer.flush() == "" and detokenizer.text == "ok"


def test_load_tokenizer_byte_and_missing_path(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(None, vocab_size=32000)
    assert isinstance(tokenizer, ByteTokenizer) and tokenizer.vocab_size == 32000
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_tokenizer(str(tmp_path / "missing"), vocab_size=32000)


# -- Hugging Face tokenizer --------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny byte-level BPE trained on CORPUS and saved as a Hugging Face tokenizer. Its few
    merges go to ASCII, so CJK and emoji characters stay split across byte tokens."""
    from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(CORPUS, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>")
    wrapped.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    path = tmp_path_factory.mktemp("tiny_bpe")
    wrapped.save_pretrained(path)
    return str(path)


def test_hf_load_and_round_trip(hf_dir: str) -> None:
    tokenizer = load_tokenizer(hf_dir, vocab_size=1000)
    assert isinstance(tokenizer, HFTokenizer)
    assert tokenizer.vocab_size <= 300 and tokenizer.eos_token_id is not None
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    with pytest.raises(ValueError, match="vocab_size"):
        load_tokenizer(hf_dir, vocab_size=100)


def test_hf_chat_template_delegates(hf_dir: str) -> None:
    tokenizer = load_tokenizer(hf_dir, vocab_size=1000)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user]hi\n[assistant]"


@pytest.mark.parametrize("text", TEXTS)
def test_hf_incremental_detokenization_equals_full_decode(hf_dir: str, text: str) -> None:
    tokenizer = load_tokenizer(hf_dir, vocab_size=1000)
    ids = tokenizer.encode(text, add_special_tokens=False)
    splits_a_character = any("\ufffd" in tokenizer.decode([token_id]) for token_id in ids)
    assert splits_a_character == (not text.isascii())
    chunks = _stream(tokenizer, ids, prompt_ids=tokenizer.encode("the prompt"))
    assert "".join(chunks) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in chunk for chunk in chunks)
