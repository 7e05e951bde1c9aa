"""runtime/run_mode.py: one pipeline for mode=sim and mode=real. Both end-of-run checks run in both
modes (a leaked KV slot is reported in the summary, a stalled scheduler is an error), the summaries
have the same keys apart from the real mode's own fields, and the pipeline imports neither torch
nor simpy."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from experiments.compose import compose_config
from runtime.app import real_run
from runtime.build import build_core
from runtime.core.request import Request, SamplingParams
from runtime.executor import check_executor
from runtime.run_checks import end_of_run_checks
from runtime.run_mode import run_mode
from sim.app import run_sim, sim_run

TINY = ["model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32", "progress=false",
        "print_summary=false", "workload.num_groups=3", "workload.prompts_per_group=4",
        "workload.system_prompt_len=48", "workload.question_len=16", "workload.output_len=12",
        "real.as_fast_as_possible=true"]
REAL_ONLY_FIELDS = {"load_time_s", "warmup_s", "device", "step_prediction_error", "gc"}
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="mode=real needs torch")
MODES = [pytest.param("sim", sim_run, id="sim"), pytest.param("real", real_run, id="real", marks=needs_torch)]


def config(mode: str, extra: tuple[str, ...] = ()):
    return compose_config([f"mode={mode}"] + TINY + list(extra))


class LeakingExecutor:
    """The mode's executor, except that its first step also takes `num_slots` KV slots nobody frees."""

    def __init__(self, inner, allocator, num_slots: int) -> None:
        self.inner, self.allocator, self.num_slots, self.leaked = inner, allocator, num_slots, False

    def _leak(self) -> None:
        if not self.leaked:
            self.allocator.allocate_slots(0, self.num_slots, None)
            self.leaked = True

    def launch(self, plan):
        self._leak()
        return self.inner.launch(plan)

    def execute(self, plan):
        self._leak()
        return self.inner.execute(plan)

    def __getattr__(self, name):          # clock_origin, the simulator's decode-run extras
        return getattr(self.inner, name)


def leaking(make_run, num_slots: int):
    def make(cfg, core, cost_model):
        run = make_run(cfg, core, cost_model)
        run.driver.executor = check_executor(LeakingExecutor(run.driver.executor, core.scheduler.kv.allocator,
                                                             num_slots))
        return run
    return make


def stalling(make_run, forgets_work: bool):
    """The scheduler plans one step, then nothing more; `forgets_work`: it also reports no work left
    from then on (the requests it holds are never served)."""
    def make(cfg, core, cost_model):
        sched = core.scheduler
        schedule, has_work = sched.schedule, sched.has_work
        calls = []

        def schedule_once(now):
            calls.append(now)
            return schedule(now) if len(calls) == 1 else None
        sched.schedule = schedule_once
        if forgets_work:
            sched.has_work = lambda: has_work() and len(calls) <= 1
        return make_run(cfg, core, cost_model)
    return make


@pytest.mark.parametrize("mode,make_run", MODES)
def test_a_leaked_kv_slot_is_reported_in_the_summary(tmp_path, mode, make_run):
    clean = run_mode(config(mode), make_run, tmp_path / "clean")
    leaky = run_mode(config(mode), leaking(make_run, 7), tmp_path / "leaky")
    assert clean["leaked_kv_slots"] == 0
    assert leaky["leaked_kv_slots"] == 7
    assert leaky["num_finished"] == clean["num_finished"] == 12


@pytest.mark.parametrize("forgets_work,message", [(False, "scheduler stalled"), (True, "unfinished requests")])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("mode,make_run", MODES)
def test_a_stalled_scheduler_ends_the_run_with_an_error(tmp_path, mode, make_run, overlap, forgets_work, message):
    with pytest.raises(RuntimeError, match=message):
        run_mode(config(mode, (f"overlap={overlap}",)), stalling(make_run, forgets_work), tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()


@needs_torch
def test_both_modes_give_summaries_with_the_same_keys(tmp_path):
    sim = run_mode(config("sim"), sim_run, tmp_path / "sim")
    real = run_mode(config("real"), real_run, tmp_path / "real")
    assert set(real) == set(sim) | REAL_ONLY_FIELDS
    assert sim["mode"] == "sim" and real["mode"] == "real"
    assert sim["leaked_kv_slots"] == real["leaked_kv_slots"] == 0
    assert sim["num_finished"] == real["num_finished"] == sim["num_requests"] == 12


def test_run_sim_is_run_mode_with_the_sim_executor(tmp_path):
    through_app = run_sim(config("sim"), out_dir=tmp_path / "app")
    direct = run_mode(config("sim"), sim_run, tmp_path / "direct")
    assert {k: v for k, v in through_app.items() if k != "wall_time_s"} == \
        {k: v for k, v in direct.items() if k != "wall_time_s"}
    for name in ("requests.parquet", "steps.parquet"):
        assert (tmp_path / "app" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes()


def test_dp_replicas_report_leaked_slots_too(tmp_path):
    summary = run_sim(config("sim", ("dp=2",)), out_dir=tmp_path / "dp")
    assert summary["leaked_kv_slots"] == 0 and summary["dp"]["replicas"] == 2


def test_a_lost_or_unfinished_request_is_an_error():
    core = build_core(config("sim"))
    with pytest.raises(RuntimeError, match="0 of 3 requests reported"):
        end_of_run_checks([core.scheduler], [], num_specs=3)
    open_request = Request(rid="r0", input_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=4), arrival_s=0.0)
    with pytest.raises(RuntimeError, match=r"1 of them not finished \(first: \['r0'\]\)"):
        end_of_run_checks([core.scheduler], [open_request], num_specs=1)
    assert end_of_run_checks([core.scheduler], [], num_specs=0) == {"leaked_kv_slots": 0}


def test_the_pipeline_imports_neither_torch_nor_simpy():
    code = ("import sys, runtime.run_mode, runtime.run_checks, runtime.executor, runtime.app\n"
            "print(sorted(k for k in ('torch', 'simpy') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
