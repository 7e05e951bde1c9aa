"""Sampling penalties served as `mode=real` serves them (scheduler, RealDriver, ModelRunner, running token counts
on the device), checked every step against the per-token reference (each penalised request's tokens recounted,
placeholders of steps in flight resolved on the device): overlap off, overlap on, and a KV pool small enough
to retract. Prints, per run, the rows checked, the largest difference, the state rows held, and the host time
of the penalty bookkeeping early and late in the run (flat: O(penalised rows), not O(tokens)); exits 1 when a
row differs or overlap changes a token.

  python experiments/penalty_probe.py model=deepseek_v2_lite [--requests 32] [--output-len 512] [overrides...]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from runtime.core.request import SamplingParams  # noqa: E402
from runtime.engine.penalties import counts_tokens  # noqa: E402

TOLERANCE = 1e-4           # |running - reference| on logits (fp32 penalties both ways)


def penalty_kinds(vocab_size: int) -> list[SamplingParams]:
    """What the probe's requests ask for, in turn: nothing, each penalty, all of them, a bias, sampled."""
    return [SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.0, frequency_penalty=1.5),
            SamplingParams(temperature=0.0, presence_penalty=1.0),
            SamplingParams(temperature=0.0, repetition_penalty=1.3),
            SamplingParams(temperature=0.0, frequency_penalty=0.7, presence_penalty=-0.5, repetition_penalty=0.8),
            SamplingParams(temperature=0.0, logit_bias=((7 % vocab_size, 3.0), (11 % vocab_size, -5.0))),
            SamplingParams(temperature=0.8, top_p=0.9, seed=5, frequency_penalty=0.5, repetition_penalty=1.2)]


def per_token_reference(logits_row: torch.Tensor, prompt: list[int], output: list[int], params: SamplingParams,
                        resolve) -> torch.Tensor:
    """One row's penalised logits [V] from the request's tokens, recounted (the definition, not the running
    counts); `output` may hold placeholders (< 0), resolved by `resolve` on the device."""
    vocab = logits_row.shape[0]
    out = logits_row.float().clone()
    device = out.device
    if counts_tokens(params):
        ids = resolve(torch.tensor(output, dtype=torch.long, device=device)).clamp(0, vocab - 1)
        counts = torch.bincount(ids, minlength=vocab).float()
        out = out - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
        if params.repetition_penalty != 1:
            seen = counts > 0
            seen[torch.tensor(prompt, dtype=torch.long, device=device).clamp(0, vocab - 1)] = True
            rep = params.repetition_penalty
            out = torch.where(seen, torch.where(out > 0, out / rep, out * rep), out)
    for token, bias in params.logit_bias:
        out[token] += bias
    if not params.ignore_eos and len(output) < params.min_new_tokens and params.stop_token_ids:
        out[list(params.stop_token_ids)] = float("-inf")
    return out


