"""`mode=real` with several processes on CPU (gloo): tp=2 and tp=2 ep=2 serve the same tokens as one
process (greedy and seeded-generator sampling), dp=2 behind each router finishes every request and
loses none, and a run leaves the usual records and no process behind."""
from __future__ import annotations

import dataclasses
import json
import os

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from hydra.utils import instantiate  # noqa: E402

from experiments.compose import compose_config  # noqa: E402
from runtime.app import run_real  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.core.request import SamplingParams  # noqa: E402
from runtime.distributed.app import serve  # noqa: E402
from runtime.driver import RealDriver  # noqa: E402
from runtime.engine.build_runner import build_model_runner  # noqa: E402

TINY = ["mode=real", "hardware=cpu", "real.device=cpu", "real.dtype=float32", "progress=false",
        "print_summary=false", "real.as_fast_as_possible=true", "workload.num_groups=2",
        "workload.prompts_per_group=3", "workload.system_prompt_len=40", "workload.question_len=12",
        "workload.output_len=10", "kv.capacity_tokens=3000"]


def specs_of(cfg) -> list:
    """The workload's requests; odd ones greedy, even ones sampled at temperature 0.8 (the sampler's
    seeded generator: every rank must draw the same noise)."""
    specs = instantiate(cfg.workload).requests()
    out = []
    for i, spec in enumerate(specs):
        sampling = SamplingParams(max_new_tokens=spec.output_len, ignore_eos=True, temperature=0.0 if i % 2 else 0.8)
        out.append(dataclasses.replace(spec, sampling=sampling))
    return out


def one_process_outputs(cfg) -> dict[str, list[int]]:
    core = build_core(cfg)
    with_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner = build_model_runner(cfg, core)
        outcome = RealDriver(core.scheduler, runner, as_fast_as_possible=True, progress=False,
                             overlap=bool(cfg.overlap)).run(specs_of(cfg))
    finally:
        torch.set_num_threads(with_threads)
    return {r.rid: list(r.output_ids) for r in outcome.requests}


@pytest.mark.parametrize("model,layout", [("tiny_mla_moe", ["tp=2"]), ("tiny_mla_moe", ["tp=2", "ep=2"]),
                                          ("tiny_llama", ["tp=2"])])
def test_sharded_ranks_serve_the_tokens_of_one_process(model, layout, tmp_path):
    base = compose_config(TINY + [f"model={model}"])
    cfg = compose_config(TINY + [f"model={model}"] + layout)
    results, pids, _ = serve(cfg, tmp_path, collect_output_ids=True, specs=specs_of(cfg))
    assert len(pids) == 2 and list(results) == [0]
    sharded = results[0].output_ids
    reference = one_process_outputs(base)
    assert sharded.keys() == reference.keys() and len(reference) == 6
    assert all(len(ids) == 10 for ids in reference.values())
    assert sharded == reference
    assert not any(_alive(pid) for pid in pids.values())


@pytest.mark.parametrize("router", ["round_robin", "shortest_queue", "cache_aware"])
def test_dp_replicas_behind_each_router_finish_every_request(router, tmp_path):
    cfg = compose_config(TINY + ["model=tiny_mla_moe", "dp=2", f"router={router}"])
    summary = run_real(cfg, out_dir=tmp_path)
    expected = {s.rid for s in instantiate(cfg.workload).requests()}
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert sorted(requests["rid"]) == sorted(expected)                     # each exactly once
    assert summary["num_finished"] == len(expected) and summary["num_aborted"] == 0
    assert (requests["output_tokens"] == 10).all() and summary["leaked_kv_slots"] == 0
    assert summary["dp"]["router"].lower().startswith(router.replace("_", ""))
    assert sum(summary["dp"]["requests_per_replica"]) == len(expected)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert set(requests["replica"]) <= {0, 1} and set(steps["replica"]) == {0, 1}
    shapes = pd.read_parquet(tmp_path / "step_shapes.parquet")             # in the merged steps' order
    assert shapes[["replica", "step_id"]].equals(steps[["replica", "step_id"]])
    assert (shapes["num_decode_reqs"] + shapes["extend_new_tokens"].map(len) == steps["batch_size"]).all()
    if router == "round_robin":
        assert summary["dp"]["requests_per_replica"] == [3, 3]
    pids = json.loads((tmp_path / "ranks.json").read_text())
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids.values())


def test_tp2_run_writes_the_one_gpu_records(tmp_path):
    single = run_real(compose_config(TINY + ["model=tiny_mla_moe"]), out_dir=tmp_path / "tp1")
    summary = run_real(compose_config(TINY + ["model=tiny_mla_moe", "tp=2"]), out_dir=tmp_path / "tp2")
    assert summary["layout"] == {"tp": 2, "ep": 1, "dp": 1, "num_ranks": 2, "nnodes": 1}
    assert summary["num_finished"] == 6 and summary["leaked_kv_slots"] == 0
    assert set(single) <= set(summary)
    for name in ("requests.parquet", "steps.parquet"):
        one, two = pd.read_parquet(tmp_path / "tp1" / name), pd.read_parquet(tmp_path / "tp2" / name)
        assert list(one.columns) == list(two.columns) and (one.dtypes == two.dtypes).all()
    steps = pd.read_parquet(tmp_path / "tp2" / "steps.parquet")
    assert steps["predicted_s"].notna().all()        # the twin priced each step for tp=2
    shapes = pd.read_parquet(tmp_path / "tp2" / "step_shapes.parquet")     # and recorded its shape beside it
    assert shapes["step_id"].tolist() == steps["step_id"].tolist()
    assert (shapes["num_decode_reqs"] + shapes["extend_new_tokens"].map(len) == steps["batch_size"]).all()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:            # a zombie is not alive
        return stat.read().split()[2] != "Z"
