"""Frequency, presence and repetition penalties (SGLang's penalizers): the logits each row samples from
against a per-token reference; placeholders of a step in flight resolved; rows that do not ask untouched;
and served through the runtime, the same tokens with overlap scheduling as without (placeholders) and
other tokens than without penalties."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from hydra.utils import instantiate  # noqa: E402

from experiments.compose import compose_config  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.core.request import Request, SamplingParams  # noqa: E402
from runtime.driver import RealDriver, all_at_once  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from runtime.engine.penalties import apply_penalties, penalty_inputs  # noqa: E402

V = 12


def request(prompt, output) -> Request:
    req = Request(rid=f"r{len(prompt)}-{len(output)}", input_ids=list(prompt), sampling=SamplingParams(), arrival_s=0.0)
    req.output_ids.extend(output)
    return req


def reference(logits_row, prompt, output, p: SamplingParams):
    out = logits_row.clone()
    for token in range(V):
        n = output.count(token)
        out[token] -= p.frequency_penalty * n + p.presence_penalty * (n > 0)
        if token in output or token in prompt:
            out[token] = out[token] / p.repetition_penalty if out[token] > 0 else out[token] * p.repetition_penalty
    for token, bias in p.logit_bias:
        out[token] += bias
    return out


def test_penalised_rows_match_the_reference_and_the_others_are_untouched():
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    ring = torch.tensor([7, 3])                        # placeholder -1 -> 7, -2 -> 3
    resolve = lambda ids: torch.where(ids < 0, ring[(-ids - 1).clamp(0, 1)], ids)   # noqa: E731
    rows = [([1, 2], [5, 5, 2, -1], SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)),
            ([0], [4], SamplingParams()),
            ([9, 9, 8], [4, -2], SamplingParams(repetition_penalty=1.5)),
            ([6], [], SamplingParams(frequency_penalty=-1.0, repetition_penalty=0.5, logit_bias=((2, 5.0), (6, -1.5))))]
    pen = penalty_inputs([request(p, o) for p, o, _ in rows], [s for _, _, s in rows])
    got = apply_penalties(logits, pen, resolve)
    for i, (prompt, output, params) in enumerate(rows):
        resolved = [7 if t == -1 else 3 if t == -2 else t for t in output]
        assert torch.allclose(got[i], reference(logits[i], prompt, resolved, params), atol=1e-6), i
    assert penalty_inputs([request([1], [2])], [SamplingParams()]) is None


@pytest.mark.parametrize("field,value", [("frequency_penalty", 2.5), ("presence_penalty", -3.0),
                                         ("repetition_penalty", 0.0), ("repetition_penalty", 2.5)])
def test_out_of_range_penalties_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


TINY = ["model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32", "kv.capacity_tokens=4000",
        "workload.num_groups=2", "workload.prompts_per_group=3", "workload.system_prompt_len=24",
        "workload.question_len=8", "workload.output_len=16"]


def served(sampling: SamplingParams, overlap: bool) -> dict[str, list[int]]:
    cfg = compose_config(["mode=real"] + TINY)
    core = build_core(cfg)
    runner = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device="cpu", dtype="float32")
    specs = [dataclasses.replace(s, sampling=dataclasses.replace(sampling, max_new_tokens=s.output_len))
             for s in all_at_once(instantiate(cfg.workload).requests())]
    done = RealDriver(core.scheduler, runner, progress=False, overlap=overlap).run(specs)
    return {r.rid: list(r.output_ids) for r in done.requests}


def test_served_penalties_are_the_same_with_overlap_scheduling():
    penalised = SamplingParams(temperature=0.0, ignore_eos=True, frequency_penalty=1.5, presence_penalty=0.5,
                               repetition_penalty=1.3)
    with_overlap, without = served(penalised, overlap=True), served(penalised, overlap=False)
    assert with_overlap == without                     # the placeholders of steps in flight resolve to the same
    plain = served(SamplingParams(temperature=0.0, ignore_eos=True), overlap=True)
    assert plain != with_overlap
    repeats = lambda outs: sum(len(ids) - len(set(ids)) for ids in outs.values())   # noqa: E731
    assert repeats(with_overlap) < repeats(plain)


def test_min_new_tokens_keeps_stop_tokens_out_until_reached():
    """Greedy, the first token t0 made a stop token: without min_new_tokens the request stops at once;
    with min_new_tokens=5 it runs at least 5 tokens, none of the first 4 being t0."""
    cfg = compose_config(["mode=real"] + TINY)
    core = build_core(cfg)
    runner = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device="cpu", dtype="float32")
    spec = instantiate(cfg.workload).requests()[0]

    def run(rid: str, sampling: SamplingParams) -> list[int]:
        done = RealDriver(core.scheduler, runner, progress=False, overlap=True).run(
            [dataclasses.replace(spec, rid=rid, arrival_s=0.0, sampling=sampling)])
        return list(done.requests[0].output_ids)

    t0 = run("probe", SamplingParams(max_new_tokens=1, temperature=0.0))[0]
    stop_at_once = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(t0,))
    assert run("plain", stop_at_once) == [t0]
    held = run("held", dataclasses.replace(stop_at_once, min_new_tokens=5))
    assert len(held) >= 5 and t0 not in held[:4]
    held_request = Request(rid="r", arrival_s=0.0, input_ids=[1], sampling=dataclasses.replace(stop_at_once, min_new_tokens=5))
    assert held_request.finishes_with(t0, 4) is None and held_request.finishes_with(t0, 5) is not None