class ReferenceCheck:
    """Wraps a ModelRunner (prepare, run, the penalty state's apply): every penalised row of every step is
    compared with `per_token_reference`. Snapshots the requests' tokens at prepare: O(tokens), a check only."""

    def __init__(self, runner, tolerance: float = TOLERANCE) -> None:
        self.runner, self.tolerance = runner, tolerance
        self.num_steps = self.num_rows = self.num_mismatches = 0
        self.max_abs_diff = 0.0
        self.peak_state_rows = 0
        self.book_us: list[float] = []        # host time of PenaltyBook.inputs, per step
        self._current = None
        prepare, run, apply, book = runner.prepare, runner.run, runner.penalty_counts.apply, runner.penalty_book.inputs

        def timed_book(requests, params):
            start = time.perf_counter()
            out = book(requests, params)
            self.book_us.append(1e6 * (time.perf_counter() - start))
            return out

        def checked_prepare(plan):
            inputs = prepare(plan)
            inputs.reference_rows = [(list(it.request.input_ids), list(it.request.output_ids), it.request.sampling)
                                     for it in plan.items if it.samples]
            return inputs

        def checked_run(inputs, poll=None):
            self._current = inputs
            return run(inputs, poll=poll)

        def checked_apply(logits, pen, resolve):
            out = apply(logits, pen, resolve)
            self._compare(logits, out, pen, resolve)
            return out

        runner.penalty_book.inputs = timed_book
        runner.prepare, runner.run, runner.penalty_counts.apply = checked_prepare, checked_run, checked_apply

    def _compare(self, logits, out, pen, resolve) -> None:
        self.num_steps += 1
        self.peak_state_rows = max(self.peak_state_rows, self.runner.penalty_counts.capacity)
        rows = self._current.reference_rows
        for i, (prompt, output, params) in enumerate(rows):
            penalised = counts_tokens(params) or params.logit_bias or params.min_new_tokens
            if not penalised:
                continue
            want = per_token_reference(logits[i], prompt, output, params, resolve)
            finite = torch.isfinite(want)
            same_inf = torch.equal(finite, torch.isfinite(out[i]))
            diff = (out[i][finite] - want[finite]).abs().max().item() if finite.any() else 0.0
            self.max_abs_diff = max(self.max_abs_diff, diff)
            self.num_rows += 1
            if not same_inf or diff > self.tolerance * max(1.0, want[finite].abs().max().item()):
                self.num_mismatches += 1

    def summary(self) -> str:
        tenth = max(1, len(self.book_us) // 10)
        early, late = self.book_us[:tenth], self.book_us[-tenth:]
        mean = lambda xs: sum(xs) / max(len(xs), 1)   # noqa: E731
        return (f"{self.num_steps} steps, {self.num_rows} penalised rows checked, {self.num_mismatches} differ "
                f"(max |diff| {self.max_abs_diff:.2e}); peak state rows {self.peak_state_rows}; "
                f"bookkeeping {mean(early):.0f} us/step early, {mean(late):.0f} us/step late")


def serve(cfg, runner, specs, overlap: bool, checked: bool = True):
    """One RealDriver run over `specs` on a fresh scheduler with `runner`, every step checked (the check syncs
    with the device; unchecked, the run is as served)."""
    from runtime.build import build_core
    from runtime.driver import RealDriver

    core = build_core(cfg)
    check = ReferenceCheck(runner) if checked else None
    start = time.perf_counter()
    done = RealDriver(core.scheduler, runner, progress=False, overlap=overlap).run(specs)
    elapsed_s = time.perf_counter() - start
    for name in ("prepare", "run"):                      # unwrap: the next run wraps afresh
        vars(runner).pop(name, None)
    vars(runner.penalty_counts).pop("apply", None)
    vars(runner.penalty_book).pop("inputs", None)
    tokens = sum(len(r.output_ids) for r in done.requests)
    print(f"  {tokens} tokens in {elapsed_s:.1f} s, {core.scheduler.num_retractions} retractions; "
          f"{check.summary() if check else 'unchecked'}; state rows now {runner.penalty_counts.capacity}", flush=True)
    return {r.rid: list(r.output_ids) for r in done.requests}, check


def main(argv: list[str] | None = None) -> int:
    from hydra.utils import instantiate

    from experiments.compose import compose_config
    from runtime.build import build_core
    from runtime.driver import all_at_once
    from runtime.engine.build_runner import build_model_runner

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    base = ["mode=real", "progress=false", "workload=shared_prefix", "workload.num_groups=4",
            f"workload.prompts_per_group={max(1, args.requests // 4)}", "workload.system_prompt_len=256",
            "workload.question_len=64", f"workload.output_len={args.output_len}"]
    cfg = compose_config(base + args.overrides)
    core = build_core(cfg)
    runner = build_model_runner(cfg, core)
    print(f"device {runner.device}, vocab {core.model.vocab_size}, KV capacity {core.kv_capacity_tokens} tokens",
          flush=True)
    kinds = penalty_kinds(core.model.vocab_size)
    specs = all_at_once(instantiate(cfg.workload).requests())[:args.requests]
    specs = [dataclasses.replace(s, sampling=dataclasses.replace(kinds[i % len(kinds)], max_new_tokens=s.output_len,
                                                                 ignore_eos=True)) for i, s in enumerate(specs)]
    failed = False
    outputs = {}
    for overlap, checked in ((False, True), (True, True), (False, False), (True, False)):
        name = f"overlap {'on' if overlap else 'off'}{'' if checked else ', unchecked (as served: no sync in a step)'}"
        print(f"{name}:", flush=True)
        outputs[name], check = serve(cfg, runner, specs, overlap, checked)
        failed |= check is not None and check.num_mismatches > 0
    first = next(iter(outputs.values()))
    for name, tokens in outputs.items():
        same = sum(tokens[rid] == first[rid] for rid in first)
        print(f"{name}: {same}/{len(first)} requests give the tokens of overlap off", flush=True)
        failed |= same != len(first)
    # a pool for about a third of the requests' tokens, over-admitting: decode must retract
    need = sum(len(s.input_ids) + s.output_len for s in specs)
    small = compose_config(base + args.overrides + [f"kv.capacity_tokens={max(need // 3, 4 * args.output_len)}",
                                                    "scheduler.init_new_token_ratio=0.05"])
    print("small KV pool (retractions), overlap on:", flush=True)
    _, check = serve(small, runner, specs, overlap=True)
    failed |= check.num_mismatches > 0
    if runner.device.type == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated(runner.device) / 2**30:.1f} GiB", flush=True)
    print("FAILED" if failed else "OK", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
