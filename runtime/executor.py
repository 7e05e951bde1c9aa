"""The Executor Protocol: what a driver needs of whatever runs a step plan (the torch model runner,
the simulator's cost-model executor, a plain `execute(plan)` callable wrapped). Imports neither
torch nor simpy.
"""
from __future__ import annotations

import inspect
from typing import Callable, Protocol

from runtime.core.batch import StepPlan, StepResult


class LaunchedStep(Protocol):
    """A step handed to the device. `placeholder_ids`: one per sampling item, what the scheduler
    appends until the real tokens arrive (the executor resolves them on the device)."""

    placeholder_ids: list[int]

    def done(self) -> bool:
        """Without blocking: has the step finished, so that wait() returns at once?"""
        ...

    def wait(self) -> StepResult:
        """Block until the step's tokens are on the host."""
        ...

    def interval_s(self, origin: object) -> tuple[float, float] | None:
        """(start, end) of the step on the device, seconds since `origin` (the executor's clock
        origin); None when the executor cannot tell (the driver then uses its own clock)."""
        ...


class Executor(Protocol):
    """Runs step plans. A driver calls `clock_origin()` once at the start of a run, then for each
    plan either `launch(plan)` (the real-time driver: the device may still run the step when it
    returns; `wait()` gives its tokens, `interval_s(origin)` its device times) or `execute(plan)`
    (launch and wait in one call; the simulator's driver, which reads `StepResult.duration_s`).
    Neither reads nor changes the scheduler: tokens come back in `plan.sampling_items` order.
    An executor whose launch keeps the host long may also take `launch(plan, poll=callable)` and call
    `poll()` at points of its launch (`accepts_poll` tells): the overlap driver completes the step ahead
    there once that step is done, so its tokens leave without waiting for the rest of this launch.
    Implemented by runtime.engine.model_runner.ModelRunner, sim.executor.SimExecutor and
    CallableExecutor below; `check_executor` says what an object lacks."""

    def clock_origin(self) -> object | None:
        """The origin `LaunchedStep.interval_s` measures from (None: steps carry no device times)."""
        ...

    def launch(self, plan: StepPlan) -> LaunchedStep:
        """Start the step without waiting for the device."""
        ...

    def execute(self, plan: StepPlan) -> StepResult:
        """Run the step to completion: `launch(plan).wait()`."""
        ...


EXECUTOR_METHODS: tuple[str, ...] = ("clock_origin", "launch", "execute")
_ARITY = {name: len(inspect.signature(getattr(Executor, name)).parameters) - 1 for name in EXECUTOR_METHODS}


def accepts_poll(executor: object) -> bool:
    """Whether `executor.launch` takes a `poll` keyword (see Executor)."""
    try:
        return "poll" in inspect.signature(executor.launch).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def missing_executor_methods(obj: object) -> list[str]:
    """The Executor methods `obj` (an instance or a class) lacks, or has with a signature that does
    not take the Protocol's arguments (e.g. 'launch(plan)')."""
    missing = []
    for name in EXECUTOR_METHODS:
        args = ("plan",) * _ARITY[name]
        method = getattr(obj, name, None)
        if method is None or not callable(method):
            missing.append(f"{name}({', '.join(args)})")
            continue
        bound = (None,) if isinstance(obj, type) else ()   # a class's methods still take self
        try:
            inspect.signature(method).bind(*bound, *args)
        except TypeError:
            missing.append(f"{name}({', '.join(args)})")
        except ValueError:          # no signature to inspect (a builtin): trust it
            pass
    return missing


def check_executor(obj: object) -> Executor:
    """`obj` itself if it satisfies the Executor Protocol, else a TypeError naming what it lacks."""
    missing = missing_executor_methods(obj)
    if missing:
        raise TypeError(f"{type(obj).__name__} is not an Executor (runtime/executor.py): it lacks "
                        f"{', '.join(missing)}")
    return obj


class FinishedStep:
    """A step that ran to completion when it was launched. `start_s`/`end_s`: readings of the
    executor's clock (its `clock_origin()` is that clock's reading at the run start); None when the
    executor has no clock of its own (the driver then places the step on its clock)."""

    def __init__(self, result: StepResult, start_s: float | None = None, end_s: float | None = None) -> None:
        self.result = result
        self.placeholder_ids = list(result.next_token_ids)
        self.start_s, self.end_s = start_s, end_s

    def done(self) -> bool:
        return True

    def wait(self) -> StepResult:
        return self.result

    def interval_s(self, origin: object) -> tuple[float, float] | None:
        if self.start_s is None or origin is None:
            return None
        return self.start_s - origin, self.end_s - origin


class CallableExecutor:
    """An Executor around a plain `execute(plan) -> StepResult` callable, timed on `clock`."""

    def __init__(self, execute: Callable[[StepPlan], StepResult], clock: Callable[[], float]) -> None:
        self._execute, self.clock = execute, clock

    def clock_origin(self) -> float:
        return self.clock()

    def launch(self, plan: StepPlan) -> FinishedStep:
        start = self.clock()
        result = self._execute(plan)
        return FinishedStep(result, start, self.clock())

    def execute(self, plan: StepPlan) -> StepResult:
        return self._execute(plan)
