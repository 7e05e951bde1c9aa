"""What the GPU probes start from: a mode=real runner for the composed config (the decode probes' with its KV
pool's first slots written by the model, runtime.profile.kv_fill, as mode=profile times decode), and the steps
they time: a decode step of given contexts, a one-sequence prefill. Imports torch."""
from __future__ import annotations

from experiments.compose import compose_config
from runtime.build import build_core
from runtime.profile.kv_fill import fill_kv_pool

FILL_SLOTS_MAX = 1 << 20       # slots the probes fill (and read): enough for their batches x contexts


def built_runner(overrides: list[str]):
    """(core, runner) for `mode=real` with `overrides`: the runner as serving builds it (warm-up included)."""
    from runtime.engine.build_runner import build_model_runner

    cfg = compose_config(["mode=real", "progress=false"] + list(overrides))
    core = build_core(cfg)
    return core, build_model_runner(cfg, core)


def filled_runner(overrides: list[str]):
    """(core, runner, slots filled) for `mode=real` with `overrides`."""
    core, runner = built_runner(overrides)
    slots = min(core.kv_capacity_tokens, FILL_SLOTS_MAX)
    fill_kv_pool(runner, slots, 8192, core.model.max_context_tokens or 8192, core.model.vocab_size, progress=False)
    return core, runner, slots


def decode_probe_args(description: str, default_batches: list[int], add_arguments=None, repeats: int = 10,
                      argv=None):
    """The decode probes' command line: --batches, --repeats, Hydra overrides, plus what `add_arguments(parser)`
    adds. Returns the parsed args."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batches", type=int, nargs="*", default=default_batches)
    parser.add_argument("--repeats", type=int, default=repeats)
    if add_arguments is not None:
        add_arguments(parser)
    parser.add_argument("overrides", nargs="*")
    return parser.parse_args(argv)


def decode_step_ms(runner, requests, contexts: list[int], repeats: int) -> float:
    """Median device ms of one decode step of `requests`, each decoding at the last of its contexts[i] tokens
    (timed as mode=profile times steps); the requests are finished afterwards (their slot-table rows freed)."""
    from runtime.core.batch import ScheduledItem
    from runtime.profile.plans import finish, step_plan
    from runtime.profile.timing import time_plan

    items = [ScheduledItem(r, c - 1, 1, [r.kv_slots[c - 1]], is_decode=True, samples=True)
             for r, c in zip(requests, contexts)]
    ms = time_plan(runner, step_plan(items), repeats).device_s * 1e3
    finish(requests)
    return ms


def prefill_step_ms(runner, tokens: int, tag: str, vocab_size: int) -> float:
    """Interval (ms) of one prefill of `tokens` new tokens for one request without a cached prefix, launched
    alone and waited for; the request (`tag` in its rid) is finished afterwards (its slot-table row freed)."""
    from runtime.profile.plans import SyntheticBatch, step_plan

    batch = SyntheticBatch(tag, 1, tokens, 0, vocab_size)
    ms = 1e3 * runner.launch(step_plan(batch.extend_items(tokens, 0))).wait().duration_s
    batch.release()
    return ms
