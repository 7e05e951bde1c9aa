"""Log-probabilities of sampled tokens: the sampler's rows that ask (and only those), and the runner's
tokens against a reference forward of the same model, through the real-time driver.

The reported distribution follows SGLang's Sampler.forward (python/sglang/srt/layers/sampler.py, with
SGLANG_RETURN_ORIGINAL_LOGPROB unset): greedy rows log_softmax(logits), sampled rows
log(softmax(logits / temperature)) before top-k / top-p / min-p; top logprobs from the same tensor.
"""
from __future__ import annotations

import math

import pytest
import torch

from experiments.compose import compose_config
from runtime.build import build_core
from runtime.core.request import RequestSpec, SamplingParams
from runtime.driver import RealDriver
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.logprob_params import LogprobSamplingParams, top_logprobs_num
from runtime.engine.model_runner import ModelRunner
from runtime.engine.sampler import Sampler
from runtime.request_source import ReplaySource

# Legend: B = rows, V = vocab.
VOCAB = 64


def _logits(num_rows: int, seed: int = 0) -> torch.Tensor:              # [B, V]
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _log_softmax(row: list[float], temperature: float) -> list[float]:
    """Plain-Python reference in double precision."""
    scaled = [x / temperature for x in row]
    top = max(scaled)
    log_total = top + math.log(sum(math.exp(x - top) for x in scaled))
    return [x - log_total for x in scaled]


def test_rows_that_ask_get_their_distribution_and_others_nothing() -> None:
    logits = _logits(5)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, top_k=10),
              SamplingParams(temperature=0.7), SamplingParams(temperature=2.0, top_p=0.8),
              SamplingParams(temperature=1.0, top_k=1)]
    top_nums = [5, 3, None, 0, 20]
    sampler = Sampler(seed=3)
    ids = sampler.sample(logits, params, [0] * 5)
    out = sampler.logprobs(logits, params, ids, top_nums)
    entries = out.entries(5)
    assert entries[2] is None
    for row, (p, k) in enumerate(zip(params, top_nums)):
        if k is None:
            continue
        ref = _log_softmax(logits[row].tolist(), p.temperature if p.temperature > 0 else 1.0)
        token_logprob, top, _ = entries[row]
        assert abs(token_logprob - ref[int(ids[row])]) < 1e-4
        assert len(top) == k
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        for token_id, value in top:
            assert abs(value - ref[token_id]) < 1e-4
        assert [t for t, _ in top] == sorted(range(VOCAB), key=lambda v: -ref[v])[:k]
    greedy_top = entries[0][1]
    assert greedy_top[0][0] == int(logits[0].argmax()) == int(ids[0])
    assert greedy_top[0][1] == entries[0][0]


def test_no_row_asking_costs_nothing() -> None:
    logits = _logits(3)
    params = [SamplingParams(temperature=0.0)] * 3
    ids = Sampler().sample(logits, params)
    assert Sampler().logprobs(logits, params, ids, [None] * 3) is None


def test_masked_logits_stay_finite() -> None:
    logits = _logits(1)
    logits[0, 5:] = float("-inf")
    ids = Sampler().sample(logits, [SamplingParams(temperature=0.0)])
    _, top, _ = Sampler().logprobs(logits, [SamplingParams(temperature=0.0)], ids, [8]).entries(1)[0]
    assert all(math.isfinite(v) for _, v in top) and top[-1][1] < -1e30


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_logprobs_reach_pinned_host_buffers_and_match_the_cpu() -> None:
    logits = _logits(4)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.6, seed=2)] * 2
    top_nums = [3, None, 0, 5]
    cpu_ids = Sampler().sample(logits, params, [1] * 4)
    cpu = Sampler().logprobs(logits, params, cpu_ids, top_nums)
    assert cpu.to_host() is cpu
    gpu_logits, sampler = logits.cuda(), Sampler("cuda")
    gpu = sampler.logprobs(gpu_logits, params, cpu_ids.cuda(), top_nums).to_host()
    assert gpu.token_logprobs.is_pinned() and gpu.top_ids.is_pinned()
    torch.cuda.synchronize()
    for a, b in zip(gpu.entries(4), cpu.entries(4)):
        assert (a is None) == (b is None)
        if a is not None:
            assert abs(a[0] - b[0]) < 1e-4 and [t for t, _ in a[1]] == [t for t, _ in b[1]]


