"""experiments.launch_timer takes its origin where the driver takes its own (after the runner's clock_origin,
which synchronises the device), and experiments.launch_regimes puts launch times written before that onto the
step records' clock."""
from __future__ import annotations

import pandas as pd
import pytest

from experiments.launch_regimes import clock_offset_s
from experiments.launch_timer import LaunchTimer


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Runner:
    """clock_origin takes 2 ms (a device synchronisation); launch takes 5 ms."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def clock_origin(self):
        self.clock.t += 0.002
        return "gpu-origin"

    def launch(self, plan):
        self.clock.t += 0.005
        return "step"


class _Plan:
    step_id = 0


def test_the_timer_origin_is_taken_after_the_runners_clock_origin():
    clock = _Clock()
    timer = LaunchTimer(_Runner(clock), clock=clock)
    assert timer.clock_origin() == "gpu-origin"
    driver_origin = clock()                     # the driver's own origin, right after (runtime.driver)
    clock.t += 0.001
    timer.launch(_Plan())
    row = timer.frame().iloc[0]
    assert driver_origin == pytest.approx(0.002) and row["launch_start_s"] == pytest.approx(0.001)
    assert row["launch_end_s"] == pytest.approx(0.006)


def test_the_clock_offset_is_the_latest_launch_begin_past_its_steps_start():
    steps = pd.DataFrame({"start_s": [0.0100, 0.0200, 0.0300], "launch_start_s": [0.0115, 0.0150, 0.0290]})
    assert clock_offset_s(steps) == pytest.approx(0.0015)        # the first step was launched on an idle device
    assert clock_offset_s(steps.assign(launch_start_s=steps["start_s"] - 0.001)) == 0.0   # never negative


def test_each_launch_carries_the_threads_cpu_time_and_the_cpu_it_began_on():
    clock, cpu_clock = _Clock(), _Clock()

    class _Busy(_Runner):
        def launch(self, plan):          # 5 ms of wall, 3 ms of it on the CPU (2 ms waiting)
            cpu_clock.t += 0.003
            return super().launch(plan)

    timer = LaunchTimer(_Busy(clock), clock=clock, cpu_clock=cpu_clock, current_cpu=lambda: 7)
    timer.launch(_Plan())
    row = timer.frame().iloc[0]
    assert row["cpu_s"] == pytest.approx(0.003) and row["cpu"] == 7
    assert row["launch_end_s"] - row["launch_start_s"] == pytest.approx(0.005)


def test_the_default_cpu_reader_names_a_cpu_this_process_may_run_on():
    import os

    from experiments.launch_timer import current_cpu_reader

    cpu = current_cpu_reader()()
    if cpu == -1:
        pytest.skip("sched_getcpu is unavailable here")
    assert cpu in os.sched_getaffinity(0)
