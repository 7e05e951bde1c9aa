"""The device-side batch metadata: kv_indices gathered from the request->slot table equal the
host-built ones for random batches (CPU torch path, and the Triton kernel under the interpreter),
rows follow rewritten slots, overlap placeholders resolve on the device."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from runtime.core.batch import ForwardMode, ScheduledItem, StepPlan
from runtime.core.request import Request, SamplingParams
from runtime.engine.batch_builder import BatchBuilder, FutureTokens
from runtime.engine.forward_batch import ForwardBatch


def random_plan(rng: np.random.Generator, step: int, requests: dict[str, Request], num_slots: int) -> StepPlan:
    """Decodes of the existing requests plus a few new prefills with random prefixes."""
    items, free = [], rng.permutation(num_slots).tolist()
    used = {s for r in requests.values() for s in r.kv_slots.tolist()}
    free = [s for s in free if s not in used]
    for req in list(requests.values()):
        if rng.random() < 0.2:                      # finished
            del requests[req.rid]
            continue
        start = len(req.kv_slots)
        slot = free.pop()
        req.append_kv_slots([slot])
        req.output_ids.append(int(rng.integers(1, 50)))
        items.append(ScheduledItem(req, start, 1, [slot], is_decode=True, samples=True))
    for k in range(int(rng.integers(1, 4))):
        prompt = rng.integers(1, 50, size=int(rng.integers(2, 300))).tolist()
        req = Request(f"s{step}-{k}", prompt, SamplingParams(max_new_tokens=64), 0.0)
        prefix = int(rng.integers(0, len(prompt)))
        new = len(prompt) - prefix
        slots = [free.pop() for _ in range(prefix + new)]
        req.kv_slots = slots
        requests[req.rid] = req
        items.append(ScheduledItem(req, prefix, new, slots[prefix:], is_decode=False, samples=True))
    return StepPlan(step, ForwardMode.MIXED, items)


def test_table_built_kv_indices_equal_host_built():
    rng = np.random.default_rng(0)
    builder = BatchBuilder(num_rows=64, max_context_tokens=512, device=torch.device("cpu"),
                           future=FutureTokens(256, torch.device("cpu")))
    requests: dict[str, Request] = {}
    for step in range(12):
        plan = random_plan(rng, step, requests, num_slots=20000)
        fb = builder.build(plan)
        ref = ForwardBatch.from_plan(plan, "cpu")
        assert torch.equal(fb.kv_indices, ref.kv_indices)
        assert torch.equal(fb.kv_indptr, ref.kv_indptr) and torch.equal(fb.positions, ref.positions)
        assert torch.equal(fb.input_ids, ref.input_ids) and torch.equal(fb.out_cache_loc, ref.out_cache_loc)


def test_rewritten_slots_rewrite_the_row():
    builder = BatchBuilder(8, 64, torch.device("cpu"), FutureTokens(32, torch.device("cpu")))
    req = Request("a", [1, 2, 3, 4], SamplingParams(max_new_tokens=8), 0.0)
    req.kv_slots = [10, 11, 12, 13]
    builder.build(StepPlan(0, ForwardMode.EXTEND, [ScheduledItem(req, 0, 4, [10, 11, 12, 13], False, True)]))
    req.kv_slots[:2] = [20, 21]                     # re-pinned on the cache's copy
    req.kv_version += 1
    req.output_ids.append(5)
    req.append_kv_slots([14])
    fb = builder.build(StepPlan(1, ForwardMode.DECODE, [ScheduledItem(req, 4, 1, [14], True, True)]))
    assert fb.kv_indices.tolist() == [20, 21, 12, 13, 14]


def test_placeholders_resolve_from_the_future_ring():
    future = FutureTokens(16, torch.device("cpu"))
    ring = future.reserve(3)
    future.store(torch.from_numpy(ring), torch.tensor([7, 8, 9]))
    ids = torch.tensor([1] + future.placeholders(ring) + [2])
    assert future.resolve(ids).tolist() == [1, 7, 8, 9, 2]


_TRITON_CHECK = """
import torch
from kernels.kv_indices.triton_kv_indices import kv_indices_torch, kv_indices_triton
g = torch.Generator().manual_seed(0)
table = torch.randint(0, 10**6, (16, 9000), generator=g, dtype=torch.int32)
for lens in ([1, 5, 8200, 3], [4096, 4097, 1]):
    rows = torch.randperm(16, generator=g)[:len(lens)].to(torch.int32)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(lens), 0)
    k = int(indptr[-1])
    assert torch.equal(kv_indices_triton(table, rows, indptr, k, max(lens)), kv_indices_torch(table, rows, indptr, k))
print("ok")
"""


def test_triton_kv_indices_kernel_matches_torch_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", _TRITON_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kv_indices_kernel_on_gpu():
    from kernels.kv_indices.triton_kv_indices import kv_indices_torch, kv_indices_triton
    table = torch.randint(0, 10**6, (64, 20000), dtype=torch.int32, device="cuda")
    lens = torch.randint(1, 20000, (48,))
    rows = torch.randperm(64, device="cuda")[:48].to(torch.int32)
    indptr = torch.zeros(49, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    k = int(indptr[-1])
    indptr = indptr.cuda()
    assert torch.equal(kv_indices_triton(table, rows, indptr, k, int(lens.max())), kv_indices_torch(table, rows, indptr, k))


def test_rows_are_reused_when_an_id_comes_back():
    """A new request with an earlier request's id (a second run through the same runner) takes over
    a row without leaking the old one."""
    builder = BatchBuilder(2, 16, torch.device("cpu"), FutureTokens(8, torch.device("cpu")))
    for generation in range(5):
        reqs = [Request(f"r{i}", [1, 2], SamplingParams(max_new_tokens=2), 0.0) for i in range(2)]
        items = []
        for i, req in enumerate(reqs):
            req.kv_slots = [10 * i + generation, 10 * i + generation + 1]
            items.append(ScheduledItem(req, 0, 2, list(req.kv_slots), False, True))
        fb = builder.build(StepPlan(generation, ForwardMode.EXTEND, items))
        assert fb.kv_indices.tolist() == reqs[0].kv_slots.tolist() + reqs[1].kv_slots.tolist()
