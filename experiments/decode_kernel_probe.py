"""Where a graph-replayed decode step's time goes, kernel by kernel: times decode steps of B requests
(context C, KV written by the model, launched as serving launches them) under torch.profiler and prints,
per kernel name, launches per step, mean device microseconds and share of the step; then the step's
interval next to the summed kernel time (the rest: gaps between kernels, host waits). GPU (imports torch).

  python experiments/decode_kernel_probe.py [model=...] [--batches 1 8] [--context 1024] [--out CSV]
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from experiments.probe_runner import decode_probe_args, filled_runner
from experiments.rows_csv import write_rows_csv
from runtime.profile.plans import synthetic_request


def kernel_table(events, steps: int) -> list[dict]:
    """Rows {kernel, per_step, mean_us, step_us} from the profiler's device kernel events, most time first."""
    total_us, count = defaultdict(float), defaultdict(int)
    for e in events:
        if e.device_type.name != "CUDA" or e.name.startswith(("Memcpy", "Memset")):
            continue
        total_us[e.name] += e.time_range.elapsed_us()
        count[e.name] += 1
    rows = [dict(kernel=name[:90], per_step=count[name] / steps, mean_us=total_us[name] / count[name],
                 step_us=total_us[name] / steps) for name in total_us]
    return sorted(rows, key=lambda r: -r["step_us"])


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from runtime.core.batch import ScheduledItem
    from runtime.profile.plans import finish, step_plan
    from runtime.profile.timing import time_plan

    args = decode_probe_args(__doc__.splitlines()[0], [1, 8], lambda p: (
        p.add_argument("--context", type=int, default=1024), p.add_argument("--out", type=Path, default=None)))
    core, runner, _ = filled_runner(args.overrides)
    vocab = core.model.vocab_size
    out_rows = []
    for batch in args.batches:
        requests = []
        for i in range(batch):
            req = synthetic_request(f"kp{batch}-{i}", 7 * i + batch, args.context, 0, vocab)
            req.kv_slots = list(range(i * args.context, (i + 1) * args.context))
            requests.append(req)
        items = [ScheduledItem(r, args.context - 1, 1, [r.kv_slots[-1]], is_decode=True, samples=True)
                 for r in requests]
        plan = step_plan(items)
        time_plan(runner, plan, 5)                                          # warm
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            timing = time_plan(runner, plan, args.repeats)
        torch.cuda.synchronize()
        steps = args.repeats + 1                                            # time_plan's untimed launch too
        rows = kernel_table(prof.events(), steps)
        kernels_us = sum(r["step_us"] for r in rows)
        launches = sum(r["per_step"] for r in rows)
        step_us = timing.device_s * 1e6
        print(f"\n== batch {batch}, context {args.context}: step {step_us:.0f} us, kernels {kernels_us:.0f} us "
              f"({launches:.0f} launches), rest {step_us - kernels_us:.0f} us "
              f"({(step_us - kernels_us) / max(launches, 1):.2f} us a launch); host launch {timing.launch_host_s * 1e6:.0f} us")
        print(f"{'per step':>8} {'mean us':>8} {'us/step':>8} {'share':>6}  kernel")
        for r in rows[:40]:
            print(f"{r['per_step']:8.1f} {r['mean_us']:8.2f} {r['step_us']:8.1f} {r['step_us'] / step_us:6.1%}  {r['kernel']}")
        out_rows += [dict(batch=batch, context=args.context, step_interval_us=round(step_us, 1), **r) for r in rows]
        finish(requests)
    if args.out is not None:
        print(f"wrote {write_rows_csv(args.out, out_rows)}")


if __name__ == "__main__":
    main()
