"""Under overlap scheduling the real loop plans step n+2 only once step n+1's launch has returned
(runtime.driver: schedule, launch, then wait for step n); the simulator keeps the host busy for the cost
model's launch_time_s, so requests that arrive during a long launch (an eager 8k-token prefill holds the
host ~30 ms) make the next plan. A decode graph replay reaches the device only as its launch returns
(runtime.engine.model_runner.launch records the step's start event before building the batch): after a
host-bound step the device idles through that launch, as real tp=2 runs show (decode steps right after a
prefill last 8.5 ms against 5.1 ms). Coalesced decode runs follow the same rules, step for step."""
from __future__ import annotations

import dataclasses

import pytest
from hydra.utils import instantiate

from experiments.compose import compose_config
from runtime.build import build_core
from sim.driver import SimDriver
from sim.executor import SimExecutor
from sim.predictor import build_cost_model

TINY = ["model=tiny_mla_moe", "hardware=cpu", "progress=false", "print_summary=false", "workload.num_groups=1",
        "workload.prompts_per_group=2", "workload.system_prompt_len=48", "workload.question_len=16",
        "workload.output_len=6"]


class SlowLaunches:
    """The configured cost model with launches of `extend_s` (steps with extends) and `decode_s`, and
    steps with extends launch-bound for `bound_s` of their device time."""

    def __init__(self, inner, extend_s: float, decode_s: float, bound_s: float = 0.0, host_s: float | None = None,
                 decode_waits: bool = False, lockstep: bool = False, saving_s: float = 0.0,
                 idle_factor: float = 1.0) -> None:
        self.inner, self.extend_s, self.decode_s, self.bound_s, self.host_s = inner, extend_s, decode_s, bound_s, host_s
        self.decode_waits, self.lockstep, self.saving_s, self.idle_factor = decode_waits, lockstep, saving_s, idle_factor

    def idle_launch_factor(self, idle_s: float) -> float:     # idle_factor after more than 1 s of host idle
        return self.idle_factor if idle_s > 1.0 else 1.0

    def after_decode_saving_s(self, shape) -> float:
        return 0.0 if shape.is_decode_only else self.saving_s

    def launch_ends_step(self, shape) -> bool:     # lockstep: extends launched as tensor-parallel piecewise steps
        return self.lockstep and not shape.is_decode_only

    def host_time_s(self, shape) -> float:     # host_s: every step's host share (planning) fixed
        return self.inner.host_time_s(shape) if self.host_s is None else self.host_s

    def launch_time_s(self, shape) -> float:
        return self.decode_s if shape.is_decode_only else self.extend_s

    def launch_bound_s(self, shape) -> float:
        return 0.0 if shape.is_decode_only else self.bound_s

    def device_waits_for_launch(self, shape) -> bool:
        return self.decode_waits and shape.is_decode_only

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run(extend_s: float, decode_s: float = 0.0, second_arrival_s: float = 1e-4, overlap: bool = True,
        bound_s: float = 0.0, host_s: float | None = None, decode_waits: bool = False, fast_forward: bool = True,
        extra: tuple[str, ...] = (), lockstep: bool = False, saving_s: float = 0.0, idle_factor: float = 1.0):
    cfg = compose_config(TINY + list(extra))
    first, second = instantiate(cfg.workload).requests()[:2]
    specs = [dataclasses.replace(first, arrival_s=0.0), dataclasses.replace(second, arrival_s=second_arrival_s)]
    core = build_core(cfg)
    model = SlowLaunches(build_cost_model(cfg, core), extend_s, decode_s, bound_s, host_s, decode_waits, lockstep,
                         saving_s, idle_factor)
    outcome = SimDriver(core.scheduler, SimExecutor(model, core.model.vocab_size), progress=False, overlap=overlap,
                        fast_forward=fast_forward).run(specs)
    return {r.rid: r for r in outcome.requests}, outcome.steps.columns


def test_a_request_arriving_during_a_long_launch_makes_the_next_plan_only_when_it_returns():
    quick, _ = run(extend_s=0.0)
    slow, _ = run(extend_s=0.5)
    second = sorted(quick)[1]
    assert quick[second].admitted_s < 0.5 <= slow[second].admitted_s   # the host was launching until 0.5 s


def test_steps_without_overlap_are_not_delayed_by_their_launches():
    """Without overlap a step is planned after the one before it ended: its launch is inside its price."""
    _, base = run(extend_s=0.0, overlap=False)
    _, slow = run(extend_s=0.5, decode_s=0.5, overlap=False, decode_waits=True)
    assert slow["start_s"] == base["start_s"] and slow["end_s"] == base["end_s"]


