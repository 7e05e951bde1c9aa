"""mode=real on CPU with a tiny model: the same scheduler serves through the torch runtime, writes
the simulator's record schema, leaks no KV, and a replay of its step times through the simulator
reproduces its plans exactly (DESIGN contract 5)."""
from __future__ import annotations

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from hydra.utils import instantiate  # noqa: E402

from experiments.compose import compose_config  # noqa: E402
from runtime.app import leaked_slots, run_real  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.driver import RealDriver, all_at_once  # noqa: E402
from runtime.request_source import ReplaySource  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from sim.app import run_sim  # noqa: E402
from sim.costmodel.replay import ReplayCostModel  # noqa: E402
from sim.driver import SimDriver  # noqa: E402
from sim.executor import SimExecutor  # noqa: E402
from sim.predictor import build_cost_model  # noqa: E402
from sim.step_shapes import STEP_SHAPES_FILE, read_shapes  # noqa: E402

TINY = ["model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32", "progress=false",
        "print_summary=false", "workload.num_groups=3", "workload.prompts_per_group=4",
        "workload.system_prompt_len=48", "workload.question_len=16", "workload.output_len=12"]


def test_real_mode_serves_and_writes_the_sim_schema(tmp_path):
    # a small prefill budget spreads the groups over several steps, so later members hit the cache
    small_batches = ["scheduler.max_prefill_tokens=160"]
    real = run_real(compose_config(["mode=real"] + TINY + small_batches), out_dir=tmp_path / "real")
    sim = run_sim(compose_config(["mode=sim"] + TINY + small_batches), out_dir=tmp_path / "sim")
    assert real["num_finished"] == real["num_requests"] == 12 and real["num_aborted"] == 0
    assert real["leaked_kv_slots"] == 0 and real["cache_hit_rate"] > 0.3
    assert set(sim) <= set(real)
    for name in ("requests.parquet", "steps.parquet"):
        r, s = pd.read_parquet(tmp_path / "real" / name), pd.read_parquet(tmp_path / "sim" / name)
        assert list(r.columns) == list(s.columns) and (r.dtypes == s.dtypes).all()
    requests = pd.read_parquet(tmp_path / "real" / "requests.parquet")
    assert (requests["output_tokens"] == 12).all() and (requests["finish_reason"] == "length").all()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("capacity", [4000, 260])
def test_replayed_step_times_reproduce_the_real_plans(capacity, overlap):
    """capacity 260 tokens forces chunking, eviction and retraction in the real run."""
    # a reservation ratio of 0.05 over-admits on purpose, so the small pool must retract
    overrides = ["mode=real"] + TINY + [f"kv.capacity_tokens={capacity}", "scheduler.chunked_prefill_size=40",
                                        "scheduler.max_prefill_tokens=80", "scheduler.init_new_token_ratio=0.05"]
    cfg = compose_config(overrides)
    specs = all_at_once(instantiate(cfg.workload).requests())

    real_core = build_core(cfg)
    runner = ModelRunner(dict(real_core.model.hf_config), real_core.kv_capacity_tokens, device="cpu",
                         dtype="float32", seed=0)
    real = RealDriver(real_core.scheduler, runner, progress=False, record_plans=True, overlap=overlap).run(specs)
    assert all(r.is_finished for r in real.requests) and len(real.requests) == len(specs)
    assert leaked_slots(real_core.scheduler) == 0
    if capacity == 260:
        assert real_core.scheduler.num_retractions > 0

    sim_core = build_core(cfg)
    replay = ReplayCostModel.from_steps(real.steps.columns["start_s"], real.steps.columns["end_s"])
    sim = SimDriver(sim_core.scheduler, SimExecutor(replay, sim_core.model.vocab_size), fast_forward=False,
                    progress=False, record_plans=True, overlap=overlap).run(specs)
    assert sim.steps.plan_signatures == real.steps.plan_signatures
    assert sim.steps.columns["num_retractions"] == real.steps.columns["num_retractions"]


def cpu_core_and_runner(cfg):
    """A fresh scheduler and an fp32 CPU runner for it."""
    core = build_core(cfg)
    return core, ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device="cpu", dtype="float32")


