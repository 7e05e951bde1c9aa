"""The Executor Protocol (runtime/executor.py): the simulator's executor and the torch model runner
both implement it, an object that does not is refused with what it lacks, and what the Protocol
promises is enough for the real-time driver to serve with the simulator's executor."""
from __future__ import annotations

import pytest
from hydra.utils import instantiate

from experiments.compose import compose_config
from runtime.build import build_core
from runtime.driver import RealDriver, all_at_once
from runtime.executor import CallableExecutor, check_executor, missing_executor_methods
from runtime.run_checks import end_of_run_checks
from sim.driver import SimDriver
from sim.executor import SimExecutor
from sim.predictor import build_cost_model

TINY = ["model=tiny_mla_moe", "hardware=cpu", "progress=false", "print_summary=false", "workload.num_groups=3",
        "workload.prompts_per_group=4", "workload.system_prompt_len=48", "workload.question_len=16",
        "workload.output_len=12"]


class OnlyLaunch:
    def launch(self, plan):
        raise AssertionError("never called")


class LaunchWithoutPlan:
    def clock_origin(self):
        return None

    def launch(self):
        raise AssertionError("never called")

    def execute(self, plan):
        raise AssertionError("never called")


def test_the_sim_executor_and_the_wrappers_implement_the_protocol():
    assert missing_executor_methods(SimExecutor) == []
    assert missing_executor_methods(CallableExecutor) == []
    core = build_core(compose_config(TINY))
    executor = SimExecutor(build_cost_model(compose_config(TINY), core), core.model.vocab_size)
    assert check_executor(executor) is executor


def test_the_model_runner_implements_the_protocol():
    pytest.importorskip("torch")
    from runtime.engine.model_runner import ModelRunner
    assert missing_executor_methods(ModelRunner) == []


def test_an_object_that_is_no_executor_is_refused_naming_what_it_lacks():
    assert missing_executor_methods(OnlyLaunch) == ["clock_origin()", "execute(plan)"]
    with pytest.raises(TypeError, match=r"OnlyLaunch is not an Executor .*lacks clock_origin\(\), execute\(plan\)"):
        check_executor(OnlyLaunch())
    with pytest.raises(TypeError, match=r"LaunchWithoutPlan is not an Executor .*lacks launch\(plan\)$"):
        check_executor(LaunchWithoutPlan())


@pytest.mark.parametrize("bad", [OnlyLaunch(), LaunchWithoutPlan(), object()])
def test_the_real_driver_refuses_a_bad_executor_before_any_step(bad):
    core = build_core(compose_config(TINY))
    with pytest.raises(TypeError, match="is not an Executor"):
        RealDriver(core.scheduler, bad, progress=False)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_real_driver_serves_through_the_sim_executor_as_the_sim_driver_does(overlap):
    """The Protocol is all the real-time driver needs: with the simulator's executor (no device
    clock: host times) it serves every request to the same tokens the simulator gives them."""
    cfg = compose_config(TINY)
    specs = all_at_once(instantiate(cfg.workload).requests())
    outputs = []
    for make_driver in (lambda s, e: RealDriver(s, e, progress=False, overlap=overlap),
                        lambda s, e: SimDriver(s, e, progress=False, overlap=overlap)):
        core = build_core(cfg)
        executor = SimExecutor(build_cost_model(cfg, core), core.model.vocab_size)
        outcome = make_driver(core.scheduler, executor).run(specs)
        assert end_of_run_checks([core.scheduler], outcome.requests, len(specs)) == {"leaked_kv_slots": 0}
        starts, ends = outcome.steps.columns["start_s"], outcome.steps.columns["end_s"]
        assert all(0 <= s <= e for s, e in zip(starts, ends))
        outputs.append({r.rid: list(r.output_ids) for r in outcome.requests})
    assert outputs[0] == outputs[1] and all(len(ids) == 12 for ids in outputs[0].values())
