"""Prefill step time of the real runtime (eager fast path, dummy weights) with MLA attention in absorbed
form, in MHA form (k/v expanded by kv_b_proj; FlashInfer ragged prefill), and as SGLang's rule picks
(runtime.core.mla_form), next to the step's ideal roofline (experiments/step_roofline.py). Shapes:
one sequence of 2,048 / 8,192 new tokens, and the offline 1000-in steps as the scheduler builds them
(chunked prefill of 8,192 tokens: the previous step's chunked request continues with a cached prefix,
so SGLang's rule keeps them absorbed), and a shared-prefix step of the default workload (50 requests,
~100k cached prefix tokens in all: SGLang's rule expands the prefix in one shot). Optionally a kernel-time
profile of one step per form.

  python experiments/bench_mla_prefill.py --out DIR [--profile]     # DeepSeek-V2-Lite on one GPU, ~1 min
Writes DIR/prefill_forms.csv (and DIR/prefill_kernels.csv with --profile).
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch
from hydra.utils import instantiate

from experiments.compose import compose_config
from experiments.step_roofline import ideal_model
from runtime.core.layout import ParallelLayout
from runtime.core.mla_form import mla_attends_as_mha
from runtime.engine.fast_path import FastPathConfig, never_mha
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.model_runner import ModelRunner
from sim.costmodel.base import StepShape
from sim.costmodel.roofline_ops import GPU_OPS

# name -> per sequence (new tokens, cached prefix tokens)
SHAPES = {
    "1x2048": [(2048, 0)],
    "1x8192": [(8192, 0)],
    "offline_2048": [(1000, 0), (1000, 0), (48, 0)],
    "offline_8192": [(808, 192)] + [(1000, 0)] * 7 + [(384, 0)],
    "shared_prefix_8200": [(164, 2010)] * 50,
}
PROFILED = ("1x8192", "offline_8192")
FORMS = ("absorbed", "mha", "rule")


def batch_of(shape: list[tuple[int, int]], vocab: int, device: torch.device) -> ForwardBatch:
    gen = torch.Generator().manual_seed(0)
    seqs, next_slot = [], 0
    for new, prefix in shape:
        ids = torch.randint(0, vocab, (new,), generator=gen).tolist()
        seqs.append((ids, prefix, list(range(next_slot, next_slot + prefix + new))))
        next_slot += prefix + new
    return ForwardBatch.build(seqs, device)


def set_form(runner: ModelRunner, form: str) -> None:
    """absorbed: never MHA; mha: every extend in MHA form (prefix expanded); rule: SGLang's choice."""
    rules = {"absorbed": never_mha, "mha": lambda prefix_lens, seq_lens: True, "rule": mla_attends_as_mha}
    runner.attn_backend.mha_rule = rules[form]


def time_step_ms(runner: ModelRunner, fb: ForwardBatch, reps: int) -> float:
    times = []
    for i in range(reps + 2):                                  # two warm-ups (JIT, allocator)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runner.forward(fb, "eager")
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def profile_kernels(runner: ModelRunner, fb: ForwardBatch) -> dict[str, float]:
    """CUDA kernel time (ms) of one step, summed by kernel name."""
    from torch.profiler import ProfilerActivity, profile

    runner.forward(fb, "eager")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.forward(fb, "eager")
        torch.cuda.synchronize()
    by_name: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_name[event.name[:90]] += getattr(event, "device_time", 0.0) / 1e3
    return by_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="deepseek_v2_lite")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help=f"kernel times of {PROFILED} per form")
    args = parser.parse_args()
    cfg = compose_config([f"model={args.model}", "hardware=h200"])
    spec, hardware = instantiate(cfg.model), instantiate(cfg.hardware)
    slots = max(sum(p + n for n, p in shape) for shape in SHAPES.values()) + 16
    runner = ModelRunner(dict(spec.hf_config), slots, device="cuda", dtype="bfloat16",
                         fast=FastPathConfig(cuda_graph=False, progress=False))
    ideal = ideal_model(spec, hardware, ParallelLayout())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, kernels = [], []
    for name, shape in SHAPES.items():
        fb = batch_of(shape, int(spec.hf_config["vocab_size"]), runner.device)
        new, prefix = tuple(n for n, _ in shape), tuple(p for _, p in shape)
        parts = ideal.breakdown_s(StepShape(new, prefix))
        row = {"shape": name, "new_tokens": sum(new), "seqs": len(shape), "prefix_tokens": sum(prefix),
               "rule_form": "mha" if mla_attends_as_mha(prefix, [n + p for n, p in shape]) else "absorbed",
               "ideal_ms": 1e3 * sum(parts[op] for op in GPU_OPS)}
        for form in FORMS:
            set_form(runner, form)
            row[f"{form}_ms"] = time_step_ms(runner, fb, args.reps)
            if args.profile and name in PROFILED and form != "rule":
                kernels += [{"shape": name, "form": form, "kernel": k, "ms": v}
                            for k, v in profile_kernels(runner, fb).items()]
        row["rule_over_ideal"] = row["rule_ms"] / row["ideal_ms"]
        rows.append(row)
        print(pd.DataFrame([row]).to_string(index=False, float_format=lambda x: f"{x:.2f}"), flush=True)
    set_form(runner, "rule")
    table = pd.DataFrame(rows)
    table.to_csv(out / "prefill_forms.csv", index=False)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    if kernels:
        k = pd.DataFrame(kernels).sort_values(["shape", "form", "ms"], ascending=[True, True, False])
        k.to_csv(out / "prefill_kernels.csv", index=False)
        for (shape, form), g in k.groupby(["shape", "form"]):
            print(f"\n{shape} {form}: {g['ms'].sum():.1f} ms of kernels, top 10")
            print(g.head(10)[["kernel", "ms"]].to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
