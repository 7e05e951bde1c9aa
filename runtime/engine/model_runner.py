"""Executes a core StepPlan on a torch model: builds the ForwardBatch from the plan's slot
indices, runs the model over the paged KV pool, samples one token per sampling item.

Imports torch; never imported by runtime/core or sim/.
"""
from __future__ import annotations

import time

import torch

from runtime.core.batch import StepPlan, StepResult
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.kv_pool import create_kv_pool
from runtime.engine.sampler import Sampler
from runtime.models.config import ModelConfig
from runtime.models.loader import build_model

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class ModelRunner:
    """The real executor: `execute(plan) -> StepResult` (tokens in plan.sampling_items order,
    duration measured on the wall clock after the device finished)."""

    def __init__(self, hf_config: dict, num_kv_slots: int, device: str = "auto", dtype: str = "bfloat16",
                 load_format: str = "dummy", path: str | None = None, seed: int = 0) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        self.device = resolve_device(device)
        self.dtype = DTYPES[dtype]
        start = time.perf_counter()
        self.model = build_model(hf_config, self.dtype, self.device, load_format, path, seed)
        self.pool = create_kv_pool(ModelConfig.from_hf(hf_config), num_kv_slots, self.dtype, self.device)
        self.sampler = Sampler(device=self.device, seed=seed)
        self._sync()
        self.load_time_s = time.perf_counter() - start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def forward_logits(self, plan: StepPlan) -> torch.Tensor:
        """Logits [B, V] of the last new token of every plan item (float32)."""
        fb = ForwardBatch.from_plan(plan, self.device)
        return self.model(fb, self.pool)

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> StepResult:
        start = time.perf_counter()
        logits = self.forward_logits(plan)                               # [B, V]
        rows = [i for i, it in enumerate(plan.items) if it.samples]
        tokens: list[int] = []
        if rows:
            items = [plan.items[i] for i in rows]
            ids = self.sampler.sample(logits[rows], [it.request.sampling for it in items],
                                      [len(it.request.output_ids) for it in items])
            tokens = ids.tolist()                                        # the one host sync of the step
        self._sync()
        return StepResult(next_token_ids=tokens, duration_s=time.perf_counter() - start)
