"""`ModelRunner.launch` never waits for the device: launched behind a long sleep kernel, a
graph-replayed decode step and a step with a row that samples nothing (a prefill chunk) return while
the sleep still runs, so the overlap loop's host work hides under the previous step. A blocking
upload in the decode graph's inputs once made every served step wait for the one before it."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels.event_timing import behind_sleep_ms, sleep_cycles  # noqa: E402
from runtime.core.batch import ScheduledItem  # noqa: E402
from runtime.engine.fast_path import FastPathConfig  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from runtime.profile.plans import SyntheticBatch, decode_items, finish, step_plan  # noqa: E402
from tests.engine.test_fast_path import hf_config  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
SLEEP_S = 0.3
CONTEXT = 256


def launch_behind_sleep_s(runner: ModelRunner, plan, cycles: int) -> float:
    launched = []
    host_ms = behind_sleep_ms(lambda: launched.append(runner.launch(plan)), cycles)
    launched[0].wait()
    return host_ms / 1e3


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    cfg = hf_config("deepseek_v2_lite", num_hidden_layers=2)
    fast = FastPathConfig(cuda_graph_batch_sizes=(1, 2, 4, 8), progress=False)
    return ModelRunner(cfg, num_kv_slots=16 * CONTEXT, device="cuda", dtype="bfloat16", fast=fast)


def test_a_replayed_decode_step_is_launched_without_waiting(runner: ModelRunner) -> None:
    batch = SyntheticBatch("ahead", 4, CONTEXT, 0, runner.model.config.vocab_size)
    plan = step_plan(decode_items(batch.requests, CONTEXT))
    runner.launch(plan).wait()                                  # JIT, plans, allocator
    replays = runner.graphs.num_replays
    cycles = sleep_cycles(SLEEP_S)
    assert launch_behind_sleep_s(runner, plan, cycles) < SLEEP_S / 3
    assert runner.graphs.num_replays == replays + 1            # the step was a graph replay
    finish(batch.requests)


def test_a_step_with_a_row_that_samples_nothing_is_launched_without_waiting(runner: ModelRunner) -> None:
    vocab = runner.model.config.vocab_size
    decoding = SyntheticBatch("ahead-d", 2, CONTEXT, 4 * CONTEXT, vocab)
    chunk = SyntheticBatch("ahead-c", 1, CONTEXT, 8 * CONTEXT, vocab).requests[0]
    items = decode_items(decoding.requests, CONTEXT) + [
        ScheduledItem(chunk, 0, 64, list(chunk.kv_slots[:64]), is_decode=False, samples=False)]
    plan = step_plan(items)
    first = runner.launch(plan).wait()
    assert len(first.next_token_ids) == 2                       # the chunk's row samples nothing
    cycles = sleep_cycles(SLEEP_S)
    assert launch_behind_sleep_s(runner, plan, cycles) < SLEEP_S / 3
    finish(decoding.requests + [chunk])
