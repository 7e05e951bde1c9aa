"""FlashInfer's MLA decode plan as the profiled model prices it (sim/costmodel/mla_kv_split.py): the chunk
limit and makespan on hand-worked steps, the makespan against a plain replay of the plan (every chunk through
a min-heap of the SMs' work), the rate fitted back from a table built with it, and a decode step priced by its
own KV lengths the same whether stepped alone or inside a run."""
from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.compose import compose_config
from runtime.build import build_core
from sim.costmodel.base import StepShape
from sim.costmodel.mla_kv_split import KVSplitExcess, chunk_limit, equal_split, makespan_tokens, num_clusters
from sim.costmodel.profiled import ProfiledCostModel
from sim.costmodel.roofline import RooflineCostModel
from tests.sim.test_profiled_costmodel import SMALL, TINY


def plan_replay(lens: list[int], sms: int) -> int:
    """The plan step by step: every chunk, in batch order, to the SM with the least work (lowest index on a tie)."""
    limit = chunk_limit(sum(lens), sms)
    heap = [(0, sm) for sm in range(sms)]
    for length in lens:
        while length > 0:
            load, sm = heapq.heappop(heap)
            take = min(length, limit)
            heapq.heappush(heap, (load + take, sm))
            length -= take
    return max(load for load, _ in heap)


def test_hand_worked_steps_on_132_sms():
    """Equal 16k contexts: batch 48 cuts each into 6,144 + 6,144 + 4,096 (144 chunks: 12 SMs take a second
    one), 64 into two 8,192s (128 chunks), 72 into 9,216 + 7,168 (144): the measured 17.9 / 17.1 / 23.3 ms."""
    assert chunk_limit(48 * 16384, 132) == 6144 and chunk_limit(64 * 16384, 132) == 8192
    assert makespan_tokens(np.full(48, 16384), 132) == 4096 + 6144
    assert makespan_tokens(np.full(64, 16384), 132) == 8192
    assert makespan_tokens(np.full(72, 16384), 132) == 7168 + 9216
    assert chunk_limit(150, 132) == 32 and makespan_tokens(np.array([100, 50]), 132) == 32   # few chunks
    assert makespan_tokens(np.array([20, 5]), 132) == 20
    assert num_clusters(132, 16) == 132 and num_clusters(132, 128) == 66
    assert equal_split(10, 4).tolist() == [3, 3, 2, 2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40000), min_size=1, max_size=80), st.sampled_from([4, 16, 132]))
def test_makespan_equals_the_plan_replayed_chunk_by_chunk(lens, sms):
    assert makespan_tokens(np.array(lens, dtype=np.int64), sms) == plan_replay(lens, sms)


def test_the_rate_is_fitted_back_from_a_table_made_with_it():
    rows = pd.DataFrame([(b, c) for b in (8, 48, 64, 72) for c in (1024, 4096, 16384, 65536)],
                        columns=["batch_size", "context_tokens"])
    spans = [makespan_tokens(np.full(b, c), 132) for b, c in zip(rows["batch_size"], rows["context_tokens"])]
    rows["device_s"] = [0.005 + 1e-4 * b + 0.8e-6 * s for b, s in zip(rows["batch_size"], spans)]
    fitted = KVSplitExcess.fit(rows, 132)
    assert fitted is not None and fitted.seconds_per_token == pytest.approx(0.8e-6, rel=1e-9)
    assert KVSplitExcess.fit(rows.assign(device_s=0.01), 132) is None          # no rate: no correction
    spread = np.array([30000, 500, 500, 530])
    excess = fitted.excess_s(spread, 8, 40)                                    # 4 requests padded to 8 rows
    for j in range(40):
        step = np.concatenate([spread + j, np.ones(4, dtype=np.int64)])
        want = 0.8e-6 * (makespan_tokens(step, 132) - makespan_tokens(equal_split(int(step.sum()), 8), 132))
        assert excess[j] == pytest.approx(want, rel=1e-9)


def mla_model(**kw) -> ProfiledCostModel:
    """The small committed profile on an MLA model and a GPU with 132 SMs."""
    core = build_core(compose_config(TINY))
    hardware = dataclasses.replace(core.hardware, num_sms=132)
    return ProfiledCostModel(core.model, hardware, core.layout, fallback=RooflineCostModel, profile=str(SMALL), **kw)


def test_a_decode_step_is_priced_by_its_own_lengths_alone_or_in_a_run():
    model, plain = mla_model(decode_kv_split="flashinfer_mla"), mla_model()   # the default: none
    assert model.kv_split is not None and plain.kv_split is None
    lens = (1484, 520, 2824, 1759, 2329, 2875, 1834, 2149, 2576, 2941, 1610, 1724, 2006, 2950, 1354, 2511)
    n = len(lens)                                    # 16, a capture size: no padding rows; 330 vs 299 tokens
    shape = StepShape(num_decode_reqs=n, decode_context_tokens=sum(lens), decode_context_lens=lens)
    equal = StepShape(num_decode_reqs=n, decode_context_tokens=sum(lens))
    extra = model.kv_split.excess_s(np.array(lens), n, 1)[0]
    assert extra == pytest.approx(model.kv_split.seconds_per_token * (330 - 299), rel=1e-12) and extra > 0
    assert model.device_time_s(shape) == pytest.approx(model.device_time_s(equal) + extra, rel=1e-12)
    assert plain.device_time_s(shape) == plain.device_time_s(equal)
    run = model.decode_times_s(n, sum(lens) + n * np.arange(70), 0, np.array(lens))
    for j in range(70):
        step = tuple(length + j for length in lens)
        alone = model.step_time_s(StepShape(num_decode_reqs=n, decode_context_tokens=sum(step), decode_context_lens=step))
        assert run[j] == alone                       # float for float: fast-forward runs stay exact
    with pytest.raises(ValueError, match="decode_kv_split='x'"):
        mla_model(decode_kv_split="x")
    with pytest.raises(ValueError, match="decode_context_lens"):
        StepShape(num_decode_reqs=2, decode_context_tokens=10, decode_context_lens=(4, 5))


@pytest.mark.parametrize("overlap", [False, True])
def test_fast_forward_stays_exact_with_the_split_priced(tmp_path, overlap):
    """The default model (DeepSeek-V2-Lite on the H200 profile) with decode_kv_split=flashinfer_mla: decode
    runs, through finishes, give the records of stepping every decode one by one."""
    from tests.sim.test_sim_runs import assert_same_records, simulate
    base = ["workload=random", "workload.num_requests=50", "workload.request_rate=20", "workload.input_len=3000",
            "workload.output_len=96", "costmodel=profiled", f"overlap={overlap}"]
    split = base + ["costmodel.decode_kv_split=flashinfer_mla"]
    on, dir_on = simulate(tmp_path, "on", split + ["sim.fast_forward=true"])
    off, dir_off = simulate(tmp_path, "off", split + ["sim.fast_forward=false"])
    plain, _ = simulate(tmp_path, "plain", base)
    steps_on, steps_off = pd.read_parquet(dir_on / "steps.parquet"), pd.read_parquet(dir_off / "steps.parquet")
    assert len(steps_on) == len(steps_off)
    assert_same_records(steps_on, steps_off, pd.read_parquet(dir_on / "requests.parquet"),
                        pd.read_parquet(dir_off / "requests.parquet"), overlap)
    assert on["duration_s"] != plain["duration_s"]               # the split moved the run's times
