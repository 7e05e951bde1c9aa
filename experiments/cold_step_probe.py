"""Which parts of the first served steps are still cold after the runner's warm-up: builds the scheduler
and runner as `mode=real` does (warm-up included), schedules the workload's first steps, and times each
step's host half, input copy, forward and sampling twice (cold, then the same step again), then profiles
the cold pass with torch.profiler (top operators by host and device time).

  python experiments/cold_step_probe.py model=deepseek_v2_lite [--steps 2] [overrides...]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def timed_parts(runner, plan, sync) -> dict[str, float]:
    """Milliseconds of prepare (host), to_device, forward and sampling of one plan, each synchronised."""
    out, t = {}, time.perf_counter()
    inputs = runner.prepare(plan)
    sync()
    out["prepare_ms"], t = 1e3 * (time.perf_counter() - t), time.perf_counter()
    fb = runner.batches.to_device(inputs.batch)
    sync()
    out["to_device_ms"], t = 1e3 * (time.perf_counter() - t), time.perf_counter()
    logits = runner.forward(fb)
    sync()
    out["forward_ms"], t = 1e3 * (time.perf_counter() - t), time.perf_counter()
    rows = inputs.sample_rows
    if rows:
        from runtime.engine.model_runner import GREEDY
        sampling = inputs.sampling if inputs.sampling is not None else [GREEDY] * len(rows)
        runner.sampler.sample(logits[rows], sampling, inputs.output_positions)
    sync()
    out["sample_ms"] = 1e3 * (time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    import torch
    from hydra.utils import instantiate
    from torch.profiler import ProfilerActivity, profile

    from experiments.compose import compose_config
    from runtime.build import build_core
    from runtime.engine.build_runner import build_model_runner
    from runtime.request_source import ReplaySource

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2, help="first steps to probe")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    cfg = compose_config(["mode=real", "progress=false", *args.overrides])
    core = build_core(cfg)
    runner = build_model_runner(cfg, core)
    cuda = runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(f"warm-up {runner.warmup_s:.1f} s", flush=True)
    sched = core.scheduler
    for req in ReplaySource(instantiate(cfg.workload).requests(), all_at_once=True).poll(0.0):
        sched.add(req, 0.0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for k in range(args.steps):
        plan = sched.schedule(0.0)
        if plan is None:
            break
        with profile(activities=activities) as prof:     # the cold pass, profiled
            cold = timed_parts(runner, plan, sync)
        warm = timed_parts(runner, plan, sync)
        new_tokens = sum(it.num_new_tokens for it in plan.items)
        print(f"step {k}: {len(plan.items)} seqs, {new_tokens} new tokens | cold (profiled) "
              + " ".join(f"{n} {v:.1f}" for n, v in cold.items()) + " | again "
              + " ".join(f"{n} {v:.1f}" for n, v in warm.items()), flush=True)
        table = prof.key_averages()
        print(table.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=70))
        if cuda:
            print(table.table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=70))
        sched.commit(plan, runner.execute(plan), 0.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