def test_a_decode_graph_replay_after_a_host_bound_step_waits_for_its_launch():
    """Decode launches of 0.5 s: every decode step is planned once the launch ahead returned (steps end
    >= 0.5 s apart either way), but only a graph replay (device_waits_for_launch) keeps the device idle
    through its own launch: the first decode after the prefill lasts its launch plus its kernels."""
    _, base = run(extend_s=0.0)
    _, eager = run(extend_s=0.0, decode_s=0.5)
    _, graph = run(extend_s=0.0, decode_s=0.5, decode_waits=True)
    duration = lambda steps, i: steps["end_s"][i] - steps["start_s"][i]      # noqa: E731
    decodes = [i for i, tokens in enumerate(base["num_prefill_tokens"]) if tokens == 0]
    first = decodes[0]
    assert all(b - a >= 0.5 for a, b in zip(eager["end_s"][first:], eager["end_s"][first + 1:]))
    assert duration(eager, first) == pytest.approx(duration(base, first)) and duration(base, first) < 0.01
    assert duration(graph, first) == pytest.approx(0.5 + duration(base, first), abs=1e-3)
    assert all(duration(graph, i) >= 0.5 for i in decodes)


@pytest.mark.parametrize("decode_s", [0.0, 1e-4, 0.5])
def test_coalesced_decode_runs_wait_for_launches_as_stepping_does(decode_s):
    """Host-bound and GPU-bound decode launches: the records of coalesced runs equal stepping's, float
    for float (long outputs, so that runs form)."""
    common = dict(extend_s=3e-4, decode_s=decode_s, decode_waits=True, second_arrival_s=2e-3,
                  extra=("workload.output_len=64",))
    _, stepped = run(**common, fast_forward=False)
    _, coalesced = run(**common, fast_forward=True)
    assert coalesced == stepped


def test_a_launch_bound_step_launched_while_the_step_ahead_runs_ends_earlier_by_its_head_start():
    """The second request arrives while the first decodes: its prefill is planned and launched while a
    decode step still runs, so up to its launch-bound part of its interval is hidden by that head start;
    the first prefill (nothing ahead of it) keeps its whole interval. (Host shares of 1 us: the CPU
    roofline's host work would outlast the tiny model's decode steps and leave no head start.)"""
    common = dict(extend_s=0.0, second_arrival_s=0.001, host_s=1e-6)
    _, base = run(**common)
    _, bound = run(**common, bound_s=1e-6)
    _, unbounded = run(**common, bound_s=10.0)
    durations = [[e - s for s, e in zip(r["start_s"], r["end_s"])] for r in (base, bound, unbounded)]
    extends = [i for i, tokens in enumerate(base["num_prefill_tokens"]) if tokens > 0]
    first, second = extends[0], extends[1]
    assert first == 0 and durations[1][0] == durations[0][0] == durations[2][0]
    assert durations[1][second] == pytest.approx(durations[0][second] - 1e-6, abs=1e-12)
    head_start = durations[0][second] - durations[2][second]       # the whole head start, hidden
    assert 0 < head_start <= durations[0][second - 1]                # at most the step ahead of it


def test_a_decode_replay_after_a_step_its_launch_set_waits_for_every_rank_to_have_launched_it():
    """The ranks launch in lockstep (a tensor-parallel follower receives each step from the leader): a
    launch-bound prefill, whose end its launch set, is launched on every rank only as it ends, so the decode
    graph after it begins its own launch then, even though the leader planned it long before."""
    common = dict(extend_s=0.0, host_s=1e-6, decode_waits=True)
    _, probe = run(**common)
    duration = lambda steps, i: steps["end_s"][i] - steps["start_s"][i]      # noqa: E731
    first_decode = [i for i, tokens in enumerate(probe["num_prefill_tokens"]) if tokens == 0][0]
    prefill_s = duration(probe, first_decode - 1)
    lead_s = prefill_s / 4                 # a decode launch shorter than the prefill ahead of it
    _, free = run(**common, decode_s=lead_s)
    _, bound = run(**common, decode_s=lead_s, bound_s=10.0)
    assert duration(free, first_decode) == pytest.approx(duration(probe, first_decode), rel=1e-9)   # hidden
    assert duration(bound, first_decode) == pytest.approx(duration(probe, first_decode) + lead_s, rel=1e-6)


