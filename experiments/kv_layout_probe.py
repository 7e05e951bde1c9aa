"""Does a decode step cost more when its requests' KV slots are scattered over the pool, as a serving run's
are after many allocations and evictions, than on the contiguous slot ranges `mode=profile` decodes over?
Times graph-replayed decode steps of B requests of equal context on a KV pool the model wrote, with each
request's slots (a) one contiguous range, (b) strided: request i holds slots i, i + B, i + 2B, ... (the
requests' tokens interleaved), (c) scattered: a random sample of the written pool. GPU (imports torch).

  python experiments/kv_layout_probe.py [model=...] [--batches 16 64 128 256] [--context 1024]
"""
from __future__ import annotations

import numpy as np

from experiments.probe_runner import decode_probe_args, decode_step_ms, filled_runner
from runtime.profile.plans import synthetic_request

LAYOUTS = ("contiguous", "strided", "scattered")


def slot_layout(kind: str, batch: int, context: int, pool_slots: int, seed: int = 0) -> list[np.ndarray]:
    """Each of `batch` requests' `context` KV slots (disjoint, all below pool_slots) in layout `kind`."""
    need = batch * context
    if need > pool_slots:
        raise ValueError(f"{batch} x {context} slots exceed the {pool_slots} written ones")
    if kind == "contiguous":
        return [np.arange(i * context, (i + 1) * context) for i in range(batch)]
    if kind == "strided":
        return [np.arange(i, need, batch) for i in range(batch)]
    if kind == "scattered":
        picked = np.random.default_rng(seed).choice(pool_slots, size=need, replace=False)
        return [picked[i * context:(i + 1) * context] for i in range(batch)]
    raise ValueError(f"layout {kind!r}: expected one of {LAYOUTS}")


def main() -> None:
    args = decode_probe_args(__doc__.splitlines()[0], [16, 64, 128, 256],
                             lambda p: p.add_argument("--context", type=int, default=1024))
    core, runner, filled = filled_runner(args.overrides)
    vocab = core.model.vocab_size
    print("batch  layout       ms      / contiguous")
    for batch in args.batches:
        base = None
        for kind in LAYOUTS:
            requests = []
            for i, slots in enumerate(slot_layout(kind, batch, args.context, filled)):
                req = synthetic_request(f"kl{kind}{batch}-{i}", 11 * i + batch, args.context, 0, vocab)
                req.kv_slots = slots.tolist()
                requests.append(req)
            ms = decode_step_ms(runner, requests, [args.context] * batch, args.repeats)
            base = base or ms
            print(f"{batch:5d}  {kind:11s} {ms:7.3f}  {ms / base:6.3f}", flush=True)


if __name__ == "__main__":
    main()
