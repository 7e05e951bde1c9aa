"""The overlap driver hands out the step ahead's tokens from inside the next step's launch once the device
has finished it (runtime/driver.py `complete_if_done`; the model runner polls between the layers of a
piecewise replay), instead of after that launch returns: the same steps, tokens and records, earlier."""
from __future__ import annotations

from hydra.utils import instantiate

from experiments.compose import compose_config
from runtime.build import build_core
from runtime.driver import RealDriver, all_at_once
from runtime.executor import CallableExecutor, accepts_poll
from runtime.run_checks import end_of_run_checks
from sim.executor import SimExecutor
from sim.predictor import build_cost_model

TINY = ["model=tiny_mla_moe", "hardware=cpu", "progress=false", "print_summary=false", "workload.num_groups=2",
        "workload.prompts_per_group=3", "workload.system_prompt_len=40", "workload.question_len=12",
        "workload.output_len=9"]


class PollingExecutor:
    """The simulator's executor behind a launch that calls `poll` twice (as the runner does after the
    batch build and between layers), logging each launch's start and end around the polls."""

    def __init__(self, inner: SimExecutor, log: list, polls: bool) -> None:
        self.inner, self.log, self.polls = inner, log, polls

    def clock_origin(self):
        return None

    def execute(self, plan):
        return self.inner.execute(plan)

    def launch(self, plan, poll=None):
        self.log.append(("launch", plan.step_id))
        step = self.inner.launch(plan)
        if self.polls and poll is not None:
            poll()
            poll()
        self.log.append(("launched", plan.step_id))
        return step


def serve(polls: bool, overlap: bool = True):
    cfg = compose_config(TINY)
    core = build_core(cfg)
    log: list = []
    executor = PollingExecutor(SimExecutor(build_cost_model(cfg, core), core.model.vocab_size), log, polls)
    driver = RealDriver(core.scheduler, executor, progress=False, overlap=overlap)
    specs = all_at_once(instantiate(cfg.workload).requests())
    record = core.scheduler.resolve if overlap else core.scheduler.commit

    def logged(plan, result, end_s):
        log.append(("resolved", plan.step_id))
        return record(plan, result, end_s)
    if overlap:
        core.scheduler.resolve = logged
    outcome = driver.run(specs)
    assert end_of_run_checks([core.scheduler], outcome.requests, len(specs)) == {"leaked_kv_slots": 0}
    outputs = {r.rid: list(r.output_ids) for r in outcome.requests}
    return outputs, outcome.steps.columns, log


def test_the_step_ahead_resolves_inside_the_next_launch_when_it_is_done():
    _, _, log = serve(polls=True)
    inside = 0
    for i, event in enumerate(log):
        if event[0] == "resolved":
            before = [e for e in log[:i] if e[0] in ("launch", "launched")]
            if before and before[-1][0] == "launch":        # resolved between a launch's start and its end
                assert before[-1][1] > event[1]              # ... of a later step
                inside += 1
    resolved = sum(1 for e in log if e[0] == "resolved")
    assert inside >= resolved - 1 and resolved >= 8      # all but the last step (no launch after it)


def test_polling_changes_no_token_and_no_record():
    with_poll, steps_poll, _ = serve(polls=True)
    without, steps_plain, log = serve(polls=False)
    assert with_poll == without
    for column in ("step_id", "mode", "batch_size", "num_prefill_tokens", "num_decode_requests", "kv_tokens_used"):
        assert steps_poll[column] == steps_plain[column]
    assert not any(e[0] == "resolved" and log[i - 1][0] == "launch" for i, e in enumerate(log) if i)


def test_only_launches_that_take_a_poll_get_one_and_never_without_overlap():
    assert accepts_poll(PollingExecutor(None, [], True))
    assert not accepts_poll(CallableExecutor(lambda plan: None, clock=lambda: 0.0))
    _, _, log = serve(polls=True, overlap=False)
    assert not any(e[0] == "resolved" for e in log)      # without overlap the driver commits, never polls


def test_a_steps_tokens_leave_before_its_record_and_prediction():
    """A served token's way out does not wait for the step's bookkeeping: the driver hands the tokens to the source
    (and so to the HTTP workers) before it records the step with the simulator's prediction, with overlap and
    without; the records still carry every step's prediction."""
    from runtime.request_source import ReplaySource

    class LoggingSource(ReplaySource):
        def on_tokens(self, requests, now_s):
            log.append(("tokens", steps_recorded[0]))
            return super().on_tokens(requests, now_s)

    for overlap in (True, False):
        cfg = compose_config(TINY)
        core = build_core(cfg)
        log: list = []
        steps_recorded = [0]

        def predict(plan):
            log.append(("predict", steps_recorded[0]))
            steps_recorded[0] += 1
            return 1e-3

        executor = PollingExecutor(SimExecutor(build_cost_model(cfg, core), core.model.vocab_size), [], True)
        driver = RealDriver(core.scheduler, executor, progress=False, overlap=overlap, predict=predict)
        specs = instantiate(cfg.workload).requests()
        outcome = driver.serve(LoggingSource(specs, all_at_once=True), total=len(specs))
        kinds = [kind for kind, _ in log]
        assert kinds.count("predict") == len(outcome.steps.columns["step_id"]) >= 8
        for i, (kind, recorded) in enumerate(log):       # each step's tokens come before its own prediction
            if kind == "tokens":
                assert log[i + 1:i + 2] == [("predict", recorded)], (overlap, log[max(0, i - 2):i + 3])