def test_a_lockstep_piecewise_step_ends_no_earlier_than_its_launch_and_paces_the_decode_after_it():
    """launch_ends_step (tensor-parallel piecewise extends): a prefill whose launch outlasts its kernels ends
    its launch after it began, whatever it is priced; without a head start (nothing ahead) its whole
    launch-bound part shows; and its ranks are done launching it only as it ends, so the decode graph after
    it starts its launch then and lasts its launch plus its kernels, even where its leader planned it early."""
    common = dict(host_s=1e-6, decode_waits=True)
    _, probe = run(extend_s=0.0, **common)
    duration = lambda steps, i: steps["end_s"][i] - steps["start_s"][i]      # noqa: E731
    first_decode = [i for i, tokens in enumerate(probe["num_prefill_tokens"]) if tokens == 0][0]
    price_s = duration(probe, 0)
    launch_s = 3 * price_s
    _, lockstep = run(extend_s=launch_s, lockstep=True, **common)
    assert lockstep["end_s"][0] == pytest.approx(1e-6 + launch_s, rel=1e-9)       # its launch, not its price
    _, bound = run(extend_s=0.0, bound_s=price_s / 2, lockstep=True, **common)
    assert duration(bound, 0) == pytest.approx(price_s, rel=1e-9)                   # nothing ahead: all of it
    lead_s = price_s / 4
    _, paced = run(extend_s=0.0, decode_s=lead_s, lockstep=True, **common)
    _, free = run(extend_s=0.0, decode_s=lead_s, **common)
    assert duration(free, first_decode) == pytest.approx(duration(probe, first_decode), rel=1e-9)   # hidden
    assert duration(paced, first_decode) == pytest.approx(duration(probe, first_decode) + lead_s, rel=1e-6)


@pytest.mark.parametrize("decode_s", [0.0, 1e-4, 0.5])
def test_coalesced_decode_runs_after_lockstep_steps_equal_stepping(decode_s):
    """The decode runs after lockstep piecewise steps (launched on every rank only as they end) give the
    records of stepping one by one, float for float."""
    common = dict(extend_s=3e-4, decode_s=decode_s, decode_waits=True, second_arrival_s=2e-3, bound_s=1e-4,
                  lockstep=True, extra=("workload.output_len=64",))
    _, stepped = run(**common, fast_forward=False)
    _, coalesced = run(**common, fast_forward=True)
    assert coalesced == stepped


def test_an_extend_right_behind_a_decode_ends_its_saving_earlier():
    """after_decode_saving_s: the second request's prefill, launched while the first request decodes, starts as
    that decode ends and takes its saving less; the first prefill (nothing ahead of it) keeps its price, and
    without overlap (the host plans between steps, the device idles) nothing changes."""
    common = dict(extend_s=0.0, second_arrival_s=0.001, host_s=1e-6)
    _, base = run(**common)
    _, saved = run(**common, saving_s=1e-6)
    duration = lambda steps, i: steps["end_s"][i] - steps["start_s"][i]      # noqa: E731
    extends = [i for i, tokens in enumerate(base["num_prefill_tokens"]) if tokens > 0]
    first, second = extends[0], extends[1]
    assert base["num_prefill_tokens"][second - 1] == 0                          # a decode ran ahead of it
    assert base["start_s"][second] == base["end_s"][second - 1]                 # right behind it
    assert duration(saved, first) == duration(base, first)
    assert duration(saved, second) == pytest.approx(duration(base, second) - 1e-6, abs=1e-12)
    _, plain = run(**common, overlap=False)
    _, plain_saved = run(**common, overlap=False, saving_s=1e-6)
    assert plain_saved == plain


@pytest.mark.parametrize("overlap", [True, False])
def test_the_first_launch_after_the_host_idled_is_slower_by_the_idle_factor(overlap):
    """The second request arrives once the first has finished: its prefill is the first step after the host
    idled, its launch (launch-bound, 10 ms) takes idle_launch_factor times as long, and it ends that much
    later, with overlap or without; after an idle of under a second (the factor 1 here) nothing changes, and
    the first request (no idle before it) never does."""
    common = dict(extend_s=0.01, bound_s=0.01, host_s=1e-6, overlap=overlap)
    ttft = lambda r: r.first_token_s - r.arrival_s       # noqa: E731
    for arrival_s, extra_s in ((5.0, 2 * 0.01), (0.5, 0.0)):
        base, _ = run(**common, second_arrival_s=arrival_s)
        slow, _ = run(**common, second_arrival_s=arrival_s, idle_factor=3.0)
        first, second = sorted(base)
        assert base[first].finish_s < arrival_s                        # the host idled before the second
        assert slow[first].first_token_s == base[first].first_token_s
        assert ttft(slow[second]) == pytest.approx(ttft(base[second]) + extra_s, abs=1e-9)