def test_logprob_params_validate_the_top_count() -> None:
    assert top_logprobs_num(SamplingParams()) is None
    assert top_logprobs_num(LogprobSamplingParams(top_logprobs_num=4)) == 4
    for bad in (-1, 21):
        with pytest.raises(ValueError, match="top_logprobs_num"):
            LogprobSamplingParams(top_logprobs_num=bad)
    with pytest.raises(ValueError, match="temperature"):          # the parent's checks still run
        LogprobSamplingParams(temperature=-1.0)


# -- through the runner and the driver ------------------------------------------------------------
TINY = ["mode=real", "model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32",
        "progress=false", "kv.capacity_tokens=4000"]
NUM_OUTPUTS = 6


class _Recording(ReplaySource):
    """A replay that keeps each request's log-probabilities by output index (as the online source does)."""

    def __init__(self, specs) -> None:
        super().__init__(specs)
        self.logprobs: dict[tuple[str, int], tuple] = {}

    def on_logprobs(self, items, logprobs) -> None:
        for item, entry in zip(items, logprobs):
            if entry is not None and not item.dropped:
                index = item.num_prefix_tokens + item.num_new_tokens - len(item.request.input_ids)
                self.logprobs[(item.request.rid, index)] = entry


def _reference_log_softmax(runner: ModelRunner, prompts: list[list[int]], outputs: list[list[int]],
                           temperatures: list[float]) -> list[list[list[float]]]:
    """Per request, per output index: log_softmax of the reference forward's last logits over the
    prompt and the outputs before it, each prefix prefilled from scratch."""
    seqs, offset = [], 0
    for prompt, out in zip(prompts, outputs):
        for i in range(len(out)):
            ids = prompt + out[:i]
            seqs.append((ids, 0, list(range(offset, offset + len(ids)))))
            offset += len(ids)
    logits = runner.forward(ForwardBatch.build(seqs, runner.device), path="reference").double()   # [B, V]
    rows = iter(logits)
    return [[torch.log_softmax(next(rows) / t, dim=-1).tolist() for _ in out]
            for out, t in zip(outputs, temperatures)]


@pytest.mark.parametrize("overlap", [False, True])
def test_runner_logprobs_match_a_reference_forward(overlap: bool) -> None:
    cfg = compose_config(TINY)
    core = build_core(cfg)
    runner = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device="cpu", dtype="float32")
    prompts = [[(7 * i + 3 * j) % 250 + 1 for j in range(12 + 5 * i)] for i in range(3)]
    sampling = [LogprobSamplingParams(max_new_tokens=NUM_OUTPUTS, ignore_eos=True, temperature=0.0, top_logprobs_num=5),
                SamplingParams(max_new_tokens=NUM_OUTPUTS, ignore_eos=True, temperature=0.0),
                LogprobSamplingParams(max_new_tokens=NUM_OUTPUTS, ignore_eos=True, temperature=0.8, seed=11,
                                      top_logprobs_num=2)]
    specs = [RequestSpec(f"r{i}", 0.0, tuple(p), NUM_OUTPUTS, sampling=s)
             for i, (p, s) in enumerate(zip(prompts, sampling))]
    source = _Recording(specs)
    done = RealDriver(core.scheduler, runner, progress=False, overlap=overlap).serve(source)
    outputs = {r.rid: list(r.output_ids) for r in done.requests}
    assert all(len(o) == NUM_OUTPUTS for o in outputs.values())
    assert not any(rid == "r1" for rid, _ in source.logprobs)            # it did not ask
    reference_runner = ModelRunner(dict(core.model.hf_config), 512, device="cpu", dtype="float32")
    asked = [0, 2]
    ref = _reference_log_softmax(reference_runner, [prompts[i] for i in asked],
                                 [outputs[f"r{i}"] for i in asked], [1.0, 0.8])
    for ref_rows, i in zip(ref, asked):
        for index, row in enumerate(ref_rows):
            token_logprob, top, prompt = source.logprobs[(f"r{i}", index)]
            assert prompt is None                                          # it asked for none
            token = outputs[f"r{i}"][index]
            assert abs(token_logprob - row[token]) < 1e-4
            assert [t for t, _ in top] == sorted(range(len(row)), key=lambda v: -row[v])[:len(top)]
            assert all(abs(v - row[t]) < 1e-4 for t, v in top)
            if i == 0:                                                    # greedy: the top-1 is the token
                assert top[0][0] == token and len(top) == 5
