"""Seeded simulator runs end to end through Hydra composition: determinism, stored expected
summaries, LPM vs FCFS on the shared-prefix workload, exactness of the decode fast-forward."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.compose import compose_config
from sim.app import run_sim

EXPECTED = Path(__file__).parent / "expected"
QUIET = ["progress=false", "print_summary=false"]
SMALL_SHARED_PREFIX = ["workload.num_groups=4", "workload.prompts_per_group=8", "workload.output_len=64"]


def simulate(tmp_path: Path, name: str, overrides: list[str]) -> tuple[dict, Path]:
    out = tmp_path / name
    own_workload = any(o.startswith("workload=") for o in overrides)
    summary = run_sim(compose_config(QUIET + ([] if own_workload else SMALL_SHARED_PREFIX) + overrides), out_dir=out)
    return summary, out


def _without_wall(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "wall_time_s"}


def test_same_seed_gives_identical_outputs(tmp_path):
    random_load = ["workload=random", "workload.num_requests=40", "workload.request_rate=10"]
    a, dir_a = simulate(tmp_path, "a", random_load + ["seed=3"])
    b, dir_b = simulate(tmp_path, "b", random_load + ["seed=3"])
    assert _without_wall(a) == _without_wall(b)
    for name in ("requests.parquet", "steps.parquet"):
        assert (dir_a / name).read_bytes() == (dir_b / name).read_bytes()
    c, _ = simulate(tmp_path, "c", random_load + ["seed=4"])
    assert _without_wall(c) != _without_wall(a)


EXPECTATION_POLICIES = ("fcfs", "lpm")


def expectation_run(tmp_path: Path, policy: str) -> dict:
    """The seeded run whose summary is stored under expected/ (a small pool: eviction, retraction)."""
    # the stored summaries are of the roofline (the default, costmodel=auto, follows the committed profile)
    summary, _ = simulate(tmp_path, policy, [f"policy={policy}", "kv.capacity_tokens=20000", "costmodel=roofline"])
    return _without_wall(summary)


@pytest.mark.parametrize("policy", EXPECTATION_POLICIES)
def test_summary_matches_stored_expectation(tmp_path, policy):
    summary = expectation_run(tmp_path, policy)
    expected_file = EXPECTED / f"small_{policy}.json"
    assert expected_file.exists(), f"{expected_file} missing: regenerate on purpose with " \
                                   "`python -m tests.sim.regenerate_expected` and commit it"
    expected = json.loads(expected_file.read_text())
    _assert_close(summary, expected)


def _assert_close(actual, expected, path="summary"):
    if isinstance(expected, dict):
        assert set(actual) == set(expected), path
        for key in expected:
            _assert_close(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-9, abs=1e-12), path
    else:
        assert actual == expected, path


def test_lpm_beats_fcfs_on_cache_hits_and_ttft(tmp_path):
    common = ["kv.capacity_tokens=30000"]
    fcfs = run_sim(compose_config(["policy=fcfs", "progress=false", "print_summary=false"] + common),
                   out_dir=tmp_path / "fcfs")
    lpm = run_sim(compose_config(["policy=lpm", "progress=false", "print_summary=false"] + common),
                  out_dir=tmp_path / "lpm")
    assert lpm["cache_hit_rate"] > fcfs["cache_hit_rate"] + 0.01
    assert lpm["ttft_s"]["mean"] < 0.8 * fcfs["ttft_s"]["mean"]
    assert lpm["ttft_s"]["p99"] < fcfs["ttft_s"]["p99"]


@pytest.mark.parametrize("capacity,policy,max_running", [
    (40000, "fcfs", 1024), (6000, "fcfs", 1024), (6000, "lpm", 1024), (6000, "random", 1024),
    (40000, "lpm", 4), (40000, "random", 4)])
@pytest.mark.parametrize("overlap", [False, True])
def test_fast_forward_is_exact(tmp_path, capacity, policy, max_running, overlap):
    """Also with a queue blocked on memory (capacity 6000): runs end where admission would pass;
    and blocked on max_running_requests, where a stateful policy (random) must not be fast-forwarded."""
    overrides = ["workload=random", "workload.num_requests=60", "workload.request_rate=20",
                 f"kv.capacity_tokens={capacity}", "workload.input_len=512", "workload.output_len=128",
                 f"policy={policy}", f"scheduler.max_running_requests={max_running}", f"overlap={overlap}"]
    on, dir_on = simulate(tmp_path, "on", overrides + ["sim.fast_forward=true"])
    off, dir_off = simulate(tmp_path, "off", overrides + ["sim.fast_forward=false"])
    req_on, req_off = pd.read_parquet(dir_on / "requests.parquet"), pd.read_parquet(dir_off / "requests.parquet")
    steps_on, steps_off = pd.read_parquet(dir_on / "steps.parquet"), pd.read_parquet(dir_off / "steps.parquet")
    assert len(steps_on) == len(steps_off) and on["num_steps"] == off["num_steps"]
    assert_same_records(steps_on, steps_off, req_on, req_off, overlap)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("rate", ["inf", "40"])
def test_fast_forward_spans_finishes_exactly(tmp_path, monkeypatch, overlap, rate):
    """Requests of different lengths draining with nothing waiting: decode runs continue past
    finishes (several in one run), and the records are still those of stepping one by one."""
    from runtime.core.scheduler import Scheduler
    commit = Scheduler.commit_decode_run
    finishes_inside: list[int] = []

    def counting_commit(self, plan, end_s, tokens, schedule_s=None, overlap=False):
        before = len(self._finished)
        used = commit(self, plan, end_s, tokens, schedule_s, overlap)
        finishes_inside.append(sum(r.finish_s < end_s[-1] for r in self._finished[before:]))
        return used

    monkeypatch.setattr(Scheduler, "commit_decode_run", counting_commit)
    overrides = ["workload=random", "workload.num_requests=40", f"workload.request_rate={rate}",
                 "workload.input_len=256", "workload.output_len=96", "workload.range_ratio=0.1",
                 f"overlap={overlap}"]
    on, dir_on = simulate(tmp_path, "on", overrides + ["sim.fast_forward=true"])
    assert max(finishes_inside) >= 3 and sum(finishes_inside) >= 20
    off, dir_off = simulate(tmp_path, "off", overrides + ["sim.fast_forward=false"])
    steps_on, steps_off = pd.read_parquet(dir_on / "steps.parquet"), pd.read_parquet(dir_off / "steps.parquet")
    req_on, req_off = pd.read_parquet(dir_on / "requests.parquet"), pd.read_parquet(dir_off / "requests.parquet")
    assert_same_records(steps_on, steps_off, req_on, req_off, overlap)
    assert _without_wall(on).keys() == _without_wall(off).keys() and on["num_steps"] == off["num_steps"]


@pytest.mark.parametrize("overlap", [False, True])
def test_fast_forward_runs_through_evictions_exactly(tmp_path, monkeypatch, overlap):
    """A full pool of cached prefixes, nothing waiting: the decode steps evict leaves as they
    allocate, and runs replay those evictions (the same leaves, the same KV in use per step)."""
    from runtime.core.kv_manager import KVManager
    allocate_rows = KVManager.allocate_rows
    evicted_in_runs: list[int] = []

    def counting(self, num_rows, num_tokens, now):
        rows, evicted = allocate_rows(self, num_rows, num_tokens, now)
        evicted_in_runs.append(len(evicted))
        return rows, evicted

    monkeypatch.setattr(KVManager, "allocate_rows", counting)
    overrides = ["workload=random", "workload.num_requests=40", "workload.request_rate=20", "workload.input_len=256",
                 "workload.output_len=96", "workload.range_ratio=0.1", "kv.capacity_tokens=2500", f"overlap={overlap}"]
    on, dir_on = simulate(tmp_path, "on", overrides + ["sim.fast_forward=true"])
    assert sum(1 for n in evicted_in_runs if n) >= 3
    off, dir_off = simulate(tmp_path, "off", overrides + ["sim.fast_forward=false"])
    assert on["num_steps"] == off["num_steps"] and on["num_retractions"] == 0
    assert_same_records(pd.read_parquet(dir_on / "steps.parquet"), pd.read_parquet(dir_off / "steps.parquet"),
                        pd.read_parquet(dir_on / "requests.parquet"), pd.read_parquet(dir_off / "requests.parquet"), overlap)


def assert_same_records(steps_on, steps_off, req_on, req_off, overlap: bool) -> None:
    """Decode runs against stepping: the same decisions, and with overlap the very same floats (a
    run adds its step times in stepping's order); without, times within 1e-9 (relative)."""
    pd.testing.assert_frame_equal(steps_on.drop(columns=["start_s", "end_s"]), steps_off.drop(columns=["start_s", "end_s"]))
    if overlap:
        pd.testing.assert_frame_equal(steps_on, steps_off, check_exact=True)
        pd.testing.assert_frame_equal(req_on.drop(columns=["token_times_s"]), req_off.drop(columns=["token_times_s"]),
                                      check_exact=True)
        assert [list(t) for t in req_on["token_times_s"]] == [list(t) for t in req_off["token_times_s"]]
        return
    pd.testing.assert_series_equal(steps_on["end_s"], steps_off["end_s"], rtol=1e-9)
    pd.testing.assert_frame_equal(req_on.drop(columns=["token_times_s"]), req_off.drop(columns=["token_times_s"]), rtol=1e-9)


def test_overlap_hides_host_time_and_notices_finishes_one_step_later(tmp_path):
    """Overlap: each step costs max(GPU, host) rather than their sum, and a request that ends in
    step n still rides in step n+1 (SGLang's overlap scheduler), so batches are never smaller."""
    overrides = ["workload=random", "workload.num_requests=40", "workload.request_rate=inf",
                 "workload.input_len=256", "workload.output_len=16", "workload.range_ratio=1.0",
                 "sim.fast_forward=false"]
    on, dir_on = simulate(tmp_path, "on", overrides + ["overlap=true"])
    off, dir_off = simulate(tmp_path, "off", overrides + ["overlap=false"])
    steps_on, steps_off = pd.read_parquet(dir_on / "steps.parquet"), pd.read_parquet(dir_off / "steps.parquet")
    assert on["duration_s"] < off["duration_s"]
    assert on["leaked_kv_slots"] == off["leaked_kv_slots"] == 0      # the end-of-run check of both modes
    assert steps_on["num_decode_requests"].sum() > steps_off["num_decode_requests"].sum()
    req_on = pd.read_parquet(dir_on / "requests.parquet")
    assert (req_on["output_tokens"] == 16).all() and (req_on["finish_reason"] == "length").all()
