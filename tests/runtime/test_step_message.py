"""The step a tensor-parallel leader broadcasts to its peers every step (ModelRunner.prepare's StepInputs) holds
its slots and token ids as served steps hold them -- int32 arrays or Python ints, never numpy scalars (they
pickle slowly: at 8,192 tokens they put 24 ms on the leader's hand-off and the followers' start on the
H200s, experiments/results/h200x2/tp_launch_probe). Checked for the scheduler's plans and for the profile's
synthetic ones, which must cost the hand-off what serving costs it."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.build import build_core, build_scheduler  # noqa: E402
from runtime.core.request import Request, SamplingParams  # noqa: E402
from runtime.engine.build_runner import build_model_runner  # noqa: E402
from runtime.profile.host import synthetic_prompt  # noqa: E402
from runtime.profile.plans import SharedPrefixBatch, SyntheticBatch, finish, step_plan  # noqa: E402

TINY = ["mode=real", "model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32",
        "progress=false", "kv.capacity_tokens=4096"]


@pytest.fixture(scope="module")
def built():
    cfg = compose_config(TINY)
    core = build_core(cfg)
    return cfg, core, build_model_runner(cfg, core)


def _numpy_scalars(value) -> int:
    """How many numpy scalars `value` (lists, tuples, arrays, dataclass-like objects) holds."""
    if isinstance(value, np.generic):
        return 1
    if isinstance(value, np.ndarray) or value is None or isinstance(value, (int, float, bool, str)):
        return 0
    if isinstance(value, (list, tuple)):
        return sum(_numpy_scalars(v) for v in value)
    if hasattr(value, "__dict__") or hasattr(value, "__dataclass_fields__"):
        fields = getattr(value, "__dataclass_fields__", None) or vars(value)
        return sum(_numpy_scalars(getattr(value, name)) for name in fields)
    return 0


def _launch_and_catch(runner, plan):
    """The message `runner.launch(plan)` hands its peers (its step_sender), and the step's result."""
    sent = []
    runner.step_sender = sent.append
    try:
        result = runner.launch(plan).wait()
    finally:
        runner.step_sender = None
    (inputs,) = sent
    pickle.loads(pickle.dumps(inputs, protocol=pickle.HIGHEST_PROTOCOL))     # it travels pickled
    return inputs, result


def test_served_prefill_and_decode_steps_carry_no_numpy_scalars(built):
    cfg, core, runner = built
    scheduler = build_scheduler(cfg, core.model, core.kv_capacity_tokens)
    for k in range(3):
        scheduler.add(Request(f"r{k}", synthetic_prompt(k, 300 + 50 * k, core.model.vocab_size),
                              SamplingParams(max_new_tokens=3, ignore_eos=True), 0.0), 0.0)
    kinds, now = set(), 0.0
    while scheduler.has_work():
        now += 0.01
        plan = scheduler.schedule(now)
        kinds.add(plan.mode.value)
        inputs, result = _launch_and_catch(runner, plan)
        assert _numpy_scalars(inputs.batch) == 0, plan.mode
        scheduler.commit(plan, result, now)
    assert {"extend", "decode"} <= kinds


def test_the_profiles_synthetic_steps_carry_no_numpy_scalars(built):
    _, core, runner = built
    vocab = core.model.vocab_size
    batch = SyntheticBatch("msg", 2, 600, 0, vocab)
    shared = SharedPrefixBatch("msg-shared", 4, 2, 64, 32, 1400, vocab)
    plans = {"extend": step_plan(batch.extend_items(300, 200)), "decode": step_plan(batch.decode_items(500)),
             "mixed": step_plan(batch.extend_items(100, 0)[:1] + batch.decode_items(500)[1:]),
             "shared decode": step_plan(shared.decode_items())}
    for name, plan in plans.items():
        batch_msg = _launch_and_catch(runner, plan)[0].batch
        assert _numpy_scalars(batch_msg) == 0, name
        assert all(isinstance(s, np.ndarray) and s.dtype == np.int32 for s, d in
                   zip(batch_msg.new_slots, batch_msg.is_decode) if not d), name
    finish(batch.requests)
    finish(shared.requests)
