"""Does a decode step's time follow its requests' mean context or its longest one? Times graph-replayed decode
steps of B requests whose contexts are all equal against steps with the same summed context spread unevenly
(half short, half long; one long and the rest short), on a KV pool the model wrote. GPU (imports torch).

  python experiments/mixed_context_probe.py [model=...] [--batches 4 8 16 32 64 128] [--mean 1024]
"""
from __future__ import annotations

from experiments.probe_runner import decode_probe_args, decode_step_ms, filled_runner
from runtime.profile.plans import synthetic_request


def contexts_of(kind: str, batch: int, mean: int) -> list[int]:
    if kind == "equal":
        return [mean] * batch
    if kind == "halves":              # half at mean/4, half at 7 mean/4
        return [mean // 4 if i % 2 else 7 * mean // 4 for i in range(batch)]
    long = mean * batch // 2           # one request holds half the batch's KV
    short = max(2, (mean * batch - long) // max(batch - 1, 1))
    return [long] + [short] * (batch - 1)


def main() -> None:
    args = decode_probe_args(__doc__.splitlines()[0], [4, 8, 16, 32, 64, 128],
                             lambda p: p.add_argument("--mean", type=int, default=1024))
    core, runner, _ = filled_runner(args.overrides)
    vocab = core.model.vocab_size
    print("batch  kind    contexts(min/max)   ms      / equal")
    for batch in args.batches:
        base = None
        for kind in ("equal", "halves", "one_long"):
            ctx = contexts_of(kind, batch, args.mean)
            starts = [sum(ctx[:i]) for i in range(batch)]         # each request on its own slot range
            requests = [synthetic_request(f"mc{kind}{batch}-{i}", 7 * i + batch, c, s, vocab)
                        for i, (c, s) in enumerate(zip(ctx, starts))]
            ms = decode_step_ms(runner, requests, ctx, args.repeats)
            base = base or ms
            print(f"{batch:5d}  {kind:8s} {min(ctx):6d}/{max(ctx):7d}   {ms:7.3f}  {ms / base:6.3f}", flush=True)


if __name__ == "__main__":
    main()
