"""Prompt-token log-probabilities (SGLang's input_token_logprobs) through the runner and the driver:
values stitched across small prefill chunks, a cached prefix used only up to the start (SGLang's match
stops at logprob_start_len), the last-token-only and not-asking cases, all equal to log_softmax of a plain
full forward."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.core.request import RequestSpec, SamplingParams  # noqa: E402
from runtime.driver import RealDriver  # noqa: E402
from runtime.engine.forward_batch import ForwardBatch  # noqa: E402
from runtime.engine.logprob_params import LogprobSamplingParams, prompt_logprob_start  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from runtime.request_source import ReplaySource  # noqa: E402

TINY = ["mode=real", "model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32",
        "progress=false", "kv.capacity_tokens=4000", "scheduler.chunked_prefill_size=16"]
TOL = 1e-4


class _Recording(ReplaySource):
    """A replay that keeps the prompt part of each request's log-probability entries."""

    def __init__(self, specs) -> None:
        super().__init__(specs)
        self.prompt: dict[str, tuple] = {}

    def on_logprobs(self, items, logprobs) -> None:
        for item, entry in zip(items, logprobs):
            if entry is not None and entry.prompt is not None:
                assert item.request.rid not in self.prompt          # once per request
                self.prompt[item.request.rid] = entry.prompt


def _prompt(seed: int, length: int) -> list[int]:
    return [(seed * 31 + 7 * j) % 250 + 1 for j in range(length)]


def _reference(runner: ModelRunner, prompt: list[int]) -> list[list[float]]:
    """log_softmax of a plain forward over the whole prompt, every position [L, V]."""
    fb = ForwardBatch.build([(prompt, 0, list(range(len(prompt))))], runner.device)
    hidden = runner.model.hidden_states(fb, runner.pool)
    return torch.log_softmax(runner.model.compute_logits(hidden).double(), dim=-1).tolist()


def _check(values: tuple, prompt: list[int], start: int, top_num: int, ref: list[list[float]]) -> None:
    got_start, logprobs, tops = values
    assert got_start == start and len(logprobs) == len(tops) == len(prompt) - 1 - start
    for j, (value, top) in enumerate(zip(logprobs, tops)):
        row = ref[start + j]                                 # position start + j predicts the next token
        assert abs(value - row[prompt[start + j + 1]]) < TOL
        assert [t for t, _ in top] == sorted(range(len(row)), key=lambda v: -row[v])[:top_num]
        assert all(abs(v - row[t]) < TOL for t, v in top)


def test_start_is_clamped_below_the_last_prompt_token() -> None:
    assert prompt_logprob_start(SamplingParams(), 10) is None
    assert prompt_logprob_start(LogprobSamplingParams(), 10) is None          # -1: the output only
    assert prompt_logprob_start(LogprobSamplingParams(logprob_start_len=3), 10) == 3
    assert prompt_logprob_start(LogprobSamplingParams(logprob_start_len=30), 10) == 9
    with pytest.raises(ValueError, match="logprob_start_len"):
        LogprobSamplingParams(logprob_start_len=-2)


@pytest.mark.parametrize("overlap", [False, True])
def test_prompt_logprobs_equal_a_full_forward_across_chunks_and_the_cache(overlap: bool) -> None:
    core = build_core(compose_config(TINY))
    runner = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device="cpu", dtype="float32")
    driver = RealDriver(core.scheduler, runner, progress=False, overlap=overlap)
    ask = lambda start, top=0: LogprobSamplingParams(max_new_tokens=3, ignore_eos=True, temperature=0.0,   # noqa: E731
                                                      top_logprobs_num=top, logprob_start_len=start)
    prompts = {"chunked": _prompt(1, 50), "from7": _prompt(2, 30), "plain": _prompt(3, 20), "last": _prompt(4, 12)}
    sampling = {"chunked": ask(0, 3), "from7": ask(7), "plain": SamplingParams(max_new_tokens=3, ignore_eos=True),
                "last": ask(11, 2)}
    first = _Recording([RequestSpec(rid, 0.0, tuple(prompts[rid]), 3, sampling=sampling[rid]) for rid in prompts])
    driver.serve(first)
    # the same 40 first tokens again: the radix cache serves only the 5 before the start; 5..39 are prefilled
    prompts["cached"] = prompts["chunked"][:40] + _prompt(5, 10)
    second = _Recording([RequestSpec("cached", 0.0, tuple(prompts["cached"]), 3, sampling=ask(5, 2))])
    done = driver.serve(second)
    assert done.requests[0].num_cached_tokens == 5
    assert set(first.prompt) == {"chunked", "from7", "last"} and set(second.prompt) == {"cached"}
    reference = ModelRunner(dict(core.model.hf_config), 512, device="cpu", dtype="float32")
    for rid, values, start, top in (("chunked", first.prompt["chunked"], 0, 3), ("from7", first.prompt["from7"], 7, 0),
                                    ("last", first.prompt["last"], 11, 2), ("cached", second.prompt["cached"], 5, 2)):
        _check(values, prompts[rid], start, top, _reference(reference, prompts[rid]))
    assert len(runner.prompt_logprobs) == 0                     # nothing kept once delivered