def test_warmup_leaves_serving_unchanged():
    """Warm-up writes KV only into slots nobody owns yet and samples on a sampler of its own (the runner's
    random stream is untouched): the same sampled requests give the same tokens."""
    cfg = compose_config(["mode=real"] + TINY + ["kv.capacity_tokens=4000"])
    specs = all_at_once(instantiate(cfg.workload).requests())
    outputs = []
    for warm in (False, True):
        core, runner = cpu_core_and_runner(cfg)
        if warm:
            assert runner.warmup([300, 64]) > 0
        done = RealDriver(core.scheduler, runner.execute, progress=False).run(specs)
        outputs.append({r.rid: r.output_ids for r in done.requests})
    assert outputs[0] == outputs[1]


class _AbortingSource(ReplaySource):
    """Replays the specs and aborts every third request once it has produced a token."""

    def __init__(self, specs):
        super().__init__(specs, all_at_once=True)
        self.seen: dict[str, object] = {}
        self.aborted: set[str] = set()

    def poll(self, now_s):
        reqs = super().poll(now_s)
        self.seen.update({r.rid: r for r in reqs})
        return reqs

    def aborted_rids(self):
        rids = [rid for i, (rid, r) in enumerate(sorted(self.seen.items()))
                if i % 3 == 0 and r.output_ids and rid not in self.aborted]
        self.aborted.update(rids)
        return rids


@pytest.mark.parametrize("overlap", [False, True])
def test_aborts_and_retractions_leak_no_kv_slot(overlap):
    cfg = compose_config(["mode=real"] + TINY + ["kv.capacity_tokens=260", "scheduler.chunked_prefill_size=40",
                                                 "scheduler.max_prefill_tokens=80", "scheduler.init_new_token_ratio=0.05"])
    specs = instantiate(cfg.workload).requests()
    core = build_core(cfg)
    runner = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device="cpu", dtype="float32", seed=0)
    source = _AbortingSource(specs)
    done = RealDriver(core.scheduler, runner, progress=False, overlap=overlap).serve(source)
    assert len(done.requests) == len(specs) and source.aborted
    assert sum(r.finish_reason.value == "abort" for r in done.requests) == len(source.aborted)
    assert leaked_slots(core.scheduler) == 0 and core.scheduler.num_retractions > 0


def test_overlap_gives_the_same_greedy_tokens():
    """fp32 tiny model on CPU: planning step n+1 before step n's tokens are known (placeholders
    resolved from the future ring) changes no token."""
    cfg = compose_config(["mode=real"] + TINY + ["kv.capacity_tokens=4000"])
    specs = all_at_once(instantiate(cfg.workload).requests())
    outputs = []
    for overlap in (False, True):
        core, runner = cpu_core_and_runner(cfg)
        done = RealDriver(core.scheduler, runner, progress=False, overlap=overlap).run(specs)
        outputs.append({r.rid: r.output_ids for r in done.requests})
        assert leaked_slots(core.scheduler) == 0
    assert outputs[0] == outputs[1]


def test_real_runs_record_the_simulators_prediction_per_step(tmp_path):
    summary = run_real(compose_config(["mode=real"] + TINY), out_dir=tmp_path / "real")
    steps = pd.read_parquet(tmp_path / "real" / "steps.parquet")
    assert steps["predicted_s"].notna().all() and (steps["predicted_s"] > 0).all()
    error = summary["step_prediction_error"]
    assert error["num_steps"] == len(steps) and 0 <= error["median"] <= error["p90"]
    # every step's shape beside it: the run's own cost model prices the recorded shapes as it priced the steps
    cfg = compose_config(["mode=real"] + TINY)
    shapes = read_shapes(tmp_path / "real")
    assert pd.read_parquet(tmp_path / "real" / STEP_SHAPES_FILE)["step_id"].tolist() == steps["step_id"].tolist()
    model = build_cost_model(cfg, build_core(cfg))
    repriced = [model.step_time_s(s) - (model.host_time_s(s) if cfg.overlap else 0.0) for s in shapes]
    assert repriced == pytest.approx(steps["predicted_s"].tolist(), rel=1e-12)
    sim_steps = run_sim(compose_config(["mode=sim"] + TINY), out_dir=tmp_path / "sim")
    sim = pd.read_parquet(tmp_path / "sim" / "steps.parquet")
    assert sim_steps["num_steps"] == len(sim)
    assert ((sim["end_s"] - sim["start_s"]) - sim["predicted_s"]).abs().max() < 1e-12
