"""mode=profile on the tiny CPU model (smoke grid): it writes every table and meta.json, a second run
resumes (measures nothing new), and costmodel=profiled prices steps from what it wrote."""
from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.profile.app import KEYS, run_profile  # noqa: E402
from runtime.profile.grid import GRIDS, Limits, decode_points  # noqa: E402
from sim.costmodel.base import StepShape  # noqa: E402
from sim.costmodel.profiled import ProfiledCostModel  # noqa: E402
from sim.costmodel.roofline import RooflineCostModel  # noqa: E402

TINY = ["mode=profile", "model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32",
        "progress=false", "profile.grid=smoke", "kv.capacity_tokens=4096"]


def test_profile_writes_resumable_tables_the_profiled_model_reads(tmp_path):
    cfg = compose_config(TINY + [f"profile.out_dir={tmp_path}"])
    first = run_profile(cfg)
    grid = GRIDS["smoke"]
    for name, keys in KEYS.items():
        frame = pd.read_csv(tmp_path / f"{name}.csv")
        assert set(keys) <= set(frame.columns) and len(frame) > 0, name
        time_column = {"host": "host_s", "idle_launch": "launch_s"}.get(name, "device_s")
        assert (frame[time_column] > 0).all(), name
        assert not frame.duplicated(list(keys)).any(), name
    decode = pd.read_csv(tmp_path / "decode.csv")
    assert set(decode["path"]) == {"eager"}                    # no CUDA graphs on CPU
    assert len(decode) == len(grid.eager_batches) * len(grid.eager_contexts)
    for name in ("prefill", "mixed"):         # steps with extends are also timed with their launch hidden
        frame = pd.read_csv(tmp_path / f"{name}.csv")
        assert (frame["device_alone_s"] > 0).all(), name
    after = pd.read_csv(tmp_path / "prefill_after_decode.csv")   # each extend also behind decodes, and one after it
    assert list(after["new_tokens"]) == list(grid.after_decode_tokens)
    assert (after[["device_alone_s", "after_decode_s", "decode_s", "decode_after_s"]] > 0).all().all()
    assert (after["decode_batch"] == grid.after_decode_batch).all()
    idle = pd.read_csv(tmp_path / "idle_launch.csv")         # per step kind: gap 0 and every grid gap
    assert sorted(set(idle["gap_s"])) == [0.0, *grid.idle_gaps_s] and (idle["next_launch_s"] > 0).all()
    host = pd.read_csv(tmp_path / "host.csv")
    assert set(host["kind"]) == {"decode", "prefill"}
    assert (host["host_s"] >= host["schedule_s"] + host["commit_s"]).all()
    meta = json.loads((tmp_path / "meta.json").read_text())
    run = meta["runs"][-1]
    assert run["grid"] == "smoke" and run["model"] == "tiny_mla_moe" and run["versions"]["torch"]
    assert run["git_revision"] and run["date"] and "command" in run
    # every smoke decode point (batch <= 4, context <= 64) decoded its own sequence of the 4096-slot pool
    assert (run["kv_fill_sequence_tokens"], run["kv_fill_sequences"]) == (64, 64)

    again = run_profile(cfg)                                     # resumes: every point is already there
    assert again == first and len(json.loads((tmp_path / "meta.json").read_text())["runs"]) == 2
    assert json.loads((tmp_path / "meta.json").read_text())["runs"][-1]["points_measured"] == 0

    core = build_core(compose_config(TINY))
    model = ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                              profile=str(tmp_path))
    step = StepShape(num_decode_reqs=4, decode_context_tokens=4 * 64)
    assert model.step_time_s(step) > model.host_time_s(step) > 0
    assert model.device_time_s(StepShape((64,), (0,))) > 0
    assert model.fallbacks == {"decode": 0, "prefill": 0}


def test_decode_points_fill_the_pool_and_stop_at_its_edge():
    limits = Limits(kv_slots=10_000, max_context_tokens=4096, max_batch=64, max_new_tokens=8192)
    points = decode_points((1, 8, 64, 128), (128, 1024, 8192), limits)
    assert (1, 4095) in points and (1, 8192) not in points        # the context limit
    assert (8, 1024) in points and (8, 1250) in points            # the pool: 10,000 slots / 8 requests
    assert all(b <= 64 for b, _ in points) and all(b * c <= 10_000 for b, c in points)


