"""Frequency, presence and repetition penalties (SGLang's penalizers) with running token counts on the device:
the logits each row samples from against a per-token reference, every step of long outputs, with and without
overlap placeholders; a retraction and re-admission rebuilds the state; requests that ask for none hold none;
finished requests free theirs; a TP follower given the pickled inputs keeps the same state; and, served
through the runtime, every step matches the reference (overlap, retractions) and overlap changes no token."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

torch = pytest.importorskip("torch")

from hydra.utils import instantiate  # noqa: E402

from experiments.compose import compose_config  # noqa: E402
from experiments.penalty_probe import ReferenceCheck, per_token_reference  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.core.request import Request, RequestStatus, SamplingParams  # noqa: E402
from runtime.driver import RealDriver, all_at_once  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from runtime.engine.penalties import PenaltyBook, PenaltyCounts, counts_tokens  # noqa: E402

V = 12


def request(prompt, output, sampling=SamplingParams(), rid=None) -> Request:
    req = Request(rid=rid or f"r{len(prompt)}-{len(output)}", input_ids=list(prompt), sampling=sampling, arrival_s=0.0)
    req.output_ids.extend(output)
    req.status = RequestStatus.DECODING
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


class Ring:
    """The future ring of a test: placeholders -(index + 1) resolve to the tokens stored at index."""

    def __init__(self) -> None:
        self.tokens = torch.zeros(64, dtype=torch.long)
        self.next = 0

    def store(self, ids: torch.Tensor) -> list[int]:
        idx = [(self.next + k) % 64 for k in range(len(ids))]
        self.next = (self.next + len(ids)) % 64
        self.tokens[idx] = ids
        return [-(i + 1) for i in idx]

    def resolve(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.where(ids < 0, self.tokens[(-ids - 1).clamp(0, 63)], ids)


def step(book: PenaltyBook, counts: PenaltyCounts, requests, logits, resolve):
    """One step's penalties as the runner applies them; returns (penalised logits, inputs)."""
    pen = book.inputs(requests, [r.sampling for r in requests])
    if pen is None:
        return logits, None
    pen = pickle.loads(pickle.dumps(pen))             # what a TP follower receives
    return counts.apply(logits, pen, resolve), pen


def test_penalised_rows_match_the_reference_and_the_others_are_untouched():
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    ring = torch.tensor([7, 3])                        # placeholder -1 -> 7, -2 -> 3
    resolve = lambda ids: torch.where(ids < 0, ring[(-ids - 1).clamp(0, 1)], ids)   # noqa: E731
    rows = [([1, 2], [5, 5, 2, -1], SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)),
            ([0], [4], SamplingParams()),
            ([9, 9, 8], [4, -2], SamplingParams(repetition_penalty=1.5)),
            ([6], [], SamplingParams(frequency_penalty=-1.0, repetition_penalty=0.5, logit_bias=((2, 5.0), (6, -1.5))))]
    book, counts = PenaltyBook(), PenaltyCounts("cpu")
    got, _ = step(book, counts, [request(p, o, s, rid=f"r{i}") for i, (p, o, s) in enumerate(rows)], logits, resolve)
    for i, (prompt, output, params) in enumerate(rows):
        resolved = [7 if t == -1 else 3 if t == -2 else t for t in output]
        assert torch.allclose(got[i], reference(logits[i], prompt, resolved, params), atol=1e-6), i
    assert book.num_requests == 3 and counts.capacity == 4


MIXED = [SamplingParams(frequency_penalty=0.8),
         SamplingParams(presence_penalty=1.2, repetition_penalty=1.4),
         SamplingParams(),
         SamplingParams(frequency_penalty=-0.6, presence_penalty=0.4, repetition_penalty=0.7, logit_bias=((3, 2.0),)),
         SamplingParams(repetition_penalty=1.9),
         SamplingParams(logit_bias=((1, -4.0),))]


