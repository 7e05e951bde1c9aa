"""Replay cost model: returns, step after step, the durations a real run measured (the
sim-vs-real parity proof, DESIGN contract 5). Torch-free."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sim.costmodel.base import StepShape, decode_segments_one_by_one


class ReplayCostModel:
    """Durations are consumed in order, one per step; use with `sim.fast_forward=false`."""

    def __init__(self, durations_s: Sequence[float]) -> None:
        self.durations_s = list(durations_s)
        self.next_step = 0

    def step_time_s(self, shape: StepShape) -> float:
        if self.next_step >= len(self.durations_s):
            raise IndexError(f"replay has only {len(self.durations_s)} recorded steps")
        self.next_step += 1
        return self.durations_s[self.next_step - 1]

    def host_time_s(self, shape: StepShape) -> float:
        return 0.0      # measured durations already include whatever host time was not hidden

    def launch_time_s(self, shape: StepShape) -> float:
        return 0.0      # the recorded steps' starts already carry when the real host planned them

    def launch_bound_s(self, shape: StepShape) -> float:
        return 0.0      # the recorded durations are what the launches left

    def launch_ends_step(self, shape: StepShape) -> bool:
        return False      # the recorded durations already hold the launches

    def after_decode_saving_s(self, shape: StepShape) -> float:
        return 0.0      # the recorded durations are what the steps took where they ran

    def idle_launch_factor(self, idle_s: float) -> float:
        return 1.0      # the recorded durations already hold any slow launch after idle

    def device_waits_for_launch(self, shape: StepShape) -> bool:
        return False    # the recorded durations already hold any wait for a launch

    def decode_times_s(self, num_reqs: int, context_tokens: np.ndarray, shared_tokens: int = 0,
                       first_context_lens: np.ndarray | None = None) -> np.ndarray:
        return np.array([self.step_time_s(None) for _ in range(len(context_tokens))])  # type: ignore[arg-type]

    def decode_segment_times_s(self, num_reqs: Sequence[int], segment_steps: Sequence[int],
                               context_tokens: np.ndarray, shared_tokens: Sequence[int],
                               first_context_lens: Sequence[np.ndarray | None]) -> np.ndarray:
        return decode_segments_one_by_one(self, num_reqs, segment_steps, context_tokens, shared_tokens,
                                          first_context_lens)

    def breakdown_s(self, shape: StepShape) -> dict[str, float]:
        return {"replayed": self.step_time_s(shape)}

    @classmethod
    def from_steps(cls, start_s: Sequence[float], end_s: Sequence[float]) -> "ReplayCostModel":
        """From a real run's steps: each step lasts until the next one started (the scheduler's
        own time between steps included), so simulated steps start when the real ones did."""
        starts = list(start_s)
        gaps = [b - a for a, b in zip(starts, starts[1:])] + ([end_s[-1] - starts[-1]] if starts else [])
        return cls(gaps)
