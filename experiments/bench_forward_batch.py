"""Host cost of building a decode step's ForwardBatch from a StepPlan: the numpy path
(ForwardBatch.from_plan) against the list-and-torch.tensor path it replaced (kept here as the baseline).

Scenario: B decode requests with C tokens of KV each (K = B * C slot indices to flatten), built on the
CPU (the device copy is excluded, so it runs anywhere). Prints ms per build and the speedup; checks
both builds give identical tensors.

  python experiments/bench_forward_batch.py                   # B=256, C=1024
  python experiments/bench_forward_batch.py --batch 1 8 64 256 --context 1024 4096
"""
from __future__ import annotations

import argparse
import statistics

import torch

from experiments.bench_decode_step import time_ms
from experiments.bench_real_decode import decode_plan
from runtime.core.batch import StepPlan
from runtime.core.cache.allocator import KVSlotAllocator
from runtime.engine.forward_batch import ForwardBatch

FIELDS = ("input_ids", "positions", "out_cache_loc", "seq_lens", "prefix_lens", "extend_lens", "qo_indptr",
          "kv_indptr", "kv_indices", "logits_indices", "is_decode")


def from_plan_lists(plan: StepPlan, device: str) -> ForwardBatch:
    """The previous implementation: Python lists per token, then one torch.tensor per field."""
    ids, positions, out_loc, kv_indices = [], [], [], []
    prefix_lens, extend_lens, seq_lens = [], [], []
    for item in plan.items:
        req, start = item.request, item.num_prefix_tokens
        new_ids = req.fill_ids[start:start + item.num_new_tokens]
        slots = list(req.kv_slots[:start]) + list(item.new_slots)
        ids.extend(new_ids)
        positions.extend(range(start, start + len(new_ids)))
        out_loc.extend(slots[start:])
        kv_indices.extend(slots)
        prefix_lens.append(start)
        extend_lens.append(len(new_ids))
        seq_lens.append(start + len(new_ids))
    qo_indptr, kv_indptr = [0], [0]
    for n, s in zip(extend_lens, seq_lens):
        qo_indptr.append(qo_indptr[-1] + n)
        kv_indptr.append(kv_indptr[-1] + s)

    def long(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    def int32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return ForwardBatch(
        input_ids=long(ids), positions=long(positions), out_cache_loc=long(out_loc), seq_lens=long(seq_lens),
        prefix_lens=long(prefix_lens), extend_lens=long(extend_lens), qo_indptr=int32(qo_indptr),
        kv_indptr=int32(kv_indptr), kv_indices=int32(kv_indices), logits_indices=long([e - 1 for e in qo_indptr[1:]]),
        is_decode=torch.tensor([it.is_decode for it in plan.items], dtype=torch.bool, device=device),
        seq_lens_cpu=seq_lens, prefix_lens_cpu=prefix_lens, extend_lens_cpu=extend_lens)


def check_same(a: ForwardBatch, b: ForwardBatch) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), f"{name} differs"
    assert (a.seq_lens_cpu, a.prefix_lens_cpu, a.extend_lens_cpu) == (b.seq_lens_cpu, b.prefix_lens_cpu,
                                                                      b.extend_lens_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[256])
    parser.add_argument("--context", type=int, nargs="+", default=[1024])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--vocab", type=int, default=102400)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("batch  context  kv_tokens  lists_ms  numpy_ms  speedup")
    for context in args.context:
        for batch in args.batch:
            plan = decode_plan(batch, context, KVSlotAllocator(batch * context + 16), args.vocab)
            check_same(ForwardBatch.from_plan(plan, "cpu"), from_plan_lists(plan, "cpu"))
            old = statistics.median(time_ms(lambda: from_plan_lists(plan, "cpu"), args.repeats, warmup=1))
            new = statistics.median(time_ms(lambda: ForwardBatch.from_plan(plan, "cpu"), args.repeats, warmup=1))
            print(f"{batch:5d}  {context:7d}  {batch * context:9d}  {old:8.2f}  {new:8.2f}  {old / new:6.2f}x")


if __name__ == "__main__":
    main()
