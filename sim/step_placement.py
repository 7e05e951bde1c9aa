"""Where one step of the overlap loop sits on the device clock, from its cost model's terms (a StepResult) and what
the host and the step ahead did: the rule sim/driver.py applies to every step it does not coalesce, and that
experiments/fidelity_table.py applies to a real run's steps behind their real predecessors. Torch-free; imports
nothing of the simulator's state.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.core.batch import StepResult


@dataclass(frozen=True)
class Placement:
    start_s: float          # the step begins on the device: the step ahead ended and its launch had begun
    end_s: float
    launch_end_s: float     # the leader's launch returns (the host plans the next step after it)
    launched_by_s: float    # every rank has launched it (a rank takes the next step no earlier)


def place_step(result: StepResult, launch_begin_s: float, prev_end_s: float, launched_by_s: float,
               after_decode: bool, launch_factor: float = 1.0) -> Placement:
    """`result`'s step launched at `launch_begin_s` (its plan's time plus its host share), the step ahead ending at
    `prev_end_s` (decode-only: `after_decode`), the ranks done launching the step ahead at `launched_by_s`; its
    launch `launch_factor` times slower than result.launch_s (>= 1: after the host idled, idle_launch_factor).

    The device part (duration_s - host_s) begins once the step ahead ended, or, where the kernels reach the device
    only as the launch returns (launch_lead_s), once the lead has passed from the launch's begin and from when every
    rank could take it. A launch-bound share (launch_bound_s) is hidden by the head start the launch had on the step
    ahead; for ranks in lockstep (launch_ends_step) only by what the step ahead still ran once every rank could take
    this one, and the step ends no earlier than its launch from then. Right behind a decode-only step a device-bound
    extend saves after_decode_saving_s."""
    start = max(prev_end_s, launch_begin_s)
    slow = launch_factor
    launch_s, lead = result.launch_s * slow, result.launch_lead_s * slow
    ready = max(prev_end_s, launch_begin_s + lead, launched_by_s + lead) if lead else start
    end = ready + result.duration_s - result.host_s       # (this order: decode runs sum the same way)
    if slow > 1.0 and not lead:
        if result.launch_bound_s > 0.0 and not result.launch_ends_step:
            end += launch_s - result.launch_s
        end = max(end, launch_begin_s + launch_s)
    head_start = prev_end_s - launch_begin_s
    if result.after_decode_saving_s > 0.0 and ready <= prev_end_s and after_decode:
        end -= result.after_decode_saving_s                 # right behind a decode-only step
    if result.launch_ends_step:
        # ranks in lockstep: every rank can take the step once the leader launches it and each has launched the
        # step ahead (launched_by); only what the device still ran of the step ahead after that hides the
        # launch-bound part, and no rank is done launching it before its launch time from then, nor (paced by
        # its device) before the step ends
        free = max(launch_begin_s, launched_by_s)
        end = max(end - min(max(prev_end_s - free, 0.0), result.launch_bound_s), free + launch_s)
        launched_by = max(free + launch_s, end)
    else:
        launched_by = launch_begin_s + launch_s
    if result.launch_bound_s > 0.0 and not result.launch_ends_step:
        if head_start > 0.0:                             # the head start the launch had
            end -= min(head_start, result.launch_bound_s)
        if head_start < result.launch_bound_s:           # its launch set its end: every rank launched it only then
            launched_by = max(launched_by, end)
    return Placement(start, end, launch_begin_s + launch_s, launched_by)
