"""Per-step and per-request records, identical in both modes (DESIGN contract 4). Plain Python
columns here; runtime/records_io.py writes them as parquet.

Must not import torch, simpy or time (times are passed in).
"""
from __future__ import annotations

from typing import Sequence

from runtime.core.batch import ForwardMode, StepPlan
from runtime.core.request import Request

STEP_COLUMNS = (
    "step_id", "start_s", "end_s", "mode", "batch_size", "num_prefill_tokens", "num_decode_requests",
    "num_cache_hit_tokens", "kv_tokens_used", "num_retractions", "num_waiting", "num_running",
    "extend_prefix_tokens", "decode_context_tokens", "predicted_s",
)


class StepLog:
    """Column store of steps. `record` takes one executed plan; `record_decode_run` takes k
    consecutive decode steps of one unchanged batch (the simulator's fast-forward)."""

    def __init__(self, predicted_from_duration: bool = False) -> None:
        """`predicted_from_duration`: the simulator's log, where a step's predicted duration is the
        one it ran for; a real run passes each step's prediction (NaN where none was made)."""
        self.columns: dict[str, list] = {name: [] for name in STEP_COLUMNS}
        self.plan_signatures: list[tuple] | None = None   # set to [] to keep every plan's decisions
        self.predicted_from_duration = predicted_from_duration

    def __len__(self) -> int:
        return len(self.columns["step_id"])

    def record(self, plan: StepPlan, start_s: float, end_s: float, kv_tokens_used: int,
               num_waiting: int, num_running: int, predicted_s: float | None = None) -> None:
        c = self.columns
        items = plan.items
        if plan.mode is ForwardMode.DECODE:     # every item decodes one token: one pass
            num_prefill, num_decodes, extend_prefix = 0, len(items), 0
            decode_context = sum(it.num_prefix_tokens for it in items) + len(items)
        else:
            num_prefill, num_decodes = plan.num_prefill_tokens, plan.num_decode_requests
            extend_prefix = sum(it.num_prefix_tokens for it in items if not it.is_decode)
            decode_context = sum(it.num_prefix_tokens + 1 for it in items if it.is_decode)
        c["step_id"].append(plan.step_id)
        c["start_s"].append(start_s)
        c["end_s"].append(end_s)
        c["mode"].append(plan.mode.value)
        c["batch_size"].append(len(items))
        c["num_prefill_tokens"].append(num_prefill)
        c["num_decode_requests"].append(num_decodes)
        c["num_cache_hit_tokens"].append(plan.num_cache_hit_tokens)
        c["kv_tokens_used"].append(kv_tokens_used)
        c["num_retractions"].append(len(plan.retracted_rids))
        c["num_waiting"].append(num_waiting)
        c["num_running"].append(num_running)
        c["extend_prefix_tokens"].append(extend_prefix)
        c["decode_context_tokens"].append(decode_context)
        c["predicted_s"].append(self._predicted(start_s, end_s, predicted_s))
        if self.plan_signatures is not None:
            self.plan_signatures.append(plan.signature())

    def record_decode_run(self, plan: StepPlan, start_s: Sequence[float], end_s: Sequence[float],
                          kv_tokens_used: Sequence[int], num_waiting: int, num_running: int,
                          step_offset: int = 0, context_tokens: int | None = None) -> None:
        """`num_running`: after the last step (only the last step of a run can finish requests).
        `step_offset`: the first recorded step is the run's step `step_offset` (0 = plan's own).
        `context_tokens`: the plan's decode context, sum of num_prefix_tokens + 1 over its items
        (summed here when not given)."""
        k = len(end_s)
        n = len(plan.items)                      # a decode plan: every item decodes
        c = self.columns
        first = plan.step_id + step_offset
        c["step_id"].extend(range(first, first + k))
        c["start_s"].extend(start_s)
        c["end_s"].extend(end_s)
        c["mode"].extend([plan.mode.value] * k)
        c["batch_size"].extend([n] * k)
        c["num_prefill_tokens"].extend([0] * k)
        c["num_decode_requests"].extend([n] * k)
        c["num_cache_hit_tokens"].extend([0] * k)
        c["kv_tokens_used"].extend(kv_tokens_used)
        c["num_retractions"].extend([len(plan.retracted_rids) if step_offset == 0 else 0] + [0] * (k - 1))
        c["num_waiting"].extend([num_waiting] * k)
        c["num_running"].extend([n] * (k - 1) + [num_running])   # finishes end a run
        c["extend_prefix_tokens"].extend([0] * k)
        context0 = sum(it.num_prefix_tokens + 1 for it in plan.items) if context_tokens is None else context_tokens
        c["decode_context_tokens"].extend(range(context0 + n * step_offset, context0 + n * (step_offset + k), n))
        if self.predicted_from_duration:
            c["predicted_s"].extend([b - a for a, b in zip(start_s, end_s)])
        else:
            c["predicted_s"].extend([float("nan")] * k)
        if self.plan_signatures is not None:
            for j in range(step_offset, step_offset + k):
                self.plan_signatures.append(tuple((it.request.rid, it.num_prefix_tokens + j, 1) for it in plan.items))


    def record_decode_steps(self, plan: StepPlan, start_s: Sequence[float], end_s: Sequence[float],
                            kv_tokens_used: Sequence[int], num_waiting: int, num_running: Sequence[int],
                            batch_sizes: Sequence[int], context_tokens: Sequence[int]) -> None:
        """Steps 0 .. k-1 of a decode run from `plan` (its own step first) whose batch shrinks as requests
        finish: step j decodes batch_sizes[j] requests attending context_tokens[j], with num_running[j]
        running after it; the same rows as record_decode_run over each stretch of one batch. Plan
        signatures need each step's batch: keep them with record_decode_run."""
        if self.plan_signatures is not None:
            raise ValueError("record_decode_steps keeps no plan signatures: record each batch with record_decode_run")
        k = len(end_s)
        c = self.columns
        c["step_id"].extend(range(plan.step_id, plan.step_id + k))
        c["start_s"].extend(start_s)
        c["end_s"].extend(end_s)
        c["mode"].extend([plan.mode.value] * k)
        c["batch_size"].extend(batch_sizes)
        c["num_prefill_tokens"].extend([0] * k)
        c["num_decode_requests"].extend(batch_sizes)
        c["num_cache_hit_tokens"].extend([0] * k)
        c["kv_tokens_used"].extend(kv_tokens_used)
        c["num_retractions"].extend([len(plan.retracted_rids)] + [0] * (k - 1))
        c["num_waiting"].extend([num_waiting] * k)
        c["num_running"].extend(num_running)
        c["extend_prefix_tokens"].extend([0] * k)
        c["decode_context_tokens"].extend(context_tokens)
        if self.predicted_from_duration:
            c["predicted_s"].extend([b - a for a, b in zip(start_s, end_s)])
        else:
            c["predicted_s"].extend([float("nan")] * k)

    def _predicted(self, start_s: float, end_s: float, predicted_s: float | None) -> float:
        if predicted_s is not None:
            return float(predicted_s)
        return end_s - start_s if self.predicted_from_duration else float("nan")


REQUEST_COLUMNS = (
    "rid", "arrival_s", "admitted_s", "first_token_s", "finish_s", "input_tokens", "output_tokens",
    "cached_tokens", "finish_reason", "num_retractions", "priority", "token_times_s",
)


def request_record(req: Request) -> dict:
    """One row of requests.parquet. `token_times_s[i]` is when output token i was sampled."""
    return {
        "rid": req.rid,
        "arrival_s": req.arrival_s,
        "admitted_s": req.admitted_s,
        "first_token_s": req.first_token_s,
        "finish_s": req.finish_s,
        "input_tokens": len(req.input_ids),
        "output_tokens": len(req.output_ids),
        "cached_tokens": req.num_cached_tokens,
        "finish_reason": req.finish_reason.value if req.finish_reason else None,
        "num_retractions": req.num_retractions,
        "priority": req.priority,
        "token_times_s": list(req.token_times_s),
    }
