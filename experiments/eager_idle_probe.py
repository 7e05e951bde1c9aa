"""Are extend steps (eager past the piecewise graphs' limit, graph-replayed within it) slower after the runner has
been idle, and is that apart from a token count being served for the first time? Builds the runner as `mode=real` does (warm-up
included), serves one token count a few times (warm), then for each idle gap (in a shuffled order, several
rounds) sleeps that long and launches, back to back: the warm token count, a token count never served before,
and the warm one again. Prints and writes (`--out` CSV) each step's interval with the gap before it. GPU (imports
torch).

  python experiments/eager_idle_probe.py --gaps 0 0.5 2 8 --rounds 3 --out idle.csv [overrides...]
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from experiments.probe_runner import built_runner, prefill_step_ms
    from experiments.rows_csv import write_rows_csv

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gaps", type=float, nargs="+", default=[0.0, 0.5, 2.0, 8.0], help="idle seconds before a trial")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warm-tokens", type=int, default=3001)
    p.add_argument("--first-new-tokens", type=int, default=2101, help="new token counts: this, +37, +74, ...")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    core, runner = built_runner(args.overrides)
    vocab = core.model.vocab_size
    print(f"warm-up {runner.warmup_s:.1f} s", flush=True)
    served = 0

    def run(tokens: int) -> float:
        nonlocal served
        served += 1
        return prefill_step_ms(runner, tokens, f"i{served}", vocab)

    warm = [run(args.warm_tokens) for _ in range(4)]
    print(f"warm {args.warm_tokens} tokens: " + " ".join(f"{x:.1f}" for x in warm) + " ms", flush=True)
    trials = [gap for gap in args.gaps for _ in range(args.rounds)]
    random.Random(args.seed).shuffle(trials)
    rows, new_tokens = [], args.first_new_tokens
    for trial, gap in enumerate(trials):
        time.sleep(gap)
        for order, (kind, tokens) in enumerate([("warm", args.warm_tokens), ("new", new_tokens),
                                                ("warm_again", args.warm_tokens)]):
            rows.append({"trial": trial, "gap_s": gap, "order": order, "kind": kind, "tokens": tokens,
                         "interval_ms": round(run(tokens), 3)})
        new_tokens += 37
        print(f"gap {gap:4.1f} s: " + ", ".join(f"{r['kind']} {r['tokens']} {r['interval_ms']:.1f} ms" for r in rows[-3:]),
              flush=True)
    if args.out is not None:
        write_rows_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
