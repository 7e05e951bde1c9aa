"""`mode=real dp_attention=true` on CPU (gloo): tp=2 dp=2 (also with ep=2, and tp=4 dp=2: two GPUs per
attention rank) serves every request the greedy tokens one process serves them (fp32), also when one
attention rank idles for most of the run; a rank
that gets no request at all still serves the other's MLP until the end, and the run writes the usual
records with a `replica` column and a `dp` section; a killed rank stops the run naming it."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

pytest.importorskip("torch")

from hydra.utils import instantiate  # noqa: E402

from experiments.compose import compose_config  # noqa: E402
from runtime.app import run_real  # noqa: E402
from runtime.core.request import SamplingParams  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.distributed.app import serve  # noqa: E402
from runtime.driver import RealDriver  # noqa: E402
from runtime.engine.build_runner import build_model_runner  # noqa: E402
from tests.distributed.test_rank_failure import _alive, gone, kill_rank, launch  # noqa: E402
from tests.distributed.test_real_layouts import TINY  # noqa: E402

# a lockstep bug hangs collectives: fail within a minute rather than the default ten
DP = ["model=tiny_mla_moe", "dp=2", "dp_attention=true", "real.dist_timeout_s=60"]
DPA = DP + ["tp=2"]
LONG_TOKENS, SHORT_TOKENS = 24, 2


def uneven_specs(cfg) -> list:
    """The workload's requests, greedy; round robin sends every other one (in arrival, then rid order)
    to attention rank 1, and those stop after SHORT_TOKENS: rank 1 then idles while rank 0 decodes."""
    specs = sorted(instantiate(cfg.workload).requests(), key=lambda s: (s.arrival_s, s.rid))
    out = []
    for i, spec in enumerate(specs):
        tokens = SHORT_TOKENS if i % 2 else LONG_TOKENS
        out.append(dataclasses.replace(spec, output_len=tokens, sampling=SamplingParams(
            max_new_tokens=tokens, ignore_eos=True, temperature=0.0)))
    return out


def one_process_outputs(specs) -> dict[str, list[int]]:
    """Every request's tokens from tp=1 dp=1 in this process, all requests in one batch."""
    cfg = compose_config(TINY + ["model=tiny_mla_moe"])
    core = build_core(cfg)
    outcome = RealDriver(core.scheduler, build_model_runner(cfg, core), as_fast_as_possible=True, progress=False,
                         overlap=bool(cfg.overlap)).run(specs)
    return {r.rid: list(r.output_ids) for r in outcome.requests}


@pytest.mark.parametrize("layout", [["tp=2"], ["tp=2", "ep=2"], ["tp=4"]], ids=["tp2-dp2", "tp2-dp2-ep2", "tp4-dp2"])
def test_attention_ranks_serve_the_greedy_tokens_of_one_process(layout, tmp_path):
    cfg = compose_config(TINY + DP + layout)
    specs = uneven_specs(cfg)
    results, pids, dispatcher = serve(cfg, tmp_path, collect_output_ids=True, specs=specs)
    assert sorted(results) == [0, 1] and len(pids) == cfg.tp
    assert dispatcher.routed_per_replica == [3, 3]
    served = {**results[0].output_ids, **results[1].output_ids}
    reference = one_process_outputs(specs)
    assert sorted(len(ids) for ids in reference.values()) == [SHORT_TOKENS] * 3 + [LONG_TOKENS] * 3
    assert served == reference
    # rank 1's requests end after a couple of steps; it then runs idle steps for rank 0's decodes
    assert results[1].facts["idle_steps"] >= LONG_TOKENS - SHORT_TOKENS - 2
    assert results[0].facts["lockstep_rounds"] == results[1].facts["lockstep_rounds"]
    assert not any(_alive(pid) for pid in pids.values())


def test_a_rank_without_requests_serves_the_other_to_the_end(tmp_path):
    cfg = compose_config(TINY + DPA + ["workload.num_groups=1", "workload.prompts_per_group=1"])
    summary = run_real(cfg, out_dir=tmp_path)
    assert summary["num_finished"] == 1 and summary["num_aborted"] == 0 and summary["leaked_kv_slots"] == 0
    dp = summary["dp"]
    assert dp["dp_attention"] and dp["num_gpus"] == 2 and dp["requests_per_replica"] == [1, 0]
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert set(steps["replica"]) == {0} and dp["steps_per_replica"] == [len(steps), 0]
    assert dp["idle_steps_per_replica"] == [0, len(steps)]        # every step of rank 0, rank 1 idle
    # plus the round where both were done, and any where neither had work yet (the request still in the inbox)
    assert dp["lockstep_rounds"] >= len(steps) + 1
    assert steps["predicted_s"].notna().all() and (steps["predicted_s"] > 0).all()
    assert summary["layout"] == {"tp": 2, "ep": 1, "dp": 2, "num_ranks": 2, "nnodes": 1, "dp_attention": True}
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert list(requests["replica"]) == [0] and (requests["output_tokens"] == 10).all()
    pids = json.loads((tmp_path / "ranks.json").read_text())
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids.values())


def test_a_killed_attention_rank_stops_the_run_naming_it(tmp_path):
    proc, pids = launch(tmp_path, ["mode=real", *DPA, "hardware=cpu", "real.device=cpu", "real.dtype=float32",
                                   "progress=false", "workload.num_groups=2", "workload.prompts_per_group=2",
                                   "workload.system_prompt_len=32", "workload.question_len=8",
                                   "workload.output_len=1500"])
    line = kill_rank(proc, pids, 1)
    assert "rank 1 of 2" in line and "attention rank 1 of 2" in line and "killed by SIGKILL" in line
    assert gone(pids.values())