def long_run(overlap: bool, num_steps: int = 260):
    """Six requests (one without penalties, one with a bias only) joining at steps 0, 10, ..., each running
    100-200 steps, greedy on the penalised logits of seeded random logits. Every step every row is checked
    against the reference; after its first step a request's tokens never cross to the device again.
    Returns the tokens and every step's penalised logits."""
    gen = torch.Generator().manual_seed(1)
    book, counts, ring = PenaltyBook(), PenaltyCounts("cpu"), Ring()
    reqs = [request([(5 * k + j) % V for j in range(4 + k)], [], p, rid=f"q{k}") for k, p in enumerate(MIXED)]
    ends = [100 + 20 * k for k in range(len(reqs))]
    pending: list[tuple[Request, int, int]] = []      # placeholders to resolve one step later
    history = []
    for t in range(num_steps):
        for req, index, token in pending:             # the core resolves the previous step's tokens
            req.output_ids[index] = token
        pending = []
        batch = [r for k, r in enumerate(reqs) if 10 * k <= t < 10 * k + ends[k]]
        for k, r in enumerate(reqs):
            if t == 10 * k + ends[k]:
                r.status = RequestStatus.FINISHED
        logits = torch.randn(len(batch), V, generator=gen) * 3
        num_new = sum(counts_tokens(r.sampling) and not r.output_ids for r in batch)
        out, pen = step(book, counts, batch, logits, ring.resolve)
        for i, r in enumerate(batch):
            resolved = ring.resolve(torch.tensor(r.output_ids, dtype=torch.long)).tolist()
            assert torch.allclose(out[i], reference(logits[i], r.input_ids, resolved, r.sampling), atol=1e-5), (t, r.rid)
        # rows are built only at a request's first step, and no generated token is ever sent: O(penalised rows)
        assert pen is None or (pen.reset_rows.size == num_new and pen.output_tokens.shape[1] == 0)
        ids = out.argmax(dim=-1)
        if pen is not None:
            counts.cumulate(pen, ids)
        history.append(out)
        if overlap:
            for r, placeholder, token in zip(batch, ring.store(ids), ids.tolist()):
                pending.append((r, len(r.output_ids), token))
                r.output_ids.append(placeholder)
        else:
            for r, token in zip(batch, ids.tolist()):
                r.output_ids.append(token)
    for req, index, token in pending:
        req.output_ids[index] = token
    step(book, counts, [request([1], [], rid="plain")], torch.randn(1, V), ring.resolve)   # the next step sweeps
    return {r.rid: list(r.output_ids) for r in reqs}, history, book, counts


def test_long_outputs_match_the_reference_every_step_with_and_without_overlap():
    tokens_off, history_off, _, _ = long_run(overlap=False)
    tokens_on, history_on, book, counts = long_run(overlap=True)
    assert tokens_on == tokens_off and all(len(ids) >= 100 for ids in tokens_on.values())
    assert all(torch.equal(a, b) for a, b in zip(history_on, history_off))
    assert book.num_requests == 0 and counts.capacity == 0 and counts.counts is None   # all finished: freed


def test_retraction_then_readmission_gives_the_adjustments_of_a_request_never_retracted():
    """Twins see the same logits; one is retracted (its row freed and reused by another request meanwhile),
    then re-admitted with its tokens: from then on both rows get the same penalised logits."""
    gen = torch.Generator().manual_seed(2)
    params = SamplingParams(frequency_penalty=0.9, presence_penalty=0.3, repetition_penalty=1.5)
    twin, kept = request([1, 2, 3], [], params, rid="twin"), request([1, 2, 3], [], params, rid="kept")
    other = request([4], [], SamplingParams(frequency_penalty=1.0), rid="other")
    book, counts, ring = PenaltyBook(), PenaltyCounts("cpu"), Ring()

    def run(batch, row_logits):
        logits = torch.stack([row_logits] * len(batch))
        out, pen = step(book, counts, batch, logits, ring.resolve)
        ids = out.argmax(dim=-1)
        counts.cumulate(pen, ids)
        for r, token in zip(batch, ids.tolist()):
            r.output_ids.append(token)
        return out, pen

    for _ in range(30):
        out, _ = run([twin, kept], torch.randn(V, generator=gen))
        assert torch.equal(out[0], out[1])
    twin_row = book._entries["twin"].row
    twin.status, twin.num_retractions = RequestStatus.WAITING, 1      # retracted: back to the queue
    for _ in range(5):                                # the twins wait; another request takes the freed row
        run([other], torch.randn(V, generator=gen))
    assert "twin" not in book._entries and book._entries["other"].row == twin_row   # reused, rebuilt
    twin.status = RequestStatus.DECODING              # re-admitted with its 30 tokens
    out, pen = run([twin, kept], torch.randn(V, generator=gen))
    assert pen.reset_rows.tolist() == [book._entries["twin"].row] and pen.output_tokens.shape[1] == 30
    for _ in range(30):
        assert torch.equal(out[0], out[1])
        row_logits = torch.randn(V, generator=gen)
        out, pen = run([twin, kept], row_logits)
        assert pen.reset_rows.size == 0
        assert torch.allclose(out[0], reference(row_logits, twin.input_ids, twin.output_ids[:-1], params), atol=1e-5)
    assert twin.output_ids == kept.output_ids


