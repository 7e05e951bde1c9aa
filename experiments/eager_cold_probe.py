"""Are eager extend steps (past the piecewise graphs' limit) cold the first time a size is served after the
runner's warm-up? Builds the runner as `mode=real` does (warm-up included), then launches one-sequence
prefills of the given sizes back to back, each twice, and prints each step's interval, the allocator's
reserved bytes and, for the first step, the top host operators of a profiled pass. GPU (imports torch).

  python experiments/eager_cold_probe.py --sizes 2221 2584 4085 [overrides...]
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from experiments.probe_runner import built_runner, prefill_step_ms

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[2221, 2584, 4085, 2049, 3001])
    p.add_argument("--profile-first", action="store_true", help="profile the first step's cold pass")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    core, runner = built_runner(args.overrides)
    vocab = core.model.vocab_size
    print(f"warm-up {runner.warmup_s:.1f} s; reserved {torch.cuda.memory_reserved() / 2**30:.2f} GiB", flush=True)

    def run(tokens: int, tag: str) -> float:
        return prefill_step_ms(runner, tokens, tag, vocab)

    for k, tokens in enumerate(args.sizes):
        before = torch.cuda.memory_reserved()
        profiled = k == 0 and args.profile_first
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if profiled else nullcontext() as prof:
            first = run(tokens, f"c{k}a")
        grew = (torch.cuda.memory_reserved() - before) / 2**20
        again = [run(tokens, f"c{k}{r}") for r in "bc"]
        print(f"{tokens:6d} tokens: first {first:7.1f} ms (reserved +{grew:.0f} MiB), again "
              + " ".join(f"{x:.1f}" for x in again) + " ms", flush=True)
        if profiled:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
