"""Does a decode step's time depend on which tokens it decodes? At small batches an MoE decode step reads the
weights of the experts its tokens pick, so the distinct experts a batch touches set much of its time. Times
graph-replayed decode steps of B requests at one context, three ways, and counts the distinct experts per
MoE layer (one eager run of the same step):
  profile  -- the profile's requests (runtime/profile/plans.py) over a pool the fill prefills wrote (mode=profile's
              decode table as measured);
  own_kv   -- the same requests after prefilling their own tokens into their own slots;
  served   -- uniform random prompts prefilled into their own slots, decoding the token the model sampled
              (as a served random-workload request decodes).
GPU (imports torch).

  python experiments/decode_routing_probe.py [model=...] [--batches 1 4 8 16 32 64] [--context 1024]
"""
from __future__ import annotations

import statistics

import numpy as np

from experiments.probe_runner import decode_probe_args, filled_runner
from runtime.core.batch import ScheduledItem
from runtime.core.request import Request, RequestStatus
from runtime.profile.plans import PROFILE_SAMPLING, finish, step_plan, synthetic_request
from runtime.profile.timing import eager_decode, time_plan


class ExpertCounter:
    """Distinct experts each MoE layer's tokens picked in the forwards run while `active`."""

    def __init__(self, model) -> None:
        from runtime.models.moe import MoE

        self.active, self.per_layer = False, []
        for layer in (m for m in model.modules() if isinstance(m, MoE)):
            layer.experts_fn = self._wrap(layer.experts_fn)

    def _wrap(self, experts_fn):
        def counted(x, w13, w2, topk_weights, topk_ids):
            if self.active:
                self.per_layer.append(int(topk_ids.unique().numel()))
            return experts_fn(x, w13, w2, topk_weights, topk_ids)
        return counted

    def distinct(self, runner, plan) -> float:
        self.active, self.per_layer = True, []
        with eager_decode(runner):
            runner.launch(plan).wait()
        self.active = False
        return statistics.mean(self.per_layer) if self.per_layer else float("nan")


def prefill_own(runner, requests: list[Request], context: int) -> list[int]:
    """Prefill each request's first context - 1 tokens into its own slots; the token each sampled."""
    sampled = []
    for r in requests:
        item = ScheduledItem(r, 0, context - 1, list(r.kv_slots[:context - 1]), is_decode=False, samples=True)
        sampled.append(int(runner.launch(step_plan([item])).wait().next_token_ids[0]))
    return sampled


def decode_items(requests: list[Request], context: int) -> list[ScheduledItem]:
    return [ScheduledItem(r, context - 1, 1, [r.kv_slots[context - 1]], is_decode=True, samples=True) for r in requests]


def main() -> None:
    args = decode_probe_args(__doc__.splitlines()[0], [1, 4, 8, 16, 32, 64],
                             lambda p: p.add_argument("--context", type=int, default=1024), repeats=20)
    core, runner, fill_slots = filled_runner(args.overrides)
    counter = ExpertCounter(runner.model)
    vocab, ctx = core.model.vocab_size, args.context
    rng = np.random.default_rng(0)
    print(f"context {ctx}; distinct experts per MoE layer (mean over layers) and graph-replayed step ms")
    print("batch  kind      experts   ms      / profile")
    for batch in args.batches:
        base = None
        for kind in ("profile", "own_kv", "served"):
            first = 0 if kind == "profile" else fill_slots if fill_slots + batch * ctx <= core.kv_capacity_tokens else 0
            requests = [synthetic_request(f"rp{kind}{batch}-{i}", 7 * i + batch, ctx, first + i * ctx, vocab)
                        for i in range(batch)]
            if kind == "own_kv":
                prefill_own(runner, requests, ctx)
            elif kind == "served":
                prompts = [rng.integers(0, vocab, ctx - 1).tolist() for _ in range(batch)]
                requests = [Request(f"rs{batch}-{i}", p, PROFILE_SAMPLING, 0.0) for i, p in enumerate(prompts)]
                for i, r in enumerate(requests):
                    r.kv_slots = range(first + i * ctx, first + (i + 1) * ctx)      # type: ignore[assignment]
                    r.status = RequestStatus.PREFILL
                for r, token in zip(requests, prefill_own(runner, requests, ctx)):
                    r.output_ids.append(token)
                    r.status = RequestStatus.DECODING
            plan = step_plan(decode_items(requests, ctx))
            experts = counter.distinct(runner, plan)
            ms = time_plan(runner, plan, args.repeats).device_s * 1e3
            finish(requests)
            base = base or ms
            print(f"{batch:5d}  {kind:8s} {experts:7.1f}  {ms:7.3f}  {ms / base:6.3f}", flush=True)


if __name__ == "__main__":
    main()