def test_requests_without_counting_penalties_hold_no_state():
    book, counts = PenaltyBook(), PenaltyCounts("cpu")
    logits = torch.randn(2, V)
    plain = [request([1], [2], rid="a"), request([3], [], SamplingParams(temperature=0.5), rid="b")]
    out, pen = step(book, counts, plain, logits, lambda ids: ids)
    assert pen is None and out is logits
    stop = SamplingParams(min_new_tokens=3, stop_token_ids=(5,))
    biased = [request([1], [2], SamplingParams(logit_bias=((4, 1.0),)), rid="c"), request([3], [], stop, rid="d")]
    out, pen = step(book, counts, biased, logits, lambda ids: ids)
    assert pen.counted.shape[1] == 0 and book.num_requests == 0 and counts.capacity == 0 and counts.counts is None
    assert out[0, 4] == logits[0, 4] + 1.0 and out[1, 5] == float("-inf")
    assert torch.equal(out[:, :4], logits[:, :4])


def test_finished_requests_free_their_state_rows():
    book, counts = PenaltyBook(), PenaltyCounts("cpu")
    reqs = [request([1], [], SamplingParams(presence_penalty=1.0), rid=f"p{k}") for k in range(5)]
    plain = request([2], [], rid="plain")

    def run(batch):
        out, pen = step(book, counts, batch, torch.randn(len(batch), V), lambda ids: ids)
        if pen is not None:
            counts.cumulate(pen, out.argmax(dim=-1))
        for r, token in zip(batch, out.argmax(dim=-1).tolist()):
            r.output_ids.append(token)

    run(reqs + [plain])
    assert book.num_requests == 5 and counts.capacity == 8
    for r in reqs[1:]:
        r.status = RequestStatus.FINISHED
    run(reqs[:1] + [plain])                           # four rows freed: 8 rows shrink to 1
    assert book.num_requests == 1 and counts.capacity == 1 and counts.counts.shape == (1, V)
    reqs[0].status = RequestStatus.ABORTED
    run([plain])
    assert book.num_requests == 0 and counts.capacity == 0 and counts.counts is None


@pytest.mark.parametrize("field,value", [("frequency_penalty", 2.5), ("presence_penalty", -3.0),
                                         ("repetition_penalty", 0.0), ("repetition_penalty", 2.5)])
def test_out_of_range_penalties_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_the_per_token_reference_of_the_probe_is_the_definition():
    torch.manual_seed(3)
    logits = torch.randn(V)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=1.5, logit_bias=((2, 1.0),))
    got = per_token_reference(logits, [9, 8], [5, 5, 2], params, lambda ids: ids)
    assert torch.allclose(got, reference(logits, [9, 8], [5, 5, 2], params), atol=1e-6)


TINY = ["model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32", "kv.capacity_tokens=4000",
        "workload.num_groups=2", "workload.prompts_per_group=3", "workload.system_prompt_len=24",
        "workload.question_len=8", "workload.output_len=16"]