def test_shared_prefix_batches_read_their_groups_slots():
    from runtime.profile.plans import SharedPrefixBatch
    for interleaved in (False, True):
        batch = SharedPrefixBatch("t", 8, 4, 32, 8, 100, 1000, interleaved=interleaved)
        slots = [list(r.kv_slots) for r in batch.requests]
        groups = {tuple(s[:32]) for s in slots}
        assert len(groups) == 2 and all(len(s) == 40 for s in slots)
        privates = [x for s in slots for x in s[32:]]
        assert len(set(privates)) == len(privates) and not set(privates) & {x for g in groups for x in g}
        assert batch.unique_tokens == len({x for s in slots for x in s}) == 2 * 32 + 8 * 8
        assert min(x for s in slots for x in s) == 100
        firsts = [tuple(s[:32]) for s in slots]
        assert (firsts[0] == firsts[1]) != interleaved          # grouped: neighbours share; interleaved: not
        items = batch.decode_items()
        assert all(it.num_prefix_tokens == 39 and it.new_slots == [it.request.kv_slots[39]] for it in items)
    with pytest.raises(ValueError, match="groups of 3"):
        SharedPrefixBatch("t", 8, 3, 32, 8, 0, 1000)


def test_the_kv_pool_is_filled_by_the_model_before_timing():
    from runtime.engine.build_runner import build_model_runner
    from runtime.profile.kv_fill import fill_kv_pool

    cfg = compose_config(TINY + ["kv.capacity_tokens=600"])
    core = build_core(cfg)
    runner = build_model_runner(cfg, core)
    layers = runner.pool.kv_buffers                                # [slots, latent + rope] per layer
    assert all(not layer[:600].any() for layer in layers)          # allocated as zeros
    calls = []
    launch = runner.launch
    runner.launch = lambda plan: calls.append(plan.items[0].num_new_tokens) or launch(plan)
    assert fill_kv_pool(runner, 600, 256, 200, core.model.vocab_size, progress=False).num_slots == 600
    assert calls == [199, 199, 199, 3]                             # prompts of at most max context - 1
    for layer in layers:
        assert layer[:600].abs().sum(dim=-1).gt(0).all()            # every slot written by a prefill
    with pytest.raises(ValueError, match="kv_fill=ones: expected one of"):
        run_profile(compose_config(TINY + ["profile.kv_fill=ones"]))


def test_the_fill_writes_whole_sequences_whose_decodes_attend_their_own_kv():
    """Sequences of the fill are prefilled chunk after chunk over their own prefix; a request the pool
    hands back for a decode attends KV equal to what a fresh prefill of its own tokens writes."""
    import torch

    from runtime.engine.build_runner import build_model_runner
    from runtime.profile.kv_fill import fill_kv_pool
    from runtime.profile.plans import SyntheticBatch, step_plan

    cfg = compose_config(TINY + ["kv.capacity_tokens=700"])
    core = build_core(cfg)
    runner = build_model_runner(cfg, core)
    prefixes = []
    launch = runner.launch
    runner.launch = lambda plan: prefixes.append(plan.items[0].num_prefix_tokens) or launch(plan)
    vocab = core.model.vocab_size
    pool = fill_kv_pool(runner, 500, 64, 1000, vocab, progress=False, sequence_tokens=150)
    assert (len(pool.seeds), pool.sequence_tokens) == (3, 150)
    assert prefixes == [0, 64, 128] * 3 + [0]                      # 3 sequences in chunks, then 50 slots
    assert pool.requests("d", 4, 100, vocab) is None and pool.requests("d", 2, 151, vocab) is None
    second = pool.requests("d", 2, 150, vocab)[1]
    assert list(second.kv_slots) == list(range(150, 300))
    fresh = SyntheticBatch("fresh", 1, 150, 550, vocab)             # slots 550..699: the same tokens, at once
    fresh.requests[0].input_ids = second.input_ids
    runner.launch(step_plan(fresh.extend_items(150, 0))).wait()
    for layer in runner.pool.kv_buffers:
        torch.testing.assert_close(layer[150:300], layer[550:700], rtol=1e-4, atol=1e-5)
