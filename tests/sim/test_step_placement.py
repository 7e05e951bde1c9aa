"""sim.step_placement.place_step: the driver's rule for one step behind the step ahead, and experiments.fidelity_table's
replay of real steps behind their real predecessors with it."""
from __future__ import annotations

import pandas as pd
import pytest

from experiments.fidelity_table import place_real_steps
from runtime.core.batch import StepResult
from sim.step_placement import place_step


def terms(duration_s, host_s=0.0, launch_s=0.0, lead=False, bound_s=0.0, lockstep=False, saving_s=0.0):
    return StepResult(next_token_ids=[], duration_s=duration_s, host_s=host_s, launch_s=launch_s,
                      launch_lead_s=launch_s if lead else 0.0, launch_bound_s=bound_s, launch_ends_step=lockstep,
                      after_decode_saving_s=saving_s)


def test_a_step_launched_early_runs_its_device_share_right_after_the_step_ahead():
    placed = place_step(terms(0.010, host_s=0.002, launch_s=0.004), launch_begin_s=0.5, prev_end_s=1.0,
                        launched_by_s=0.0, after_decode=False)
    assert (placed.start_s, placed.end_s) == (1.0, pytest.approx(1.008))
    assert placed.launch_end_s == pytest.approx(0.504) and placed.launched_by_s == pytest.approx(0.504)


def test_a_graph_replay_waits_for_its_launch_and_a_head_start_hides_a_launch_bound_share():
    late = place_step(terms(0.005, launch_s=0.003, lead=True), launch_begin_s=0.999, prev_end_s=1.0,
                      launched_by_s=0.0, after_decode=False)
    assert late.end_s == pytest.approx(0.999 + 0.003 + 0.005)           # kernels reach the device as it returns
    hidden = place_step(terms(0.010, launch_s=0.006, bound_s=0.004), launch_begin_s=0.997, prev_end_s=1.0,
                        launched_by_s=0.0, after_decode=False)
    assert hidden.end_s == pytest.approx(1.0 + 0.010 - 0.003)           # 3 ms of head start hide 3 of the 4 ms
    assert hidden.launched_by_s == pytest.approx(hidden.end_s)          # its launch set its end
    behind = place_step(terms(0.010, bound_s=0.002, saving_s=0.001), launch_begin_s=0.9, prev_end_s=1.0,
                        launched_by_s=0.0, after_decode=True)
    assert behind.end_s == pytest.approx(1.0 + 0.010 - 0.001 - 0.002)


def test_in_lockstep_a_step_ends_no_earlier_than_its_launch_from_when_every_rank_could_take_it():
    placed = place_step(terms(0.004, launch_s=0.015, bound_s=0.006, lockstep=True), launch_begin_s=0.995,
                        prev_end_s=1.0, launched_by_s=1.002, after_decode=False)
    assert placed.end_s == pytest.approx(1.002 + 0.015)
    assert placed.launched_by_s == pytest.approx(placed.end_s)


def _real(starts, ends, prefill_tokens, launch_starts, launch_ends):
    steps = pd.DataFrame({"step_id": range(len(starts)), "start_s": starts, "end_s": ends,
                          "num_prefill_tokens": prefill_tokens})
    launches = pd.DataFrame({"step_id": range(len(starts)), "launch_start_s": launch_starts,
                             "launch_end_s": launch_ends}).set_index("step_id")
    return steps, launches


def test_real_steps_without_launch_terms_replay_as_their_device_share():
    steps, launches = _real([0.0, 0.010, 0.020], [0.010, 0.020, 0.031], [100, 0, 0],
                            [0.0, 0.004, 0.014], [0.003, 0.006, 0.016])
    got = place_real_steps([terms(0.012, host_s=0.002), terms(0.009, host_s=0.001), terms(0.011, host_s=0.001)],
                           steps, launches)
    assert got.tolist() == pytest.approx([0.010, 0.008, 0.010])


def test_a_decode_behind_a_long_launch_waits_for_its_own_launch_and_idle_launches_stretch():
    # step 1 (a decode graph) began launching 1 ms before the extend ahead ended: its 3 ms launch sets its start
    steps, launches = _real([0.0, 0.020], [0.020, 0.027], [512, 0], [0.0, 0.019], [0.019, 0.022])
    got = place_real_steps([terms(0.020), terms(0.004, launch_s=0.003, lead=True)], steps, launches)
    assert got.tolist() == pytest.approx([0.020, 0.002 + 0.004])
    # a launch begun 0.5 s after the step ahead ended and its launch returned: the host idled, the launch stretches
    steps, launches = _real([0.0, 0.520], [0.010, 0.530], [512, 512], [0.0, 0.510], [0.005, 0.518])
    slow = place_real_steps([terms(0.010), terms(0.010, launch_s=0.008, bound_s=0.004)], steps, launches,
                            idle_factor=lambda idle_s: 1.5 if idle_s > 0.4 else 1.0)
    assert slow[1] == pytest.approx(0.010 + 0.008 * 0.5)         # the launch-bound step pays the longer launch
    plain = place_real_steps([terms(0.010), terms(0.010, launch_s=0.008, bound_s=0.004)], steps, launches)
    assert plain[1] == pytest.approx(0.010)