# a pool too small for all of them, over-admitting: decode retracts
SMALL_POOL = ["kv.capacity_tokens=150", "scheduler.chunked_prefill_size=40", "scheduler.max_prefill_tokens=80",
              "scheduler.init_new_token_ratio=0.05", "workload.output_len=40"]
PENALISED = SamplingParams(temperature=0.0, ignore_eos=True, frequency_penalty=1.5, presence_penalty=0.5,
                           repetition_penalty=1.3)


def served(sampling: SamplingParams, overlap: bool, extra=(), check: bool = False, step_sender=None,
           device: str = "cpu"):
    cfg = compose_config(["mode=real"] + TINY + list(extra))
    core = build_core(cfg)
    runner = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device=device, dtype="float32")
    runner.step_sender = step_sender
    checker = ReferenceCheck(runner) if check else None
    specs = [dataclasses.replace(s, sampling=dataclasses.replace(sampling, max_new_tokens=s.output_len))
             for s in all_at_once(instantiate(cfg.workload).requests())]
    done = RealDriver(core.scheduler, runner, progress=False, overlap=overlap).run(specs)
    return {r.rid: list(r.output_ids) for r in done.requests}, core, runner, checker


def test_served_penalties_are_the_same_with_overlap_scheduling():
    with_overlap, *_ = served(PENALISED, overlap=True)
    without, *_ = served(PENALISED, overlap=False)
    assert with_overlap == without                     # the placeholders of steps in flight resolve to the same
    plain, *_ = served(SamplingParams(temperature=0.0, ignore_eos=True), overlap=True)
    assert plain != with_overlap
    repeats = lambda outs: sum(len(ids) - len(set(ids)) for ids in outs.values())   # noqa: E731
    assert repeats(with_overlap) < repeats(plain)


@pytest.mark.parametrize("overlap", [False, True])
def test_served_penalties_match_the_reference_every_step_through_retractions(overlap):
    mixed = dataclasses.replace(PENALISED, temperature=0.7, seed=3, logit_bias=((5, 2.0),))
    _, core, _, check = served(mixed, overlap=overlap, extra=SMALL_POOL, check=True)
    assert core.scheduler.num_retractions > 0
    assert check.num_rows > 100 and check.num_mismatches == 0, check.summary()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_served_penalties_on_cuda_match_the_reference_and_overlap_changes_no_token():
    """On the GPU the running counts are updated from the sampled ids on the stream, with no sync: every step
    still matches the reference, through retractions, and overlap on gives the tokens of overlap off."""
    mixed = dataclasses.replace(PENALISED, logit_bias=((5, 2.0),))
    _, core, runner, check = served(mixed, overlap=True, extra=SMALL_POOL, check=True, device="cuda")
    assert core.scheduler.num_retractions > 0 and check.num_rows > 100 and check.num_mismatches == 0, check.summary()
    assert runner.penalty_counts.counts is None or runner.penalty_counts.counts.is_cuda
    outputs = {}
    for overlap in (False, True):
        outputs[overlap], _, _, check = served(mixed, overlap, check=True, device="cuda")
        assert check.num_rows > 50 and check.num_mismatches == 0, check.summary()
    assert outputs[True] == outputs[False]


def test_a_tp_follower_given_the_pickled_inputs_keeps_the_same_state():
    """The leader hands each step's inputs to a follower (pickled, as the TP step channel does); the follower's
    runner, running them on its own, holds the same counts and samples the same tokens."""
    cfg = compose_config(["mode=real"] + TINY)
    core = build_core(cfg)
    follower = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device="cpu", dtype="float32")
    tokens = []

    def send(inputs):
        ids, _ = follower.run(pickle.loads(pickle.dumps(inputs)))
        tokens.append(ids.tolist())
        assert (follower.penalty_counts.capacity == inputs.penalties.capacity) if inputs.penalties else True

    outputs, _, leader, _ = served(PENALISED, overlap=True, extra=SMALL_POOL, step_sender=send)
    assert tokens and leader.penalty_counts.capacity == follower.penalty_counts.capacity
    if leader.penalty_counts.counts is not None:
        assert torch.equal(leader.penalty_counts.counts, follower.penalty_counts.counts)


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
