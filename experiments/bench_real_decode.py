"""Real-runtime decode step time (torch reference path) for a model with dummy weights: load time,
then one decode step of batch B at context C, timed after warm-up. GPU (or CPU for tiny models).

  python experiments/bench_real_decode.py --model deepseek_v2_lite --batch 1 8 64 --context 1024 --out experiments/results/h200/real_decode_reference.csv
"""
from __future__ import annotations

import argparse
import statistics

from hydra.utils import instantiate

from experiments.compose import compose_config
from experiments.rows_csv import write_rows_csv
from runtime.core.batch import ForwardMode, ScheduledItem, StepPlan
from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.request import Request, SamplingParams
from runtime.engine.model_runner import ModelRunner


def decode_plan(batch: int, context: int, allocator: KVSlotAllocator, vocab: int) -> StepPlan:
    """A decode step of `batch` requests that each have `context - 1` tokens of KV."""
    items = []
    for b in range(batch):
        req = Request(f"b{b}", [(7 * b + i) % vocab for i in range(context - 1)],
                      SamplingParams(max_new_tokens=1 << 20, ignore_eos=True, temperature=0.0), 0.0)
        req.output_ids = [(131 * b + 17) % vocab]   # distinct tokens: identical ones would route to the same experts
        req.kv_slots = allocator.allocate(0, context - 1, None)
        req.num_computed_tokens = context - 1
        new = allocator.allocate(context - 1, 1, req.kv_slots[-1])
        req.append_kv_slots(new)
        items.append(ScheduledItem(req, context - 1, 1, new, is_decode=True, samples=True))
    return StepPlan(0, ForwardMode.DECODE, items)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="deepseek_v2_lite")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="experiments/results/h200/real_decode_reference.csv")
    args = parser.parse_args()
    spec = instantiate(compose_config([f"model={args.model}"]).model)
    slots = max(args.batch) * args.context + 16
    runner = ModelRunner(dict(spec.hf_config), slots, device=args.device, dtype=args.dtype)
    print(f"{args.model}: load (dummy weights + KV pool of {slots} slots) {runner.load_time_s:.2f} s on {runner.device}")
    rows = []
    for batch in args.batch:
        allocator = KVSlotAllocator(slots)
        plan = decode_plan(batch, args.context, allocator, spec.vocab_size)
        runner.execute(plan)                                   # warm-up
        times = [runner.execute(plan).duration_s for _ in range(args.repeats)]
        row = {"model": args.model, "device": str(runner.device), "path": "torch_reference", "batch": batch,
               "context": args.context, "step_ms_median": round(statistics.median(times) * 1e3, 3),
               "step_ms_min": round(min(times) * 1e3, 3), "load_s": round(runner.load_time_s, 2)}
        rows.append(row)
        print(row)
    write_rows_csv(args.out, rows)


if __name__ == "__main__":
    main()
