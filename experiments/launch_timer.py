"""An Executor wrapper that records, per launched step, when its launch began and returned on the driver's host
clock, and how long the polls inside it took (the step ahead completed during the launch): the host side of
each real step, next to the device interval the step records hold. Torch-free; wraps any Executor.
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Callable

import pandas as pd

from runtime.executor import accepts_poll

LAUNCH_TIMES_FILE = "launch_times.parquet"


def current_cpu_reader() -> Callable[[], int]:
    """() -> the logical CPU the calling thread runs on (glibc's sched_getcpu), or -1 where it is unavailable."""
    try:
        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return lambda: -1
    getcpu.restype = ctypes.c_int
    return getcpu


class LaunchTimer:
    """Passes every call through to `executor`; `launch(plan, poll=...)` is timed. Times are seconds since
    `clock_origin()` was called (the driver calls it right before it takes its own origin), so they sit on the
    timeline of the step records' start_s / end_s."""

    def __init__(self, executor: Any, clock: Callable[[], float] = time.perf_counter, parts=None,
                 cpu_clock: Callable[[], float] = time.thread_time, current_cpu: Callable[[], int] | None = None) -> None:
        self._executor, self._clock, self._cpu_clock = executor, clock, cpu_clock
        self._current_cpu = current_cpu if current_cpu is not None else current_cpu_reader()
        self._takes_poll = accepts_poll(executor)
        self._origin = clock()
        self.rows: list[tuple[int, float, float, float, float, int]] = []
        self.parts = parts                  # runtime.profile.launch_parts.PartTimers installed on the runner, or None
        self.part_rows: list[dict] = []

    def clock_origin(self):
        # after the executor's origin, as the driver takes its own: a runner's clock_origin synchronises the
        # device first (1.5-1.8 ms at tp=2, 0.5-0.6 ms at tp=1 on H200), and an origin taken before it put every
        # launch that much late against the step records (the launch_times.parquet files written before this)
        origin = self._executor.clock_origin()
        self._origin = self._clock()
        return origin

    def launch(self, plan, poll: Callable[[], None] | None = None):
        polled = [0.0]

        def timed_poll() -> None:
            begin = self._clock()
            poll()
            polled[0] += self._clock() - begin

        if self.parts is not None:
            self.parts.reset()
        cpu, cpu_begin = self._current_cpu(), self._cpu_clock()
        begin = self._clock()
        if poll is not None and self._takes_poll:
            step = self._executor.launch(plan, poll=timed_poll)
        else:
            step = self._executor.launch(plan)
        end = self._clock()
        cpu_s = self._cpu_clock() - cpu_begin
        self.rows.append((plan.step_id, begin - self._origin, end - self._origin, polled[0], cpu_s, cpu))
        if self.parts is not None:
            self.part_rows.append(self.parts.ms())
        return step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)

    def frame(self) -> pd.DataFrame:
        """One row per launched step: step_id, launch_start_s, launch_end_s, poll_s (inside the launch), cpu_s (the
        driver thread's CPU time during the launch: below the launch's wall time, the thread was off its CPU or
        blocked), cpu (the logical CPU the launch began on; -1 where unknown), and with
        `parts` the host ms of each launch part (send_ms, core_ms, ...; polls inside a part count in it too) and
        clock_origin_s, the clock's own reading at the origin (time.perf_counter: CLOCK_MONOTONIC, which the
        other ranks' step timings on this host share)."""
        frame = pd.DataFrame(self.rows, columns=["step_id", "launch_start_s", "launch_end_s", "poll_s", "cpu_s", "cpu"])
        if self.part_rows:
            frame = pd.concat([frame, pd.DataFrame(self.part_rows)], axis=1).assign(clock_origin_s=self._origin)
        return frame
