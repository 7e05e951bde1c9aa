"""Under overlap scheduling the real loop plans step n+2 only once step n+1's launch has returned
(runtime.driver: schedule, launch, then wait for step n); the simulator keeps the host busy for the cost
model's launch_time_s of steps with extends, so requests that arrive during a long launch (an eager
8k-token prefill holds the host ~30 ms) make the next plan. Decode launches never bind (they return before
the step ahead of them ends), so they are left out and coalesced decode runs stay exact."""
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

    def __init__(self, inner, extend_s: float, decode_s: float, bound_s: float = 0.0, host_s: float | None = None) -> None:
        self.inner, self.extend_s, self.decode_s, self.bound_s, self.host_s = inner, extend_s, decode_s, bound_s, host_s

    def host_time_s(self, shape) -> float:     # host_s: every step's host share (planning) fixed
        return self.inner.host_time_s(shape) if self.host_s is None else self.host_s

    def launch_time_s(self, shape) -> float:
        return self.decode_s if shape.is_decode_only else self.extend_s

    def launch_bound_s(self, shape) -> float:
        return 0.0 if shape.is_decode_only else self.bound_s

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run(extend_s: float, decode_s: float = 0.0, second_arrival_s: float = 1e-4, overlap: bool = True,
        bound_s: float = 0.0, host_s: float | None = None):
    cfg = compose_config(TINY)
    first, second = instantiate(cfg.workload).requests()[:2]
    specs = [dataclasses.replace(first, arrival_s=0.0), dataclasses.replace(second, arrival_s=second_arrival_s)]
    core = build_core(cfg)
    executor = SimExecutor(SlowLaunches(build_cost_model(cfg, core), extend_s, decode_s, bound_s, host_s), core.model.vocab_size)
    outcome = SimDriver(core.scheduler, executor, progress=False, overlap=overlap).run(specs)
    return {r.rid: r for r in outcome.requests}, outcome.steps.columns


def test_a_request_arriving_during_a_long_launch_makes_the_next_plan_only_when_it_returns():
    quick, _ = run(extend_s=0.0)
    slow, _ = run(extend_s=0.5)
    second = sorted(quick)[1]
    assert quick[second].admitted_s < 0.5 <= slow[second].admitted_s   # the host was launching until 0.5 s


@pytest.mark.parametrize("overlap", [True, False])
def test_decode_launches_and_steps_without_overlap_are_not_delayed(overlap):
    base, base_steps = run(extend_s=0.0, overlap=overlap)
    decode_slow, decode_steps = run(extend_s=0.0, decode_s=0.5, overlap=overlap)
    assert decode_steps["start_s"] == base_steps["start_s"] and decode_steps["end_s"] == base_steps["end_s"]
    if not overlap:          # a step without overlap is planned after the one before it ended: launch inside
        _, slow_steps = run(extend_s=0.5, overlap=False)
        assert slow_steps["start_s"] == base_steps["start_s"]


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
