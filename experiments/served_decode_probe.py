"""Are served decode steps slower than the profile's because their contexts spread? Rebuilds decode steps of a
committed real run with their own per-request contexts (experiments/served_decode_contexts.py) and times each as
served and with equal contexts of the same sum, graph-replayed on a KV pool the model wrote, as mode=profile times
decode (experiments/probe_runner.py). GPU (imports torch). Writes one CSV row per step.

  python experiments/served_decode_probe.py --run experiments/results/h200/fidelity/real/random_poisson_32rps \\
      --out OUT/served_decode.csv [--steps 48] [--min-batch 32] [--max-batch 256] [overrides...]
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from experiments.probe_runner import decode_step_ms, filled_runner
from experiments.served_decode_contexts import decode_step_contexts
from runtime.profile.plans import synthetic_request


def equal_contexts(contexts: list[int]) -> list[int]:
    """len(contexts) contexts as equal as integers allow, with the same sum."""
    n, total = len(contexts), sum(contexts)
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def pick_steps(frame: pd.DataFrame, num: int, min_batch: int, max_batch: int) -> pd.DataFrame:
    """Up to `num` exactly rebuilt steps with min_batch <= batch < max_batch, spread evenly over their batch sizes."""
    exact = frame[(frame["rebuilt_tokens"] == frame["decode_context_tokens"])
                  & (frame["contexts"].map(len) == frame["batch_size"])
                  & (frame["batch_size"] >= min_batch) & (frame["batch_size"] < max_batch)]
    exact = exact.sort_values("batch_size")
    if len(exact) <= num:
        return exact
    return exact.iloc[np.linspace(0, len(exact) - 1, num).round().astype(int)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--min-batch", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    picked = pick_steps(decode_step_contexts(args.run), args.steps, args.min_batch, args.max_batch)
    core, runner, slots = filled_runner(args.overrides)
    vocab = core.model.vocab_size
    rows = []
    print("step  batch  ctx/req  cv     served ms  equal ms  served/equal  measured ms")
    for step in picked.itertuples(index=False):
        timed = {}
        for kind, ctx in (("served", list(step.contexts)), ("equal", equal_contexts(list(step.contexts)))):
            starts = np.concatenate(([0], np.cumsum(ctx)[:-1])) % max(slots - max(ctx), 1)   # own slot ranges
            requests = [synthetic_request(f"sd{kind}{step.step_id}-{i}", 11 * i + step.step_id, c, int(s), vocab)
                        for i, (c, s) in enumerate(zip(ctx, starts))]
            timed[kind] = decode_step_ms(runner, requests, ctx, args.repeats)
        cv = float(np.std(step.contexts) / np.mean(step.contexts))
        rows.append({"step_id": step.step_id, "batch_size": step.batch_size,
                     "decode_context_tokens": step.decode_context_tokens, "context_cv": cv,
                     "served_ms": timed["served"], "equal_ms": timed["equal"], "measured_ms": 1e3 * step.duration_s})
        print(f"{step.step_id:5d} {step.batch_size:5d} {step.decode_context_tokens // step.batch_size:7d}  {cv:.3f}  "
              f"{timed['served']:9.3f} {timed['equal']:9.3f}  {timed['served'] / timed['equal']:12.3f}  "
              f"{1e3 * step.duration_s:10.3f}", flush=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(args.out, index=False)
    ratio = frame["served_ms"] / frame["equal_ms"]
    print(f"served / equal contexts: median {ratio.median():.3f} over {len(frame)} steps; "
          f"measured / served probe: median {(frame['measured_ms'] / frame['served_ms']).median():.3f}")


if __name__ == "__main__":
    main()
